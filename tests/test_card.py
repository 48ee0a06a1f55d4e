"""Probes from a model card (``tasks.card``): a local folder's README.md front matter, read offline,
proposes the lm-eval tasks it names; the precheck prints the probe lines, and asks them with
``--probes-from-card``."""

import shutil

import pytest
import yaml

from mergekit_mergeability.tasks import card

LEADERBOARD = """---
license: apache-2.0
datasets:
  - HuggingFaceH4/ultrachat_200k
  - openai/gsm8k
model-index:
  - name: my-model
    results:
      - task: {type: text-generation, name: Text Generation}
        dataset: {name: AI2 Reasoning Challenge (25-Shot), type: ai2_arc, config: ARC-Challenge, split: test}
        metrics: [{type: acc_norm, value: 60.1, name: normalized accuracy}]
      - task: {type: text-generation}
        dataset: {name: TruthfulQA (0-shot), type: truthful_qa, config: multiple_choice, split: validation}
        metrics: [{type: mc2, value: 50.2}]
      - task: {type: text-generation}
        dataset: {name: HellaSwag (10-Shot), type: hellaswag, split: validation}
        metrics: [{type: acc_norm, value: 80.0}]
---
# my-model

Fine-tuned on chat data.
"""


def _card(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(text)
    return folder


def test_front_matter_names_results_then_datasets(tmp_path):
    meta = card.front_matter(_card(tmp_path / "m", LEADERBOARD) / "README.md")
    assert card.references(meta) == [
        card.Reference("ai2_arc", "ARC-Challenge", "acc_norm"),
        card.Reference("truthful_qa", "multiple_choice", "mc2"),
        card.Reference("hellaswag", None, "acc_norm"),
        card.Reference("HuggingFaceH4/ultrachat_200k"),
        card.Reference("openai/gsm8k"),
    ]


@pytest.mark.parametrize(
    "text",
    ["# no front matter\n", "---\ndatasets: [unclosed\n---\n", "---\nlicense: mit\n", "---\n- a list\n---\n"],
)
def test_a_card_without_readable_front_matter_proposes_nothing(tmp_path, text):
    assert card.proposed(_card(tmp_path / "m", text)) == []
    assert card.proposed(tmp_path / "no card") == []


def test_a_leaderboard_card_proposes_the_lm_eval_tasks_it_was_scored_on(tmp_path):
    """Offline: lm-eval's index of its own tasks, nothing downloaded. ultrachat is no lm-eval task."""
    assert card.proposed(_card(tmp_path / "m", LEADERBOARD)) == [
        "arc_challenge",
        "truthfulqa_mc2",
        "hellaswag",
        "gsm8k",
    ]


def test_a_dataset_whose_tasks_span_several_configs_is_not_guessed():
    assert card.task_for(card.Reference("allenai/ai2_arc")) is None  # arc_easy or arc_challenge: the card must say
    assert card.task_for(card.Reference("allenai/ai2_arc", "ARC-Easy")) == "arc_easy"
    assert card.task_for(card.Reference("cais/mmlu")) == "mmlu"  # the group named as the dataset


def _flat(text):
    """Printed text without its whitespace: the terminal wraps long lines."""
    return "".join(text.split())


def _config(tmp_path, family, with_cards):
    experts = [family["expert0"], family["expert1"]]
    if with_cards:
        copies = []
        for i, expert in enumerate(experts):
            copy = shutil.copytree(expert, tmp_path / f"carded{i}")
            _card(copy, "---\nmodel-index:\n  - results:\n      - dataset: {type: demo_arithmetic}\n---\n")
            copies.append(copy)
        experts = copies
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(family["base"]),
        "models": [{"model": str(e), "parameters": {"weight": 0.5}} for e in experts],
        "dtype": "float32",
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(document))
    return path, experts


def test_the_precheck_prints_card_probes_and_asks_them_with_the_flag(tmp_path, llama, capsys):
    """A card naming a shipped task (it loads offline): proposed without the flag, asked with it."""
    from mergekit_mergeability.measuring import measure
    from mergekit_mergeability.merge_config import read
    from mergekit_mergeability.settings import PrecheckSettings

    path, experts = _config(tmp_path, llama, with_cards=True)
    spec = read(path)
    proposed = measure(spec, {}, PrecheckSettings(limit=4, device="cpu"), dry_run=True)
    printed = capsys.readouterr().err
    for expert in experts:
        assert _flat(f"{expert}: its model card names lm-eval tasks") in _flat(printed)
    assert "\n    probe: demo_arithmetic\n" in printed
    assert proposed.probe_specs == {} and not any(m.probes for m in proposed.models)

    used = measure(spec, {}, PrecheckSettings(limit=4, device="cpu", probes_from_card=True), dry_run=True)
    assert _flat("probe from its model card (--probes-from-card): demo_arithmetic") in _flat(capsys.readouterr().err)
    assert used.probe_specs == {str(e): "demo_arithmetic" for e in experts}
    assert all(len(m.probes) == 4 and m.task.name == "demo_arithmetic" for m in used.models)

    # a probe given for a model wins over its card
    probe = tmp_path / "probe.jsonl"
    probe.write_text('{"prompt": "2 + 2 =", "answer": "4"}\n')
    settings = PrecheckSettings(device="cpu", probes_from_card=True)
    given = measure(spec, {str(experts[0]): str(probe)}, settings, dry_run=True)
    assert given.probe_specs == {str(experts[0]): str(probe), str(experts[1]): "demo_arithmetic"}


def test_no_card_no_line(tmp_path, llama, capsys):
    from mergekit_mergeability.measuring import measure
    from mergekit_mergeability.merge_config import read
    from mergekit_mergeability.settings import PrecheckSettings

    path, _ = _config(tmp_path, llama, with_cards=False)
    measure(read(path), {}, PrecheckSettings(device="cpu", probes_from_card=True), dry_run=True)
    assert "model card" not in capsys.readouterr().err
