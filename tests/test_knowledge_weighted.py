import math

import pytest
import torch
from mergekit.merge_methods import merge_state_dicts, merge_tensors

import mergekit_mergeability  # noqa: F401  (registers the methods)
from mergekit_mergeability.methods import knowledge_weights
from mergekit_mergeability.tiny import state_dict


def test_weights_are_the_softmax_of_missing_knowledge():
    w = knowledge_weights([0.9, 0.4], temperature=0.5)
    expected_ratio = math.exp((0.6 - 0.1) / 0.5)  # e^1: the weakly-known one gets e times more
    assert w.sum().item() == pytest.approx(1)
    assert (w[1] / w[0]).item() == pytest.approx(expected_ratio)


def test_lower_knowledge_gets_strictly_larger_weight():
    w = knowledge_weights([0.95, 0.7, 0.5, 0.1], temperature=0.3)
    assert torch.all(w[1:] > w[:-1])


def test_weight_multiplies_and_renormalises():
    w = knowledge_weights([0.5, 0.5, 0.5], temperature=1.0, weight=[2, 1, 1])
    assert w.tolist() == pytest.approx([0.5, 0.25, 0.25])


def test_equal_knowledge_and_huge_temperature_are_the_mean():
    assert knowledge_weights([0.3, 0.3]).tolist() == pytest.approx([0.5, 0.5])
    assert knowledge_weights([0.0, 1.0], temperature=1e9).tolist() == pytest.approx([0.5, 0.5])


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        knowledge_weights([0.5], temperature=0)


def _models(family):
    return {key: state_dict(family[key]) for key in ("base", "expert0", "expert1")}


@pytest.mark.parametrize(
    "knowledge, temperature", [({"expert0": 0.4, "expert1": 0.4}, 0.1), ({"expert0": 0.1, "expert1": 0.9}, 1e9)]
)
def test_mean_identity_against_mergekit(llama, knowledge, temperature):
    models = _models(llama)
    ours = merge_state_dicts(
        models,
        "knowledge_weighted",
        base="base",
        parameters={"knowledge": knowledge, "temperature": temperature, "ties": False},
    )
    linear = merge_state_dicts({k: models[k] for k in ("expert0", "expert1")}, "linear", parameters={"weight": 1.0})
    ta = merge_state_dicts(models, "task_arithmetic", base="base", parameters={"weight": 0.5})
    for name in models["base"]:
        torch.testing.assert_close(ours[name], linear[name])
        torch.testing.assert_close(ours[name], ta[name])


def test_ties_option_with_equal_knowledge_is_mergekit_ties(llama):
    models = _models(llama)
    params = {"density": 0.5}
    ours = merge_state_dicts(
        models, "knowledge_weighted", base="base", parameters={**params, "knowledge": 0.5, "ties": True}
    )
    ties = merge_state_dicts(models, "ties", base="base", parameters={**params, "weight": 1.0})
    for name in models["base"]:
        torch.testing.assert_close(ours[name], ties[name])


def test_known_answer_on_one_tensor():
    base, a, b = torch.zeros(2), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    w = knowledge_weights([0.8, 0.2], temperature=0.2).tolist()
    merged = merge_tensors(
        [base, a, b],
        "knowledge_weighted",
        base_index=0,
        parameters={"knowledge": [0.8, 0.2], "temperature": 0.2, "scale": 2.0, "ties": False},
    )
    assert merged.tolist() == pytest.approx([2 * w[0], 2 * w[1]])
    assert merged[1] > merged[0]  # the weakly-known expert's coordinate moves more


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"knowledge": 1.5}, "less than or equal to 1"),
        ({"knowledge": 0.5, "temperature": 0.0}, "greater than 0"),
        ({}, "knowledge"),
    ],
)
def test_bad_parameters_in_memory(parameters, message):
    tensors = [torch.zeros(2), torch.ones(2)]
    with pytest.raises(Exception, match=message):
        merge_tensors(tensors, "knowledge_weighted", base_index=0, parameters=parameters)


def test_needs_a_base():
    with pytest.raises(ValueError, match="requires a base"):
        merge_tensors([torch.zeros(2), torch.ones(2)], "knowledge_weighted", parameters={"knowledge": 0.5})


@pytest.mark.parametrize("density", [0.1, 0.5, 0.9])
def test_trim_keeps_the_same_entries_as_mergekit_magnitude_sparsification(density):
    from mergekit.sparsify import SparsificationMethod, sparsify

    from mergekit_mergeability.methods.knowledge_weighted import trim

    g = torch.Generator().manual_seed(3)
    delta = torch.randn(64, 48, generator=g)
    delta[:, :10] = 0  # untouched entries, as a partial update has
    assert torch.equal(trim(delta, density), sparsify(delta, density=density, method=SparsificationMethod.magnitude))


@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_threshold_read_in_blocks_is_the_kth_largest_magnitude(density, dtype):
    """The radix select over row blocks against a full sort: the keep-th largest |value| (keep =
    max(1, ⌊density·n⌋)), on values with ties, zeros and both signs, split in uneven blocks."""
    from mergekit_mergeability.maths.merging import threshold, threshold_in_blocks

    g = torch.Generator().manual_seed(5)
    delta = (torch.randn(301, 17, generator=g) * 1e-3).to(dtype)
    delta[delta.abs() < 5e-4] = 0
    delta[7] = delta[3]  # tied values
    keep = max(1, int(density * delta.numel()))
    expected = delta.float().abs().reshape(-1).sort(descending=True).values[keep - 1].item()
    assert threshold(delta, density) == expected
    assert threshold_in_blocks(lambda: iter(delta.split(40)), density) == expected


@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("rescale", [None, "l1"])
def test_in_memory_trials_trim_as_mergekit_does(density, rescale):
    """The trials' selection replaces mergekit's sort only inside ``selected_magnitudes``, and gives
    its results, rescaled or not; outside the block mergekit's own function is back."""
    from mergekit import sparsify as mergekit_sparsify
    from mergekit.sparsify import RescaleNorm, SparsificationMethod, sparsify

    from mergekit_mergeability.rehearsal.inmemory import selected_magnitudes

    g = torch.Generator().manual_seed(4)
    delta = torch.randn(96, 40, generator=g)
    delta[:, :7] = 0
    norm = RescaleNorm(rescale) if rescale else None
    expected = sparsify(delta, density=density, method=SparsificationMethod.magnitude, rescale_norm=norm)
    original = mergekit_sparsify.magnitude
    with selected_magnitudes():
        assert mergekit_sparsify.magnitude is not original
        got = sparsify(delta, density=density, method=SparsificationMethod.magnitude, rescale_norm=norm)
    assert mergekit_sparsify.magnitude is original
    assert torch.allclose(got, expected, rtol=1e-6, atol=0) and torch.equal(got != 0, expected != 0)


def test_a_ties_merge_in_memory_equals_mergekits_own():
    from mergekit.merge_methods import merge_tensors

    from mergekit_mergeability.rehearsal.inmemory import selected_magnitudes

    g = torch.Generator().manual_seed(6)
    base = torch.randn(32, 24, generator=g)
    members = [base + 0.1 * torch.randn(32, 24, generator=g) for _ in range(3)]
    kwargs = dict(ids=["b", "x", "y", "z"], base_index=0, parameters={"weight": 1.0, "density": 0.4}, name="w")
    expected = merge_tensors([base, *members], "ties", **kwargs)
    with selected_magnitudes():
        got = merge_tensors([base, *members], "ties", **kwargs)
    assert torch.equal(got, expected)


def test_density_by_knowledge_trims_the_better_known_update_less():
    """density 0.5 raised by knowledge: k = 1 keeps all 4 entries, k = 0 keeps the top 2."""
    from mergekit_mergeability.methods.knowledge_weighted import known_density

    assert known_density(0.5, 0.0) == 0.5 and known_density(0.5, 1.0) == 1.0 and known_density(0.4, 0.5) == 0.7
    base = torch.zeros(4)
    known, unknown = torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([-1.0, 2.0, 0.0, 0.0])
    parameters = {"knowledge": [1.0, 0.0], "temperature": 1e9, "density": 0.5, "density_by_knowledge": True}
    merged = merge_tensors([base, known, unknown], "knowledge_weighted", base_index=0, parameters=parameters)
    # Entry 0: signs +4 vs −1 elect +, the disjoint mean keeps 4. Entry 1: 3 and 2 agree, mean 2.5.
    # Entries 2 and 3: only the untrimmed, fully known update has them.
    assert merged.tolist() == pytest.approx([4.0, 2.5, 2.0, 1.0])
    plain = merge_tensors(
        [base, known, unknown],
        "knowledge_weighted",
        base_index=0,
        parameters={**parameters, "density_by_knowledge": False},
    )
    assert plain.tolist() == pytest.approx([4.0, 2.5, 0.0, 0.0])  # both trimmed to their top 2
