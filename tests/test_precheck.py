"""precheck end to end on tiny real models: files, schema, verdicts, bad input, plugins, the gate."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main
from mergekit_mergeability.plugins import contributions, hookimpl, plugin_manager
from mergekit_mergeability.precheck.report import SCHEMA
from mergekit_mergeability.tiny import CORPUS, derive

from conftest import noise, ranked_probes

QUESTIONS = [f"{sentence} Question {i}?" for i in range(3) for sentence in CORPUS]
CHOICES = ["Paris", "water", "fox", "dog"]


def _noise(seed, scale, layers=None):
    return noise(seed, scale, lambda name: layers is None or any(f".layers.{i}." in name for i in layers))


def _probes(path, base, pick):
    return ranked_probes(path, base, QUESTIONS, CHOICES, pick)


@pytest.fixture(scope="module")
def pool(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    base = llama["base"]
    return {
        "base": base,
        "known": derive(base, root / "known", _noise(1, 0.01)),
        "unknown": derive(base, root / "unknown", _noise(2, 0.01)),
        "upper_a": derive(base, root / "upper_a", _noise(3, 0.3, layers=(2, 3))),
        "upper_b": derive(base, root / "upper_b", _noise(4, 0.3, layers=(2, 3))),
        "probe_known": _probes(root / "known.jsonl", base, pick=0),
        "probe_unknown": _probes(root / "unknown.jsonl", base, pick=3),
    }


def _config(tmp_path, pool, experts, probes, method="task_arithmetic", name="config.yml"):
    models = [{"model": str(pool[e]), **({"probe": str(pool[p])} if p else {}), "parameters": {"weight": 1.0}} for e, p in zip(experts, probes)]
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"merge_method": method, "base_model": str(pool["base"]), "models": models, "dtype": "float32"}, sort_keys=False))
    return path


def _precheck(config, out, *extra):
    return CliRunner().invoke(main, ["precheck", str(config), "--out", str(out), "--quiet", *extra])


def _merge(config_path, out):
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    run_merge(MergeConfiguration.model_validate(yaml.safe_load(Path(config_path).read_text())), str(out), MergeOptions(quiet=True, write_model_card=False))
    return out


def test_weakly_known_probes_lead_to_knowledge_weighting(tmp_path, pool):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = _precheck(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    experts = {m["path"]: m for m in report["models"] if m["role"] == "expert"}
    known, unknown = experts[str(pool["known"])], experts[str(pool["unknown"])]
    assert known["knowledge"]["accuracy"] == 1 and known["knowledge"]["mean_gap"] == 0
    assert unknown["knowledge"]["accuracy"] == 0 and unknown["knowledge"]["mean_gap"] > 0
    assert known["predicted_mergeability"] > unknown["predicted_mergeability"]
    rec = report["recommendation"]
    assert rec["verdict"] == "knowledge_weighted"
    assert rec["knowledge"] == {str(pool["known"]): 1.0, str(pool["unknown"]): 0.0}
    assert rec["weights"][str(pool["unknown"])] > 0.99  # softmax((1 − k)/0.1)
    # pairs: base–known, base–unknown, known–unknown; CKA at the embedding output and after each of 4 blocks
    assert {(p["a"], p["b"]) for p in report["pairs"]} >= {(str(pool["known"]), str(pool["unknown"]))}
    assert all(len(p["cka"]) == 5 and len(p["cka_unbiased"]) == 5 for p in report["pairs"] if "cka" in p)
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["merge_method"] == "knowledge_weighted"
    assert {m["parameters"]["knowledge"] for m in recommended["models"]} == {1.0, 0.0}
    assert (_merge(tmp_path / "out" / "recommended.yml", tmp_path / "merged") / "config.json").exists()
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "knowledge_weighted" in html
    assert yaml.safe_load(config.read_text())["merge_method"] == "task_arithmetic"  # input untouched


def test_divergent_upper_layers_lead_to_a_layer_selective_cutoff(tmp_path, pool):
    config = _config(tmp_path, pool, ["upper_a", "upper_b"], ["probe_known", "probe_unknown"])
    result = _precheck(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    pair = next(p for p in report["pairs"] if {p["a"], p["b"]} == {str(pool["upper_a"]), str(pool["upper_b"])})
    assert min(pair["cka"][:3]) > 0.9 > max(pair["cka"][3:])  # blocks 0–1 untouched, 2–3 randomised
    rec = report["recommendation"]
    assert (rec["verdict"], rec["cutoff"]) == ("layer_selective", 2)
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["parameters"] == {"cutoff": 2, "inner": "task_arithmetic"}
    assert (_merge(tmp_path / "out" / "recommended.yml", tmp_path / "merged") / "config.json").exists()


def test_incompatible_models_stop_from_headers_alone(tmp_path, pool, families):
    config = _config(tmp_path, {**pool, "qwen": families["qwen2"]["expert0"]}, ["known", "qwen"], ["probe_known", None])
    result = _precheck(config, tmp_path / "out")
    assert result.exit_code == 1
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["recommendation"]["verdict"] == "do_not_merge"
    assert "architectures" in " ".join(report["recommendation"]["reasons"])
    assert report["skipped_diagnostics"] == ["weights", "knowledge", "representations"]
    assert report["stop"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--probe", "known=missing.jsonl"], "probe missing.jsonl: no such file"),
        (["--probe", "nobody=x.jsonl"], "'nobody' matches 0 models"),
        (["--layers", "3-x"], "not a layer or a range"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, pool, extra, message):
    config = _config(tmp_path, pool, ["known", "unknown"], [None, None])
    result = _precheck(config, tmp_path / "out", *extra)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_missing_model_folder_is_named(tmp_path, pool):
    config = _config(tmp_path, {**pool, "gone": tmp_path / "gone"}, ["known", "gone"], [None, None])
    result = _precheck(config, tmp_path / "out")
    assert result.exit_code == 2 and f"model {tmp_path / 'gone'}: no such folder" in result.output


class _Plugin:
    """A third-party plugin: one diagnostic and a gate on the finished report."""

    class Diagnostic:
        name = "mean_weight"
        needs = frozenset()

        def run(self, inputs):
            from mergekit_mergeability.diagnostics import DiagnosticResult

            return DiagnosticResult(per_model={m.name: {"answer": 42.0} for m in inputs.models})

    @hookimpl
    def mergeability_diagnostics(self):
        return [self.Diagnostic()]

    @hookimpl
    def mergeability_precheck_report(self, report, config_path):
        return f"policy: {report['recommendation']['verdict']} needs a review" if config_path.endswith("config.yml") else None


def test_third_party_diagnostics_and_report_hooks(tmp_path, pool):
    manager = plugin_manager()
    manager.register(_Plugin(), name="third_party")
    try:
        assert "mean_weight" in [d.name for _, d in contributions("mergeability_diagnostics")]
        result = _precheck(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    finally:
        manager.unregister(name="third_party")
    assert result.exit_code == 1 and "policy: merge_as_configured needs a review" in result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["diagnostics"]["mean_weight"]["per_model"][str(pool["known"])] == {"answer": 42.0}
    assert report["stop"] == ["policy: merge_as_configured needs a review"]


def test_the_opt_in_gate_stops_stock_mergekit_yaml(tmp_path, pool):
    broken = derive(pool["base"], tmp_path / "broken", lambda k, v: torch.full_like(v, float("inf")) if "layers.0.mlp" in k else 0 * v)
    config = _config(tmp_path, {**pool, "broken": broken}, ["known", "broken"], [None, None])
    command = [str(Path(sys.executable).with_name("mergekit-yaml")), str(config), str(tmp_path / "merged"), "--no-write-model-card"]
    gated = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "MERGEKIT_MERGEABILITY_PRECHECK": "1"})
    assert gated.returncode != 0
    assert "MERGEKIT_MERGEABILITY_PRECHECK is set and the precheck says stop" in gated.stderr + gated.stdout
    assert "NaN/Inf" in gated.stderr + gated.stdout
    assert not (tmp_path / "merged").exists()
    plain = subprocess.run(command, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "MERGEKIT_MERGEABILITY_PRECHECK"})
    assert plain.returncode == 0, plain.stderr[-2000:]


def test_layers_option_limits_the_compared_layers(tmp_path, pool):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = _precheck(config, tmp_path / "out", "--layers", "0-2", "--limit", "4")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    for pair in (p for p in report["pairs"] if "cka" in p):
        assert all(v is not None for v in pair["cka"][:3]) and pair["cka"][3:] == [None, None]
    assert {m["knowledge"]["instances"] for m in report["models"] if m["knowledge"]} == {4}


@pytest.mark.parametrize(
    "value, report_to",
    [("1", None), ("true", None), ("TRUE", None), ("Yes", None), ("./reports", "reports"), ("true-reports", "true-reports"), ("0", "off"), ("False", "off"), ("no", "off"), ("", "off")],
)
def test_the_gate_setting_reads_a_switch_or_a_folder(tmp_path, pool, monkeypatch, value, report_to):
    from mergekit.config import MergeConfiguration

    import mergekit_mergeability.precheck as precheck
    from mergekit_mergeability.precheck import gate

    runs = []
    monkeypatch.setattr(precheck, "run", lambda spec, options, out: runs.append(out) or {"stop": []})
    monkeypatch.setattr("mergekit_mergeability.summary.print_precheck", lambda report, out: None)
    monkeypatch.setenv(gate.ENVIRONMENT, value)
    config = _config(tmp_path, pool, ["known", "unknown"], [None, None])
    gate.check(MergeConfiguration.model_validate(yaml.safe_load(config.read_text())))
    assert runs == ([] if report_to == "off" else [None if report_to is None else Path(report_to)])
