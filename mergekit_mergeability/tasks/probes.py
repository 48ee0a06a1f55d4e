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
- a ``{"prompt", "choices", "label"}`` line is asked as written: its prompt verbatim, each
  choice a continuation (lm-eval's convention: a space between, unless either side has one);
  no lettering and no shots are added;
- an lm-eval task keeps its own ``num_fewshot`` and formatting.

Solved examples (shots): where the model's entry names a ``fewshot:`` file, its lines ARE the
shots, in the file's order, the same for every item, as lm-eval's fixed few-shot examples are
(``fewshot_config: {sampler: first_n, samples: [...]}``); an ``options`` line with ``"shots": k``
gets the file's first k. Only without a file are they drawn, per item, from the probe's other
lines (never the item itself, nor another phrasing of it: lines sharing an ``"id"``), then a small
neutral set shipped in ``configs/fewshot/``.

The base model's knowledge of a multiple-choice line is also asked as Will it Merge?
(arXiv 2601.06672) asks it: ``with_shots`` puts K (``--fewshot``) solved examples, from the same
sources, before a lettered question.

``chat: true`` next to ``probe:`` asks every item through the model's tokenizer chat template, as
lm-eval's ``--apply_chat_template`` does (``chatted``): the prompt, shots included, is the user
turn, and each continuation is scored right after the generation prompt, with no delimiter.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from mergekit_mergeability.errors import UserError, reading

MULTIPLE_CHOICE, GENERATION = "multiple_choice", "generation"
CLOZE, OPTIONS, LM_EVAL = "cloze", "options", "lm-eval"  # how an instance is scored
CODE = "code"  # an lm-eval task whose metric runs generated code: its reference solution's per-token p(gold)
FORMATS = (CLOZE, OPTIONS)  # what a JSONL line's "format" may say
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# the keys that make a JSONL line a probe line: multiple choice, with its own prompt, generation
LINE_KEYS = ({"question", "choices", "label"}, {"prompt", "choices", "label"}, {"prompt", "answer"})
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

    @property
    def sequences(self) -> int:
        """What scoring it counts (the cost line's unit, a progress bar's step): each option and letter."""
        return len(self.continuations) + len(self.letters)


def lettered(question: str, options: Sequence[str]) -> str:
    """Question: …\nA. …\nB. …\nAnswer:"""
    return "\n".join([f"Question: {question}", *(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)), "Answer:"])


def with_shots(
    instances: Sequence[Instance],
    k: int,
    extra: Sequence[Instance] = (),
    seed: int = 0,
    fixed: Optional[Sequence[Instance]] = None,
) -> List[Instance]:
    """The instances as k-shot lettered questions, each option scored as its own text.

    Shots for every instance: the first ``k`` of ``fixed`` (a ``fewshot:`` file's lines), in order,
    where given. Else, for instance i, a seeded sample of the probe's other lines (never i itself
    nor a line with its id), then ``extra`` in order, up to ``k``. Instances without a question
    of their own (lm-eval tasks, generation, lines with their own prompt) are returned unchanged.
    """
    return [_lettered(instances, index, k, extra, seed, fixed) for index in range(len(instances))]


def _lettered(
    instances: Sequence[Instance],
    index: int,
    k: int,
    extra: Sequence[Instance],
    seed: int,
    fixed: Optional[Sequence[Instance]] = None,
) -> Instance:
    instance = instances[index]
    if instance.question is None or instance.kind != MULTIPLE_CHOICE:
        return instance
    if fixed is not None:
        shots = list(fixed[:k])
    else:
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


def as_scored(
    instances: Sequence[Instance], extra: Sequence[Instance] = (), fixed: Optional[Sequence[Instance]] = None
) -> List[Instance]:
    """Each line in the format its task is scored in: ``options`` lines as their own
    ``shots``-shot lettered question (shots: the first ``shots`` of ``fixed``, a ``fewshot:``
    file's lines, where given; else from the probe's other lines, then ``extra``), the rest
    unchanged."""
    return [
        _lettered(instances, i, inst.shots, extra, 0, fixed) if inst.format == OPTIONS else inst
        for i, inst in enumerate(instances)
    ]


def chatted(instances: Sequence[Instance], tokenizer, where: str = "probe") -> List[Instance]:
    """The instances asked through ``tokenizer``'s chat template, as lm-eval's
    ``--apply_chat_template`` asks them: the prompt (shots included, one turn) as the user's
    message, the generation prompt after it, and each continuation scored right there, without
    the delimiter a plain prompt puts before it."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{where}: chat: true, but the model's tokenizer has no chat template; remove chat: true")
    asked = []
    for instance in instances:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": instance.prompt}], tokenize=False, add_generation_prompt=True
        )
        plain = (undelimited(instance.prompt, c) for c in instance.continuations)
        asked.append(
            replace(
                instance,
                prompt=prompt,
                continuations=tuple(plain),
                letters=tuple(letter.lstrip() for letter in instance.letters),
            )
        )
    return asked


def undelimited(prompt: str, continuation: str) -> str:
    """A continuation without the delimiter ``join`` put before it (lm-eval's chat delimiter is "")."""
    return continuation[1:] if continuation.startswith(" ") and not prompt[-1:].isspace() else continuation


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
    """Solved examples: a ``fewshot:`` JSONL file of multiple-choice lines, else the shipped neutral set."""
    path = _neutral() if spec is None else fewshot_file(spec, relative_to)
    lines = _from_jsonl(path, None)
    for number, line in enumerate(lines, 1):
        if line.question is None or line.kind != MULTIPLE_CHOICE:
            raise UserError(f'fewshot {path}: line {number} is not a {{"question", "choices", "label"}} line')
    return lines


def fewshot_file(spec: Optional[str], relative_to: Optional[Path] = None) -> Optional[Path]:
    """A ``fewshot:`` spec as the file it names (None for None); a missing one is a UserError."""
    if spec is None:
        return None
    path = existing_file(spec, relative_to)
    if path is None or path.suffix != ".jsonl":
        raise UserError(f'fewshot {spec}: no such .jsonl file of {{"question", "choices", "label"}} lines')
    return path


def scored_lines(path: Path, fewshot: Optional[Path] = None) -> List[Instance]:
    """Every line of a JSONL probe, as its task scores it: shots from the ``fewshot`` file where
    given (its first ones, in order, the same for every line), else drawn from the whole probe and
    the shipped neutral set, so a ``--limit`` never changes a prompt."""
    lines = _from_jsonl(path, None)
    if fewshot is None:
        return as_scored(lines, _from_jsonl(_neutral(), None))
    fixed = shots_from(str(fewshot))
    wanted = max((i.shots for i in lines if i.format == OPTIONS), default=0)
    if wanted > len(fixed):
        raise UserError(f"fewshot {fewshot}: {len(fixed)} solved examples, but probe {path} asks for {wanted} shots")
    return as_scored(lines, fixed=fixed)


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
    with reading(path, "JSONL file"), open(path, encoding="utf-8") as handle:
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
    return parse(json_line(path, number, line), f"{path}:{number}")


def json_line(path: Path, number: int, line: str) -> Any:
    """Line ``number`` of the JSONL file ``path``, parsed; a UserError naming the file, line and column."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{number}: not JSON ({error.msg} column {error.colno})") from None


def json_rows(path: Path) -> List[Any]:
    """Every non-blank line of the JSONL file ``path``, parsed (``json_line``)."""
    with reading(path, "JSONL file"):
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json_line(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]


def _kind(where: str, row: dict) -> Instance:
    if {"question", "choices", "label"} <= row.keys():
        choices = [str(c) for c in row["choices"]]
        label = _label(where, row["label"], choices)
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
    if {"prompt", "choices", "label"} <= row.keys():
        return _verbatim(where, row)
    if {"prompt", "answer"} <= row.keys():
        prompt = str(row["prompt"])
        return Instance(prompt, (join(prompt, str(row["answer"])),), 0, GENERATION, format=GENERATION)
    raise UserError(
        f'{where}: expected {{"question", "choices", "label"}}, {{"prompt", "choices", "label"}} or {{"prompt", "answer"}}, got {sorted(row)}'
    )


def _verbatim(where: str, row: dict) -> Instance:
    """A multiple-choice line with its own prompt: asked as written, each choice its continuation."""
    if "format" in row or "shots" in row:
        raise UserError(f'{where}: a line with its own "prompt" is asked as written; drop "format" and "shots"')
    prompt, choices = str(row["prompt"]), [str(c) for c in row["choices"]]
    label = _label(where, row["label"], choices)
    item = None if row.get("id") is None else str(row["id"])
    return Instance(
        prompt, tuple(join(prompt, c) for c in choices), label, options=tuple(choices), item=item, format=CLOZE
    )


def _label(where: str, label, choices: Sequence[str]) -> int:
    """A line's ``label`` (an index, or the choice's text) as an index into ``choices``."""
    if isinstance(label, str):
        if label not in choices:
            raise UserError(f"{where}: label {label!r} is not one of the choices")
        label = choices.index(label)
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices) or len(choices) < 2:
        raise UserError(f"{where}: label must index one of at least 2 choices, got {label!r}")
    return label
