"""research/configs.py's ``task_yaml``: a JSONL probe written as an lm-eval task asks lm-eval the
same requests the precheck scores from the JSONL (amendments 6 and 8 compare the two routes)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))
from configs import task_yaml  # noqa: E402

from mergekit_mergeability import tasks  # noqa: E402
from mergekit_mergeability.tasks.probes import scored_lines  # noqa: E402


def test_a_probe_written_as_an_lm_eval_task_asks_the_same_prompts_and_choices(tmp_path):
    lines = [
        {"id": "add", "question": "What is 7 plus 8?", "choices": ["16", "13", "15"], "label": 2},
        {"question": "Which is larger, 4 or 9?", "choices": ["4", "9"], "label": 1, "format": "options"},
    ]
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join(json.dumps(line) + "\n" for line in lines))
    jsonl = scored_lines(probe)

    asked = tasks.load(str(task_yaml(tmp_path / "tasks", "probe_as_task", jsonl)))

    assert [(i.prompt, i.label) for i in asked] == [(i.prompt, i.label) for i in jsonl]
    # lm-eval joins prompt and choice with its target delimiter, as the JSONL route does
    for mine, theirs in zip(jsonl, asked):
        assert [c.strip() for c in theirs.continuations] == [c.strip() for c in mine.continuations]
        assert all(c.startswith(" ") for c in theirs.continuations)
