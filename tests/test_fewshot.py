"""The knowledge prompt, as Will it Merge? asks it: few-shot, options lettered, never its own answer."""

import json

import pytest

from mergekit_mergeability.tasks import load
from mergekit_mergeability.tasks.probes import Instance, lettered, shots_from, with_shots


def _probe(tmp_path, rows):
    path = tmp_path / "probe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load(str(path))


def _question(i, item=None):
    row = {"question": f"Question number {i}?", "choices": [f"yes{i}", f"no{i}", f"maybe{i}"], "label": i % 3}
    return {**row, "id": item} if item else row


def test_the_lettered_format():
    assert (
        lettered("Capital of France?", ["Paris", "Rome"]) == "Question: Capital of France?\nA. Paris\nB. Rome\nAnswer:"
    )


def test_an_instance_is_never_among_its_own_shots_nor_are_its_paraphrases(tmp_path):
    rows = [_question(0, "x"), _question(1, "x"), *(_question(i) for i in range(2, 8))]
    instances = _probe(tmp_path, rows)
    asked = with_shots(instances, 3, shots_from(None))
    assert len(asked) == len(instances) == len(rows)
    for instance, prompt in zip(instances, asked):
        *shots, own = prompt.prompt.split("\n\n")
        assert len(shots) == 3 and own == lettered(instance.question, instance.options)
        assert instance.question not in "".join(shots)
        if instance.item == "x":  # the other phrasing of the same item is never shown solved
            assert "Question number 0" not in "".join(shots) and "Question number 1" not in "".join(shots)
    # each shot is solved with its own gold option's text, and the options are scored as text and as letters
    first = asked[2]
    assert first.continuations == (" yes2", " no2", " maybe2") and first.letters == (" A", " B", " C")
    shot = first.prompt.split("\n\n")[0]
    solved = next(r for r in rows if r["question"] in shot)
    assert shot.endswith(f"Answer: {solved['choices'][solved['label']]}")


def test_a_one_line_probe_takes_its_shots_from_the_neutral_set(tmp_path):
    (asked,) = with_shots(_probe(tmp_path, [_question(0)]), 4, shots_from(None))
    neutral = {i.question for i in shots_from(None)}
    shots = asked.prompt.split("\n\n")[:-1]
    assert len(shots) == 4 and all(any(q in s for q in neutral) for s in shots)


def test_zero_shots_is_the_lettered_question_alone(tmp_path):
    (asked,) = with_shots(_probe(tmp_path, [_question(5)]), 0, shots_from(None))
    assert asked.prompt == lettered("Question number 5?", ["yes5", "no5", "maybe5"])


def test_the_same_shots_every_time(tmp_path):
    instances = _probe(tmp_path, [_question(i) for i in range(10)])
    assert with_shots(instances, 3) == with_shots(instances, 3)


def test_generation_and_lm_eval_instances_are_left_as_they_are():
    plain = Instance("Translate: cat ->", (" kat",), 0, "generation")
    assert with_shots([plain], 3, shots_from(None)) == [plain]


def test_a_fewshot_file_must_be_jsonl(tmp_path):
    from mergekit_mergeability.errors import UserError

    with pytest.raises(UserError, match="fewshot missing.txt: no such .jsonl file"):
        shots_from("missing.txt", tmp_path)
