"""Probe specs: JSONL files and lm-eval tasks become the same instances."""

import json

import pytest

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks import load
from mergekit_mergeability.tasks.probes import GENERATION, MULTIPLE_CHOICE


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_multiple_choice_and_generation_lines(tmp_path):
    path = _jsonl(
        tmp_path / "p.jsonl",
        [
            {"question": "2+2?", "choices": ["3", "4"], "label": 1},
            {"question": "Sky?", "choices": ["blue", "green"], "label": "blue"},
            {"prompt": "Water boils at", "answer": "100 C"},
        ],
    )
    first, second, third = load(str(path))
    assert (first.prompt, first.continuations, first.label, first.kind) == (
        "2+2?\nAnswer:",
        (" 3", " 4"),
        1,
        MULTIPLE_CHOICE,
    )
    assert second.label == 0 and second.gold == " blue"
    assert (third.continuations, third.kind) == ((" 100 C",), GENERATION)
    assert len(load(str(path), limit=2)) == 2


def test_relative_specs_resolve_against_the_config_folder(tmp_path):
    _jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": "b"}])
    assert len(load("p.jsonl", relative_to=tmp_path)) == 1


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "q", "choices": ["a", "b"], "label": 2}, "label must index"),
        ({"question": "q", "choices": ["a", "b"], "label": "c"}, "not one of the choices"),
        ({"text": "q"}, "expected"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, row, message):
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "b"}, row])
    with pytest.raises(UserError, match=rf"bad.jsonl:2: .*{message}"):
        load(str(path))


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load(str(tmp_path / "nope.jsonl"))


def test_an_lm_eval_task_yaml(tmp_path):
    data = _jsonl(
        tmp_path / "facts.jsonl",
        [{"q": f"Fact {i}?", "options": ["yes", "no", "maybe"], "gold": i % 3} for i in range(5)],
    )
    task = tmp_path / "facts.yaml"
    task.write_text(
        f"""task: probe_facts_test
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Q: {{{{q}}}}\\nA:"
doc_to_choice: options
doc_to_target: gold
metric_list:
  - metric: acc
"""
    )
    instances = load(str(task), limit=4)
    assert len(instances) == 4
    assert instances[1].prompt == "Q: Fact 1?\nA:"
    assert instances[1].continuations == (" yes", " no", " maybe") and instances[1].label == 1


def _task_yaml(folder, name="probe_shared_test", items=6):
    data = _jsonl(
        folder / "shared.jsonl", [{"q": f"Fact {i}?", "options": ["yes", "no"], "gold": i % 2} for i in range(items)]
    )
    task = folder / "shared.yaml"
    task.write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "Q: {{q}}\\nA:"\ndoc_to_choice: options\ndoc_to_target: gold\nmetric_list:\n  - metric: acc\n'
    )
    return task


def test_models_sharing_an_lm_eval_probe_build_it_once(tmp_path, monkeypatch):
    from lm_eval import utils
    from lm_eval.tasks import TaskManager

    builds = []
    original = TaskManager.load
    monkeypatch.setattr(TaskManager, "load", lambda self, entry: builds.append(entry) or original(self, entry))
    task = _task_yaml(tmp_path)
    first, second = load(str(task), limit=4), load(str(task), limit=4)
    assert len(builds) == 1 and first == second and first is not second  # one build, each model its own list
    assert [i.prompt for i in first] == [f"Q: Fact {i}?\nA:" for i in range(4)]
    assert len(load(str(task), limit=6)) == 6 and len(builds) == 2  # another limit is another probe
    _task_yaml(tmp_path, items=3)  # the task's data changed: built again
    assert len(load(str(task), limit=6)) == 3 and len(builds) == 3
    assert utils.apply_template.__module__ == "lm_eval.utils"  # lm-eval's own template function is back in place
