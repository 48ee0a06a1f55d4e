"""Probe sets: a few instances of the task each model was fine-tuned for.

A probe spec is one of
- a JSONL file of multiple-choice ``{"question", "choices", "label"}`` or
  generation ``{"prompt", "answer"}`` lines (``label`` an index or the choice text);
- an lm-eval task YAML file (found with its folder as ``include_path``);
- an installed lm-eval task name (``hellaswag``, ``arc_easy``...).
A JSONL line may name its ``"group"`` (a language, a task): the neuron-selectivity
diagnostic compares groups; lines without one belong to their model's probe set.
Every spec becomes the same ``Instance`` list: a prompt and the continuations to
score, as lm-eval's loglikelihood requests would (zero-shot for JSONL lines; an
lm-eval task keeps its own ``num_fewshot`` and formatting).

The base model's knowledge of a multiple-choice line is asked as Will it Merge?
(arXiv 2601.06672) asks it: ``with_shots`` puts K solved examples before a lettered
question; the examples never include the instance itself, nor another phrasing of it
(lines sharing an ``"id"``), and come from the probe's other lines, then a ``fewshot:``
file, then a small neutral set shipped in ``configs/fewshot/``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mergekit_mergeability.errors import UserError

MULTIPLE_CHOICE, GENERATION = "multiple_choice", "generation"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NEUTRAL_SHOTS = "fewshot/general.jsonl"


@dataclass(frozen=True)
class Instance:
    prompt: str
    continuations: Tuple[str, ...]  # the choices; one for generation (the answer)
    label: int  # index of the gold continuation
    kind: str = MULTIPLE_CHOICE
    question: Optional[str] = None  # a JSONL line's question and options, as written (None: keep the prompt)
    options: Tuple[str, ...] = ()
    item: Optional[str] = None  # lines with the same "id" are phrasings of one item
    letters: Tuple[str, ...] = ()  # " A", " B"…: scored too when the options are lettered
    group: Optional[str] = None  # a JSONL line's "group" (None: its model's probe set)

    @property
    def gold(self) -> str:
        return self.continuations[self.label]


def lettered(question: str, options: Sequence[str]) -> str:
    """Question: …\nA. …\nB. …\nAnswer:"""
    return "\n".join([f"Question: {question}", *(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)), "Answer:"])


def with_shots(instances: Sequence[Instance], k: int, extra: Sequence[Instance] = (), seed: int = 0) -> List[Instance]:
    """The instances as few-shot lettered questions, each option scored as its own text.

    Shots for instance i: a seeded sample of the probe's other lines (never i itself
    nor a line with its id), then ``extra`` in order, up to ``k``. Instances without a
    question of their own (lm-eval tasks, generation) are returned unchanged.
    """
    asked = []
    for index, instance in enumerate(instances):
        if instance.question is None or instance.kind != MULTIPLE_CHOICE:
            asked.append(instance)
            continue
        own = [o for o in instances if _other(o, instance)]
        shots = random.Random(f"{seed}:{index}").sample(own, min(k, len(own)))
        shots += [o for o in extra if _other(o, instance)][: k - len(shots)]
        blocks = [f"{lettered(s.question, s.options)} {s.options[s.label]}" for s in shots]
        prompt = "\n\n".join([*blocks, lettered(instance.question, instance.options)])
        asked.append(
            replace(
                instance,
                prompt=prompt,
                continuations=tuple(f" {o}" for o in instance.options),
                letters=tuple(f" {LETTERS[i]}" for i in range(len(instance.options))),
            )
        )
    return asked


def _other(candidate: Instance, instance: Instance) -> bool:
    """May ``candidate`` serve as a solved example for ``instance``?"""
    if candidate.question is None or candidate.kind != MULTIPLE_CHOICE or candidate.question == instance.question:
        return False
    return instance.item is None or candidate.item != instance.item


def shots_from(spec: Optional[str], relative_to: Optional[Path] = None) -> List[Instance]:
    """Solved examples: a ``fewshot:`` JSONL file, else the shipped neutral set."""
    from mergekit_mergeability.resources import shipped

    if spec is None:
        return _from_jsonl(shipped(NEUTRAL_SHOTS), None)
    path = existing_file(spec, relative_to)
    if path is None or path.suffix != ".jsonl":
        raise UserError(f"fewshot {spec}: no such .jsonl file of {{\"question\", \"choices\", \"label\"}} lines")
    return _from_jsonl(path, None)


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
    if not spec.strip():
        return None  # Path("") is the working directory
    for candidate in (Path(spec), *([relative_to / spec] if relative_to else [])):
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:  # a name too long for the file system: no such file
            continue
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
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    group = row.get("group")
    if group is not None and (not isinstance(group, str) or not group.strip()):
        raise UserError(f"{where}: group must be a non-empty string, got {group!r}")
    return replace(_kind(where, row), group=group)


def _kind(where: str, row: dict) -> Instance:
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
        item = None if row.get("id") is None else str(row["id"])
        return Instance(prompt, tuple(join(prompt, c) for c in choices), label, question=str(row["question"]), options=tuple(choices), item=item)
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


# (task name, fingerprint, limit) -> its instances. lm-eval builds a task, dataset included, on every
# load; models that share a probe share its instances (frozen, so sharing is safe).
_built: Dict[Tuple[str, str, Optional[int]], Tuple[Instance, ...]] = {}


def _from_lm_eval(task, limit: Optional[int]) -> List[Instance]:
    key = (task.name, task.fingerprint, limit)
    if key not in _built:
        _built[key] = tuple(_build_lm_eval(task, limit))
    return list(_built[key])


def _build_lm_eval(task, limit: Optional[int]) -> List[Instance]:
    from mergekit_mergeability.evaluation.harness import compiled_templates, quiet_harness

    manager, entry = task.load()
    with quiet_harness():
        loaded = list(manager.load(entry)["tasks"].values())
    if len(loaded) != 1:
        raise UserError(f"lm-eval task {task.name!r} is a group of {len(loaded)} tasks; name one of them")
    task = loaded[0]
    task.set_fewshot_seed(seed=1234)  # lm-eval's default fewshot seed
    docs = task.eval_docs
    count = len(docs) if limit is None else min(limit, len(docs))
    with compiled_templates():
        return [_task_instance(task, docs[i]) for i in range(count)]


def _task_instance(task, doc) -> Instance:
    shots = task.config.num_fewshot or 0
    prompt = task.fewshot_context(doc, shots) if shots else task.doc_to_text(doc)
    target = task.doc_to_target(doc)
    delimiter = task.config.target_delimiter
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        label = target if isinstance(target, int) else choices.index(str(target))
        return Instance(prompt, tuple(join(prompt, c, delimiter) for c in choices), label)
    answer = target[0] if isinstance(target, list) else str(target)
    return Instance(prompt, (join(prompt, answer, delimiter),), 0, GENERATION)
