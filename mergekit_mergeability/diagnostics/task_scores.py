"""A task scored by its own metric on a model in memory, as lm-eval scores it: the multiple-choice
tasks ``lmeval.plain`` accepts (every metric a mean of acc or acc_norm) read from their choices'
summed log-probs, 16 items a pass whatever their task; any other through lm-eval's own run
(``tasks.harness.score``). ``evaluate``, ``mergeability`` and ``plan`` score models with it, and the
dilution's rehearsal scores a member's lm-eval task probe with it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from mergekit_mergeability.diagnostics.activations import choice_logprobs
from mergekit_mergeability.maths.stats import standard_error
from mergekit_mergeability.tasks import harness, lmeval
from mergekit_mergeability.tasks.lmeval import Task


def score_all(
    model,
    tokenizer,
    tasks: Sequence[Task],
    limit: Optional[int] = None,
    batch_size: int = 16,
    device: str = "cpu",
    run_code: bool = False,
) -> List[Dict[str, Any]]:
    """``harness.score`` for each of ``tasks`` on one model. The multiple-choice tasks ``lmeval.plain``
    reads (a mean of acc or acc_norm) are asked together, 16 items a pass whatever their task
    (``choice_logprobs``), and scored as lm-eval scores them (``plain_score``); the others run
    through lm-eval's harness, one task at a time (a code task only with ``run_code``). lm-eval's
    own run costs about 0.8 s a task beyond its passes, more than a 16-item probe's passes on a
    small model."""
    read = [lmeval.plain(task, limit) for task in tasks]
    asked = [instance for found in read if found is not None for instance in found.instances]
    options = iter([scores for scores, _ in choice_logprobs(model, tokenizer, asked)])
    return [
        plain_score(found, [next(options) for _ in found.instances])
        if found is not None
        else harness.score(model, tokenizer, task, limit, batch_size, device, run_code)
        for task, found in zip(tasks, read)
    ]


def plain_score(task: lmeval.Plain, option_logprobs: Sequence) -> Dict[str, Any]:
    """``harness.score``'s result for a ``Plain`` task from each item's choices' summed log-probs, as
    lm-eval's multiple-choice ``process_results`` computes it: acc where the highest log-prob is the
    gold's, acc_norm where the highest per character is (the first such choice on a tie, as
    ``np.argmax``); each averaged over items, with lm-eval's stderr of a mean (None under 2 items)."""
    rows = {metric: [] for metric in task.metrics}
    for instance, lengths, scores in zip(task.instances, task.lengths, option_logprobs):
        lls = np.array([float(v) for v in scores])
        picked = {"acc": np.argmax(lls), "acc_norm": np.argmax(lls / np.array(lengths, dtype=float))}
        for metric in task.metrics:
            rows[metric].append(float(picked[metric] == instance.label))
    metrics = {metric: float(np.mean(values)) for metric, values in rows.items()}
    primary = task.metrics[0]
    values = rows[primary]
    return {
        "metrics": metrics,
        "primary": primary,
        "samples": len(values),
        "score": metrics[primary],
        "stderr": standard_error(values),
    }
