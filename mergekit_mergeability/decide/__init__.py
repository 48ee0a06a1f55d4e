"""From measurements to a decision, no I/O: per model the calibration's features (``features``) and
its predicted mergeability (``calibration``), capped by what the configured merge keeps of its
update; per merge the layer cut-off and the verdict (``verdict``). ``advice`` writes a verdict as
the configs a user runs. ``decide`` takes every step; the precheck's report only writes it down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from mergekit_mergeability.decide.calibration import Calibration
    from mergekit_mergeability.decide.features import Features
    from mergekit_mergeability.decide.verdict import MethodChoice, Prediction, Recommendation

Pair = Tuple[str, str]


@dataclass
class Decision:
    """Everything the precheck decided, and what it decided on."""

    calibration: Calibration
    features: Dict[str, Features]  # per expert
    kept: Dict[str, float]  # per expert: the share of its update the configured merge keeps along it
    predictions: Dict[str, Prediction]  # per expert: calibrated, then capped by ``kept``
    outside: Dict[str, List[str]]  # per expert: where it lies outside the calibration's domain
    threshold: float  # CKA's, and the level below which its curve counts as diverged
    effective_threshold: Optional[float]
    curve: List[float]  # CKA per layer, the median over pairs of fine-tunes
    overlap: List[float]  # the group-specific neurons' overlap per block, likewise
    overlap_threshold: float
    selectivity_cutoff: Optional[int]  # the cut-off the overlap alone would set
    signal: str  # the cut-off signal asked for: cka, selectivity or both
    cutoff: Optional[int]
    decided_by: Optional[str]  # the signal that set the cut-off
    recommendation: Recommendation
    weights: Optional[Dict[str, float]]  # the shares the advice gives (knowledge_weighted), else the configured weights
    against_ties: Optional[Tuple[float, float]] = None  # mean score: knowledge_weighted, TIES
    against_ties_by: Optional[str] = None  # REHEARSED (both merges asked the probes) or PREDICTED (the planner's)


def decide(
    experts: Sequence[Mapping[str, Any]],
    calibration: Calibration,
    configured: Mapping[str, float],
    cosines: Mapping[Pair, float],
    cka: Mapping[Pair, Sequence[float]],
    overlaps: Mapping[Pair, Sequence[float]],
    *,
    base: Optional[str],
    method: str,
    errors: Sequence[str],
    threshold: float,
    overlap_threshold: float,
    signal: str,
    label: Callable[[str], str] = str,
    against_ties: Optional[Tuple[float, float]] = None,
    choice: Optional[MethodChoice] = None,
) -> Decision:
    """The decision on a pool's measurements.

    ``experts``: per expert its ``path``, ``role`` and the ``knowledge`` and ``weights`` metrics
    (as precheck.json's ``models``); ``configured``: each expert's configured weight; ``cosines``:
    the task-vector cosine per pair; ``cka`` and ``overlaps``: per pair, per layer, the unbiased CKA
    and the group-specific neurons' overlap; ``errors``: the error findings (any: do_not_merge);
    ``label`` names a model in reasons; ``against_ties``: the experts' mean predicted score merged
    with knowledge_weighted's defaults and with TIES (``planner.decide``), None if not predicted;
    ``choice``: the config as written and the menu rehearsed (``verdict.choose_method``), which then
    chooses the method."""
    from mergekit_mergeability.decide.calibration import REHEARSAL, domain_check
    from mergekit_mergeability.records import WeightStats
    from mergekit_mergeability.decide.features import features, rehearsal_interval, rehearsal_stderr
    from mergekit_mergeability.decide.verdict import (
        RELATIVE_DROP,
        Prediction,
        derived,
        effective_threshold,
        kept_shares,
        layer_cut,
        predict,
        recommend,
    )

    table = features(experts)
    against_ties, against_ties_by = _against_ties(experts, against_ties)
    calibrated = {name: Prediction(*calibration.predict(values)) for name, values in table.items()}
    if calibration.reads_first == REHEARSAL:  # a prediction that is the rehearsal carries its probe's noise
        for model in experts:
            prediction = calibrated.get(model["path"])
            if prediction is not None and table[model["path"]].get(REHEARSAL) is not None:
                prediction.stderr, prediction.bounds = rehearsal_stderr(model), rehearsal_interval(model)
                if prediction.bounds is not None:
                    low, high = prediction.bounds
                    prediction.reasons[0] += f" (95% interval {low:.2f}–{high:.2f} over its probe's items)"
    norms = {m["path"]: WeightStats.of(m["weights"]).update_norm for m in experts if m["role"] == "expert"}
    kept = kept_shares(configured, norms, cosines)
    predictions = derived(predict(calibrated, kept), experts)
    outside = domain_check(calibration, experts, table)
    cut = layer_cut(experts, cka, overlaps, base, threshold, overlap_threshold, signal)
    known = {name: values[calibration.knowledge_feature] for name, values in table.items()}
    rehearsed = {n for n, v in table.items() if calibration.reads_first and v.get(calibration.reads_first) is not None}
    recommendation = recommend(
        method,
        predictions,
        known,
        cosines,
        cut.acting,
        errors,
        label=label,
        decided_by=cut.decided_by or "cka",
        against_ties=against_ties,
        against_ties_by=against_ties_by,
        grounded={n for n, k in known.items() if k is not None} | rehearsed,
        choice=choice,
    )
    if cut.void:
        recommendation.reasons.append(
            f"the representations part above block {cut.cutoff - 1}, but no expert's update reaches block {cut.cutoff} or"
            " above: keeping each expert's own blocks there would change nothing"
        )
    return Decision(
        calibration=calibration,
        features=table,
        kept=kept,
        predictions=predictions,
        outside=outside,
        threshold=threshold,
        effective_threshold=effective_threshold(cut.curve, threshold, RELATIVE_DROP) if cut.curve else None,
        curve=cut.curve,
        overlap=cut.overlap,
        overlap_threshold=overlap_threshold,
        selectivity_cutoff=cut.selectivity_cutoff,
        signal=signal,
        cutoff=cut.cutoff,
        decided_by=cut.decided_by,
        recommendation=recommendation,
        weights=_weights(recommendation, configured),
        against_ties=against_ties,
        against_ties_by=against_ties_by,
    )


REHEARSED, PREDICTED = "rehearsal", "conditional prediction"


def _against_ties(
    experts: Sequence[Mapping[str, Any]], predicted: Optional[Tuple[float, float]]
) -> Tuple[Optional[Tuple[float, float]], Optional[str]]:
    """knowledge_weighted's and TIES's mean score over the experts, and what says it: the two
    merges rehearsed (every expert's probe asked on both), else the planner's ``predicted`` one."""
    from mergekit_mergeability.decide.features import compared
    from mergekit_mergeability.maths.merging import COMPARED

    scored = [[compared(m, method) for method in COMPARED] for m in experts if m["role"] == "expert"]
    if scored and all(v is not None for row in scored for v in row):
        return tuple(sum(column) / len(column) for column in zip(*scored)), REHEARSED
    return predicted, None if predicted is None else PREDICTED


def _weights(recommendation: Recommendation, configured: Mapping[str, float]) -> Optional[Dict[str, float]]:
    """The knowledge_weighted shares the advice gives, else the configured weights."""
    from mergekit_mergeability.decide.verdict import KNOWLEDGE_WEIGHTED

    if recommendation.method == KNOWLEDGE_WEIGHTED and recommendation.knowledge:
        from mergekit_mergeability.methods.knowledge_weighted import DEFAULT_TEMPERATURE, knowledge_weights

        names = list(recommendation.knowledge)
        shares = knowledge_weights(
            [recommendation.knowledge[n] for n in names], DEFAULT_TEMPERATURE, [configured.get(n, 1.0) for n in names]
        )
        return {n: float(w) for n, w in zip(names, shares)}
    return dict(configured) or None
