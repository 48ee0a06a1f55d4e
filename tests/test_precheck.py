"""precheck end to end on tiny real models: files, schema, verdicts, bad input, plugins, the gate."""

import contextlib
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
from mergekit_mergeability.decide.calibration import Calibration
from mergekit_mergeability.output.precheck_report import SCHEMA
from mergekit_mergeability.tiny import CORPUS, derive

from conftest import noise, precheck_cli, ranked_probes

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
    models = [
        {"model": str(pool[e]), **({"probe": str(pool[p])} if p else {}), "parameters": {"weight": 1.0}}
        for e, p in zip(experts, probes)
    ]
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(
            {"merge_method": method, "base_model": str(pool["base"]), "models": models, "dtype": "float32"},
            sort_keys=False,
        )
    )
    return path


@contextlib.contextmanager
def _registered(**plugins):
    """These plugins in the process's plugin manager, by name, for the block's duration."""
    manager = plugin_manager()
    for name, plugin in plugins.items():
        manager.register(plugin, name=name)
    try:
        yield
    finally:
        for name in plugins:
            manager.unregister(name=name)


def _merge(config_path, out):
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    run_merge(
        MergeConfiguration.model_validate(yaml.safe_load(Path(config_path).read_text())),
        str(out),
        MergeOptions(quiet=True, write_model_card=False),
    )
    return out


@pytest.fixture
def ungated(monkeypatch):
    """The knowledge_weighted advice without its gate against TIES: these tests are of what the
    advice holds; whether it beats TIES on two tiny experts is the rehearsal's (or the plan's
    prediction's) to say (tests/test_formats.py, test_dilution.py and test_plan.py test the gate)."""
    from mergekit_mergeability import decide
    from mergekit_mergeability.planner import deciding

    monkeypatch.setattr(deciding, "knowledge_weighted_against_ties", lambda report, calibration: None)
    monkeypatch.setattr(decide, "_against_ties", lambda experts, predicted: (None, None))


def test_weakly_known_probes_lead_to_knowledge_weighting(tmp_path, pool, ungated):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = precheck_cli(
        config, tmp_path / "out", "--skip", "menu"
    )  # the knowledge_weighted branch, as a pool takes it
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    experts = {m["path"]: m for m in report["models"] if m["role"] == "expert"}
    known, unknown = experts[str(pool["known"])], experts[str(pool["unknown"])]
    assert known["knowledge"]["scored_accuracy"] == 1 and known["knowledge"]["scored_mean_gap"] == 0
    assert unknown["knowledge"]["scored_accuracy"] == 0 and unknown["knowledge"]["scored_mean_gap"] > 0
    assert known["knowledge"]["scored_mean_p_gold"] > unknown["knowledge"]["scored_mean_p_gold"]
    assert len(known["knowledge"]["per_instance"]) == len(QUESTIONS) and known["knowledge"]["fewshot"] == 3
    assert known["predicted_mergeability"] > unknown["predicted_mergeability"]
    rec = report["recommendation"]
    assert rec["verdict"] == "knowledge_weighted"
    feature = Calibration.load().knowledge_feature
    assert rec["knowledge"] == {
        str(pool["known"]): known["features"][feature],
        str(pool["unknown"]): unknown["features"][feature],
    }
    assert rec["weights"][str(pool["unknown"])] > rec["weights"][str(pool["known"])]
    # pairs: base–known, base–unknown, known–unknown; CKA at the embedding output and after each of 4 blocks
    assert {(p["a"], p["b"]) for p in report["pairs"]} >= {(str(pool["known"]), str(pool["unknown"]))}
    compared = [p for p in report["pairs"] if "cka" in p]
    assert len(compared) == 3 and all(len(p["cka"]) == 5 and len(p["cka_unbiased"]) == 5 for p in compared)
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["merge_method"] == "knowledge_weighted"
    assert {m["parameters"]["knowledge"] for m in recommended["models"]} == {
        round(v, 4) for v in rec["knowledge"].values()
    }
    assert (_merge(tmp_path / "out" / "recommended.yml", tmp_path / "merged") / "config.json").exists()
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and "knowledge_weighted" in html
    assert yaml.safe_load(config.read_text())["merge_method"] == "task_arithmetic"  # input untouched


def test_knowledge_weighted_advice_keeps_the_configured_update_size(tmp_path, pool, ungated):
    """Item 2: task_arithmetic with weight 1.0 each adds both whole updates; the advice must too."""
    from mergekit.merge_methods import merge_tensors

    from mergekit_mergeability.tiny import state_dict

    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    assert precheck_cli(config, tmp_path / "out", "--skip", "menu").exit_code == 0  # as a pool
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["parameters"]["scale"] == 2.0
    merged = state_dict(_merge(tmp_path / "out" / "recommended.yml", tmp_path / "merged"))
    base, known, unknown = (state_dict(pool[k]) for k in ("base", "known", "unknown"))
    name = "model.layers.1.mlp.up_proj.weight"
    unit = merge_tensors(
        [base[name], known[name], unknown[name]],
        "knowledge_weighted",
        base_index=0,
        parameters={
            **recommended["parameters"],
            "scale": 1.0,
            "knowledge": [m["parameters"]["knowledge"] for m in recommended["models"]],
        },
    )
    assert torch.allclose(
        merged[name] - base[name], 2.0 * (unit - base[name]), atol=1e-6
    )  # twice the shares' update, as configured
    assert "scale 2 keeps the configured update size" in (tmp_path / "out" / "recommended.yml").read_text()


def test_divergent_upper_layers_get_one_model_per_expert_that_keeps_its_own_upper_blocks(tmp_path, pool):
    """Item 1: paper 3's layer patch for every expert; no recommended model is the base. The menu
    skipped, the patch is not weighed against a merge (the next test weighs it)."""
    from mergekit_mergeability.tiny import state_dict

    config = _config(tmp_path, pool, ["upper_a", "upper_b"], ["probe_known", "probe_unknown"])
    result = precheck_cli(config, tmp_path / "out", "--skip", "menu")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    pair = next(p for p in report["pairs"] if {p["a"], p["b"]} == {str(pool["upper_a"]), str(pool["upper_b"])})
    assert min(pair["cka_unbiased"][:3]) > 0.8 > max(pair["cka_unbiased"][3:])  # blocks 0–1 untouched, 2–3 randomised
    rec = report["recommendation"]
    assert (rec["verdict"], rec["cutoff"]) == ("layer_selective", 2)
    # item 4: the verdict reads the unbiased estimator (the biased one drifts with the number of probe rows)
    assert report["layers"]["cka_estimator"] == "unbiased" and report["layers"]["divergence"] == pair["cka_unbiased"]
    assert [m["file"] for m in rec["models"]] == [
        "recommended.yml",
        "recommended/upper_a.yml",
        "recommended/upper_b.yml",
    ]
    base = state_dict(pool["base"])
    for expert in ("upper_a", "upper_b"):
        merged = state_dict(_merge(tmp_path / "out" / "recommended" / f"{expert}.yml", tmp_path / f"merged_{expert}"))
        own = state_dict(pool[expert])
        upper = [n for n in merged if ".layers.2." in n or ".layers.3." in n or n.startswith(("lm_head", "model.norm"))]
        assert merged.keys() == own.keys() and len(upper) > 2
        for name in upper:
            assert torch.equal(merged[name], own[name]), name  # its own upper blocks, norm and head
        assert not all(torch.equal(t, base[n]) for n, t in merged.items())
    main = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    chosen = next(m["model"] for m in main["models"] if (m.get("parameters") or {}).get("upper"))
    experts = sorted((m for m in report["models"] if m["role"] == "expert"), key=lambda m: m["predicted_mergeability"])
    assert (
        len(experts) == 2
        and chosen == experts[0]["path"]
        and "predicted to lose most" in " ".join(rec["models"][0]["notes"])
    )
    assert rec["models"][0]["drops"] == f"blocks ≥ 2 of {experts[1]['name']}"  # the other expert's upper blocks


def test_a_rehearsed_layer_patch_reads_each_expert_on_the_patch_mergekit_writes_for_it(tmp_path, pool):
    """Where the menu is rehearsed, the layer patch is one of its candidates: each expert's probe read
    on its own patched model, which is the model mergekit-yaml writes from recommended/<expert>.yml
    (merged on disk here and read again). The choice between it and the merges sets the verdict."""
    from mergekit_mergeability import tasks
    from mergekit_mergeability.diagnostics.knowledge import as_read
    from mergekit_mergeability.sources import load_causal_lm

    config = _config(tmp_path, pool, ["upper_a", "upper_b"], ["probe_known", "probe_unknown"])
    result = precheck_cli(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    rec = json.loads((tmp_path / "out" / "precheck.json").read_text())["recommendation"]
    patch = next(c for c in rec["search"] if c["name"] == "layer patch")
    assert (patch["method"], patch["cutoff"]) == ("layer_selective", 2)
    choice = rec["method_choice"]
    assert (rec["verdict"] == "layer_selective") == (choice["chosen"] == "layer patch")
    assert "the layer patch at block 2" in " ".join(rec["reasons"])
    for expert, probe in (("upper_a", "probe_known"), ("upper_b", "probe_unknown")):
        patched = tmp_path / "patched" / expert
        written = yaml.safe_load(config.read_text())
        written.update(merge_method="layer_selective", parameters={"cutoff": 2, "inner": "task_arithmetic"})
        for entry in written["models"]:
            entry.pop("probe")
            entry["parameters"]["upper"] = entry["model"] == str(pool[expert])
        (tmp_path / f"{expert}.yml").write_text(yaml.safe_dump(written))
        module, tokenizer = load_causal_lm(_merge(tmp_path / f"{expert}.yml", patched), "cpu", "float32")
        read = as_read(module, tokenizer, tasks.load(str(pool[probe])))
        assert choice["per_model"]["layer patch"][str(pool[expert])] == pytest.approx(sum(read) / len(read), abs=1e-5)


def test_incompatible_models_stop_from_headers_alone(tmp_path, pool, families):
    config = _config(tmp_path, {**pool, "qwen": families["qwen2"]["expert0"]}, ["known", "qwen"], ["probe_known", None])
    result = precheck_cli(config, tmp_path / "out")
    assert result.exit_code == 1
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["recommendation"]["verdict"] == "do_not_merge"
    assert "architectures" in " ".join(report["recommendation"]["reasons"])
    assert report["skipped_diagnostics"] == [
        "weights",
        "knowledge",
        "fluency",
        "dilution",
        "representations",
        "selectivity",
    ]
    assert report["stop"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--probe", "known=missing.jsonl"], "probe missing.jsonl: no such file"),
        (["--probe", "nobody=x.jsonl"], "'nobody' matches 0 models of the config; name one of: known, unknown"),
        (["--layers", "3-x"], "not a layer or a range"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, pool, extra, message):
    config = _config(tmp_path, pool, ["known", "unknown"], [None, None])
    result = precheck_cli(config, tmp_path / "out", *extra)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_missing_model_folder_is_named(tmp_path, pool):
    config = _config(tmp_path, {**pool, "gone": tmp_path / "gone"}, ["known", "gone"], [None, None])
    result = precheck_cli(config, tmp_path / "out")
    assert result.exit_code == 2 and f"model {tmp_path / 'gone'}: no such folder" in result.output


def _without_architectures(source: Path, folder: Path) -> Path:
    """A copy whose config.json has no ``architectures``: transformers loads it by ``model_type``."""
    import shutil

    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_models_without_architectures_are_measured_and_the_recommendation_names_their_class(tmp_path, pool):
    plain = {name: _without_architectures(pool[name], tmp_path / name) for name in ("base", "known", "unknown")}
    config = _config(tmp_path, {**pool, **plain}, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = CliRunner().invoke(
        main,
        ["precheck", str(config), "--out", str(tmp_path / "out"), "--quiet", "--skip", "selectivity"],
        env={"COLUMNS": "1000"},
    )
    assert result.exit_code == 0, result.output
    assert 'unknown: its config.json has no "architectures" list; measured as LlamaForCausalLM' in result.output
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["base_model"] == {"model": str(plain["base"]), "override_architecture": "LlamaForCausalLM"}
    assert [m["model"]["override_architecture"] for m in recommended["models"]] == ["LlamaForCausalLM"] * 2
    merged = CliRunner().invoke(main, ["merge", str(tmp_path / "out" / "recommended.yml"), str(tmp_path / "merged")])
    assert merged.exit_code == 0, merged.output  # the stock mergekit takes it as written
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_adapters_on_a_base_without_architectures_are_written_with_their_base_s_class(tmp_path, pool):
    """mergekit reads a model+adapter's architecture from the base's config.json: where it names none,
    the plan and the recommendation name the class (mapping form, ``lora:`` apart), not a TypeError."""
    from mergekit_mergeability.tiny import make_adapter

    base = _without_architectures(pool["base"], tmp_path / "base")
    targets = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(4)]
    adapters = [
        make_adapter(base, tmp_path / f"a{i}", targets, rank=2, seed=i, scale=0.3, base_name=str(base))
        for i in range(2)
    ]
    models = [
        {"model": f"{base}+{a}", "probe": str(pool["probe_known"]), "parameters": {"weight": 1.0}} for a in adapters
    ]
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    result = CliRunner().invoke(
        main,
        ["precheck", str(config), "--out", str(tmp_path / "out"), "--quiet", "--skip", "selectivity", "--skip", "menu"],
    )
    assert result.exit_code == 0, result.output
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert [m["model"] for m in recommended["models"]] == [
        {"model": str(base), "lora": str(a), "override_architecture": "LlamaForCausalLM"} for a in adapters
    ]
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    run_merge(  # the stock mergekit takes it as written (mergekit-yaml --lora-merge-cache)
        MergeConfiguration.model_validate(recommended),
        str(tmp_path / "merged"),
        MergeOptions(lora_merge_cache=str(tmp_path / "lora")),
    )
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


class _Plugin:
    """A third-party plugin: one diagnostic and a gate on the finished report."""

    class Diagnostic:
        name = "mean_weight"
        needs = frozenset()

        def run(self, inputs):
            from mergekit_mergeability.diagnostics import DiagnosticResult

            # the settings arrive typed: a plugin reads the fields it knows
            return DiagnosticResult(
                per_model={m.name: {"answer": 42.0, "limit": float(inputs.settings.limit)} for m in inputs.models}
            )

    @hookimpl
    def mergeability_diagnostics(self):
        return [self.Diagnostic()]

    @hookimpl
    def mergeability_precheck_report(self, report, config_path):
        return (
            f"policy: {report['recommendation']['verdict']} needs a review"
            if config_path.endswith("config.yml")
            else None
        )


def test_third_party_diagnostics_and_report_hooks(tmp_path, pool):
    with _registered(third_party=_Plugin()):
        assert "mean_weight" in [d.name for _, d in contributions("mergeability_diagnostics")]
        result = precheck_cli(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    assert result.exit_code == 1 and "policy: merge_as_configured needs a review" in result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["diagnostics"]["mean_weight"]["per_model"][str(pool["known"])] == {"answer": 42.0, "limit": 64.0}
    assert report["stop"] == ["policy: merge_as_configured needs a review"]


class _Shadow:
    """A third-party diagnostic that takes a built-in one's name."""

    name = "weights"
    needs = frozenset()

    def run(self, inputs):
        raise AssertionError("a refused diagnostic ran")

    @hookimpl
    def mergeability_diagnostics(self):
        return [self]


def test_a_diagnostic_name_two_plugins_contribute_is_refused_before_any_work(tmp_path, pool):
    with _registered(shadow=_Shadow()):
        result = precheck_cli(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "Error: two plugins contribute a diagnostic named 'weights': 'shadow' (test_precheck) and "
        "'builtin' (mergekit-mergeability); uninstall one of them"
    )
    assert not (tmp_path / "out").exists()


class _CrashingGate:
    @hookimpl
    def mergeability_precheck_report(self, report, config_path):
        raise KeyError("verdicts")


def test_a_report_hook_that_raises_is_a_warning_and_the_precheck_goes_on(tmp_path, pool):
    with _registered(crashing_gate=_CrashingGate(), third_party=_Plugin()):  # the other plugins still answer
        result = precheck_cli(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    message = "plugin 'crashing_gate' failed in mergeability_precheck_report and is skipped: KeyError: 'verdicts'"
    assert result.exit_code == 1, result.output  # the third party's reason to stop, not the crash
    assert message in " ".join(result.output.split())
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert {"diagnostic": "mergeability_precheck_report", "severity": "warning", "message": message} in report[
        "findings"
    ]
    assert report["stop"] == ["policy: merge_as_configured needs a review"]
    assert message in (tmp_path / "out" / "report.html").read_text().replace("&#x27;", "'")


def test_the_opt_in_gate_stops_stock_mergekit_yaml(tmp_path, pool):
    broken = derive(
        pool["base"],
        tmp_path / "broken",
        lambda k, v: torch.full_like(v, float("inf")) if "layers.0.mlp" in k else 0 * v,
    )
    config = _config(tmp_path, {**pool, "broken": broken}, ["known", "broken"], [None, None])
    command = [
        str(Path(sys.executable).with_name("mergekit-yaml")),
        str(config),
        str(tmp_path / "merged"),
        "--no-write-model-card",
    ]
    gated = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "MERGEKIT_MERGEABILITY_PRECHECK": "1"}
    )
    assert gated.returncode == 2
    assert "Traceback" not in gated.stderr
    (line,) = [line for line in gated.stderr.splitlines() if line.startswith("Error: ")]
    assert "MERGEKIT_MERGEABILITY_PRECHECK is set and the precheck says stop" in line
    assert "NaN/Inf" in gated.stderr + gated.stdout
    assert not (tmp_path / "merged").exists()
    plain = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "MERGEKIT_MERGEABILITY_PRECHECK"},
    )
    assert plain.returncode == 0, plain.stderr[-2000:]


def test_layers_option_limits_the_compared_layers(tmp_path, pool):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = precheck_cli(config, tmp_path / "out", "--layers", "0-2", "--limit", "4")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    compared = [p for p in report["pairs"] if "cka" in p]
    assert len(compared) == 3
    for pair in compared:
        assert all(v is not None for v in pair["cka"][:3]) and pair["cka"][3:] == [None, None]
    assert {m["knowledge"]["instances"] for m in report["models"] if m["knowledge"]} == {4}


def _opposite(seed, scale, factor):
    """``factor`` times the update ``_noise(seed, scale)`` adds: −1 undoes it exactly."""
    update = _noise(seed, scale)
    return lambda name, tensor: factor * update(name, tensor)


def test_a_cancelling_pair_is_do_not_merge_and_leaves_nothing_runnable(tmp_path, pool):
    """Items 3 and 6: ft1 = 2·base − ft0 merges back to the base."""
    undo = derive(pool["base"], tmp_path / "undo", _opposite(1, 0.01, -1.0))
    config = _config(tmp_path, {**pool, "undo": undo}, ["known", "undo"], ["probe_known", "probe_unknown"])
    stale = tmp_path / "out"
    (stale / "recommended").mkdir(parents=True)
    (stale / "recommended.yml").write_text("merge_method: linear\n")
    (stale / "recommended" / "old.yml").write_text("merge_method: linear\n")
    result = precheck_cli(config, stale)
    assert result.exit_code == 1, result.output
    report = json.loads((stale / "precheck.json").read_text())
    rec = report["recommendation"]
    assert rec["verdict"] == "do_not_merge" and rec["models"] == []
    assert "known and undo cancel each other (task-vector cosine -1.00)" in rec["reasons"][0]
    experts = [m for m in report["models"] if m["role"] == "expert"]
    assert len(experts) == 2 and all(
        m["predicted_mergeability"] < 0.5 and m["kept_share"] == pytest.approx(0, abs=1e-3) for m in experts
    )
    assert not (stale / "recommended.yml").exists() and not (stale / "recommended").exists()
    assert "cancel each other" in (stale / "report.html").read_text()


def test_partial_conflict_recommends_sign_election_at_the_configured_size(tmp_path, pool):
    """Item 3: updates at cosine ≈ −0.45 pull against each other: TIES at the configured update size."""
    pull, other = _opposite(1, 0.01, -0.5), _noise(9, 0.01)
    against = derive(pool["base"], tmp_path / "against", lambda n, t: pull(n, t) + other(n, t))
    config = _config(tmp_path, {**pool, "against": against}, ["known", "against"], [None, None])
    result = precheck_cli(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    pair = next(p for p in report["pairs"] if "cosine" in p)
    assert -0.9 < pair["cosine"] < -0.3
    rec = report["recommendation"]
    assert (rec["verdict"], rec["method"]) == ("sign_election", "ties")
    recommended = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert recommended["merge_method"] == "ties" and recommended["parameters"]["normalize"] is True
    assert recommended["parameters"]["lambda"] == rec["configured_update"]["total"] == 2.0  # two models at weight 1
    assert (_merge(tmp_path / "out" / "recommended.yml", tmp_path / "merged") / "config.json").exists()


def test_thresholds_of_interference_are_known_answers():
    from mergekit_mergeability.decide.verdict import interference, kept_shares

    cosines = {("a", "b"): -1.0, ("a", "c"): -0.5, ("b", "c"): 0.1}
    assert interference(cosines) == ([("a", "b")], [("a", "c")])
    kept = kept_shares({"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 2.0}, {("a", "b"): -1.0})
    assert kept == {"a": pytest.approx(0.0), "b": pytest.approx(0.0)}
    kept = kept_shares({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, {("a", "b"): -0.5})
    assert kept["a"] == pytest.approx(0.5)


class _BrokenBuiltin:
    """Stands in for a broken install: the built-in plugin's diagnostics hook raises."""

    @hookimpl
    def mergeability_diagnostics(self):
        raise ImportError("No module named 'scipy'")


def test_the_precheck_fails_closed_when_the_builtin_signals_cannot_be_measured(tmp_path, pool, monkeypatch):
    """Item 5: exit 3, one line, nothing runnable, instead of an unjudged merge_as_configured."""
    manager = plugin_manager()
    builtin = manager.unregister(name="builtin")
    manager.register(_BrokenBuiltin(), name="builtin")
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "recommended.yml").write_text("stale")
        result = precheck_cli(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    finally:
        manager.unregister(name="builtin")
        manager.register(builtin, name="builtin")
    assert result.exit_code == 3, result.output
    assert (
        "the precheck could not measure: plugin 'builtin' failed in mergeability_diagnostics: ImportError"
        in result.output
    )
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "recommended.yml").exists()


def test_a_crash_inside_a_builtin_diagnostic_is_exit_3_and_stops_the_gate(tmp_path, pool, monkeypatch):
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    from mergekit_mergeability.diagnostics.weights import WeightStatistics

    def crash(self, inputs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(WeightStatistics, "run", crash)
    config = _config(tmp_path, pool, ["known", "unknown"], [None, None])
    result = precheck_cli(config, tmp_path / "out")
    assert (
        result.exit_code == 3
        and "diagnostic 'weights' from plugin 'builtin' failed: RuntimeError: out of memory" in result.output
    )
    monkeypatch.setenv("MERGEKIT_MERGEABILITY_PRECHECK", "1")
    with pytest.raises(Exception, match="could not measure"):
        run_merge(
            MergeConfiguration.model_validate(yaml.safe_load(config.read_text())),
            str(tmp_path / "merged"),
            MergeOptions(quiet=True, write_model_card=False),
        )
    assert not (tmp_path / "merged").exists()


def test_a_third_party_diagnostic_failure_is_a_listed_warning(tmp_path, pool):
    class Flaky:
        name = "flaky"
        needs = frozenset()

        def run(self, inputs):
            raise ValueError("bad luck")

    class Plugin:
        @hookimpl
        def mergeability_diagnostics(self):
            return [Flaky()]

    with _registered(flaky_plugin=Plugin()):
        result = precheck_cli(_config(tmp_path, pool, ["known", "unknown"], [None, None]), tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "diagnostic 'flaky' from plugin 'flaky_plugin' failed: ValueError: bad luck" in " ".join(
        result.output.split()
    )
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["failed_diagnostics"] == ["flaky"]
    assert "bad luck" in (tmp_path / "out" / "report.html").read_text()


def test_models_with_the_same_folder_name_stay_apart_at_80_columns(tmp_path, pool):
    """Item 11: short unique names in the terminal and the page, full paths once."""
    import shutil

    for parent in ("team_a", "team_b"):
        shutil.copytree(pool["known"] if parent == "team_a" else pool["unknown"], tmp_path / parent / "expert")
    twins = {**pool, "a": tmp_path / "team_a" / "expert", "b": tmp_path / "team_b" / "expert"}
    config = _config(tmp_path, twins, ["a", "b"], ["probe_known", "probe_unknown"])
    result = CliRunner().invoke(
        main,
        ["precheck", str(config), "--out", str(tmp_path / "out"), "--quiet", "--skip", "representations"],
        env={"COLUMNS": "80"},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    assert any("team_a/expert" in line for line in lines) and any("team_b/expert" in line for line in lines)
    # the legend names both folders under their parent, which at 80 columns wraps (mid-path, too)
    assert f"in{tmp_path}:team_a/expert,team_b/expert" in "".join(result.output.split())
    html = (tmp_path / "out" / "report.html").read_text()
    assert f'title="{tmp_path / "team_a" / "expert"}">team_a/expert<' in html
    assert "table.sortable" in html and "Recommended models" in html


def test_the_table_gives_each_model_one_line_at_80_columns_and_verbose_the_reasons_whole(tmp_path, pool):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    arguments = ["precheck", str(config), "--out", str(tmp_path / "out"), "--quiet", "--skip", "representations"]
    result = CliRunner().invoke(main, [*arguments, "--verbose"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert max(map(len, result.output.splitlines())) <= 80
    assert len(rows) == len([m for m in report["models"] if m["role"] == "expert"])  # a line each
    for model in (m for m in report["models"] if m["role"] == "expert"):
        assert sum(line.startswith(f"│ {model['name']} ") for line in rows) == 1
        assert " ".join(f"{model['name']}: {'; '.join(model['reasons'])}".split()) in " ".join(result.output.split())


@pytest.mark.parametrize(
    "value, report_to",
    [
        ("1", None),
        ("true", None),
        ("TRUE", None),
        ("Yes", None),
        ("./reports", "reports"),
        ("true-reports", "true-reports"),
        ("0", "off"),
        ("False", "off"),
        ("no", "off"),
        ("", "off"),
    ],
)
def test_the_gate_setting_reads_a_switch_or_a_folder(tmp_path, pool, monkeypatch, value, report_to):
    from mergekit.config import MergeConfiguration

    from types import SimpleNamespace

    from mergekit_mergeability import api, gate

    runs = []
    nothing = SimpleNamespace(stop=[], to_json=dict)
    monkeypatch.setattr(api, "precheck", lambda spec, settings, out: runs.append(out) or nothing)
    monkeypatch.setattr("mergekit_mergeability.output.terminal.print_precheck", lambda report, out, verbose=False: None)
    monkeypatch.setenv(gate.ENVIRONMENT, value)
    config = _config(tmp_path, pool, ["known", "unknown"], [None, None])
    gate.check(MergeConfiguration.model_validate(yaml.safe_load(config.read_text())))
    assert runs == ([] if report_to == "off" else [None if report_to is None else Path(report_to)])


def test_layers_beyond_the_model_are_named_in_a_warning(tmp_path, pool):
    config = _config(tmp_path, pool, ["upper_a", "upper_b"], ["probe_known", "probe_unknown"])
    result = precheck_cli(config, tmp_path / "out", "--layers", "0-2,7-9", "--skip", "selectivity")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    (warning,) = [f["message"] for f in report["findings"] if f["message"].startswith("--layers")]
    assert "7, 8, 9 beyond these models' layers 0–4" in warning
    pair = next(p for p in report["pairs"] if p["cka_unbiased"])
    assert [v is not None for v in pair["cka_unbiased"]] == [True, True, True, False, False]


def test_a_rerun_with_cache_dir_reads_each_models_passes_back(tmp_path, pool, monkeypatch):
    """Issue 14: a killed precheck restarts where it stopped; no model's pass runs twice."""
    from mergekit_mergeability.diagnostics import representations, selectivity

    config = _config(tmp_path, pool, ["upper_a", "upper_b"], ["probe_known", "probe_unknown"])
    first = precheck_cli(config, tmp_path / "first", "--cache-dir", tmp_path / "kept")
    assert first.exit_code == 0, first.output
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "kept").iterdir())
    assert kept == ["representations"] * 3 + ["selectivity"] * 3  # base and both experts, each pass

    def never(*args, **kwargs):
        raise AssertionError("a model pass ran again")

    monkeypatch.setattr(representations, "hidden_means", never)
    monkeypatch.setattr(selectivity, "activation_probabilities", never)
    again = precheck_cli(config, tmp_path / "again", "--cache-dir", tmp_path / "kept")
    assert again.exit_code == 0, again.output
    strip = lambda r: {k: v for k, v in r.items() if k not in ("timings", "options", "created")}  # noqa: E731
    reports = [json.loads((tmp_path / d / "precheck.json").read_text()) for d in ("first", "again")]
    assert strip(reports[0]) == strip(reports[1])


def test_a_dry_run_says_the_passes_and_roughly_how_long_and_writes_nothing(tmp_path, pool):
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    result = CliRunner().invoke(  # a fresh cache: the pace is timed, and that announced, first
        main,
        ["precheck", str(config), "--out", str(tmp_path / "out"), "--dry-run"],
        env={"COLUMNS": "1000", "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert result.exit_code == 0, result.output
    assert "timing a forward pass of this shape once" in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("precheck: about"))
    assert line.startswith("precheck: about ") and " forward passes (knowledge " in line, line
    assert "dilution" in line and "menu" in line and (" s on cpu" in line or " min on cpu" in line), line
    assert not (tmp_path / "out").exists()
    narrow = CliRunner().invoke(  # on a narrow terminal: wrapped, nothing lost
        main,
        ["precheck", str(config), "--dry-run"],
        env={"COLUMNS": "60", "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert max(map(len, narrow.output.splitlines())) <= 60
    joined = " ".join(narrow.output.split())
    assert "forward passes (knowledge" in joined and "dry run: nothing written and no weights read" in joined, joined
    assert "every tensor of a whole model is counted as changed" in joined  # the building time: an upper bound
    unprobed = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", None], name="unprobed.yml")
    said = CliRunner().invoke(
        main,
        ["precheck", str(unprobed), "--dry-run"],
        env={"COLUMNS": "1000", "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert "  menu: not rehearsed, unknown without a probe" in said.output, said.output
    (tmp_path / "afile").write_text("mine")  # an --out the real run would refuse: refused by the dry run too
    refused = CliRunner().invoke(main, ["precheck", str(config), "--dry-run", "--out", str(tmp_path / "afile" / "x")])
    assert refused.exit_code == 2 and "afile is a file, so the folder cannot be made" in refused.output


def test_the_cost_line_counts_the_passes_the_progress_bars_then_count(tmp_path, pool, monkeypatch):
    from mergekit_mergeability import api, measuring, progress
    from mergekit_mergeability.settings import PrecheckSettings

    totals = {}
    real = progress.task

    @contextlib.contextmanager
    def recording(description, total, quiet=False):
        diagnostic = description.split(":")[0]
        totals[diagnostic] = totals.get(diagnostic, 0) + total
        with real(description, total, True) as advance:
            yield advance

    for module in ("knowledge", "dilution", "fluency", "representations", "selectivity"):
        monkeypatch.setattr(f"mergekit_mergeability.diagnostics.{module}.task", recording)
    monkeypatch.setattr(progress, "task", recording)  # menu imports it when it runs
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    measured = measuring.measure(api._spec(config), {}, PrecheckSettings(quiet=True, skip=("selectivity",)))
    counted = measured.cost.passes
    assert {k: counted[k] for k in ("knowledge", "dilution", "representations")} == {
        k: totals[k] for k in ("knowledge", "dilution", "representations")
    }
    assert counted["fluency"] % totals["fluency"] == 0 < counted["fluency"]  # (models + 2) passes of whole windows
    assert totals["menu"] <= counted["menu"] <= 5 * totals["menu"] // 2  # the menu may hold fewer candidates
    assert "selectivity" not in counted and "weights" in counted and counted["weights"] == 0


def _bars(monkeypatch, *modules) -> list:
    """Each progress bar these modules open, as (its total, what the pass then advanced)."""
    from mergekit_mergeability import progress

    bars, real = [], progress.task

    @contextlib.contextmanager
    def recording(description, total, quiet=False):
        done = [0]
        with real(description, total, True) as advance:
            yield lambda n=1: (done.__setitem__(0, done[0] + n), advance(n))
        bars.append((total, done[0]))

    for module in modules:
        monkeypatch.setattr(module, "task", recording)
    return bars


def test_the_bars_end_at_their_totals_for_probes_asked_with_their_options_listed(tmp_path, pool, monkeypatch):
    """Each bar's total is what the pass then advances: for a probe scored with its options listed,
    its letters count too (a 10-expert pool once showed 2,396 of 1,917 for the knowledge, a 24-expert
    one 2,688 of 1,344 for the dilution)."""
    from mergekit_mergeability import api, measuring, progress
    from mergekit_mergeability.diagnostics import dilution, knowledge
    from mergekit_mergeability.settings import PrecheckSettings

    lines = [json.loads(line) for line in Path(pool["probe_known"]).read_text().splitlines()]
    probe = tmp_path / "options.jsonl"
    probe.write_text("".join(json.dumps({**r, "format": "options", "shots": 1}) + "\n" for r in lines))
    bars = _bars(monkeypatch, knowledge, dilution, progress)  # progress: menu imports it when it runs
    config = _config(tmp_path, {**pool, "options": probe}, ["known", "unknown"], ["options", "options"])
    skip = ("fluency", "representations", "selectivity")
    measuring.measure(api._spec(config), {}, PrecheckSettings(quiet=True, skip=skip, tune_budget=0))
    assert len(bars) == 3 and all(total == done > 0 for total, done in bars), bars


def test_skipping_the_lettered_view_leaves_the_scored_view_and_asks_less(tmp_path, pool, monkeypatch):
    """``--skip lettered`` (what plan asks when its calibration reads the scored view): the base's
    scores as each task scores its probe are those of a full pass, the paper's view is absent, and
    the cost line and the bar count only what is asked."""
    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.diagnostics import knowledge
    from mergekit_mergeability.settings import PrecheckSettings

    bars = _bars(monkeypatch, knowledge)
    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    skip = ("dilution", "fluency", "representations", "selectivity", "menu")
    runs = {
        extra: measuring.measure(api._spec(config), {}, PrecheckSettings(quiet=True, skip=skip + extra))
        for extra in ((), ("lettered",))
    }
    full, lean = (runs[extra].results["knowledge"] for extra in runs)
    for name, stats in lean.per_model.items():
        assert {k: v for k, v in stats.items() if k.startswith("scored_")} == {
            k: v for k, v in full.per_model[name].items() if k.startswith("scored_")
        }
        assert (
            stats.get("mean_p_gold") is stats.get("fewshot") is None and full.per_model[name]["mean_p_gold"] is not None
        )
        assert [set(row) for row in lean.per_instance[name]] == [{"scored_p_gold", "scored_correct"}] * len(
            full.per_instance[name]
        )
    passes = [runs[extra].cost.passes["knowledge"] for extra in runs]
    assert 0 < passes[1] < passes[0] and bars == [(passes[0], passes[0]), (passes[1], passes[1])]
    with pytest.raises(Exception, match="the parts menu, lettered"):
        measuring.measure(api._spec(config), {}, PrecheckSettings(quiet=True, skip=("letters",)))


@pytest.fixture
def reads(monkeypatch):
    """The tensors read through safetensors while it is in use (names); loading a model fails."""
    import safetensors
    import transformers

    read, opened = [], safetensors.safe_open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.handle = opened(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __getattr__(self, name):
            if name in ("get_tensor", "get_slice"):
                read.append(name)
            return getattr(self.handle, name)

    def never(*args, **kwargs):
        raise AssertionError("a dry run loaded a model")

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    return read


def test_a_dry_run_reads_no_tensor_data_and_loads_no_model(tmp_path, pool, reads):
    """Issue 52: the cost line comes from headers, config.json and the probes' tokens, so that at 7B
    ``--dry-run`` reads none of the 14-28 GB it will then read."""
    from mergekit_mergeability import api

    config = _config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"])
    cost = api.precheck_cost(config)
    assert reads == [] and cost.total > 0 and cost.estimate, (reads[:3], cost.line())
    assert cost.building["menu"] > 0  # its merges timed on random inputs of the headers' shapes


def test_a_dry_run_of_a_7b_shape_config_reads_no_tensor_data(tmp_path, reads, monkeypatch):
    """Three 7B-shape fine-tunes and their base (headers only, their data sparse zeros): the dry
    run's count and time come without a byte of tensor data read."""
    import transformers

    from mergekit_mergeability import api, cost
    from mergekit_mergeability.tiny import shaped

    seven = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000
    )
    folders = {name: shaped(tmp_path / name, seven) for name in ("base", "a", "b", "c")}
    flat = {kind: [0.01] * len(cost.TIMED) for kind in cost.KINDS}
    monkeypatch.setattr(cost, "_timed", lambda *args: cost.Pace(flat, flat))  # not timing 7B here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    probe = tmp_path / "probe.jsonl"
    probe.write_text(json.dumps({"question": "2 + 2 =", "choices": ["4", "5"], "label": 0}) + "\n")
    models = [{"model": str(folders[n]), "probe": str(probe), "parameters": {"weight": 1.0}} for n in "abc"]
    config = tmp_path / "seven.yml"
    config.write_text(
        yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(folders["base"]), "models": models})
    )
    counted = api.precheck_cost(config)
    assert reads == [] and counted.total > 0 and counted.estimate > 0, (reads[:3], counted.line())
    assert "menu" in counted.passes  # the merge as written is planned from the headers


def test_a_base_whose_block_cannot_be_timed_still_gets_its_passes_counted(tmp_path, pool, monkeypatch):
    from mergekit_mergeability import api, cost

    def cannot(*args):
        raise ValueError("no such model type")

    monkeypatch.setattr(cost, "_timed", cannot)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    counted = api.precheck_cost(_config(tmp_path, pool, ["known", "unknown"], ["probe_known", "probe_unknown"]))
    assert counted.total > 0 and counted.estimate is None
    assert "no time estimated: a block of llama could not be timed (ValueError)" in counted.line()
