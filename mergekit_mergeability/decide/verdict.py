"""From signals to a prediction per model and a verdict per merge.

Predicted mergeability (``decide.calibration``): a monotone linear model of each
model's features (base knowledge, relative update size, interference with the pool),
fitted on measured pools by ``mergekit-mergeability calibrate``; the default one ships
with the package. It then is capped by what the configured merge keeps of the
model's own update along its direction:

    kept_i = (Σ_j w_j τ_j · τ_i) / (w_i ‖τ_i‖²)     1: untouched by the others, 0: cancelled
    predicted_i = min(calibrated_i, kept_i)          when kept_i < KEPT_CAP

Interference between two updates (cosine of their task vectors):
    ≤ CANCEL_COSINE (−0.9)    they cancel: the merge returns (nearly) the base → do_not_merge
    ≤ CONFLICT_COSINE (−0.3)  they pull against each other → elect signs (TIES)

Verdict, first match wins:
1. ``do_not_merge``: an error finding (incompatible models, NaN/Inf), a cancelling
   pair, or representations that diverge from the first block (nothing shared).
2. ``layer_selective``: the unbiased CKA between the fine-tunes (median over pairs) falls
   and stays below the threshold before the last layer, or drops by RELATIVE_DROP below
   the level of the shared lower blocks (the median of the lowest third compared),
   whichever is higher: merge the blocks below, and for each expert a model with its own
   blocks above (paper 3's layer patch). Opt-in (``cutoff_signal``): the Jaccard overlap
   of their group-specific neurons (LAPE) against its threshold, or the lower of the two
   cut-offs; the reasons name the signal.
   Where the menu was rehearsed, the patch was too (each member's probe on its own patched model:
   ``menu.patches``) and is the choice's baseline: a merge below (the config as written included)
   replaces it only where it keeps more on items it was not picked on (``by_rehearsal``).
   Where the menu was rehearsed (a config of 2 to 8 models, each with a probe, whose merge can be
   built in memory: ``choose_method``), it decides from here on: ``method_by_rehearsal``, the
   candidate (the menu: the mean merge, TIES, DARE-TIES, knowledge_weighted's defaults; then the
   knob grid of ``decide.tuning``) whose models keep most on their own probes, where its choice holds
   on items it was not made on (cross-fitted over two halves of every probe); else
   ``merge_as_configured``, with what the pick kept on the held-out halves said.
3. ``knowledge_weighted``: some model is predicted below 0.5 and the base's p(gold)
   spreads by ≥ 0.2 across models: weight the weakly-known ones up (on the measured
   families it lifted the weakest-known third most: README), if it scores more than TIES would:
   rehearsed where the precheck merged the whole config both ways and asked every probe on each
   (``dilution``), else the plan's conditional prediction (every expert merged each way; on the
   `options` family it kept less, 0.642 vs 0.711); else TIES (``sign_election``).
4. ``leave_out``: some model is predicted to lose its task, the prediction rests on
   measured knowledge or a rehearsal, and nothing above protects it: merge the others, keep it apart
   (one config gives it back as it is). Lost: predicted to score under LOST (0.3) on its
   own task once merged, or under LOW_PREDICTION and under half of what the others are predicted to score
   (their median). The second reading is there because a calibration's level moves with
   the pools it was fitted on (mean S 0.73 on one measured family, 0.50 on another) while
   its ranking transfers (docs/prediction.md): far below its partners is lost whatever the
   level. When every model is lost, leaving them all out is no merge: the verdicts below
   decide, and the recommended config names those tasks among what it drops.
5. ``sign_election``: a conflicting pair: mergekit's ``ties``.
6. ``merge_as_configured``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from mergekit_mergeability.maths.cka import shared_depth
from mergekit_mergeability.records import FluencyStats

LOW_PREDICTION = 0.5
LOST = 0.3  # predicted below this, a model's task is lost in the merge: never "nothing the precheck can predict"
# Or predicted under LOW_PREDICTION and under this share of the others' median: set a priori, not fitted.
RELATIVE_LOST = 0.5
# A fall this far below the shared lower blocks' CKA marks a divergence even above the
# absolute threshold (two fine-tunes at 1.0 below and 0.82 above have parted). Set before
# any pool was measured with it, not fitted.
RELATIVE_DROP = 0.15
KNOWLEDGE_SPREAD = 0.2
CANCEL_COSINE = -0.9
CONFLICT_COSINE = -0.3
KEPT_CAP = 0.75
# On the unbiased (minibatch) estimator, whose value does not drift with the number of
# probe rows: the demo's translators into different languages fall to 0.5–0.7 in their
# upper blocks, those into one language stay above 0.8 (README, "The layer cut-off").
DEFAULT_THRESHOLD = 0.8
# Opt-in (--cutoff-signal): the fine-tunes share under half of their group-specific neurons.
# A first guess, not fitted: paper 3 reports ≈ 0.12 where fine-tuning redistributed them.
DEFAULT_OVERLAP_THRESHOLD = 0.5

METHOD_BY_REHEARSAL = "method_by_rehearsal"
MERGE_AS_CONFIGURED, KNOWLEDGE_WEIGHTED, LAYER_SELECTIVE, LEAVE_OUT, SIGN_ELECTION, DO_NOT_MERGE = (
    "merge_as_configured",
    "knowledge_weighted",
    "layer_selective",
    "leave_out",
    "sign_election",
    "do_not_merge",
)
VERDICTS = (
    MERGE_AS_CONFIGURED,
    METHOD_BY_REHEARSAL,
    KNOWLEDGE_WEIGHTED,
    LAYER_SELECTIVE,
    LEAVE_OUT,
    SIGN_ELECTION,
    DO_NOT_MERGE,
)  # every verdict; precheck.schema.json lists the same
Pair = Tuple[str, str]
SHARED = {  # what a cut-off signal says is shared, in reasons
    "cka": "representations",
    "selectivity": "group-specific neurons (LAPE overlap)",
    "cka and selectivity": "representations and group-specific neurons",
}


@dataclass
class Prediction:
    value: Optional[float]
    reasons: List[str] = field(default_factory=list)
    stderr: Optional[float] = None  # where the value is the rehearsal: its standard error over the probe's items
    bounds: Optional[List[float]] = None  # and its 95% interval over them (Wilson's, ``dilution``)

    @property
    def interval(self) -> Optional[List[float]]:
        """Where the value is the rehearsal, its 95% interval over the probe's items: Wilson's, which
        a probe of n items all right leaves open below (value ± 1.96 standard errors would not)."""
        if self.value is None or self.bounds is None:
            return None
        return [float(b) for b in self.bounds]


AS_WRITTEN = "as_written"
PATCH = "layer patch"  # the candidate whose members are each read on their own layer patch (``menu.patches``)
# the merges rehearsed beside the config as written (``advice.menu`` writes each), by the method each runs
MENU = {"mean": "task_arithmetic", "ties": "ties", "dare_ties": "dare_ties", "knowledge_weighted": "knowledge_weighted"}


@dataclass
class MethodChoice:
    """The config as written, the menu and the knob grid, each merged in memory and every member's
    probe asked on it; the pick, and what it keeps on items it was not picked on."""

    kept: Dict[str, float]  # candidate -> the mean over members of each one's own-probe score
    per_model: Dict[str, Dict[str, float]]  # candidate -> member -> its own-probe score
    best: str  # the highest ``kept``
    margin: float  # best − as written, over all items
    interval: Tuple[float, float]  # paired bootstrap 95% over the probe items
    chosen: str  # best where the cross-fitted gain is above 0, else as written
    items: int  # probe items per candidate
    knowledge: Dict[str, float] = field(default_factory=dict)  # the base's p(gold) knowledge_weighted was given
    halves: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # candidate -> kept on half A, half B
    picked: Tuple[str, str] = (AS_WRITTEN, AS_WRITTEN)  # the pick on half A, on half B
    gain: float = 0.0  # cross-fitted: each half's pick read on the other half, minus as written
    gain_interval: Tuple[float, float] = (0.0, 0.0)
    runner_up: Optional[str] = None  # the second highest ``kept``
    items_to_separate: Optional[int] = None  # items per probe that would part best and runner-up, where they do not
    methods: Dict[str, str] = field(default_factory=dict)  # candidate -> the merge_method it writes
    baseline: str = AS_WRITTEN  # what the gain is measured against (plan: the best merge of everything)
    # the stepped choice (``parents`` given): each step's (candidate, what it must beat, margin, standard error)
    steps: List[Tuple[str, str, float, float]] = field(default_factory=list)


def halves(n: int) -> Tuple[List[int], List[int]]:
    """A probe's n items in two fixed halves (pre-registered: a seeded permutation, A its even
    positions, B its odd ones), so that a pick made on one can be read on the other."""
    import numpy as np

    order = np.random.default_rng(0).permutation(n).tolist()
    return sorted(order[::2]), sorted(order[1::2])


def choose_method(
    scores: Mapping[str, Mapping[str, Sequence[float]]],
    knowledge: Mapping[str, float] = {},
    methods: Mapping[str, str] = {},
    baseline: str = AS_WRITTEN,
    parents: Optional[Mapping[str, str]] = None,
    bound: Optional[float] = None,
    sure: bool = False,
) -> MethodChoice:
    """``scores``: candidate -> member -> its probe's items, each read as its task is scored, the
    ``baseline`` (the config as written) first and the rest in the order they were rehearsed. The
    candidate that keeps most on average over members, chosen over the baseline only where its
    choice holds on items it was not made on: each half of every probe picks a candidate, the pick
    is read on the other half, and the mean of those reads minus the baseline's (the cross-fitted
    gain) must be above 0 (research/pools/prereg/tuning.txt). A one-item probe lies in half A only.

    With ``parents`` (a knob's candidate -> the merge it varies) the choice is stepped instead
    (research/pools/prereg/tuning2.txt): the best of the baseline and the merges without a parent is
    chosen where its margin over the baseline is above one standard error, then the best of that
    choice's knobs where its margin over the choice is; the cross-fitted gain is still reported.

    With ``bound`` (z) each candidate's paired margin over the baseline is shrunk by z of its
    standard errors, and the candidate with the highest shrunk margin is chosen where it is above 0
    (research/pools/prereg/tuning3.txt); the cross-fitted gain is still reported.

    With ``sure`` the best is chosen only where the cross-fitted gain's 95% interval lies above 0,
    not the gain alone (plan's guard: research/pools/prereg/plan_guard.txt)."""
    from mergekit_mergeability.maths.stats import grouped_difference

    members = list(scores[baseline])
    order = list(scores)
    split = {m: halves(len(scores[baseline][m])) for m in members}

    def kept(candidate: str, half: Optional[int] = None) -> float:
        read = [
            scores[candidate][m] if half is None else [scores[candidate][m][i] for i in split[m][half]] for m in members
        ]
        return statistics.fmean(statistics.fmean(r) for r in read if r) if any(read) else 0.0

    def pick(table: Mapping[str, float]) -> str:  # a tie goes to the baseline, then the earlier
        return max(order, key=lambda c: (table[c], c == baseline, -order.index(c)))

    per_model = {c: {m: statistics.fmean(items[m]) for m in members} for c, items in scores.items()}
    whole = {c: statistics.fmean(values.values()) for c, values in per_model.items()}
    by_half = {c: (kept(c, 0), kept(c, 1)) for c in order}
    best = pick(whole)
    on_a, on_b = pick({c: v[0] for c, v in by_half.items()}), pick({c: v[1] for c, v in by_half.items()})
    crossed = [
        [scores[on_b if i in split[m][0] else on_a][m][i] for i in range(len(scores[baseline][m]))] for m in members
    ]
    written = [list(scores[baseline][m]) for m in members]
    gain, gain_interval = grouped_difference(crossed, written)
    margin, interval = grouped_difference([scores[best][m] for m in members], written)
    chosen = best if best != baseline and (gain_interval[0] if sure else gain) > 0 else baseline
    steps = [] if parents is None else _stepped(scores, whole, parents, baseline, members)
    if steps:
        chosen = steps[-1][0] if steps[-1][2] > steps[-1][3] else steps[-1][1]
    if bound is not None:
        chosen = _highest_lower_bound(scores, baseline, members, bound)
    items = sum(len(scores[baseline][m]) for m in members)
    runner_up = max((c for c in order if c != best), key=lambda c: (whole[c], -order.index(c)), default=None)
    return MethodChoice(
        whole,
        per_model,
        best,
        margin,
        interval,
        chosen,
        items,
        dict(knowledge),
        by_half,
        (on_a, on_b),
        gain,
        gain_interval,
        runner_up,
        None if runner_up is None else _items_to_separate(scores, best, runner_up, members),
        dict(methods),
        baseline,
        steps,
    )


def _stepped(scores, whole, parents: Mapping[str, str], baseline: str, members) -> List[Tuple[str, str, float, float]]:
    """The stepped choice's steps, each (the best candidate of the step, what it must beat, the
    paired margin, its standard error): the method among the baseline and the merges without a
    parent, then, where the method has knobs, the best of them against the method settled on."""
    from mergekit_mergeability.maths.stats import paired_margin

    order = list(scores)

    def step(pool, against: str) -> Tuple[str, str, float, float]:
        top = max(pool, key=lambda c: (whole[c], c == against, -order.index(c)))
        return (top, against, *paired_margin([scores[top][m] for m in members], [scores[against][m] for m in members]))

    first = step([c for c in order if c not in parents], baseline)
    settled = first[0] if first[0] != baseline and first[2] > first[3] else baseline
    knobs = [c for c in order if parents.get(c) == settled]
    return [first, step(knobs, settled)] if knobs else [first]


def _highest_lower_bound(scores, baseline: str, members, z: float) -> str:
    """The candidate whose paired margin over ``baseline``, less ``z`` standard errors, is highest
    and above 0 (ties to the earlier); else the baseline."""
    from mergekit_mergeability.maths.stats import paired_margin

    def shrunk(candidate: str) -> float:
        margin, error = paired_margin([scores[candidate][m] for m in members], [scores[baseline][m] for m in members])
        return margin - z * error

    bounds = {c: shrunk(c) for c in scores if c != baseline}
    top = max(bounds, key=lambda c: (bounds[c], -list(scores).index(c)), default=baseline)
    return top if top != baseline and bounds[top] > 0 else baseline


def _items_to_separate(scores, best: str, other: str, members: Sequence[str]) -> Optional[int]:
    """Items per probe at which the paired 95% interval of best − other would leave 0 (its
    bootstrap's spread shrinking as 1/√n); None where it already does, or where the two never differ."""
    from mergekit_mergeability.maths.stats import grouped_difference

    margin, (low, high) = grouped_difference([scores[best][m] for m in members], [scores[other][m] for m in members])
    if low > 0 or high < 0 or margin == 0:
        return None
    per_probe = statistics.fmean(len(scores[best][m]) for m in members)
    spread = (high - low) / (2 * 1.96)
    return math.ceil(per_probe * (1.96 * spread / abs(margin)) ** 2)


@dataclass
class Recommendation:
    verdict: str
    method: Optional[str]
    cutoff: Optional[int] = None
    knowledge: Dict[str, float] = field(default_factory=dict)
    reasons: List[str] = field(default_factory=list)
    pairs: List[Pair] = field(default_factory=list)  # the pairs the verdict is about (cancel, conflict)
    left_out: List[str] = field(default_factory=list)  # the models kept apart (leave_out)
    lost: List[str] = field(default_factory=list)  # predicted under LOST, yet merged: the advice names them as dropped
    choice: Optional[MethodChoice] = None  # the method chosen by rehearsal, where the menu was rehearsed


# A layer patch is void where every expert's update above its cut-off is under this share of the
# update's squared norm: float noise (a LoRA adapter's untouched blocks hold exactly 0).
VOID_SHARE = 1e-6


def patch_changes(experts: Sequence[Mapping[str, Any]], cutoff: int) -> bool:
    """Whether a layer patch at ``cutoff`` (the blocks below merged, each expert's own blocks from
    ``cutoff`` up, final norm and head kept) differs from merging everything: False only where every
    expert's update lies wholly in the blocks below (its per-block norms measured); a patch where no
    update reaches changes no weight. An updated embedding counts as reaching it: where the head is
    tied to the embedding, the patch keeps one expert's."""
    from mergekit_mergeability.records import WeightStats

    for expert in experts:
        stats = WeightStats.of(expert.get("weights"))
        if stats.update_norm is None or stats.layer_update_norm is None:
            return True
        below = sum(v * v for v in stats.layer_update_norm[:cutoff])
        if stats.update_norm**2 - below > VOID_SHARE * stats.update_norm**2:
            return True
    return False


def kept_shares(
    weights: Mapping[str, float], norms: Mapping[str, float], cosines: Mapping[Pair, float]
) -> Dict[str, float]:
    """kept_i = (Σ_j w_j τ_j · τ_i) / (w_i ‖τ_i‖²), from norms and pairwise cosines."""
    kept = {}
    for model, own in weights.items():
        if not own or not norms.get(model):
            continue
        along = own * norms[model] ** 2
        for (a, b), cosine in cosines.items():
            if model in (a, b):
                other = b if a == model else a
                along += weights.get(other, 0.0) * cosine * norms[model] * norms.get(other, 0.0)
        kept[model] = along / (own * norms[model] ** 2)
    return kept


def predict(calibrated: Mapping[str, Prediction], kept: Mapping[str, float]) -> Dict[str, Prediction]:
    """The calibrated predictions, capped where the configured merge keeps little of an update."""
    predictions = {}
    for model, prediction in calibrated.items():
        share = kept.get(model)
        if share is None or share >= KEPT_CAP or prediction.value is None:
            predictions[model] = prediction
            continue
        reason = f"the other updates cancel {1 - max(share, 0):.0%} of its own along its direction (kept {share:.2f})"
        predictions[model] = Prediction(min(prediction.value, max(share, 0.0)), [*prediction.reasons, reason])
    return predictions


def derived(predictions: Mapping[str, Prediction], experts: Sequence[Mapping[str, Any]]) -> Dict[str, Prediction]:
    """A model without a probe gets no prediction: what the precheck measured without one does not
    rank models (docs/prediction.md, "Without probes"). Its reason says what is known, under its own
    name: the share of its own shift on a shipped general text the merge as written keeps
    (``fluency``'s ``signature_kept``) and the merge's perplexity there. The others as they are."""
    found = dict(predictions)
    for model in experts:
        if unprobed(model) and model["path"] in found:
            found[model["path"]] = Prediction(None, [no_prediction(model)])
    return found


def unprobed(model: Mapping[str, Any]) -> bool:
    """A precheck model without a probe: none named, and nothing asked of one (``knowledge``, ``dilution``)."""
    return not model.get("probe") and model.get("knowledge") is None and model.get("dilution") is None


def no_prediction(model: Mapping[str, Any]) -> str:
    """The reason of a model without a probe: no prediction, and what was measured without one."""
    fluency = FluencyStats.of(model.get("fluency"))
    if fluency.signature_kept is None:
        return "no probe, no prediction: give it a probe"
    return (
        f"no probe, no prediction: the merge as written keeps {fluency.signature_kept:.2f} of its shift on a "
        f"general text (signature_kept), perplexity {fluency.merged_perplexity:.3g} there (base {fluency.base_perplexity:.3g})"
    )


def interference(cosines: Mapping[Pair, float]) -> Tuple[List[Pair], List[Pair]]:
    """(cancelling pairs, conflicting pairs), most opposed first."""
    ordered = sorted(cosines.items(), key=lambda item: item[1])
    cancelling = [pair for pair, c in ordered if c <= CANCEL_COSINE]
    conflicting = [pair for pair, c in ordered if CANCEL_COSINE < c <= CONFLICT_COSINE]
    return cancelling, conflicting


def divergence_curve(curves: Dict[tuple, Sequence[float]], base: Optional[str]) -> List[float]:
    """Per layer, the median over pairs of fine-tunes (base vs fine-tune when there is
    one fine-tune): the typical pair, so one odd pair in a large pool does not decide.
    Pairs without a value there (NaN) are left out; NaN where no pair has one."""
    between = [c for (a, b), c in curves.items() if base not in (a, b)] or list(curves.values())
    return [_median_of_measured(values) for values in zip(*between)] if between else []


def _median_of_measured(values: Sequence[float]) -> float:
    measured = [v for v in values if v == v]
    return statistics.median(measured) if measured else math.nan


def effective_threshold(
    curve: Sequence[Optional[float]], threshold: float, relative_drop: Optional[float] = RELATIVE_DROP
) -> float:
    """The level below which a curve counts as diverged: ``threshold``, or ``relative_drop``
    below the shared lower blocks (the median of the lowest third of the measured values),
    whichever is higher."""
    measured = [v for v in curve if v is not None and v == v]
    if relative_drop is None or not measured:
        return threshold
    reference = statistics.median(measured[: max(1, len(measured) // 3)])
    return max(threshold, reference - relative_drop)


def cutoff_from_curve(
    curve: Sequence[Optional[float]], threshold: float, offset: int = 1, relative_drop: Optional[float] = None
) -> Optional[int]:
    """Blocks whose outputs are still shared; None when nothing diverges.

    Index i of a CKA curve is the output of block i − 1 (0: embeddings): if the
    curve settles below the effective threshold (``effective_threshold``) from index
    i, block i − 1 is where the models part, blocks 0 … i − 2 are merged, so the
    cut-off is i − ``offset`` (1). A per-block curve (selectivity's overlap, index
    i = block i) takes ``offset`` 0. The precheck reads CKA with ``relative_drop``
    RELATIVE_DROP, the overlap without. Layers not compared
    (``--layers``, no specific neurons) are None or NaN; indices stay the model's own.
    """
    measured = [i for i, v in enumerate(curve) if v is not None and v == v]
    if not measured:
        return None
    first = shared_depth([curve[i] for i in measured], effective_threshold(curve, threshold, relative_drop))
    return None if first >= len(measured) else max(measured[first] - offset, 0)


def decide_cutoff(signal: str, cka: Optional[int], selectivity: Optional[int]) -> Tuple[Optional[int], Optional[str]]:
    """(cut-off, the signal that set it): ``cka`` or ``selectivity`` alone, or ``both``: the
    lower of the two (the first block where either signal sees the models part)."""
    found = {
        name: cut
        for name, cut in (("cka", cka), ("selectivity", selectivity))
        if signal in (name, "both") and cut is not None
    }
    if not found:
        return None, None
    lowest = min(found.values())
    return lowest, " and ".join(name for name, cut in found.items() if cut == lowest)


@dataclass
class Cut:
    """Where the fine-tunes' representations part (``layer_cut``), and whether a patch there acts."""

    curve: List[float]  # CKA per layer, the median over pairs of fine-tunes
    overlap: List[float]  # the group-specific neurons' overlap per block, likewise
    selectivity_cutoff: Optional[int]  # the cut-off the overlap alone would set
    cutoff: Optional[int]  # the cut-off the signal asked for sets
    decided_by: Optional[str]  # the signal that set it
    void: bool  # no expert's update reaches the cut-off: a patch there changes nothing

    @property
    def acting(self) -> Optional[int]:
        """The cut-off a layer patch is written at: None where there is none or it is void."""
        return None if self.void else self.cutoff


def layer_cut(
    experts: Sequence[Mapping[str, Any]],
    cka: Mapping[Pair, Sequence[float]],
    overlaps: Mapping[Pair, Sequence[float]],
    base: Optional[str],
    threshold: float = DEFAULT_THRESHOLD,
    overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD,
    signal: str = "cka",
) -> Cut:
    """The cut-off of ``signal`` on the curves over pairs of fine-tunes (``divergence_curve``;
    ``cutoff_from_curve``: CKA with RELATIVE_DROP, the overlap without), and whether any expert's
    update reaches it (``patch_changes``)."""
    curve, overlap = divergence_curve(cka, base), divergence_curve(overlaps, base)
    selectivity_cutoff = cutoff_from_curve(overlap, overlap_threshold, offset=0)
    cutoff, decided_by = decide_cutoff(
        signal, cutoff_from_curve(curve, threshold, relative_drop=RELATIVE_DROP), selectivity_cutoff
    )
    void = cutoff is not None and not patch_changes([m for m in experts if m["role"] == "expert"], cutoff)
    return Cut(curve, overlap, selectivity_cutoff, cutoff, decided_by, void)


def recommend(
    method: str,
    predictions: Dict[str, Prediction],
    knowledge: Dict[str, Optional[float]],
    cosines: Mapping[Pair, float],
    cutoff: Optional[int],
    errors: Sequence[str],
    label: Callable[[str], str] = str,
    decided_by: str = "cka",
    grounded: Optional[Set[str]] = None,
    against_ties: Optional[Tuple[float, float]] = None,
    against_ties_by: Optional[str] = None,
    choice: Optional[MethodChoice] = None,
) -> Recommendation:
    """``knowledge``: the base's p(gold) per model, as the calibration reads it (None without
    probes); ``label`` names a model in reasons; ``decided_by`` the signal that set the cut-off;
    ``grounded``: the models whose prediction may leave them out (None: those whose knowledge
    was measured; the precheck adds those it rehearsed: their prediction is measured too); ``against_ties``: the experts' mean predicted score with knowledge_weighted and
    with TIES, and ``against_ties_by`` what says so ("rehearsal": both merges asked the probes; else
    a prediction): knowledge_weighted is recommended only where it scores above TIES; ``choice``: the
    config as written and the menu rehearsed (a config of 2 to 8 models, each with a probe), which
    then chooses the method."""
    shared = SHARED[decided_by]
    if errors:
        return Recommendation(DO_NOT_MERGE, None, reasons=list(errors))
    cancelling, conflicting = interference(cosines)
    if cancelling:
        (a, b), *more = cancelling
        extra = f" (and {len(more)} more pair(s))" if more else ""
        reason = f"{label(a)} and {label(b)} cancel each other (task-vector cosine {cosines[a, b]:+.2f}){extra}: the merge would return (nearly) the base"
        return Recommendation(DO_NOT_MERGE, None, reasons=[reason], pairs=cancelling)
    if cutoff == 0:
        return Recommendation(
            DO_NOT_MERGE, None, 0, reasons=[f"{shared} diverge from the first block: nothing is shared to merge"]
        )
    if cutoff is not None:
        parted = f"{shared} stay shared up to block {cutoff - 1} and diverge above"
        patch = f"{parted}: merge blocks 0–{cutoff - 1}, keep each expert's own blocks above"
        if choice is None or choice.baseline != PATCH:
            return Recommendation(LAYER_SELECTIVE, "layer_selective", cutoff, reasons=[patch])
        chosen = by_rehearsal(choice, method, cutoff)  # the patch rehearsed: a merge replaces it where it holds
        if chosen.verdict == LAYER_SELECTIVE:
            chosen.reasons.insert(0, patch)
        else:
            chosen.reasons.append(f"{parted}, but a merge keeps more than the layer patch there")
        return chosen
    if choice is not None:
        return by_rehearsal(choice, method)
    known = {m: k for m, k in knowledge.items() if k is not None}
    weak = [m for m, p in predictions.items() if p.value is not None and p.value < LOW_PREDICTION]
    spread = max(known.values()) - min(known.values()) if len(known) > 1 else 0.0
    if weak and spread >= KNOWLEDGE_SPREAD and len(known) == len(knowledge):
        why = f"{len(weak)} model{'s' if len(weak) != 1 else ''} predicted below {LOW_PREDICTION} and the base's p(gold) spreads by {spread:.2f}"
        rehearsed = against_ties_by == "rehearsal"
        if against_ties is None or against_ties[0] > against_ties[1]:
            reason = f"{why}: weight the weakly-known ones up"
            if against_ties is not None:
                said = "rehearsed, it scores" if rehearsed else "predicted to score"
                reason += f" ({said} {against_ties[0]:.2f} on each task on average, TIES {against_ties[1]:.2f})"
            return Recommendation(KNOWLEDGE_WEIGHTED, "knowledge_weighted", knowledge=known, reasons=[reason])
        said = "rehearsed, knowledge_weighted scores" if rehearsed else "knowledge_weighted is predicted to score"
        level = "as much as" if f"{against_ties[0]:.2f}" == f"{against_ties[1]:.2f}" else "less than"
        reason = f"{why}, but {said} {against_ties[0]:.2f} on each task on average, {level} TIES ({against_ties[1]:.2f}): elect signs (TIES) instead"
        if method in ("ties", "dare_ties"):
            return Recommendation(MERGE_AS_CONFIGURED, method, reasons=[reason])
        return Recommendation(SIGN_ELECTION, "ties", reasons=[reason])
    grounded = set(known) if grounded is None else grounded
    lost = sorted((m for m in grounded if _lost(m, predictions)), key=lambda m: predictions[m].value)
    if lost:
        kept = [m for m in predictions if m not in lost]
        named = ", ".join(f"{label(m)} ({predictions[m].value:.2f})" for m in lost[:3]) + (
            f" and {len(lost) - 3} more" if len(lost) > 3 else ""
        )
        if kept:
            reason = f"{named} predicted to score under {LOST} on its own task in this merge, or under half of what the others score, and the base's knowledge does not spread enough to weight it up: merge the others, serve it apart"
            return Recommendation(LEAVE_OUT, method, reasons=[reason], left_out=lost)
        # every model lost: leaving them all out is no merge; say so beside whatever comes next
        warning = f"every model is predicted to score under {LOST} on its own task ({named}), and no other method is indicated: expect the merge to keep little of any"
        following = recommend(method, {}, {}, cosines, None, [], label, decided_by)
        reasons = [warning] if following.verdict == MERGE_AS_CONFIGURED else [f"{warning};", *following.reasons]
        return Recommendation(following.verdict, following.method, reasons=reasons, pairs=following.pairs, lost=lost)
    if conflicting and method not in ("ties", "dare_ties"):
        a, b = conflicting[0]
        reason = f"{label(a)} and {label(b)} pull against each other (task-vector cosine {cosines[a, b]:+.2f}): elect signs per entry (TIES)"
        return Recommendation(SIGN_ELECTION, "ties", reasons=[reason], pairs=conflicting)
    return Recommendation(MERGE_AS_CONFIGURED, method, reasons=["no signal of a loss that another method would avoid"])


def by_rehearsal(choice: MethodChoice, method: str, cutoff: Optional[int] = None) -> Recommendation:
    """The merge the rehearsal chose: a candidate over its baseline only where its choice holds
    beyond the probes' noise (``choose_method``). The baseline is the config as written, or, where
    the layer patch at ``cutoff`` was rehearsed, the patch: kept unless a merge beats it."""
    patched = choice.baseline == PATCH
    against = f"the layer patch at block {cutoff}" if patched else "the config as written"
    ranked = sorted(choice.kept.items(), key=lambda cv: -cv[1])
    listing = "; ".join(f"{c.replace('_', ' ')} {v:.2f}" for c, v in ranked[:4]) + (  # names hold commas
        f" … ({len(ranked)} merges)" if len(ranked) > 4 else ""
    )
    held_out = (
        f"picked on either half of each probe's items, {against} keeps the most there"
        if set(choice.picked) == {choice.baseline}  # nothing to read on the other half
        else f"picked on half of each probe's items and read on the other half, the pick keeps {choice.gain:+.3f} over"
        f" {against} (95% {choice.gain_interval[0]:+.3f} to {choice.gain_interval[1]:+.3f})"
    )
    best, chosen = choice.best.replace("_", " "), choice.chosen.replace("_", " ")
    if choice.items_to_separate:
        listing += (
            f"; the probes cannot tell {best} from {choice.runner_up.replace('_', ' ')}:"
            f" about {choice.items_to_separate} items per probe would"
        )
    if choice.chosen == choice.baseline:
        if choice.best == choice.baseline:
            reason = f"rehearsed, {against} keeps the most on its models' own probes ({listing})"
        else:
            reason = f"rehearsed, {best} keeps {choice.margin:+.3f} more than {against} on its models' own probes, but {held_out}: keep {against} ({listing})"
        if patched:
            return Recommendation(LAYER_SELECTIVE, "layer_selective", cutoff, reasons=[reason], choice=choice)
        return Recommendation(MERGE_AS_CONFIGURED, method, reasons=[reason], choice=choice)
    said = "for the patch" if patched else "as written"
    reason = f"rehearsed, {chosen} keeps {choice.kept[choice.chosen]:.2f} on its models' own probes against {choice.kept[choice.baseline]:.2f} {said}; {held_out} ({listing})"
    if choice.chosen == AS_WRITTEN:
        return Recommendation(MERGE_AS_CONFIGURED, method, reasons=[reason], choice=choice)
    knowledge = choice.knowledge if choice.chosen == "knowledge_weighted" else {}
    chosen_method = choice.methods.get(choice.chosen) or MENU[choice.chosen]
    return Recommendation(METHOD_BY_REHEARSAL, chosen_method, knowledge=knowledge, reasons=[reason], choice=choice)


def _lost(model: str, predictions: Mapping[str, Prediction]) -> bool:
    """Predicted to score under LOST on its own task once merged, or under LOW_PREDICTION and under RELATIVE_LOST
    of the others' median prediction."""
    value = predictions[model].value if model in predictions else None
    if value is None:
        return False
    others = [p.value for m, p in predictions.items() if m != model and p.value is not None]
    return value < LOST or (
        value < LOW_PREDICTION and bool(others) and value < RELATIVE_LOST * statistics.median(others)
    )
