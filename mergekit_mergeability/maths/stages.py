"""The three stages of interpolating two models, found on measured curves (paper 2,
"Revisiting Model Interpolation for Efficient Reasoning", arXiv 2510.10977).

Along θ(λ) = λ·θ_B + (1 − λ)·θ_A the curves of marker rate (the share of answers
containing ``</think>``) and accuracy move through three stages:

1. A-like: few answers carry the marker; accuracy near A's;
2. the transition: the marker rate and accuracy jump;
3. B-like: the curves have flattened at B's values.

A curve *jumps* when its two ends (the smallest and largest λ) differ by at least
``MIN_JUMP``. The *leading* curve is the marker rate if it jumps, else accuracy.
Stage 2 starts at the first λ where the leading curve has made ``START`` of its move
from its start value to its end value; stage 3 at the first λ from which every
jumping curve stays at ``FLAT`` of its move or beyond. The *transition* is the
interval between two neighbouring evaluated λ over which the leading curve moves
most; refinement halves the steepest interval of every jumping curve until each is at
most 2 × resolution wide, so the transition is located to ± resolution.
Curves are given as name → one value per λ, λ ascending.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

MIN_JUMP = 0.2  # e.g. 20 points of accuracy, or a fifth of the answers gaining the marker
START = 0.1
FLAT = 0.9
CURVES = ("marker_rate", "accuracy")  # in order of precedence for the leading curve
DIGITS = 6  # λ values are rounded to this many decimals, so a midpoint is one cache key

Curves = Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class Stages:
    jumping: Tuple[str, ...]  # the curves that move by MIN_JUMP or more
    leading: Optional[str]  # None: nothing jumps, no transition
    stage2: Optional[float] = None  # the first λ of stage 2
    stage3: Optional[float] = None  # the first λ of stage 3
    transition: Optional[Tuple[float, float]] = None  # where the leading curve moves most

    def stage(self, lam: float) -> Optional[int]:
        if self.leading is None:
            return None
        return 1 if lam < self.stage2 else 2 if lam < self.stage3 else 3


def progress(values: Sequence[float]) -> List[float]:
    """How far each value has moved from the first towards the last (0 at the start, 1 at the end)."""
    start, end = values[0], values[-1]
    return [(v - start) / (end - start) for v in values]


def jumping(curves: Curves) -> Tuple[str, ...]:
    return tuple(name for name in CURVES if name in curves and abs(curves[name][-1] - curves[name][0]) >= MIN_JUMP)


def steepest(lambdas: Sequence[float], values: Sequence[float]) -> Tuple[float, float]:
    """The neighbouring pair of λ between which ``values`` change most (the first such pair on ties)."""
    i = max(range(len(lambdas) - 1), key=lambda j: abs(values[j + 1] - values[j]))
    return lambdas[i], lambdas[i + 1]


def detect(lambdas: Sequence[float], curves: Curves) -> Stages:
    moving = jumping(curves)
    if not moving:
        return Stages(moving, None)
    leading = moving[0]
    lead = progress(curves[leading])
    stage2 = next(lam for lam, p in zip(lambdas, lead) if p >= START)
    settled = [all(p >= FLAT for name in moving for p in progress(curves[name])[i:]) for i in range(len(lambdas))]
    stage3 = lambdas[settled.index(True)]  # the last λ always qualifies: every progress ends at 1
    return Stages(moving, leading, stage2, stage3, steepest(lambdas, curves[leading]))


def midpoints(lambdas: Sequence[float], curves: Curves, resolution: float) -> List[float]:
    """Where to evaluate next: the middle of each jumping curve's steepest interval wider than
    2 × resolution."""
    wanted = set()
    for name in jumping(curves):
        low, high = steepest(lambdas, curves[name])
        if high - low > 2 * resolution + 10**-DIGITS:
            wanted.add(round((low + high) / 2, DIGITS))
    return sorted(wanted)


def refine(
    points: Dict[float, Mapping[str, float]],
    measure: Callable[[float], Mapping[str, float]],
    resolution: float,
    budget: int,
) -> List[float]:
    """Add points (λ → curve values, measured by ``measure``) where the curves change most,
    round by round, until every jumping curve's steepest interval is at most 2 × resolution
    wide or ``budget`` points were added. ``points`` grows in place; returns the added λ."""
    added: List[float] = []
    while len(added) < budget:
        lambdas = sorted(points)
        curves = {name: [points[lam][name] for lam in lambdas] for name in CURVES if name in points[lambdas[0]]}
        wanted = [lam for lam in midpoints(lambdas, curves, resolution) if lam not in points][: budget - len(added)]
        if not wanted:
            break
        for lam in wanted:
            points[lam] = measure(lam)
            added.append(lam)
    return added


def uniform_points(low: float, high: float, resolution: float) -> int:
    """How many λ a uniform grid needs to locate a transition to ± resolution: spacing 2 × resolution."""
    return math.floor((high - low) / (2 * resolution) + 10**-DIGITS) + 1


def per_token(accuracy: float, tokens: float) -> float:
    """Accuracy per token of answer; an empty answer counts as one token."""
    return accuracy / max(tokens, 1.0)


@dataclass(frozen=True)
class SweetSpot:
    lam: Optional[float]  # None: no λ qualifies (every answer is over the budget)
    reason: str


def sweet_spot(
    lambdas: Sequence[float],
    accuracy: Sequence[float],
    tokens: Sequence[float],
    tolerance: float,
    budget: Optional[float] = None,
) -> SweetSpot:
    """With ``budget``: the best accuracy among the λ whose answers average at most that many
    tokens (fewer tokens break ties). Without: the most accuracy per token among the λ within
    ``tolerance`` of the best accuracy. Accuracy per token over every λ would crown a model
    that answers in one token and is always wrong; the paper's sweet spot matches the best
    accuracy with fewer tokens."""
    rows = list(zip(lambdas, accuracy, tokens))
    if budget is not None:
        within = [r for r in rows if r[2] <= budget]
        if not within:
            fewest = min(rows, key=lambda r: r[2])
            return SweetSpot(
                None, f"no λ answers within {budget:g} tokens on average (fewest: {fewest[2]:.1f} at λ = {fewest[0]:g})"
            )
        lam = max(within, key=lambda r: (r[1], -r[2]))[0]
        return SweetSpot(lam, f"the best accuracy within {budget:g} tokens per answer")
    best = max(accuracy)
    matching = [r for r in rows if r[1] >= best - tolerance]
    lam = max(matching, key=lambda r: (per_token(r[1], r[2]), r[1]))[0]
    return SweetSpot(
        lam, f"the most accuracy per token among the λ within {tolerance:g} of the best accuracy ({best:.2f})"
    )
