"""Probe sets: a few instances of the task each model was fine-tuned for.

A probe spec is one of
- a JSONL file of multiple-choice ``{"question", "choices", "label"}`` or
  generation ``{"prompt", "answer"}`` lines (``label`` an index or the choice text);
- an lm-eval task YAML file (found with its folder as ``include_path``);
- an installed lm-eval task name (``hellaswag``, ``arc_easy``...).
Every spec becomes the same ``Instance`` list: a prompt and the continuations to
score, as lm-eval's loglikelihood requests would (zero-shot).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from mergekit_mergeability.errors import UserError

MULTIPLE_CHOICE, GENERATION = "multiple_choice", "generation"


@dataclass(frozen=True)
class Instance:
    prompt: str
    continuations: Tuple[str, ...]  # the choices; one for generation (the answer)
    label: int  # index of the gold continuation
    kind: str = MULTIPLE_CHOICE

    @property
    def gold(self) -> str:
        return self.continuations[self.label]


def load(spec: str, limit: Optional[int] = None, relative_to: Optional[Path] = None) -> List[Instance]:
    """The first ``limit`` instances of a probe spec (see the module docstring)."""
    from mergekit_mergeability.evaluation.tasks import resolve

    path = existing_file(spec, relative_to)
    if path is not None and path.suffix == ".jsonl":
        instances = _from_jsonl(path, limit)
    else:
        instances = _from_lm_eval(resolve(spec, relative_to, what="probe"), limit)
    if not instances:
        raise UserError(f"probe {spec}: no instances")
    return instances


def join(prompt: str, continuation: str, delimiter: str = " ") -> str:
    """lm-eval's convention: the continuation starts with the delimiter unless either side has one."""
    if not continuation or continuation[0].isspace() or (prompt and prompt[-1].isspace()):
        return continuation
    return delimiter + continuation


def existing_file(spec: str, relative_to: Optional[Path] = None) -> Optional[Path]:
    """``spec`` as a file: as given (against the working directory), then against ``relative_to``."""
    for candidate in (Path(spec), *([relative_to / spec] if relative_to else [])):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _from_jsonl(path: Path, limit: Optional[int]) -> List[Instance]:
    instances = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if limit is not None and len(instances) >= limit:
                break
            if line.strip():
                instances.append(_instance(path, number, line))
    return instances


def _instance(path: Path, number: int, line: str) -> Instance:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{where}: not JSON ({error.msg})") from None
    if {"question", "choices", "label"} <= row.keys():
        choices = [str(c) for c in row["choices"]]
        label = row["label"]
        if isinstance(label, str):
            if label not in choices:
                raise UserError(f"{where}: label {label!r} is not one of the choices")
            label = choices.index(label)
        if not isinstance(label, int) or not 0 <= label < len(choices) or len(choices) < 2:
            raise UserError(f"{where}: label must index one of at least 2 choices, got {row['label']!r}")
        prompt = f"{row['question']}\nAnswer:"
        return Instance(prompt, tuple(join(prompt, c) for c in choices), label)
    if {"prompt", "answer"} <= row.keys():
        prompt = str(row["prompt"])
        return Instance(prompt, (join(prompt, str(row["answer"])),), 0, GENERATION)
    raise UserError(f'{where}: expected {{"question", "choices", "label"}} or {{"prompt", "answer"}}, got {sorted(row)}')


def task_name(path: Path) -> str:
    """The ``task:`` name an lm-eval task YAML declares."""
    import yaml

    try:
        name = (yaml.safe_load(path.read_text()) or {}).get("task")
    except yaml.constructor.ConstructorError:  # lm-eval's !function tags: read the line instead
        name = next((line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("task:")), None)
    except yaml.YAMLError as error:
        raise UserError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(name, str):
        raise UserError(f"{path}: an lm-eval task YAML needs a `task:` name")
    return name


def _from_lm_eval(task, limit: Optional[int]) -> List[Instance]:
    from mergekit_mergeability.evaluation.harness import quiet_harness

    manager, entry = task.load()
    with quiet_harness():
        loaded = list(manager.load(entry)["tasks"].values())
    if len(loaded) != 1:
        raise UserError(f"lm-eval task {task.name!r} is a group of {len(loaded)} tasks; name one of them")
    docs = loaded[0].eval_docs
    count = len(docs) if limit is None else min(limit, len(docs))
    return [_task_instance(loaded[0], docs[i]) for i in range(count)]


def _task_instance(task, doc) -> Instance:
    prompt = task.doc_to_text(doc)
    target = task.doc_to_target(doc)
    delimiter = task.config.target_delimiter
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        label = target if isinstance(target, int) else choices.index(str(target))
        return Instance(prompt, tuple(join(prompt, c, delimiter) for c in choices), label)
    answer = target[0] if isinstance(target, list) else str(target)
    return Instance(prompt, (join(prompt, answer, delimiter),), 0, GENERATION)
