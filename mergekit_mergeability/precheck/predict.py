"""From signals to a prediction per model and a verdict per merge.

Predicted mergeability (a prior, hand-set from the research digest; check it on
your own pool with ``mergekit-mergeability validate``):

    knowledge  k_i = (accuracy_i + 1 − mean_gap_i) / 2          base knowledge of model i's probes
    size       s_i = min(1, ‖τ_i‖ / (2 · median_j ‖τ_j‖))        large updates merge worse
    predicted      = 0.7 · k_i + 0.3 · (1 − s_i)                 (k_i alone without weights; 1 − s_i alone without probes)

Verdict, first match wins:
1. ``do_not_merge``: an error finding (incompatible shapes, NaN/Inf), or the
   models' representations diverge from the first block on (nothing shared).
2. ``layer_selective``: CKA between the fine-tunes falls and stays below the
   threshold before the last layer (median over pairs): merge the blocks below, take the rest from
   one model (the base unless the config marks ``upper``).
3. ``knowledge_weighted``: some model is predicted below 0.5 and base accuracy
   spreads by ≥ 0.2 across models: weight the weakly-known ones up.
4. ``merge_as_configured``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from mergekit_mergeability.maths.cka import shared_depth

KNOWLEDGE_SHARE = 0.7
LOW_PREDICTION = 0.5
KNOWLEDGE_SPREAD = 0.2

MERGE_AS_CONFIGURED, KNOWLEDGE_WEIGHTED, LAYER_SELECTIVE, DO_NOT_MERGE = (
    "merge_as_configured",
    "knowledge_weighted",
    "layer_selective",
    "do_not_merge",
)


@dataclass
class Prediction:
    value: Optional[float]
    reasons: List[str] = field(default_factory=list)


@dataclass
class Recommendation:
    verdict: str
    method: Optional[str]
    cutoff: Optional[int] = None
    knowledge: Dict[str, float] = field(default_factory=dict)
    reasons: List[str] = field(default_factory=list)


def knowledge_score(accuracy: float, mean_gap: float) -> float:
    return (accuracy + 1 - mean_gap) / 2


def predict(knowledge: Dict[str, Optional[dict]], norms: Dict[str, Optional[float]]) -> Dict[str, Prediction]:
    known_norms = [n for n in norms.values() if n is not None]
    median = statistics.median(known_norms) if known_norms else None
    predictions = {}
    for model in knowledge:
        reasons = []
        k = s = None
        if knowledge[model] is not None:
            scores = knowledge[model]
            k = knowledge_score(scores["accuracy"], scores["mean_gap"])
            level = "well" if k >= 0.75 else "partly" if k >= 0.5 else "weakly"
            reasons.append(f"base knows its probes {level}: accuracy {scores['accuracy']:.2f}, mean gap {scores['mean_gap']:.2f}")
        else:
            reasons.append("no probe data: knowledge unknown")
        if norms.get(model) is not None and median:
            s = min(1.0, norms[model] / (2 * median))
            ratio = norms[model] / median
            if ratio >= 1.5 or ratio <= 0.67:
                reasons.append(f"update norm {ratio:.2f}× the median: {'large updates merge worse' if ratio > 1 else 'small update'}")
        if k is not None and s is not None:
            value = KNOWLEDGE_SHARE * k + (1 - KNOWLEDGE_SHARE) * (1 - s)
        else:
            value = k if k is not None else (1 - s if s is not None else None)
        predictions[model] = Prediction(value, reasons)
    return predictions


def divergence_curve(curves: Dict[tuple, Sequence[float]], base: Optional[str]) -> List[float]:
    """Per layer, the median CKA over pairs of fine-tunes (base vs fine-tune when there is
    one fine-tune): the typical pair, so one odd pair in a large pool does not decide."""
    between = [c for (a, b), c in curves.items() if base not in (a, b)] or list(curves.values())
    return [statistics.median(values) for values in zip(*between)] if between else []


def cutoff_from_curve(curve: Sequence[float], threshold: float) -> Optional[int]:
    """Blocks whose outputs are still shared; None when nothing diverges.

    Index i of the curve is the output of block i − 1 (0: embeddings). If the
    curve settles below the threshold from index i, block i − 1 is where the
    models part: blocks 0 … i − 2 are merged, so the cut-off is i − 1.
    """
    curve = [v for v in curve if v == v]  # layers not computed (--layers) are NaN
    if not curve:
        return None
    first_diverged = shared_depth(curve, threshold)
    return None if first_diverged >= len(curve) else max(first_diverged - 1, 0)


def recommend(
    method: str,
    predictions: Dict[str, Prediction],
    knowledge: Dict[str, Optional[dict]],
    cutoff: Optional[int],
    errors: Sequence[str],
) -> Recommendation:
    if errors:
        return Recommendation(DO_NOT_MERGE, None, reasons=list(errors))
    if cutoff == 0:
        return Recommendation(DO_NOT_MERGE, None, 0, reasons=["representations diverge from the first block: nothing is shared to merge"])
    if cutoff is not None:
        reason = f"representations stay shared up to block {cutoff - 1} and diverge above: merge blocks 0–{cutoff - 1} only"
        return Recommendation(LAYER_SELECTIVE, "layer_selective", cutoff, reasons=[reason])
    accuracies = {m: k["accuracy"] for m, k in knowledge.items() if k is not None}
    weak = [m for m, p in predictions.items() if p.value is not None and p.value < LOW_PREDICTION]
    spread = max(accuracies.values()) - min(accuracies.values()) if len(accuracies) > 1 else 0.0
    if weak and spread >= KNOWLEDGE_SPREAD and len(accuracies) == len(knowledge):
        reason = f"{len(weak)} model(s) predicted below {LOW_PREDICTION} and base accuracy spreads by {spread:.2f}: weight them up"
        return Recommendation(KNOWLEDGE_WEIGHTED, "knowledge_weighted", knowledge=accuracies, reasons=[reason])
    return Recommendation(MERGE_AS_CONFIGURED, method, reasons=["no signal of a loss that another method would avoid"])
