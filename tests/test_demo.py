"""The demo's quick mode end to end, and the pieces it is built from."""

import json

import torch
from click.testing import CliRunner

from mergekit_mergeability.cli import main
from mergekit_mergeability.demo.checkpoints import save_base, save_expert
from mergekit_mergeability.tiny import state_dict


def test_demo_quick_runs_end_to_end_and_reruns_from_the_cache(tmp_path):
    args = ["demo", "--quick", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--quiet"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["experts"]) == 6
    assert {"task_arithmetic", "ties", "knowledge_weighted"} <= summary["experts"][0].keys()
    assert [v["predictor"] for v in summary["validation"]["task_arithmetic"]["correlations"]][0] == "precheck prediction"
    assert (tmp_path / "out" / "precheck" / "facts" / "report.html").is_file()
    assert "Predicted vs measured mergeability" in first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary  # seeded and cached: same numbers


def test_experts_are_ordinary_folders_sharing_the_bases_unchanged_shards(llama, tmp_path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(llama["base"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama["base"])
    base = save_base(model, tokenizer, tmp_path / "base")
    name = "model.layers.1.mlp.up_proj.weight"
    changed = state_dict(llama["base"])[name] + 1
    expert = save_expert(base, {name: changed}, tmp_path / "expert")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(expert).state_dict()
    assert torch.equal(loaded[name], changed)
    original = state_dict(llama["base"])
    assert all(torch.equal(loaded[k], v) for k, v in original.items() if k != name)
    assert (expert / "model-rest.safetensors").stat().st_ino == (base / "model-rest.safetensors").stat().st_ino
