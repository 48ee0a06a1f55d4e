"""A pool of LoRA adapters measured from its factors gives the numbers of the same pool materialised."""

import json
import shutil

import pytest
import yaml

from mergekit_mergeability.sources import resolve
from mergekit_mergeability.diagnostics import weights
from mergekit_mergeability import merge_config
from mergekit_mergeability.api import precheck
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.sources.adapter import materialise
from mergekit_mergeability.tiny import make_adapter

LAYERS = (
    "model.layers.{}.mlp.up_proj.weight",
    "model.layers.{}.self_attn.q_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight",
)


def _targets(layers, kinds):
    return [LAYERS[k].format(layer) for layer in layers for k in kinds]


@pytest.fixture(scope="module")
def pools(llama, tmp_path_factory):
    """Adapters of different ranks and modules, overlapping in layer 1 (d: a scaled by −½), and
    their materialised folders."""
    root = tmp_path_factory.mktemp("lora_pool")
    a = _targets([0, 1], [0, 1])
    specs = {
        "a": (a, 4, 8, 1),
        "b": (_targets([1, 2], [0, 2]), 2, 4, 2),
        "c": (_targets([1], [0, 1, 2]), 8, 16, 3),
        "d": (a, 4, -4, 1),
    }
    adapters, full = {}, {}
    for name, (targets, rank, alpha, seed) in specs.items():
        adapters[name] = make_adapter(
            llama["base"], root / "adapters" / name, targets, rank=rank, alpha=alpha, seed=seed
        )
        full[name] = materialise(resolve(str(adapters[name])), root / "full" / name)
    return root, adapters, full


def _precheck(llama, root, members, label):
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [{"model": str(p), "parameters": {"weight": 0.5}} for p in members],
        "dtype": "float32",
    }
    path = root / f"{label}.yml"
    path.write_text(yaml.safe_dump(document))
    precheck(merge_config.read(path), settings=PrecheckSettings(quiet=True), out=root / label)
    return json.loads((root / label / "precheck.json").read_text())


def _numbers(value, where=""):
    """Every number of a report, by where it sits."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def test_adapter_pool_report_equals_the_materialised_pool(llama, pools, monkeypatch):
    """To 1e-5 relative; near 0 to 1e-7 absolute, the float32 rounding of the materialised
    folders' θ − θ_base (the factors' numbers are exact)."""
    root, adapters, full = pools
    with monkeypatch.context() as patch:  # measured from the factors: no model weight is streamed
        patch.setattr(weights, "TensorReader", None)
        native = _precheck(llama, root, adapters.values(), "native")
    materialised = _precheck(llama, root, full.values(), "materialised")
    ours = {k.replace(str(root / "adapters"), ""): v for k, v in _numbers(native)}
    theirs = {k.replace(str(root / "full"), ""): v for k, v in _numbers(materialised)}
    assert ours.keys() == theirs.keys()
    timing = [k for k in ours if "second" in k or "time" in k]
    compared = [k for k in ours if k not in timing]
    assert any("top_singular_value" in k for k in compared) and any("sign_conflict" in k for k in compared)
    for key in compared:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    assert native["recommendation"]["verdict"] == materialised["recommendation"]["verdict"]
    pair = native["diagnostics"]["weights"]["per_pair"][f"{adapters['a']}|{adapters['d']}"]
    assert pair["cosine"] == pytest.approx(-1) and pair["sign_conflict"] == pytest.approx(1)


def test_recommended_config_names_each_adapter_on_its_base(llama, pools):
    root, adapters, _ = pools
    _precheck(llama, root, [adapters[k] for k in "abc"], "recommended")  # without d, which cancels a
    recommended = yaml.safe_load((root / "recommended" / "recommended.yml").read_text())
    experts = [
        m["model"] for m in merge_config.model_entries(recommended) if m["model"] != recommended.get("base_model")
    ]
    assert experts and set(experts) <= {f"{llama['base'].resolve()}+{adapters[k].resolve()}" for k in "abc"}


def test_precheck_of_a_pool_folder(llama, pools, tmp_path):
    from click.testing import CliRunner

    from mergekit_mergeability.cli import main

    root, adapters, _ = pools
    pool = tmp_path / "pool"
    for name in "abc":
        shutil.copytree(adapters[name], pool / name)
    (pool / "notes").mkdir()  # a folder that is not an adapter is not a member
    result = CliRunner().invoke(main, ["precheck", "--pool", str(pool), "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert [m["path"] for m in report["models"] if m["role"] == "expert"] == [str(pool.resolve() / n) for n in "abc"]
    assert report["merge_method"] == "task_arithmetic"
    # no probe, no prediction: nothing said of a prediction's domain either
    assert all(m["out_of_domain"] is None for m in report["models"] if m["predicted_mergeability"] is None)
    assert not [f for f in report["findings"] if f["diagnostic"] == "calibration"]
    # --probes DIR gives each member its DIR/<member>.jsonl, where there is one (as plan's --pool does)
    probes = tmp_path / "probes"
    probes.mkdir()
    line = json.dumps({"question": "Which is first?", "choices": ["one", "two"], "label": 0}) + "\n"
    for name in "ab":
        (probes / f"{name}.jsonl").write_text(line * 2)
    out = tmp_path / "probed"
    skipped = [arg for d in ("representations", "selectivity", "fluency") for arg in ("--skip", d)]
    result = CliRunner().invoke(
        main, ["precheck", "--pool", str(pool), "--probes", str(probes), "--out", str(out), "--quiet", *skipped]
    )
    assert result.exit_code == 0, result.output
    given = {m["path"]: m["probe"] for m in json.loads((out / "precheck.json").read_text())["models"]}
    assert (
        given[str(pool.resolve() / "a")] == str((probes / "a.jsonl").resolve())
        and given[str(pool.resolve() / "c")] is None
    )
    config = tmp_path / "config.yml"
    config.write_text("merge_method: task_arithmetic\n")
    result = CliRunner().invoke(main, ["precheck", str(config), "--probes", str(probes), "--dry-run"])
    assert result.exit_code == 2 and "--base and --probes go with --pool" in result.output


def test_a_pool_folder_of_adapters_on_different_bases_is_refused(llama, pools, tmp_path):
    from click.testing import CliRunner

    from mergekit_mergeability.cli import main

    pool = tmp_path / "mixed"
    make_adapter(llama["base"], pool / "one", LAYERS[0].format(0).split())
    make_adapter(llama["base"], pool / "two", LAYERS[0].format(0).split(), base_name=llama["expert0"])
    (tmp_path / "empty").mkdir()
    for folder, expected in (
        (pool, f"--pool {pool}: its adapters name 2 bases"),
        (tmp_path / "empty", "no adapter or model folders in it"),
    ):
        result = CliRunner().invoke(
            main, ["precheck", "--pool", str(folder), "--out", str(tmp_path / "out"), "--quiet"]
        )
        assert result.exit_code == 2 and expected in result.output and len(result.output.strip().splitlines()) == 1, (
            result.output
        )
    # --base does not let an adapter of another base in; --probes with no file named after a member is
    # refused; a member's broken probe is named by the member, not by a config field the user never wrote
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "ONE.jsonl").write_text("{}\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "one.jsonl").write_text("{not json\n")
    for extra, expected in (
        (["--base", str(llama["base"])], f"adapter two was trained on {llama['expert0']}, not --base"),
        (["--probes", str(tmp_path / "probes")], "no file is named after a member (<member>.jsonl"),
        (["--probes", str(tmp_path / "broken"), "--dry-run"], f"--pool member one.probe: {tmp_path / 'broken'}"),
        (["--dry-run"], "a model or adapter folder itself; name the folder that holds the pool's members"),
    ):
        folder = pool if "--base" in extra else pool / "one" if extra == ["--dry-run"] else pool.parent / "one_base"
        if not folder.exists():
            shutil.copytree(pool / "one", folder / "one")
        result = CliRunner().invoke(
            main, ["precheck", "--pool", str(folder), *extra, "--out", str(tmp_path / "out"), "--quiet"]
        )
        assert result.exit_code == 2 and expected in result.output and len(result.output.strip().splitlines()) == 1, (
            result.output
        )
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(main, ["precheck", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "name a config file or a --pool folder" in result.output


def test_an_adapter_among_model_folders_is_streamed_as_base_plus_update(llama, pools):
    root, adapters, full = pools
    mixed = _precheck(llama, root, [adapters["a"], full["b"], adapters["c"]], "mixed")
    materialised = _precheck(llama, root, [full["a"], full["b"], full["c"]], "materialised_abc")
    ours = {
        k.replace(str(root / "adapters"), "").replace(str(root / "full"), ""): v
        for k, v in _numbers(mixed["diagnostics"]["weights"])
    }
    theirs = {k.replace(str(root / "full"), ""): v for k, v in _numbers(materialised["diagnostics"]["weights"])}
    assert ours.keys() == theirs.keys() and any("cosine" in k for k in ours)
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key


def test_probe_option_names_an_adapter_by_its_folder(llama, pools):
    from mergekit_mergeability.measuring import probe_specs

    root, adapters, _ = pools
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [{"model": f"{llama['base']}+{adapters[n]}"} for n in "ab"],
    }
    spec = merge_config.from_document(document, root)
    assert probe_specs(spec, {"b": "probe.jsonl"}) == {f"{llama['base']}+{adapters['b']}": "probe.jsonl"}


def test_a_pool_folders_probe_files_named_after_no_member_are_said(llama, tmp_path, capsys):
    pool, probes = tmp_path / "pool", tmp_path / "probes"
    for name in ("ad0", "ad1"):
        make_adapter(llama["base"], pool / name, LAYERS[0].format(0).split())
    probes.mkdir()
    for name in ("ad0.jsonl", "AD1.jsonl", "ad1.json"):
        (probes / name).write_text("{}\n")
    spec = merge_config.from_pool(pool, probes=probes)
    assert spec.probes == {str((pool / "ad0").resolve()): str((probes / "ad0.jsonl").resolve())}
    said = " ".join(capsys.readouterr().err.split())  # one line, however the terminal wraps it
    assert f"--probes {probes}: AD1.jsonl, ad1.json named after no member (members: ad0, ad1): not read" in said


def test_the_lines_under_the_table_say_where_a_pool_member_lives_and_how_it_gets_a_probe():
    from mergekit_mergeability.output.terminal import no_prediction

    experts = [{"name": "ad0"}, {"name": "ad3"}]
    from mergekit_mergeability.output.terminal import legend

    written = [{"name": "one", "path": "/b/base+/p/mixed/one"}, {"name": "ad0", "path": "/p/adapters/ad0"}]
    assert legend(written) == {"/p/mixed (on /b/base)": ["one"], "/p/adapters": ["ad0"]}
    assert no_prediction(experts[1:], experts, pool=True) == (
        "No prediction for ad3: no probe; for one, --probes DIR with DIR/ad3.jsonl (or .yaml, .yml), or --probe ad3=SPEC"
    )
    assert "next to its model: in the config" in no_prediction(experts[1:], experts)
