"""Data loaders for the shipped demo tasks: paths resolve from this file, so the tasks
work from any working directory (lm-eval resolves data_files against the CWD)."""

import json
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "demo"


def translation(expert: str, **_):
    """One demo translator's held-out sentences: English → its invented language, none of
    them among the sentences it was trained on."""
    import datasets

    rows = [json.loads(line) for line in (DEMO / "translation.jsonl").read_text().splitlines() if line.strip()]
    return datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([r for r in rows if r["expert"] == expert and r["split"] == "test"])}
    )


def arithmetic(**_):
    """The held-out two-digit additions of the demo's interpolation sweep."""
    import datasets

    rows = [json.loads(line) for line in (DEMO / "arithmetic.jsonl").read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
