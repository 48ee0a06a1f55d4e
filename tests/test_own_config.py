"""examples/own-config on tiny local models (its tiny.py): a config with the three kinds of probe (a
JSONL probe, an lm-eval task YAML, fine-tuning data) runs through the CLI, each probe read as its
kind is scored, and the fine-tuning data's prediction is its per-token p(gold) on the merge as
written (its rows' turns through the model's chat template), equal to the same read of the merge
mergekit-yaml writes."""

import importlib.util
import json
from pathlib import Path
from statistics import fmean

import pytest

from conftest import REPO, precheck_cli

EXAMPLE = REPO / "examples" / "own-config"


def _tiny():
    spec = importlib.util.spec_from_file_location("own_config_tiny", EXAMPLE / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_names_hub_ids_and_three_kinds_of_probe():
    import yaml

    document = yaml.safe_load((EXAMPLE / "config.yml").read_text())
    probes = [m["probe"] for m in document["models"]]
    assert all("/" in m["model"] and not Path(m["model"]).exists() for m in document["models"])  # hub ids
    assert [Path(p).suffix for p in probes] == [".jsonl", ".yaml", ".jsonl"]
    assert set(_tiny().HUB) == {document["base_model"], *(m["model"] for m in document["models"])}


def test_the_tiny_variant_runs_through_the_cli(tmp_path):
    import transformers

    from mergekit_mergeability import tasks
    from mergekit_mergeability.diagnostics.knowledge import scores
    from mergekit_mergeability.sources import load_causal_lm

    config = _tiny().tiny_config(tmp_path / "own")
    result = precheck_cli(config, tmp_path / "out", "--limit", "4")
    assert result.exit_code in (0, 1), result.output  # merge, or do_not_merge: tiny random models
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    experts = {Path(m["path"]).name: m for m in report["models"] if m["role"] == "expert"}
    formats = {name: m["knowledge"]["scored_format"] for name, m in experts.items()}
    assert formats == {"expert0": "cloze", "expert1": "lm-eval", "expert2": "generation"}
    sft = experts["expert2"]
    assert sft["dilution"]["rehearsed"] == "written" and sft["dilution"]["partnered_items"] == 4
    assert sft["predicted_mergeability"] == sft["dilution"]["partnered_mean_p_gold"]  # the rehearsal reads p(gold)

    merged = _merge(config, tmp_path / "merged")
    model, _ = load_causal_lm(merged)
    tokenizer = transformers.AutoTokenizer.from_pretrained(config.parent / "models" / "expert2")
    asked = tasks.chatted("probes/chat.jsonl", [], tokenizer, config.parent, 4)  # chat: true, as its entry says
    assert asked[0].prompt.startswith("<|system|>\nYou are a helpful assistant.</s>\n<|user|>\n")
    read = fmean(s.p_gold for s in scores(model, tokenizer, asked, lambda n: None))
    assert read == pytest.approx(sft["dilution"]["partnered_mean_p_gold"], rel=1e-4)


def _merge(config: Path, out: Path) -> Path:
    """The config as mergekit-yaml merges it (the probe: keys ignored)."""
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    run_merge(
        MergeConfiguration.model_validate(yaml.safe_load(config.read_text())),
        str(out),
        MergeOptions(quiet=True, write_model_card=False),
    )
    return out
