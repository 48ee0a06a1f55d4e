"""Probes from a model card: the lm-eval tasks a local model folder's README.md names.

A card's YAML front matter may name ``datasets:`` (hub dataset ids) and ``model-index`` results,
each with its ``dataset: {type, config}`` and ``metrics: [{type}]``. A reference becomes a
proposed probe where a task is found for it, offline (the shipped tasks, then lm-eval's own index,
read without downloading anything):

- a task or group named as the dataset and its config are, where the card names a config;
- a task built on that dataset (lm-eval's ``dataset_path``, with or without its namespace) and
  config (``ai2_arc`` + ``ARC-Challenge`` -> ``arc_challenge``): the one whose metric or name the
  card's metric names, then the shortest name. A dataset without a config whose tasks span several
  configs is ambiguous there;
- a task or group named as the dataset is (``openai/gsm8k`` -> ``gsm8k``, ``cais/mmlu`` -> the
  ``mmlu`` group; a tag, several tasks without one score, is not taken). Without a config this
  comes first.

Results come first (they say what the model was scored on), then ``datasets:``. The precheck prints
the proposals (``measuring.card_probes``); ``--probes-from-card`` asks the first for a model without
a probe.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

CARD = "README.md"


@dataclass(frozen=True)
class Reference:
    dataset: str  # a hub dataset id or name, as the card writes it
    config: Optional[str] = None
    metric: Optional[str] = None


def front_matter(readme: Path) -> Dict[str, Any]:
    """The YAML between a card's opening ``---`` lines; {} where there is none, or it does not parse
    (a card is a hint, never a reason to stop)."""
    import yaml

    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        return {}
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def references(meta: Mapping[str, Any]) -> List[Reference]:
    """What a card's front matter names: its model-index results, then its ``datasets:``."""
    found = list(_results(meta.get("model-index")))
    datasets = meta.get("datasets")
    for dataset in [datasets] if isinstance(datasets, str) else datasets if isinstance(datasets, list) else []:
        if isinstance(dataset, str) and dataset.strip():
            found.append(Reference(dataset.strip()))
    return list(dict.fromkeys(found))


def _results(index: Any) -> Iterator[Reference]:
    for model in index if isinstance(index, list) else []:
        for result in (model.get("results") if isinstance(model, dict) else None) or []:
            dataset = result.get("dataset") if isinstance(result, dict) else None
            if not isinstance(dataset, dict) or not isinstance(dataset.get("type"), str):
                continue
            metrics = [m.get("type") for m in result.get("metrics") or [] if isinstance(m, dict)]
            config = dataset.get("config")
            yield Reference(
                dataset["type"],
                config if isinstance(config, str) else None,
                next((m for m in metrics if isinstance(m, str)), None),
            )


def proposed(folder: Path) -> List[str]:
    """The tasks a model folder's card names (``references``), each once, in the card's order."""
    readme = Path(folder) / CARD
    found = references(front_matter(readme)) if readme.is_file() else []
    tasks = (task_for(reference) for reference in found)
    return list(dict.fromkeys(t for t in tasks if t is not None))


def task_for(reference: Reference) -> Optional[str]:
    """The task that scores ``reference``'s dataset (the module's rules), or None."""
    short = _name(reference.dataset.rsplit("/", 1)[-1])
    if reference.config:  # the config says which of the dataset's tasks: named for both, else built on both
        return _named(f"{short}_{_name(reference.config)}") or _built_on(reference) or _named(short)
    return _named(short) or _built_on(reference)


def _named(name: str) -> Optional[str]:
    """``name`` where the shipped tasks or lm-eval have a task or group of that name (a tag, which
    stands for several tasks and no one score, is not one)."""
    if name in _shipped():
        return name
    entry = _lm_eval_index().get(name)
    return name if entry is not None and entry.kind.name != "TAG" else None


def _built_on(reference: Reference) -> Optional[str]:
    wanted, short = reference.dataset.lower(), reference.dataset.lower().rsplit("/", 1)[-1]
    hits = []
    for name, entry in _lm_eval_index().items():
        config = entry.cfg or {}
        path = str(config.get("dataset_path") or "").lower()
        if not path or (path != wanted and path.rsplit("/", 1)[-1] != short):
            continue
        subset = str(config.get("dataset_name") or "")
        if reference.config and subset.lower() != reference.config.lower():
            continue
        metrics = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
        hits.append((name, subset, metrics))
    if not hits or len({subset for _, subset, _ in hits}) > 1:
        return None  # none, or several configs and the card says none of them
    metric = reference.metric

    def rank(hit):
        name, _, metrics = hit
        named = metric is not None and (metric in metrics or metric.lower() in name)
        return (not named, len(name), name)

    return min(hits, key=rank)[0]


def _name(text: str) -> str:
    return text.strip().lower().replace("-", "_").replace(" ", "_")


@functools.lru_cache(maxsize=None)
def _shipped() -> frozenset:
    from mergekit_mergeability.tasks.lmeval import shipped_tasks

    names = set()
    for path in shipped_tasks().glob("*.yaml"):
        names.update(
            line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("task:")
        )
    return frozenset(names)


def _lm_eval_index() -> Dict[str, Any]:
    """lm-eval's index of its own tasks (seconds, once per process: ``lmeval`` keeps the manager)."""
    from mergekit_mergeability.tasks import lmeval

    with lmeval.quiet_harness():
        return lmeval._manager(None, True).task_index


def card_probes(folders: Mapping[str, Optional[Path]]) -> Dict[str, List[str]]:
    """Model -> the tasks its folder's card proposes, for the models given a folder (None: a hub
    model, read nowhere); models whose card proposes none are left out."""
    found = {model: proposed(folder) for model, folder in folders.items() if folder is not None}
    return {model: tasks for model, tasks in found.items() if tasks}


def said(model: str, tasks: List[str], used: bool) -> str:
    """The line the precheck prints for a model's card: the probe line to add, or the one asked."""
    also = f"   # also on its card: {', '.join(tasks[1:])}" if len(tasks) > 1 else ""
    if used:
        return f"{model}: probe from its model card (--probes-from-card): {tasks[0]}{also}"
    return (
        f"{model}: its model card names lm-eval tasks; add next to its model: (or pass --probes-from-card)\n"
        f"    probe: {tasks[0]}{also}"
    )
