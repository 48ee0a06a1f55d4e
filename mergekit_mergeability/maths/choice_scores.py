"""How well the base model already knows a probe instance (Will it Merge?, arXiv 2601.06672).

Multiple choice, from the summed log-probability of each option's text as a continuation:
    p = softmax(option log-probs);   p_gold = p[gold];   gap = p(top) − p(gold)   (0 when right)
    margin = log p(gold) − max_{j ≠ gold} log p(j)   (> 0 exactly when right)
The same from the options' letters is kept beside it (``letter_p_gold``).
Generation, from the teacher-forced distribution at each answer token t:
    p_gold = exp(mean_t log p(gold_t))   (per-token, geometric mean)
    gap = mean_t [p(top_t) − p(gold_t)];   correct = greedy decoding reproduces the answer
    margin = min_t [log p(gold_t) − max_{v ≠ gold_t} log p(v)]   (> 0 exactly when correct)
Both report the gold answer's summed log-probability and its number of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean
from typing import Iterable, List, Optional

import torch


@dataclass(frozen=True)
class InstanceKnowledge:
    p_gold: float
    gap: float
    correct: bool
    gold_logprob: float  # summed over the gold answer's tokens
    tokens: int = 1  # the gold answer's tokens (generation); 1 for multiple choice
    letter_p_gold: Optional[float] = None
    letter_correct: Optional[bool] = None
    margin: Optional[float] = None  # None with a single option


@dataclass(frozen=True)
class TaskKnowledge:
    accuracy: float
    mean_p_gold: float
    mean_gap: float
    mean_gold_logprob: float
    mean_gold_logprob_per_token: float
    letter_accuracy: Optional[float]
    mean_letter_p_gold: Optional[float]
    instances: int
    mean_margin: Optional[float] = None


def multiple_choice(
    option_logprobs: torch.Tensor, label: int, letter_logprobs: Optional[torch.Tensor] = None
) -> InstanceKnowledge:
    probabilities = torch.softmax(option_logprobs.double(), dim=0)
    top = int(torch.argmax(option_logprobs))
    letter = None if letter_logprobs is None else torch.softmax(letter_logprobs.double(), dim=0)
    return InstanceKnowledge(
        p_gold=float(probabilities[label]),
        gap=float(probabilities[top] - probabilities[label]),
        correct=top == label,
        gold_logprob=float(option_logprobs[label]),
        letter_p_gold=None if letter is None else float(letter[label]),
        letter_correct=None if letter is None else int(torch.argmax(letter)) == label,
        margin=float(_margins(option_logprobs, torch.tensor(label))) if len(option_logprobs) > 1 else None,
    )


def generation(token_logprobs: torch.Tensor, answer_ids: torch.Tensor) -> InstanceKnowledge:
    """``token_logprobs``: (answer tokens, vocab) log-probs predicting each answer token."""
    probabilities = token_logprobs.double().exp()
    gold = probabilities.gather(1, answer_ids[:, None]).squeeze(1)
    top = probabilities.max(dim=1)
    gold_logprob = float(token_logprobs.gather(1, answer_ids[:, None]).sum())
    tokens = len(answer_ids)
    return InstanceKnowledge(
        p_gold=math.exp(gold_logprob / tokens),
        gap=float((top.values - gold).mean()),
        correct=bool((top.indices == answer_ids).all()),
        gold_logprob=gold_logprob,
        tokens=tokens,
        margin=float(_margins(token_logprobs, answer_ids).min()),
    )


def _margins(logprobs: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """log p(gold) − the largest other log p, along the last dimension (``gold``: its index, per row)."""
    logprobs, gold = logprobs.double(), gold[..., None]
    return (logprobs.gather(-1, gold) - logprobs.scatter(-1, gold, -math.inf).amax(-1, keepdim=True)).squeeze(-1)


def aggregate(scores: Iterable[InstanceKnowledge]) -> TaskKnowledge:
    scores: List[InstanceKnowledge] = list(scores)
    if not scores:
        raise ValueError("no probe instances to aggregate")
    letters = [s for s in scores if s.letter_p_gold is not None]
    return TaskKnowledge(
        accuracy=fmean(s.correct for s in scores),
        mean_p_gold=fmean(s.p_gold for s in scores),
        mean_gap=fmean(s.gap for s in scores),
        mean_gold_logprob=fmean(s.gold_logprob for s in scores),
        mean_gold_logprob_per_token=fmean(s.gold_logprob / s.tokens for s in scores),
        letter_accuracy=fmean(bool(s.letter_correct) for s in letters) if letters else None,
        mean_letter_p_gold=fmean(s.letter_p_gold for s in letters) if letters else None,
        instances=len(scores),
        mean_margin=fmean(s.margin for s in scores) if all(s.margin is not None for s in scores) else None,
    )
