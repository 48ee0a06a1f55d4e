"""Known answers for ``planned``: the merge as written, built tensor by tensor in memory, is what
mergekit itself writes for the same config (max abs difference ≤ 1e-6 in float32)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions

import mergekit_mergeability  # noqa: F401  (registers our methods)
from mergekit_mergeability.rehearsal import planned
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources import tensors
from mergekit_mergeability.tiny import make_adapter, make_family, state_dict

EXPERTS = ("expert0", "expert1", "expert2")
# method -> (global parameters, per-model parameters for each expert, whether the config names a base)
CONFIGS = {
    "task_arithmetic": ({"lambda": 0.9}, [{"weight": 0.7}, {"weight": 0.4}, {"weight": 0.2}], True),
    "linear": ({"normalize": True}, [{"weight": 0.5}, {"weight": 0.3}, {"weight": 0.2}], False),
    "ties": ({"normalize": True}, [{"weight": 1.0, "density": 0.5}] * 3, True),
    "dare_ties": ({}, [{"weight": 0.5, "density": 0.6}] * 3, True),
    "dare_linear": ({}, [{"weight": 0.5, "density": 0.6}] * 3, True),
    "della": ({}, [{"weight": 0.5, "density": 0.6, "epsilon": 0.1}] * 3, True),
    "breadcrumbs": ({}, [{"weight": 0.5, "density": 0.8, "gamma": 0.05}] * 3, True),
    "model_stock": ({}, [{}] * 3, True),
    "sce": ({"select_topk": 0.5}, [{"weight": 1.0}] * 3, True),
    "knowledge_weighted": ({}, [{"knowledge": 0.8}, {"knowledge": 0.3}, {"knowledge": 0.5}], True),
    "layer_selective": ({"cutoff": 2}, [{}, {"upper": True}, {}], True),
}
RANDOM = {"dare_ties", "dare_linear", "della"}  # they draw which entries to drop


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return make_family(tmp_path_factory.mktemp("three"), experts=3)


def document(method, family, experts=EXPERTS):
    shared, per_model, with_base = CONFIGS[method]
    config = {
        "merge_method": method,
        "dtype": "float32",
        "models": [{"model": str(family[e]), "parameters": p} for e, p in zip(experts, per_model)],
    }
    if shared:
        config["parameters"] = shared
    if with_base:
        config["base_model"] = str(family["base"])
    return config


def in_memory(config, readers):
    plan = planned.plan(config, "config.yml")
    return {name: planned.merged(tensor, lambda model, n: _read(readers[model], n)) for name, tensor in plan.items()}


def _read(reader, name):
    return reader[name] if name in reader.index else None


def written(config, out: Path):
    run_merge(MergeConfiguration.model_validate(config), str(out), MergeOptions(write_model_card=False, quiet=True))
    return state_dict(out)


def _readers(family):
    return {str(path): tensors(path) for path in family.values()}


@pytest.mark.parametrize("method", sorted(set(CONFIGS) - RANDOM))
def test_each_method_in_memory_is_what_mergekit_writes(three, tmp_path, method):
    config = document(method, three)
    ours, theirs = in_memory(config, _readers(three)), written(config, tmp_path / "out")
    assert ours.keys() == theirs.keys()
    base = state_dict(three["base"])
    moved = 0
    for name, tensor in theirs.items():
        assert (ours[name] - tensor).abs().max() <= 1e-6, name
        moved += not torch.equal(tensor, base[name])
    assert moved > len(theirs) // 2  # the merge is not the base: the comparison can tell methods apart


@pytest.mark.parametrize("method", sorted(RANDOM))
def test_random_methods_draw_the_same_merge_each_time_and_at_density_1_none(three, tmp_path, method):
    config = document(method, three)
    readers = _readers(three)
    first, again = in_memory(config, readers), in_memory(config, readers)
    assert all(torch.equal(first[n], again[n]) for n in first)
    full = yaml.safe_load(yaml.safe_dump(config).replace("density: 0.6", "density: 1.0"))
    ours, theirs = in_memory(full, readers), written(full, tmp_path / "out")
    assert all((ours[n] - t).abs().max() <= 1e-6 for n, t in theirs.items())
    assert any(not torch.equal(first[n], ours[n]) for n in first)  # density 0.6 dropped entries


def test_stock_mergekit_yaml_writes_the_ties_merge_rehearsed(three, tmp_path):
    path = tmp_path / "ties.yml"
    config = document("ties", three)
    path.write_text(yaml.safe_dump(config))
    binary = Path(sys.executable).parent / "mergekit-yaml"
    done = subprocess.run([binary, path, tmp_path / "out", "--no-write-model-card"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs, ours = state_dict(tmp_path / "out"), in_memory(config, _readers(three))
    assert all((ours[n] - t).abs().max() <= 1e-6 for n, t in theirs.items())


def test_an_adapter_is_merged_from_its_factors_without_writing_its_merged_model(three, tmp_path):
    """``base+adapter``: mergekit would merge the adapter into a copy of its base on disk; the
    plan reads its base's index instead, and the rehearsal forms its tensors from the factors."""
    from mergekit_mergeability.sources import resolve

    targets = ["model.layers.1.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight"]
    adapter = make_adapter(three["base"], tmp_path / "adapter", targets, seed=3)
    source = resolve(str(adapter), tmp_path, base=three["base"])
    config = {
        "merge_method": "task_arithmetic",
        "base_model": str(three["base"]),
        "models": [
            {"model": str(three["expert0"]), "parameters": {"weight": 0.5}},
            {"model": str(source), "parameters": {"weight": 0.5}},
        ],
    }
    readers = {**_readers(three), str(source): tensors(source)}
    before = sorted(p.name for p in tmp_path.iterdir())
    ours = in_memory(config, readers)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    base, expert = state_dict(three["base"]), state_dict(three["expert0"])
    for name in targets:
        formed = tensors(source)[name]
        torch.testing.assert_close(ours[name], base[name] + 0.5 * (expert[name] - base[name] + formed - base[name]))


def test_a_config_mergekit_refuses_is_one_line_naming_the_file(three):
    config = document("ties", three)
    del config["base_model"]
    with pytest.raises(UserError, match=r"^config.yml: mergekit would refuse this merge: .*base"):
        planned.plan(config, "config.yml")


def test_an_update_is_sorted_once_for_the_masks_of_every_density_the_menu_prunes_at(monkeypatch):
    """TIES's pruning sorts each update; the rehearsal's candidates prune the same updates again and
    again, at the menu's densities, so while merging an update is sorted once for the masks at each
    density named, and each mask is kept by the update's bytes and the density: the mask mergekit
    computes, ties and zeros included. Outside, only the density asked is kept."""
    from collections import OrderedDict

    import mergekit.sparsify as sparsify
    import torch

    from mergekit_mergeability.rehearsal import planned

    real, sort, sorted_at = sparsify.magnitude, planned._kept_bits, []

    def counted(tensor, densities):
        sorted_at.append(list(densities))
        return sort(tensor, densities)

    def one(tensor, density, rescale_norm=None):
        sorted_at.append(density)
        return real(tensor, density, rescale_norm)

    monkeypatch.setattr(planned, "_kept_bits", counted)
    monkeypatch.setattr(sparsify, "magnitude", one)
    monkeypatch.setattr(planned, "_masks", OrderedDict())
    monkeypatch.setattr(planned, "_kept", [0])
    update = torch.randint(-3, 4, (64, 32)).float() / 8  # magnitudes tie, a seventh are zeros
    asked = [(0.3, sparsify.RescaleNorm.l1), (0.3, None), (0.7, None), (0.5, sparsify.RescaleNorm.l2), (0.4, None)]
    with planned.sorted_together((0.3, 0.5, 0.7)), planned.shared_masks():
        masked = [sparsify.magnitude(update.clone(), density, norm) for density, norm in asked]
    assert sparsify.magnitude is one  # put back on exit
    assert sorted_at == [[0.5, 0.7, 0.3], 0.4] and planned._together == [()]  # 0.3's sort gave 0.7's and 0.5's
    for (density, norm), ours in zip(asked, masked):
        assert torch.equal(ours, real(update, density, norm)), (density, norm)
    monkeypatch.setattr(planned, "MASK_BYTES", 64 * 32 // 8)  # room for one mask, a bit a value: the oldest are let go
    with planned.shared_masks():
        kept = sparsify.magnitude(update * 2, 0.3)
    assert sorted_at[-1] == 0.3  # mergekit's own, one density
    assert len(planned._masks) == 1 and planned._kept == [64 * 32 // 8] and torch.equal(kept, real(update * 2, 0.3))


def test_a_plans_merges_keep_the_masks_of_its_own_selection_and_sort_nothing(monkeypatch):
    """plan prunes by one selection (``inmemory.selected_magnitudes``), not mergekit's sort; the
    shared masks keep what that selection keeps, and no density is sorted for."""
    from collections import OrderedDict
    from unittest import mock

    import mergekit.sparsify as sparsify

    from mergekit_mergeability.rehearsal import planned
    from mergekit_mergeability.rehearsal.inmemory import selected_magnitudes, top_magnitudes

    monkeypatch.setattr(planned, "_masks", OrderedDict())
    monkeypatch.setattr(planned, "_kept", [0])
    update = torch.randint(-3, 4, (64, 32)).float()  # ties at the threshold: the selection keeps them all
    with mock.patch.object(torch, "argsort", wraps=torch.argsort) as sort:
        with selected_magnitudes(), planned.shared_masks():
            kept = [sparsify.magnitude(update, 0.5) for _ in range(2)]
    assert sort.call_count == 0 and len(planned._masks) == 1
    assert all(torch.equal(k, top_magnitudes(update, 0.5)) for k in kept)


def test_task_arithmetic_configs_the_grid_counts_as_one_merge_build_one_and_the_others_do_not(three):
    """Known answer for the grid's ``_merge_key``: task_arithmetic configs whose lambda · weight per
    update agree (normalize dividing by the weights' sum) are one key and build the same tensors;
    swapped weights, or TIES (whose weights are not a plain product), are other keys and other merges."""
    from mergekit_mergeability.decide.tuning import _merge_key

    readers = _readers(three)

    def config(method, lam, weights, **shared):
        models = [{"model": str(three[e]), "parameters": {"weight": w}} for e, w in zip(EXPERTS, weights)]
        parameters = {"lambda": lam, **shared}
        return {"merge_method": method, "base_model": str(three["base"]), "dtype": "float32", "models": models,
                "parameters": parameters}  # fmt: skip

    def same(a, b) -> bool:
        built = in_memory(a, readers), in_memory(b, readers)
        return all(torch.allclose(built[0][n], built[1][n], atol=1e-6) for n in built[0])

    pairs = [
        (config("task_arithmetic", 1.0, [0.75, 0.75, 0.3]), config("task_arithmetic", 0.75, [1.0, 1.0, 0.4]), True),
        (config("task_arithmetic", 1.0, [1, 1, 2], normalize=True), config("task_arithmetic", 1.0, [2, 2, 4], normalize=True), True),
        (config("task_arithmetic", 1.0, [0.5, 1.0, 0.2]), config("task_arithmetic", 1.0, [1.0, 0.5, 0.2]), False),
        (config("ties", 1.0, [0.75, 0.75, 0.3], density=0.5), config("ties", 0.75, [1.0, 1.0, 0.4], density=0.5), False),
    ]  # fmt: skip
    for a, b, one in pairs:
        assert (_merge_key(a) == _merge_key(b)) is one and same(a, b) is one
