"""Multiple-choice tasks scored without lm-eval's run (``task_scores.score_all``) give lm-eval's own
result, field by field: JSONL probes in both formats, a task YAML with acc and acc_norm and shots
drawn by lm-eval's seed; what only lm-eval's run scores as it does is left to it."""

import json

import pytest
import yaml

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.diagnostics.task_scores import score_all
from mergekit_mergeability.tasks import harness, lmeval
from mergekit_mergeability.tiny import derive, state_dict

from conftest import noise

CHOICES = ["ox", "a small brown duckling", "cat", "the dog"]  # lengths differ: acc_norm can pick otherwise than acc
ROWS = [
    {"question": f"Which animal is number {i}?", "choices": CHOICES[i % 4 :] + CHOICES[: i % 4], "label": i % 3}
    for i in range(12)
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _yaml_task(root, data, name="mm_plain", **extra):
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}\nAnswer:",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        **extra,
    }
    (root / name).mkdir()  # a folder each: lm-eval indexes a folder once
    path = root / name / f"{name}.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


@pytest.fixture(scope="module")
def model(families, tmp_path_factory):
    """A tiny Llama with its weights shaken, so its choices differ item by item."""
    return load_causal_lm(derive(families["llama"]["base"], tmp_path_factory.mktemp("plain") / "shaken", noise(3, 0.5)))


def test_plain_tasks_read_as_lm_eval_reads_them(tmp_path, model):
    module, tokenizer = model
    data = _jsonl(tmp_path / "items.jsonl", ROWS)
    shots = {"num_fewshot": 2, "fewshot_split": "test"}
    both = {
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc_norm", "acc")]
    }
    tasks = [
        lmeval.resolve(str(data)),  # cloze: "Answer:" and each choice
        lmeval.resolve(str(_jsonl(tmp_path / "options.jsonl", [{**r, "format": "options"} for r in ROWS]))),
        lmeval.resolve(str(_yaml_task(tmp_path, data, **both, **shots))),  # acc, acc_norm; two shots, lm-eval's seed
        lmeval.resolve(str(_yaml_task(tmp_path, data, name="mm_default"))),  # no metric_list: lm-eval's defaults
    ]
    assert all(lmeval.plain(task, 10) is not None for task in tasks)
    plain = score_all(module, tokenizer, tasks, limit=10)
    own = [harness.score(module, tokenizer, task, limit=10) for task in tasks]
    for read, expected in zip(plain, own):
        assert read.keys() == expected.keys()
        assert read["metrics"] == pytest.approx(expected["metrics"]) and read["primary"] == expected["primary"]
        assert (read["samples"], read["score"]) == (expected["samples"], pytest.approx(expected["score"]))
        assert read["stderr"] == pytest.approx(expected["stderr"])
    assert plain[2]["metrics"].keys() == {"acc", "acc_norm"} and plain[2]["primary"] == "acc"  # lm-eval's order
    assert plain[2]["metrics"]["acc"] != plain[2]["metrics"]["acc_norm"]  # the two reads do differ here


def test_what_only_lm_eval_scores_as_it_does_is_left_to_it(tmp_path, model):
    data = _jsonl(tmp_path / "items.jsonl", ROWS)
    generation = _jsonl(tmp_path / "gen.jsonl", [{"prompt": "2 + 2 =", "answer": "4"}])
    f1 = {"metric_list": [{"metric": "f1", "aggregation": "f1", "higher_is_better": True}]}
    for spec in (str(generation), str(_yaml_task(tmp_path, data, name="mm_f1", **f1))):
        assert lmeval.plain(lmeval.resolve(spec), 4) is None
    chat = lmeval.resolve(str(data), chat=True)
    assert lmeval.plain(chat, 4) is None
    # a mixed list: the plain one read, the other through lm-eval, each in its place
    module, tokenizer = model
    tasks = [lmeval.resolve(spec) for spec in (str(generation), str(data))]
    mixed = score_all(module, tokenizer, tasks, limit=4)
    assert [r["primary"] for r in mixed] == ["exact_match", "acc"]
    assert mixed[1]["score"] == pytest.approx(harness.score(module, tokenizer, tasks[1], limit=4)["score"])


def test_a_merge_scored_for_many_tasks_reads_each_once(tmp_path, families):
    """Scorer.patch_many: every member's task read in one batched pass over the patched model,
    each result what scoring it alone gives."""
    from mergekit_mergeability.evaluation.scorer import Scorer
    from mergekit_mergeability.settings import RunSettings
    from mergekit_mergeability.sources.cache import Cache

    base = families["llama"]["base"]
    tasks = [lmeval.resolve(str(_jsonl(tmp_path / f"p{k}.jsonl", ROWS[k::2]))) for k in range(2)]
    shaken = derive(base, tmp_path / "shaken", noise(5, 0.5))
    weights = state_dict(shaken)  # the merge's tensors, patched into the loaded base
    together = Scorer(base, RunSettings(limit=6), Cache(None)).patch_many("shaken", tasks, lambda: weights)
    alone = [Scorer(base, RunSettings(limit=6), Cache(None)).patch("shaken", task, lambda: weights) for task in tasks]
    assert together == alone
    module, tokenizer = load_causal_lm(shaken)
    assert [r["score"] for r in together] == pytest.approx(
        [harness.score(module, tokenizer, task, limit=6)["score"] for task in tasks]
    )
