"""Task specs → lm-eval tasks. The same specs as probes (``tasks.probes``):

- a JSONL probe file becomes an in-memory lm-eval task config (multiple choice →
  ``acc``; generation → ``exact_match``), so a model's probe is also its task: its lines as
  ``probes`` renders them, shots from the model's ``fewshot:`` file included;
- ``chat: true`` runs the task with lm-eval's ``apply_chat_template`` (``Task.chat``);
- a task YAML is loaded with its folder as ``include_path``;
- a name is looked up in the shipped tasks (``configs/tasks``), then in lm-eval's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks.probes import (
    CODE,
    GENERATION,
    LM_EVAL,
    OPTIONS,
    Instance,
    undelimited,
    existing_file,
    fewshot_file,
    join,
    json_rows,
    scored_lines,
)


def shipped_tasks() -> Path:
    from mergekit_mergeability.resources import shipped

    return shipped("tasks")


@dataclass(frozen=True)
class Task:
    name: str  # the lm-eval task name
    entry: Union[str, Dict[str, Any]]  # what TaskManager.load gets: a name or a config dict
    include_path: Optional[Path]
    fingerprint: str  # changes when the task's definition or data change
    defaults: bool = False  # index lm-eval's ~14k own tasks too (seconds): only for their names
    chat: bool = False  # asked through the model's chat template (lm-eval's apply_chat_template)

    def load(self):
        manager = _manager(str(self.include_path) if self.include_path else None, self.defaults)
        if isinstance(self.entry, str) and self.entry not in manager.all_tasks:
            from difflib import get_close_matches

            close = get_close_matches(self.entry, manager.all_tasks, n=1, cutoff=0.8)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(f"lm-eval task {self.entry!r} not found; {hint}list tasks with `lm_eval ls tasks`")
        return manager, self.entry

    def check(self) -> None:
        """Build the task (data included) once, so a bad spec fails before any model is scored.
        A group must declare how its tasks add up to one score (``aggregate_metric_list``)."""
        manager, entry = self.load()
        try:
            with quiet_harness():
                loaded = manager.load(entry)
        except Exception as error:  # lm-eval's and datasets' errors: the first line is what the user can act on
            raise UserError(
                f"lm-eval task {self.name!r}: cannot be loaded ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
            ) from None
        group = loaded["groups"].get(self.name)
        if group is not None and not group.aggregate_metric_list:
            raise UserError(
                f"lm-eval group {self.name!r} has no aggregate_metric_list, so no single score; add one, or name one of its tasks: {', '.join(sorted(loaded['tasks']))}"
            )
        if group is None and len(loaded["tasks"]) != 1:
            raise UserError(
                f"lm-eval tag {self.name!r} stands for {len(loaded['tasks'])} tasks; name one, or a group with an aggregate_metric_list"
            )


@functools.lru_cache(maxsize=None)
def _manager(include_path: Optional[str], defaults: bool):
    """One TaskManager per folder: indexing lm-eval's own tasks takes seconds, once is enough."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=defaults)


def resolve(
    spec: str, relative_to: Optional[Path] = None, what: str = "task", fewshot: Optional[str] = None, chat: bool = False
) -> Task:
    """The lm-eval task a spec names; ``fewshot``: the model's ``fewshot:`` file (a JSONL probe's
    shots), ``chat``: asked through the chat template."""
    task = _resolve(spec, relative_to, what, fewshot_file(fewshot, relative_to), chat)
    return replace(task, chat=True, fingerprint=f"{task.fingerprint}:chat") if chat else task


def _resolve(spec: str, relative_to: Optional[Path], what: str, fewshot: Optional[Path], chat: bool) -> Task:
    from mergekit_mergeability.tasks import sft

    if sft.located(spec, relative_to) is not None:  # read by the precheck itself: no lm-eval task scores it
        raise UserError(
            f"{what} {spec}: fine-tuning data is a precheck probe only; here give a .jsonl probe or an lm-eval task"
        )
    path = existing_file(spec, relative_to)
    if path is not None and path.suffix == ".jsonl":
        return _jsonl_task(path, fewshot, chat)
    if fewshot is not None:  # lm-eval's own shots: its fewshot_config, which a file here would not change
        raise UserError(
            f"fewshot {fewshot}: shots of a .jsonl probe; the lm-eval task {spec} takes its own from "
            "num_fewshot and fewshot_config in its YAML"
        )
    if path is not None and path.suffix in (".yaml", ".yml"):
        name = _declared_name(path)
        return Task(name, name, path.parent, f"{name}:{_digest(*sorted(path.parent.iterdir()))}")
    if path is None and not spec.endswith((".jsonl", ".yaml", ".yml")) and "/" not in spec:
        shipped = shipped_tasks()
        if any(_declares(y, spec) for y in shipped.glob("*.yaml")):
            return Task(spec, spec, shipped, f"{spec}:{_digest(*sorted(shipped.iterdir()))}")
        from importlib.metadata import version

        return Task(spec, spec, None, f"lm-eval {version('lm-eval')}:{spec}", defaults=True)
    raise UserError(f"{what} {spec}: no such file; give a .jsonl file, an lm-eval task YAML or an lm-eval task name")


def resolve_all(specs, config) -> Dict[str, Task]:
    """spec -> Task for every spec, each built once: any bad spec fails here, before work, naming the
    field of ``config`` (a ``MergeSpec``) that gives it; each asked as its entry says (``MergeSpec.asked``)."""
    asked = config.asked()
    fields = {
        probe: (config.entries.get(model) or config.fields.get(model, "model").removesuffix(".model")) + ".probe"
        for model, probe in config.probes.items()
    }
    resolved = {}
    for spec in specs:  # a --tasks or --probe spec says its option itself
        with config.naming(fields[spec]) if spec in fields else contextlib.nullcontext():
            resolved[spec] = resolve(spec, config.folder, "task", *asked.get(spec, (None, False)))
            resolved[spec].check()
    return resolved


def _declared_name(path: Path) -> str:
    """The task or group a YAML file declares, as lm-eval's own index of its folder reads it."""
    names = [
        e.name
        for e in _manager(str(path.parent), False).task_index.values()
        if e.yaml_path and Path(e.yaml_path).resolve() == path
    ]
    if not names:
        raise UserError(f"{path}: not an lm-eval task or group YAML (it needs a `task:` or `group:` name)")
    return names[0]


def _declares(yaml_file: Path, name: str) -> bool:
    return any(line.strip() == f"task: {name}" for line in yaml_file.read_text().splitlines())


def _multiple_choice(delimiter: str) -> Dict[str, Any]:
    """An lm-eval multiple-choice task over ``{prompt, choices, label}`` rows, metric acc; lm-eval
    puts ``delimiter`` between the prompt and each choice."""
    return {
        "output_type": "multiple_choice",
        "doc_to_text": "{{prompt}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "target_delimiter": delimiter,
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }


def write_task(folder: Path, name: str, instances: Sequence[Instance], delimiter: str = " ") -> Path:
    """``instances`` (prompts and choices as the precheck asks them) as the lm-eval multiple-choice
    task ``name`` in ``folder``: its data as JSONL beside its YAML (metric acc); the YAML's path.
    With ``delimiter`` "" the choices are scored exactly as given."""
    import yaml

    from mergekit_mergeability.files import write_atomic

    rows = [
        {"prompt": i.prompt, "choices": [c.removeprefix(delimiter) for c in i.continuations], "label": i.label}
        for i in instances
    ]
    data = write_atomic(Path(folder) / f"{name}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        **_multiple_choice(delimiter),
    }
    return write_atomic(Path(folder) / f"{name}.yaml", yaml.safe_dump(task, sort_keys=False))


def _jsonl_task(path: Path, fewshot: Optional[Path] = None, chat: bool = False) -> Task:
    rows = json_rows(path)  # a broken line: its file, line and column, before any work
    first = rows[0]
    name = f"{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    common = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(path)}},
        "test_split": "test",
    }
    if "choices" in first and _rendered(rows):
        # each line as ``probes`` renders it (its own format, its shots, its own prompt), each choice the
        # continuation the precheck scores whole (no delimiter added): what is scored is what the precheck asked
        config = {**common, **_multiple_choice("")}
        fingerprint = _digest(path, *([fewshot] if fewshot else [])) + json.dumps(config, sort_keys=True)
        docs = functools.partial(_scored_docs, str(path), fewshot and str(fewshot), chat)
        return Task(name, {**config, "process_docs": docs}, None, fingerprint)
    if "choices" in first:  # every line cloze: lm-eval renders it, as probes.cloze does
        label = "{{choices.index(label) if label is string else label}}"
        config = {
            **common,
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}\nAnswer:",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": label,
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
        return Task(name, config, None, _digest(path) + json.dumps(config, sort_keys=True))
    config = {
        **common,
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 32, "do_sample": False},
        "filter_list": [
            {
                "name": "strip",
                "filter": [{"function": "regex", "regex_pattern": r"^\s*(.*?)\s*$"}, {"function": "take_first"}],
            }
        ],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
    return Task(name, config, None, _digest(path) + json.dumps(config, sort_keys=True))


def _rendered(rows: List[Any]) -> bool:
    """Does some line of a JSONL probe ask for the options format, or carry its own prompt?"""
    return any(row.get("format") == OPTIONS or "prompt" in row for row in rows)


def _scored_docs(path: str, fewshot: Optional[str], chat: bool, dataset):
    """lm-eval's ``process_docs``: the probe's lines as ``probes.scored_lines`` renders them, each
    choice the whole continuation (the task's target delimiter is ""); under ``chat`` without the
    delimiter, as lm-eval's ``apply_chat_template`` scores a choice."""
    from datasets import Dataset

    rows = [
        {
            "prompt": i.prompt,
            "choices": [undelimited(i.prompt, c) if chat else c for c in i.continuations],
            "label": i.label,
        }
        for i in scored_lines(Path(path), fewshot and Path(fewshot))
    ]
    return Dataset.from_list(rows)


def _digest(*files: Path) -> str:
    digest = hashlib.sha256()
    for file in files:
        if file.is_file():
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


_quieted: list = []  # what the first open quiet_harness block put aside; one entry per block open


@contextlib.contextmanager
def quiet_harness():
    """Silence lm-eval's per-request progress bars, prints and `git` probe (file descriptor 2
    itself, and sys.stderr where something has replaced it). Nested or interleaved (a rehearsal's
    jobs each score a task, in turns, and end out of order), the first block opened silences and
    whichever closes last restores: a block of its own would hand back another's closed stream."""
    if not _quieted:
        sys.stderr.flush()
        null = open(os.devnull, "w")
        _quieted.append((sys.stdout, sys.stderr, os.dup(2), null))
        sys.stdout = sys.stderr = null
        os.dup2(null.fileno(), 2)
    else:
        _quieted.append(_quieted[0])
    try:
        yield
    finally:
        stdout, stderr, saved, null = _quieted.pop()
        if not _quieted:
            null.flush()
            sys.stdout, sys.stderr = stdout, stderr
            os.dup2(saved, 2)
            os.close(saved)
            null.close()


@contextlib.contextmanager
def compiled_templates():
    """Compile each of a task's Jinja templates once: lm-eval compiles its template again for every
    document it formats (``lm_eval.utils.apply_template``), most of the time a probe takes to build.
    The same Environment renders it, so the text is the same."""
    from lm_eval import utils

    compiled: Dict[str, Any] = {}

    def apply_template(template: str, doc: dict) -> str:
        if template not in compiled:
            compiled[template] = utils.env.from_string(template)
        return compiled[template].render(**doc)

    with while_open(utils, "apply_template", apply_template):
        yield


_open: Dict[Tuple[int, str], List[Any]] = {}  # (owner, attribute) -> [its own value, blocks open]


@contextlib.contextmanager
def while_open(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` while any block of it is open (the first one's), its own value back
    once the last closes: a rehearsal's jobs score tasks in turns and end out of order, where blocks
    that each put back what they found would leave another's value behind."""
    key = (id(owner), name)
    if key not in _open:
        _open[key] = [getattr(owner, name), 0]
        setattr(owner, name, value)
    _open[key][1] += 1
    try:
        yield
    finally:
        _open[key][1] -= 1
        if not _open[key][1]:
            setattr(owner, name, _open.pop(key)[0])


# (task name, fingerprint, limit) -> its instances. lm-eval builds a task, dataset included, on every
# load; models that share a probe share its instances (frozen, so sharing is safe).
_built: Dict[Tuple[str, str, Optional[int]], Tuple[Instance, ...]] = {}


def instances(task: Task, limit: Optional[int]) -> List[Instance]:
    """The first ``limit`` documents of an lm-eval task as probe instances, built once per process."""
    key = (task.name, task.fingerprint, limit)
    if key not in _built:
        _built[key] = tuple(_build_lm_eval(task, limit))
    return list(_built[key])


def _build_lm_eval(task, limit: Optional[int]) -> List[Instance]:
    tasks = list(_loaded(task)["tasks"].values())
    if len(tasks) != 1:
        raise UserError(f"lm-eval task {task.name!r} is a group of {len(tasks)} tasks; name one of them")
    return _first(tasks[0], limit)


def _loaded(task: Task) -> Dict[str, Any]:
    """lm-eval's load of ``task`` (its "tasks" and "groups"), each task's few-shot seed set as lm-eval sets it."""
    manager, entry = task.load()
    with quiet_harness():
        loaded = manager.load(entry)
    for built in loaded["tasks"].values():
        built.set_fewshot_seed(seed=1234)  # lm-eval's default fewshot seed
    return loaded


def _first(built, limit: Optional[int]) -> List[Instance]:
    with compiled_templates():
        return [_task_instance(built, doc) for doc in _documents(built, limit)]


def _documents(built, limit: Optional[int]) -> list:
    """The documents lm-eval scores with ``limit`` (the first ``limit``)."""
    docs = built.eval_docs
    return [docs[i] for i in range(len(docs) if limit is None else min(limit, len(docs)))]


PLAIN_METRICS = ("acc", "acc_norm")  # in the order lm-eval reports them


@dataclass(frozen=True)
class Plain:
    """A multiple-choice task whose every metric is a mean of acc or acc_norm, which this package
    reads as lm-eval does from the choices' summed log-probs alone (``diagnostics.task_scores.score_all``): its
    first ``limit`` items, its metrics, each item's choices' lengths in characters (acc_norm's divisor)."""

    instances: Tuple[Instance, ...]
    metrics: Tuple[str, ...]
    lengths: Tuple[Tuple[int, ...], ...]


_plain: Dict[Tuple[str, str, Optional[int]], Optional[Plain]] = {}


def plain(task: Task, limit: Optional[int]) -> Optional[Plain]:
    """``task`` as a ``Plain`` read, or None where only lm-eval's own run scores it as lm-eval does
    (a group, generation, chat, a filter, several targets, or any metric but a mean of acc, acc_norm)."""
    key = (task.name, task.fingerprint, limit)
    if key not in _plain:
        loaded = None if task.chat else _loaded(task)
        single = loaded is not None and not loaded["groups"] and len(loaded["tasks"]) == 1
        _plain[key] = _as_plain(next(iter(loaded["tasks"].values())), limit) if single else None
    return _plain[key]


def _as_plain(built, limit: Optional[int]) -> Optional[Plain]:
    from lm_eval.api.metrics import mean

    if built.OUTPUT_TYPE != "multiple_choice" or built.multiple_input or built.multiple_target:
        return None
    metrics = tuple(built._metric_fn_list)
    if not metrics or not set(metrics) <= set(PLAIN_METRICS) or built.config.filter_list:
        return None
    if any(built._aggregation_list[m] is not mean for m in metrics):
        return None
    with compiled_templates():
        lengths = tuple(tuple(len(c) for c in built.doc_to_choice(doc)) for doc in _documents(built, limit))
    try:
        instances = tuple(_first(built, limit))
    except ValueError:  # a gold answer not among its choices: lm-eval's run scores it 0, with a warning
        return None
    return Plain(instances, tuple(m for m in PLAIN_METRICS if m in metrics), lengths)


# where a code task's documents keep the reference solution: HumanEval's, MBPP's, most others'
SOLUTION_FIELDS = ("canonical_solution", "code", "solution")


def runs_code(built) -> bool:
    """Whether an lm-eval task scores by running the code a model writes (its ``unsafe_code``)."""
    return bool(getattr(built, "UNSAFE_CODE", False) or getattr(built.config, "unsafe_code", False))


_code: Dict[Tuple[str, str], bool] = {}


def scores_by_running_code(task: Task) -> bool:
    """Whether ``task`` (or a task of its group) runs the code a model writes to score it."""
    key = (task.name, task.fingerprint)
    if key not in _code:
        _code[key] = any(runs_code(built) for built in _loaded(task)["tasks"].values())
    return _code[key]


def _task_instance(task, doc) -> Instance:
    shots = task.config.num_fewshot or 0
    prompt = task.fewshot_context(doc, shots) if shots else task.doc_to_text(doc)
    if runs_code(task):  # its target is the tests that run the answer; the answer itself is the solution
        return Instance(prompt, (_solution(task, doc),), 0, GENERATION, format=CODE, shots=shots)
    target = task.doc_to_target(doc)
    delimiter = task.config.target_delimiter
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        label = target if isinstance(target, int) else choices.index(str(target))
        return Instance(prompt, tuple(join(prompt, c, delimiter) for c in choices), label, format=LM_EVAL, shots=shots)
    answer = target[0] if isinstance(target, list) else str(target)
    return Instance(prompt, (join(prompt, answer, delimiter),), 0, GENERATION, format=LM_EVAL, shots=shots)


def _solution(task, doc) -> str:
    """A code task's reference solution, which continues its prompt as a model's answer would."""
    for field in SOLUTION_FIELDS:
        if isinstance(doc.get(field), str):
            return doc[field]
    raise UserError(
        f"lm-eval task {task.config.task}: it scores by running code, and its documents give no reference"
        f" solution ({', '.join(SOLUTION_FIELDS)}) for the precheck to read instead; give the solutions"
        " as a .jsonl probe (prompt, answer)"
    )
