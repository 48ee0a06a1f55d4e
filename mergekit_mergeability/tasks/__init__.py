"""What a model is asked: probe files (``probes``) and lm-eval tasks (``lmeval``), one spec type,
and scoring through lm-eval in memory (``harness``).

A spec is a JSONL probe file, an lm-eval task YAML or an lm-eval task name: ``load`` gives its
instances as the precheck asks them, ``lmeval.resolve`` the lm-eval task that scores them.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks import lmeval, probes, sft
from mergekit_mergeability.tasks.probes import Instance, existing_file, fewshot_file, scored_lines


def scoring_task(
    spec: str, relative_to: Optional[Path] = None, fewshot: Optional[str] = None, chat: bool = False
) -> Optional[lmeval.Task]:
    """The lm-eval task a probe spec names (a task YAML, name or group), which scores it with its
    own metric (through the chat template under ``chat``); None for a JSONL probe file."""
    path = existing_file(spec, relative_to)
    if (path is not None and path.suffix == ".jsonl") or sft.located(spec, relative_to) is not None:
        return None
    return lmeval.resolve(spec, relative_to, "probe", fewshot, chat)


def load(
    spec: str,
    limit: Optional[int] = None,
    relative_to: Optional[Path] = None,
    fewshot: Optional[str] = None,
    answer_after: Optional[str] = None,
) -> List[Instance]:
    """The first ``limit`` instances of a probe spec (see ``probes``' docstring); ``fewshot``: the
    model's ``fewshot:`` file, whose lines are the shots of a JSONL probe's ``options`` lines;
    ``answer_after``: the marker that ends a ``text`` row's prompt in fine-tuning data."""
    path = existing_file(spec, relative_to)
    data = sft.located(spec, relative_to)  # fine-tuning data: its rows as generation probes (``sft``)
    if data is not None:
        instances = sft.load(data, limit, answer_after)
    elif path is not None and path.suffix == ".jsonl":
        instances = scored_lines(path, fewshot_file(fewshot, relative_to))[:limit]
    else:
        instances = lmeval.instances(lmeval.resolve(spec, relative_to, what="probe"), limit)
    if not instances:
        raise UserError(f"probe {spec}: no instances")
    return instances


def chatted(
    spec: str,
    instances: List[Instance],
    tokenizer,
    relative_to: Optional[Path] = None,
    limit: Optional[int] = None,
    answer_after: Optional[str] = None,
    where: str = "probe",
) -> List[Instance]:
    """A probe spec's ``instances`` asked through ``tokenizer``'s chat template (``chat: true``):
    fine-tuning data read again with each row's own turns through it (``sft``), anything else as
    ``probes.chatted`` asks it."""
    data = sft.located(spec, relative_to)
    if data is None or not getattr(tokenizer, "chat_template", None):  # no template: probes.chatted's error
        return probes.chatted(instances, tokenizer, where)
    return sft.load(data, limit, answer_after, tokenizer)
