"""How well the base model already knows a probe instance (Will it Merge?, arXiv 2601.06672).

Multiple choice, from the summed log-probability of each choice's continuation:
    p = softmax(choice log-probs);   gap = p(top) − p(gold)   (0 when the base is right)
Generation, from the teacher-forced distribution at each answer token t:
    gap = mean_t [p(top_t) − p(gold_t)];   correct = greedy decoding reproduces the answer
Both report the gold answer's summed log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List

import torch


@dataclass(frozen=True)
class InstanceKnowledge:
    gold_logprob: float
    gap: float
    correct: bool


@dataclass(frozen=True)
class TaskKnowledge:
    accuracy: float
    mean_gap: float
    mean_gold_logprob: float
    instances: int


def multiple_choice(choice_logprobs: torch.Tensor, label: int) -> InstanceKnowledge:
    probabilities = torch.softmax(choice_logprobs.double(), dim=0)
    top = int(torch.argmax(choice_logprobs))
    return InstanceKnowledge(
        gold_logprob=float(choice_logprobs[label]),
        gap=float(probabilities[top] - probabilities[label]),
        correct=top == label,
    )


def generation(token_logprobs: torch.Tensor, answer_ids: torch.Tensor) -> InstanceKnowledge:
    """``token_logprobs``: (answer tokens, vocab) log-probs predicting each answer token."""
    probabilities = token_logprobs.double().exp()
    gold = probabilities.gather(1, answer_ids[:, None]).squeeze(1)
    top = probabilities.max(dim=1)
    return InstanceKnowledge(
        gold_logprob=float(token_logprobs.gather(1, answer_ids[:, None]).sum()),
        gap=float((top.values - gold).mean()),
        correct=bool((top.indices == answer_ids).all()),
    )


def aggregate(scores: Iterable[InstanceKnowledge]) -> TaskKnowledge:
    scores: List[InstanceKnowledge] = list(scores)
    if not scores:
        raise ValueError("no probe instances to aggregate")
    n = len(scores)
    return TaskKnowledge(
        accuracy=sum(s.correct for s in scores) / n,
        mean_gap=sum(s.gap for s in scores) / n,
        mean_gold_logprob=sum(s.gold_logprob for s in scores) / n,
        instances=n,
    )
