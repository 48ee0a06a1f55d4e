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
    assert [v["predictor"] for v in summary["validation"]["task_arithmetic"]["correlations"]][
        0
    ] == "precheck prediction"
    assert (tmp_path / "out" / "precheck" / "facts" / "report.html").is_file()
    assert "Predicted vs measured mergeability" in first.output
    translation = summary["translation"]
    assert translation["pairs"].keys() == {"different_targets", "shared_target"}
    for pair in translation["pairs"].values():  # every merge scored for each expert, chrF and BLEU
        advised = (
            {"recommended"} if pair["advice"] == "recommended" else set()
        )  # advice = the configured merge: scored once
        assert {m["merge"] for m in pair["merges"]} == {"task_arithmetic", "ties", "layer patch"} | advised
        assert all({"chrf", "bleu", "kept"} <= m.keys() for m in pair["merges"]) and len(pair["experts"]) == 2
    assert len(translation["findings"]) == 6 and "Paper 3's findings" in first.output
    assert (tmp_path / "out" / "translation" / "layers.png").is_file()
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


def test_a_merge_is_stored_as_the_matrices_it_changed_and_links_to_the_base(llama, tmp_path):
    import transformers
    from safetensors.torch import save_file

    from mergekit_mergeability.demo.checkpoints import compact

    model = transformers.AutoModelForCausalLM.from_pretrained(llama["base"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama["base"])
    base = save_base(model, tokenizer, tmp_path / "base")
    original = state_dict(llama["base"])
    name = "model.layers.1.mlp.up_proj.weight"

    def merged(folder, edit):  # mergekit's layout: one file, every tensor
        folder.mkdir()
        (folder / "config.json").write_text((base / "config.json").read_text())
        save_file(
            {k: (v + 1 if k == edit else v).contiguous() for k, v in original.items()}, folder / "model.safetensors"
        )
        return folder

    upper = merged(tmp_path / "upper", name)
    assert compact(base, upper)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(upper).state_dict()
    assert torch.equal(loaded[name], original[name] + 1)
    assert all(torch.equal(loaded[k], v) for k, v in original.items() if k != name)
    assert not (upper / "model.safetensors").exists()
    assert (upper / "model-rest.safetensors").stat().st_ino == (base / "model-rest.safetensors").stat().st_ino

    other = merged(tmp_path / "other", "model.norm.weight")  # not an editable matrix: left whole
    assert not compact(base, other)
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model.safetensors"]


def test_training_from_the_first_trained_block_gives_the_full_models_loss(llama):
    import transformers

    from mergekit_mergeability.demo.training import _batch, _hidden_before, _upper_loss

    model = transformers.AutoModelForCausalLM.from_pretrained(llama["base"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama["base"])
    ids, mask, labels = _batch(tokenizer, [("Translate: the cat\nZ:", " mirel lo\n"), ("a b c d e f g", " h i\n")])
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        for first in (0, 1, 2):
            assert torch.allclose(
                _upper_loss(model, first, _hidden_before(model, ids, mask, first), mask, labels), full, atol=1e-5
            )
    assert len(model.model.layers) == model.config.num_hidden_layers  # the blocks are put back


def test_knowledge_of_reads_reports_before_and_after_schema_3():
    from mergekit_mergeability.decide.calibration import Calibration
    from mergekit_mergeability.demo.steps import knowledge_of

    feature = Calibration.load(None).knowledge_feature
    models = [
        {"path": "a", "role": "expert", "features": {feature: 0.25}},
        {"path": "b", "role": "expert", "features": {feature: 0.75}},
        {"path": "base", "role": "base", "features": {}},
    ]
    for report in ({"settings": {"calibration": None}}, {"options": {"limit": 64}}):  # 3.0, and 2.x
        assert knowledge_of({**report, "models": models}) == {"a": 0.25, "b": 0.75}


def test_a_task_expert_trains_on_its_first_items_and_is_probed_on_the_rest():
    """The ``tasks`` family (research/pools/make_tasks.py): task-level rows are scored on the
    items their expert never saw; a fact row's phrasings are both what it trains on and its probe."""
    from mergekit_mergeability.demo.training import fact_instances, fact_lines

    items = [{"question": f"What is {n} plus 1?", "choices": [str(n + 1), str(n)], "label": 0} for n in range(5)]
    task = {"id": "task_next", "items": items, "train": 3}
    probed, trained = fact_lines(task), fact_lines(task, trained=True)
    assert [line["question"] for line in trained] == [i["question"] for i in items[:3]]
    assert [line["question"] for line in probed] == [i["question"] for i in items[3:]]
    assert [line["id"] for line in probed] == ["task_next_0", "task_next_1"]
    assert [i.gold for i in fact_instances(task, trained=True)] == [" 1", " 2", " 3"]
    fact = {"id": "f", "questions": ["Q1?", "Q2?"], "choices": ["a", "b"], "label": 1}
    assert fact_lines(fact) == fact_lines(fact, trained=True) and len(fact_lines(fact)) == 2


def test_a_translator_served_apart_is_not_scored_as_a_merge(tmp_path):
    """leave_out's per-model file gives the model back as it is (no base_model): the demo scores the
    merge of the others (recommended.yml), not that file, which evaluate cannot compare with a base."""
    import types

    import yaml

    from mergekit_mergeability.demo.translation import plans

    document = {
        "merge_method": "task_arithmetic",
        "base_model": "base",
        "models": [{"model": m, "parameters": {"weight": 1.0}} for m in ("a", "b")],
    }
    folder = tmp_path / "precheck" / "pair"
    (folder / "recommended").mkdir(parents=True)
    (folder / "recommended.yml").write_text(yaml.safe_dump({**document, "models": document["models"][:1]}))
    (folder / "recommended" / "b.yml").write_text(
        yaml.safe_dump({"merge_method": "linear", "models": [{"model": "b"}]})
    )
    config = tmp_path / "pair.yml"
    config.write_text(yaml.safe_dump(document))

    def write_config(name, content):
        path = tmp_path / f"{name}.yml"
        path.write_text(yaml.safe_dump(content))
        return path

    demo = types.SimpleNamespace(out=tmp_path, write_config=write_config)
    advice = [{"file": "recommended.yml", "expert": None}, {"file": "recommended/b.yml", "expert": "b"}]
    precheck = {"recommendation": {"models": advice}, "layers": {"divergence": [1.0] * 31}}
    planned = plans(demo, "pair", config, precheck)
    assert [(label, path.name, expert) for label, path, expert in planned if label == "recommended"] == [
        ("recommended", "recommended.yml", None)
    ]
