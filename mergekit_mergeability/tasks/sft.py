"""Probes from fine-tuning data: the rows a model was trained on, read as generation probes.

A row's layout is told by its keys (the first row's, or the file's columns):

- chat: ``messages``, a list of ``{"role", "content"}`` (or ShareGPT's ``conversations`` of
  ``{"from", "value"}``): the last assistant turn is the answer, the turns before it the prompt,
  written ``User: …`` / ``Assistant: …`` (``CHAT_ROLES``) with a blank line between turns;
- ``prompt`` / ``completion`` (each a string, or a list of chat turns as TRL writes them): the
  prompt as written, the completion right after it;
- Alpaca's ``instruction`` / ``input`` / ``output``: the prompt is Alpaca's own template
  (``ALPACA``, ``ALPACA_NO_INPUT``), the output the answer;
- ``text``, split where the model entry's ``answer_after:`` marker last occurs: the text up to and
  including it is the prompt, the rest the answer.

Files: ``.jsonl``, ``.json`` (a list of rows, or an object holding one), ``.parquet``, ``.csv``,
or a folder written by ``datasets``' ``save_to_disk`` (one split; a ``DatasetDict`` folder's
split is named by its subfolder). A ``.jsonl`` file of probe lines (``tasks.probes``) is read
as probe lines, not here.

Each row becomes one generation ``Instance``: the reference answer as the single continuation.
Asked of a model, its value is ``p_gold``, the reference's per-token geometric-mean probability,
exp(−the fine-tuning loss on that row) (``maths.choice_scores.generation``): defined at every
answer length, and what fine-tuning raised. Greedy match (every answer token the model's
argmax, ``correct``) is kept beside it as accuracy; it means something only for short answers.
Up to ``limit`` rows, drawn with a fixed seed (``SEED``) and kept in file order. Under ``chat: true``
the model's chat template writes each prompt instead, a chat row's own turns included.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from mergekit_mergeability.errors import UserError, reading
from mergekit_mergeability.tasks.probes import GENERATION, LINE_KEYS, Instance, existing_file, join

SEED = 0
SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
KINDS = {".json": "JSON", ".parquet": "Parquet", ".csv": "CSV"}  # a file's kind, said where it breaks its reader
ANSWER_AFTER_KEY = "answer_after"  # the model entry's key (``merge_config``): the marker ending a "text" row's prompt
CHAT_ROLES = {"system": "System", "user": "User", "human": "User", "assistant": "Assistant", "gpt": "Assistant"}
ASSISTANT = ("assistant", "gpt", "model")
TEMPLATE_ROLES = {"human": "user", "gpt": "assistant", "model": "assistant"}  # ShareGPT's names, as templates take them
ALPACA = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
PROBE_KEYS = LINE_KEYS  # a probe line's, read by tasks.probes
LAYOUTS = (
    'chat "messages" (or "conversations")',
    '"prompt"/"completion"',
    '"instruction"/"input"/"output"',
    f'"text" with {ANSWER_AFTER_KEY}: in the config entry',
)


def located(spec: str, relative_to: Optional[Path] = None) -> Optional[Path]:
    """``spec`` as fine-tuning data: a file of one of ``SUFFIXES`` that is not a JSONL file of
    probe lines, or a saved ``datasets`` folder; None otherwise."""
    path = existing_file(spec, relative_to)
    if path is not None:
        if path.suffix == ".jsonl":
            return path if not _probe_lines(path) else None
        return path if path.suffix in SUFFIXES else None
    for candidate in (Path(spec), *([relative_to / spec] if relative_to else [])):
        try:
            if candidate.is_dir() and _saved_dataset(candidate):
                return candidate.resolve()
        except OSError:
            continue
    return None


def load(path: Path, limit: Optional[int] = None, answer_after: Optional[str] = None, tokenizer=None) -> List[Instance]:
    """Up to ``limit`` rows of a fine-tuning data file (``located``), drawn with ``SEED``, as
    generation instances; with ``tokenizer`` (``chat: true``), each prompt rendered by its chat
    template: a chat row's own turns, any other row's prompt as the user's turn, the answer right
    after the generation prompt (as ``probes.chatted`` asks a probe line)."""
    kind = "saved datasets folder" if path.is_dir() else f"{KINDS.get(path.suffix, 'JSONL')} file"
    with reading(path, kind):
        columns, count, rows = _reader(path)
    if count == 0:
        raise UserError(f"probe {path}: no rows")
    layout = _layout(path, columns, answer_after)
    chosen = (
        range(count) if limit is None or limit >= count else sorted(random.Random(SEED).sample(range(count), limit))
    )
    with reading(path, kind):
        read = rows(chosen)
    return [_instance(layout, row, answer_after, f"{path}: row {i + 1}", tokenizer) for i, row in zip(chosen, read)]


# reading: (columns, row count, rows(indices) -> those rows as dicts)
Reader = Tuple[Sequence[str], int, Callable[[Sequence[int]], List[Mapping[str, Any]]]]


def _reader(path: Path) -> Reader:
    if path.is_dir():
        return _saved(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return table.column_names, table.num_rows, lambda chosen: table.take(list(chosen)).to_pylist()
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        return _listed(path, rows)
    if path.suffix == ".json":
        return _listed(path, _json_rows(path))
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def parsed(chosen):
        return [_json_line(path, lines, i) for i in chosen]

    first = _json_line(path, lines, 0) if lines else {}
    return (list(first) if isinstance(first, dict) else []), len(lines), parsed


def _listed(path: Path, rows: List[Any]) -> Reader:
    if rows and not all(isinstance(r, dict) for r in rows):
        raise UserError(f"probe {path}: expected rows of JSON objects, got {type(rows[0]).__name__}")
    return (list(rows[0]) if rows else []), len(rows), lambda chosen: [rows[i] for i in chosen]


def _json_rows(path: Path) -> List[Any]:
    try:
        with reading(path, "JSON file"):
            text = path.read_text(encoding="utf-8")
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"probe {path}: not JSON ({error.msg} at line {error.lineno})") from None
    if isinstance(document, dict):  # {"train": [...]} or {"data": [...]}: the one list it holds
        lists = [v for v in document.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UserError(
                f"probe {path}: expected a list of rows, or an object holding one list; found keys {sorted(document)}"
            )
        document = lists[0]
    if not isinstance(document, list):
        raise UserError(f"probe {path}: expected a list of rows, got {type(document).__name__}")
    return document


def _json_line(path: Path, lines: List[str], index: int) -> Any:
    try:
        return json.loads(lines[index])
    except json.JSONDecodeError as error:
        raise UserError(f"probe {path}: row {index + 1}: not JSON ({error.msg})") from None


def _saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _saved(folder: Path) -> Reader:
    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(str(folder))
    if isinstance(dataset, DatasetDict):
        if len(dataset) != 1:
            splits = ", ".join(str(folder / s) for s in dataset)
            raise UserError(f"probe {folder}: a dataset of {len(dataset)} splits; name one of their folders: {splits}")
        (dataset,) = dataset.values()
    return dataset.column_names, len(dataset), lambda chosen: dataset.select(list(chosen)).to_list()


def _probe_lines(path: Path) -> bool:
    """Is the first line of a JSONL file a probe line (``tasks.probes``) rather than a fine-tuning row?"""
    with reading(path, "JSONL file"), open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return True  # tasks.probes says which line is not JSON
    return not isinstance(row, dict) or any(keys <= row.keys() for keys in PROBE_KEYS)


class Prompted(NamedTuple):
    prompt: str  # as plain text
    answer: str
    delimiter: str  # between the plain prompt and the answer
    turns: Optional[List[Tuple[str, str]]] = None  # a chat row's turns before the answer: what a chat template renders


def _layout(path: Path, columns: Sequence[str], answer_after: Optional[str]) -> Callable[..., Prompted]:
    layout = _layout_of(columns)
    if layout is None:
        raise UserError(
            f"probe {path}: cannot read rows with keys {sorted(columns)}; expected a fine-tuning layout "
            f'({", ".join(LAYOUTS)}) or probe lines ({{"question", "choices", "label"}} or {{"prompt", "answer"}})'
        )
    if layout is _text and not answer_after:
        raise UserError(
            f'probe {path}: rows of "text" need the marker that ends each prompt: add {ANSWER_AFTER_KEY}: "…" next to probe:'
        )
    return layout


def _layout_of(columns) -> Optional[Callable[..., Prompted]]:
    keys = set(columns)
    if "messages" in keys or "conversations" in keys:
        return _chat
    if {"prompt", "completion"} <= keys:
        return _completion
    if {"instruction", "output"} <= keys:
        return _alpaca
    if "text" in keys:
        return _text
    return None


def _chat(row: Mapping[str, Any], answer_after: Optional[str] = None) -> Prompted:
    turns = _turns(row.get("messages", row.get("conversations")))
    last = max((i for i, (role, _) in enumerate(turns) if role in ASSISTANT), default=None)
    if last is None:
        raise ValueError("no assistant turn")
    return Prompted(_rendered(turns[:last]), turns[last][1], " ", turns[:last])


def _completion(row: Mapping[str, Any], answer_after: Optional[str] = None) -> Prompted:
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, list):  # TRL's conversational prompt/completion
        answers = [text for role, text in _turns(completion) if role in ASSISTANT]
        if not answers:
            raise ValueError("no assistant turn in completion")
        return Prompted(_rendered(_turns(prompt)), answers[-1], " ", _turns(prompt))
    return Prompted(_text_of(prompt, "prompt"), _text_of(completion, "completion"), "")


def _alpaca(row: Mapping[str, Any], answer_after: Optional[str] = None) -> Prompted:
    instruction, given = _text_of(row["instruction"], "instruction"), row.get("input") or ""
    template = ALPACA if str(given).strip() else ALPACA_NO_INPUT
    return Prompted(template.format(instruction=instruction, input=given), _text_of(row["output"], "output"), "")


def _text(row: Mapping[str, Any], answer_after: Optional[str] = None) -> Prompted:
    text = _text_of(row["text"], "text")
    prompt, found, answer = text.rpartition(answer_after)
    if not found:
        raise ValueError(f"no {answer_after!r} ({ANSWER_AFTER_KEY}) in its text")
    return Prompted(prompt + found, answer, "")


def _turns(value: Any) -> List[Tuple[str, str]]:
    """Chat turns as (role, text), from OpenAI's {"role", "content"} or ShareGPT's {"from", "value"}."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of turns, got {type(value).__name__}")
    turns = []
    for turn in value:
        if not isinstance(turn, Mapping):
            raise ValueError(f"a turn is {type(turn).__name__}, not an object")
        role, text = turn.get("role", turn.get("from")), turn.get("content", turn.get("value"))
        if not isinstance(role, str) or not isinstance(text, str):
            raise ValueError(f"a turn without role and content: keys {sorted(turn)}")
        turns.append((role.lower(), text))
    return turns


def _rendered(turns: Sequence[Tuple[str, str]]) -> str:
    """The turns before the answer, then the assistant's cue: ``User: …\n\nAssistant:``."""
    blocks = [f"{CHAT_ROLES.get(role, role.capitalize())}: {text}" for role, text in turns]
    return "\n\n".join([*blocks, f"{CHAT_ROLES['assistant']}:"])


def _text_of(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key} is {type(value).__name__}, not text")
    return value


def _instance(
    layout: Callable[..., Prompted], row: Mapping[str, Any], answer_after: Optional[str], where: str, tokenizer=None
) -> Instance:
    try:
        prompted = layout(row, answer_after)
    except (ValueError, KeyError) as error:
        raise UserError(f"probe {where}: {error}") from None
    if not prompted.answer.strip():
        raise UserError(f"probe {where}: the answer is empty")
    if tokenizer is None:
        prompt = prompted.prompt
        return Instance(prompt, (join(prompt, prompted.answer, prompted.delimiter),), 0, GENERATION, format=GENERATION)
    turns = prompted.turns if prompted.turns is not None else [("user", prompted.prompt)]
    messages = [{"role": TEMPLATE_ROLES.get(role, role), "content": text} for role, text in turns]
    try:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # the template's own check (a role it does not take, turns out of order)
        raise UserError(f"probe {where}: the model's chat template refused the row ({error})") from None
    return Instance(prompt, (prompted.answer,), 0, GENERATION, format=GENERATION)  # lm-eval's chat delimiter: none
