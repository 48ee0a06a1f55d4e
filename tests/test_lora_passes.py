"""Adapters through the passes that run the model: the base is loaded once and each adapter
patched in, and every number equals that of the same pool materialised as folders."""

import json

import pytest
import yaml
from click.testing import CliRunner

from mergekit_mergeability.sources import resolve
from mergekit_mergeability.cli import main
from mergekit_mergeability.diagnostics import representations
from mergekit_mergeability.sources.adapter import materialise
from mergekit_mergeability.tiny import make_adapter

from conftest import ranked_probes

TARGETS = [f"model.layers.{i}.mlp.{m}.weight" for i in range(4) for m in ("up_proj", "down_proj")]
QUESTIONS = [f"Item {i}: which one?" for i in range(6)]
CHOICES = ["Paris", "water", "fox", "dog"]


@pytest.fixture(scope="module")
def pools(llama, tmp_path_factory):
    """Three strong adapters, their materialised folders, and per adapter a probe its folder
    answers with its own favourites (so the expert scores 1 on its task)."""
    root = tmp_path_factory.mktemp("lora_passes")
    pool = {"adapters": {}, "full": {}, "probes": {}}
    for i in range(3):
        adapter = make_adapter(
            llama["base"], root / "adapters" / f"a{i}", TARGETS, rank=4, alpha=8, seed=20 + i, scale=0.4
        )
        full = materialise(resolve(str(adapter)), root / "full" / f"a{i}")
        pool["adapters"][i], pool["full"][i] = adapter, full
        pool["probes"][i] = ranked_probes(root / f"probe{i}.jsonl", full, QUESTIONS, CHOICES, pick=0)
    for kind in ("adapters", "full"):
        document = {
            "merge_method": "task_arithmetic",
            "base_model": str(llama["base"]),
            "models": [{"model": str(pool[kind][i]), "probe": str(pool["probes"][i])} for i in range(3)],
            "parameters": {"weight": 0.5},
            "dtype": "float32",
        }
        (root / f"{kind}.yml").write_text(yaml.safe_dump(document, sort_keys=False))
    pool["root"] = root
    return pool


def _run(*arguments):
    result = CliRunner().invoke(main, [*map(str, arguments), "--quiet"])
    assert result.exit_code in (0, 1), result.output
    return result


def _same(ours, theirs, rel=1e-5, abs=1e-6, where=""):
    """Equal leaf by leaf: floats to the tolerance, every other leaf (int, str, bool, None) exactly."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            _same(ours[key], theirs[key], rel, abs, f"{where}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, rel, abs, f"{where}[{i}]")
    elif isinstance(ours, float) and isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=rel, abs=abs, nan_ok=True), where
    else:
        assert type(ours) is type(theirs) and ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def test_same_compares_every_leaf():
    ours = {"a": [1, "x", None, True, 0.1]}
    _same(ours, {"a": [1, "x", None, True, 0.1 + 1e-9]})
    for leaf, other in ((0, 2), (1, "y"), (2, 0), (3, 1), (4, 0.2), (0, 1.0)):
        theirs = {"a": [*ours["a"][:leaf], other, *ours["a"][leaf + 1 :]]}
        with pytest.raises(AssertionError):
            _same(ours, theirs)


def _by_position(report: dict, pool: dict, kind: str) -> dict:
    """The report with each pool member's path replaced by its position (the only expected difference)."""
    text = json.dumps(report)
    for i, path in pool[kind].items():
        text = text.replace(str(resolve(str(path))), f"#{i}").replace(str(path), f"#{i}")
    return json.loads(text.replace(str(pool["root"] / kind), "#"))


def test_precheck_with_probes_equals_the_materialised_pool_and_loads_the_base_once(pools, monkeypatch):
    loads = []
    original = representations.load_causal_lm
    monkeypatch.setattr(
        representations, "load_causal_lm", lambda source, *a: loads.append(source) or original(source, *a)
    )
    reports = {}
    for kind in ("adapters", "full"):
        _run("precheck", pools["root"] / f"{kind}.yml", "--out", pools["root"] / f"pre_{kind}")
        report = json.loads((pools["root"] / f"pre_{kind}" / "precheck.json").read_text())
        reports[kind] = _by_position(
            {k: report[k] for k in ("models", "pairs", "layers", "diagnostics", "recommendation")}, pools, kind
        )
    assert len(loads) == 1 + 1 + 3  # adapters: the base, once; folders: the base and each model
    assert reports["adapters"]["diagnostics"]["representations"]["per_layer"]
    _same(reports["adapters"], reports["full"])


def test_evaluate_and_mergeability_score_adapters_as_their_folders(pools, tmp_path):
    merged = pools["full"][0]  # any model folder stands for the merge
    results = {}
    for kind in ("adapters", "full"):
        config = pools["root"] / f"{kind}.yml"
        _run("evaluate", config, "--merged", merged, "--out", tmp_path / f"eval_{kind}", "--no-cache")
        _run("mergeability", config, "--partners", "1", "--trials", "1", "--out", tmp_path / f"mg_{kind}", "--no-cache")
        evaluation = json.loads((tmp_path / f"eval_{kind}" / "evaluation.json").read_text())
        measured = json.loads((tmp_path / f"mg_{kind}" / "mergeability.json").read_text())
        results[kind] = _by_position({"tasks": evaluation["tasks"], "models": measured["models"]}, pools, kind)
    assert [row["expert"] for row in results["adapters"]["tasks"]] == [1.0, 1.0, 1.0]  # the adapter was applied
    assert [row["expert_score"] for row in results["adapters"]["models"]] == [1.0, 1.0, 1.0]
    _same(results["adapters"], results["full"])


def test_the_gate_prechecks_adapters_and_stock_mergekit_yaml_merges_them(llama, pools, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": f"{llama['base']}+{pools['adapters'][i]}", "parameters": {"weight": 0.5}} for i in range(2)
        ],
        "dtype": "float32",
    }
    config = tmp_path / "gated.yml"
    config.write_text(yaml.safe_dump(document))
    command = [
        str(Path(sys.executable).with_name("mergekit-yaml")),
        str(config),
        str(tmp_path / "merged"),
        "--no-write-model-card",
        "--lora-merge-cache",
        str(tmp_path / "lora_cache"),
    ]
    gated = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "MERGEKIT_MERGEABILITY_PRECHECK": str(tmp_path / "report")},
    )
    assert gated.returncode == 0, (gated.stderr + gated.stdout)[-2000:]
    report = json.loads((tmp_path / "report" / "precheck.json").read_text())
    assert report["diagnostics"]["weights"]["per_model"][document["models"][0]["model"]]["update_norm"] > 0
    assert (tmp_path / "merged" / "config.json").is_file()
