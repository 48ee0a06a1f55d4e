"""Probe sets: a few instances of the task each model was fine-tuned for.

A probe spec is one of
- a JSONL file of multiple-choice ``{"question", "choices", "label"}`` or
  generation ``{"prompt", "answer"}`` lines (``label`` an index or the choice text);
- an lm-eval task YAML file (found with its folder as ``include_path``);
- an installed lm-eval task name (``hellaswag``, ``arc_easy``...).
A JSONL line may name its ``"group"`` (a language, a task): the neuron-selectivity
diagnostic compares groups; lines without one belong to their model's probe set.
Every spec becomes the same ``Instance`` list (``tasks.load``): a prompt and the continuations to
score, as lm-eval's loglikelihood requests would, **in the format the task is scored
in** (``evaluate`` and ``mergeability`` score exactly these prompts):

- a multiple-choice line's ``"format"``: ``"cloze"`` (the default: ``question\nAnswer:``
  and each choice as its continuation) or ``"options"`` (the choices listed and lettered
  after ``"shots"`` solved examples, 0 unless the line says, each choice scored as its own
  text); lines that say nothing are taken as cloze, and the precheck says so;
- an lm-eval task keeps its own ``num_fewshot`` and formatting.

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
from typing import List, Optional, Sequence, Tuple

from mergekit_mergeability.errors import UserError, not_yaml

MULTIPLE_CHOICE, GENERATION = "multiple_choice", "generation"
CLOZE, OPTIONS, LM_EVAL = "cloze", "options", "lm-eval"  # how an instance is scored
FORMATS = (CLOZE, OPTIONS)  # what a JSONL line's "format" may say
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
    format: str = CLOZE  # how the task scores it: cloze, options, lm-eval (a task's own), generation
    shots: int = 0  # solved examples before it, as scored
    declared: bool = True  # False: a JSONL line that did not say its format (taken as cloze)

    @property
    def gold(self) -> str:
        return self.continuations[self.label]


def lettered(question: str, options: Sequence[str]) -> str:
    """Question: …\nA. …\nB. …\nAnswer:"""
    return "\n".join([f"Question: {question}", *(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)), "Answer:"])


def with_shots(instances: Sequence[Instance], k: int, extra: Sequence[Instance] = (), seed: int = 0) -> List[Instance]:
    """The instances as k-shot lettered questions, each option scored as its own text.

    Shots for instance i: a seeded sample of the probe's other lines (never i itself
    nor a line with its id), then ``extra`` in order, up to ``k``. Instances without a
    question of their own (lm-eval tasks, generation) are returned unchanged.
    """
    return [_lettered(instances, index, k, extra, seed) for index in range(len(instances))]


def _lettered(instances: Sequence[Instance], index: int, k: int, extra: Sequence[Instance], seed: int) -> Instance:
    instance = instances[index]
    if instance.question is None or instance.kind != MULTIPLE_CHOICE:
        return instance
    own = [o for o in instances if _other(o, instance)]
    shots = random.Random(f"{seed}:{index}").sample(own, min(k, len(own)))
    shots += [o for o in extra if _other(o, instance)][: k - len(shots)]
    blocks = [f"{lettered(s.question, s.options)} {s.options[s.label]}" for s in shots]
    return replace(
        instance,
        prompt="\n\n".join([*blocks, lettered(instance.question, instance.options)]),
        continuations=tuple(f" {o}" for o in instance.options),
        letters=tuple(f" {LETTERS[i]}" for i in range(len(instance.options))),
        format=OPTIONS,
        shots=len(shots),
    )


def as_scored(instances: Sequence[Instance], extra: Sequence[Instance] = ()) -> List[Instance]:
    """Each line in the format its task is scored in: ``options`` lines as their own
    ``shots``-shot lettered question (shots from the probe's other lines, then ``extra``),
    the rest unchanged."""
    return [
        _lettered(instances, i, inst.shots, extra, 0) if inst.format == OPTIONS else inst
        for i, inst in enumerate(instances)
    ]


def cloze(instance: Instance) -> Instance:
    """A multiple-choice line as a cloze question, whatever it declares (the lettered and
    few-shot views are built from this one)."""
    if instance.question is None:
        return instance
    prompt = f"{instance.question}\nAnswer:"
    return replace(
        instance, prompt=prompt, continuations=tuple(join(prompt, c) for c in instance.options), letters=(), shots=0
    )


def _other(candidate: Instance, instance: Instance) -> bool:
    """May ``candidate`` serve as a solved example for ``instance``?"""
    if candidate.question is None or candidate.kind != MULTIPLE_CHOICE or candidate.question == instance.question:
        return False
    return instance.item is None or candidate.item != instance.item


def shots_from(spec: Optional[str], relative_to: Optional[Path] = None) -> List[Instance]:
    """Solved examples: a ``fewshot:`` JSONL file, else the shipped neutral set."""
    if spec is None:
        return _from_jsonl(_neutral(), None)
    path = existing_file(spec, relative_to)
    if path is None or path.suffix != ".jsonl":
        raise UserError(f'fewshot {spec}: no such .jsonl file of {{"question", "choices", "label"}} lines')
    return _from_jsonl(path, None)


def scored_lines(path: Path) -> List[Instance]:
    """Every line of a JSONL probe, as its task scores it (shots drawn from the whole file
    and the shipped neutral set, so a ``--limit`` never changes a prompt)."""
    return as_scored(_from_jsonl(path, None), _from_jsonl(_neutral(), None))


def _neutral() -> Path:
    from mergekit_mergeability.resources import shipped

    return shipped(NEUTRAL_SHOTS)


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


def parse(row: dict, where: str = "probe line") -> Instance:
    """One probe line (a parsed JSON object) as an Instance, its group included."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    group = row.get("group")
    if group is not None and (not isinstance(group, str) or not group.strip()):
        raise UserError(f"{where}: group must be a non-empty string, got {group!r}")
    return replace(_kind(where, row), group=group)


def _instance(path: Path, number: int, line: str) -> Instance:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{where}: not JSON ({error.msg})") from None
    return parse(row, where)


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
        item = None if row.get("id") is None else str(row["id"])
        declared, shots = row.get("format"), row.get("shots", 0)
        if declared is not None and declared not in FORMATS:
            raise UserError(f"{where}: format must be one of {', '.join(FORMATS)}, got {declared!r}")
        if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
            raise UserError(f"{where}: shots must be a whole number ≥ 0, got {shots!r}")
        if shots and declared != OPTIONS:
            raise UserError(f'{where}: shots apply to "format": "options" lines only')
        line = Instance(
            "",
            (),
            label,
            question=str(row["question"]),
            options=tuple(choices),
            item=item,
            format=declared or CLOZE,
            declared=declared is not None,
        )
        return replace(cloze(line), shots=shots)
    if {"prompt", "answer"} <= row.keys():
        prompt = str(row["prompt"])
        return Instance(prompt, (join(prompt, str(row["answer"])),), 0, GENERATION, format=GENERATION)
    raise UserError(
        f'{where}: expected {{"question", "choices", "label"}} or {{"prompt", "answer"}}, got {sorted(row)}'
    )


def task_name(path: Path) -> str:
    """The ``task:`` name an lm-eval task YAML declares."""
    import yaml

    try:
        name = (yaml.safe_load(path.read_text()) or {}).get("task")
    except yaml.constructor.ConstructorError:  # lm-eval's !function tags: read the line instead
        name = next(
            (line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("task:")), None
        )
    except yaml.YAMLError as error:
        raise not_yaml(path, error) from None
    if not isinstance(name, str):
        raise UserError(f"{path}: an lm-eval task YAML needs a `task:` name")
    return name
