"""From a pool's measurements to a plan: the candidate merges, the search, the references.

No I/O: it receives a precheck report (as a dict) and a conditional calibration, and returns a
``Decision``. The objective, stated in every output:

    expected tasks kept = Σ_i  score_i,   score_i = the predicted own-task score of expert i in
                                          the merged model it is planned into; its own score if
                                          that model is itself alone; the base's own score on
                                          its task if it is in no model

against the same sum for: every expert merged as the config says, every expert merged with
TIES, each expert alone (the ceiling: one model per task), and nothing merged (the base).

Planned merges use the mean update (the members' weights sum to 1, ties' lambda 1,
knowledge_weighted's scale 1): the only size every measurement so far used. Knobs are the
methods' defaults (the measured settings) unless ``knobs="grid"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.planner import conditional
from mergekit_mergeability.planner.search import Result, search

DEFAULT_METHODS = (
    conditional.TASK_ARITHMETIC,
    conditional.TIES,
    conditional.KNOWLEDGE_WEIGHTED,
    conditional.LAYER_SELECTIVE,
)
TIES_DENSITY = 0.5  # the density the project measured TIES at (README, knowledge_weighted's defaults)
GRID = {"density": (0.3, 0.5, 0.7), "temperature": (0.1, 0.3, 1.0)}
REFERENCE = "reference: "  # the label's start of a plan that merges everything (``planning.references``)


def knowledge_defaults() -> Dict[str, Any]:
    """knowledge_weighted's defaults, as a recommended config writes them, named as ``conditional.Merge``'s knobs."""
    from mergekit_mergeability.decide.advice import knowledge_weighted_defaults

    knobs = knowledge_weighted_defaults()
    knobs["by_knowledge"] = knobs.pop("density_by_knowledge")
    return knobs


def candidate_merges(
    report: Mapping[str, Any], methods: Optional[Sequence[str]] = None, knobs: str = "defaults"
) -> Tuple[List[conditional.Merge], List[str]]:
    """The merges the search may give a model, and a note for each method it cannot use."""
    chosen = list(methods or DEFAULT_METHODS)
    unknown = [m for m in chosen if m not in conditional.METHODS]
    if unknown:
        raise UserError(f"--methods {unknown[0]}: the plan knows {', '.join(conditional.METHODS)}")
    experts = [m for m in report["models"] if m["role"] == "expert"]
    grid = knobs == "grid"
    merges: List[conditional.Merge] = []
    notes: List[str] = []
    for method in chosen:
        if method in (conditional.TASK_ARITHMETIC, conditional.LINEAR):
            merges.append(conditional.Merge(method))
        elif method == conditional.TIES:
            merges += [conditional.Merge(method, density=d) for d in (GRID["density"] if grid else (TIES_DENSITY,))]
        elif method == conditional.KNOWLEDGE_WEIGHTED:
            defaults = knowledge_defaults()
            if any(not (m.get("knowledge") or {}) for m in experts):
                notes.append("knowledge_weighted: not planned, some expert has no measured knowledge (no probe)")
                continue
            trimmed = {k: defaults[k] for k in ("density", "by_knowledge")}
            settings = (
                [
                    dict(temperature=t, ties=s, **(trimmed if s else {}))
                    for t in GRID["temperature"]
                    for s in (True, False)
                ]
                if grid
                else [defaults]
            )
            merges += [conditional.Merge(method, **knobs) for knobs in settings]
        elif method == conditional.LAYER_SELECTIVE:
            cutoff = (report.get("layers") or {}).get("cutoff")
            if cutoff is None:
                notes.append(
                    "layer_selective: not planned, the precheck measured no layer cut-off (it needs the representations diagnostic and a divergence)"
                )
                continue
            merges.append(conditional.Merge(method, cutoff=int(cutoff)))
    if not merges:
        raise UserError(f"--methods {','.join(chosen)}: none of them can be planned here ({'; '.join(notes)})")
    return merges, notes


def knowledge_weighted_against_ties(
    report: Mapping[str, Any], calibration: conditional.ConditionalCalibration
) -> Optional[Tuple[float, float]]:
    """Every expert of a precheck report merged with knowledge_weighted's defaults and with TIES
    (density 0.5): the experts' mean predicted own-task score under each, by the conditional
    ``calibration``. None where it cannot say: fewer than two experts, an expert without measured
    knowledge or weight statistics, or no fitted rule."""
    experts = [m for m in report["models"] if m["role"] == "expert"]
    if len(experts) < 2 or any(not m.get("knowledge") or not m.get("weights") for m in experts):
        return None
    pool, members = conditional.from_report(report), list(range(len(experts)))
    weighted = conditional.Merge(conditional.KNOWLEDGE_WEIGHTED, **knowledge_defaults())
    try:
        kw = calibration.predict(pool, members, weighted, domain=False).values
        trimmed = calibration.predict(
            pool, members, conditional.Merge(conditional.TIES, density=TIES_DENSITY), domain=False
        ).values
    except LookupError:
        return None
    if not (np.isfinite(kw).all() and np.isfinite(trimmed).all()):
        return None
    return float(np.mean(kw)), float(np.mean(trimmed))


def merge_of(
    method: str, shared: Mapping[str, Any], per_model: Mapping[str, Mapping[str, Any]], members
) -> conditional.Merge:
    """The merge a config (or a measured trial) asks mergekit for, every member's weight as
    mergekit computes it. One source for fitting on trials and for the "as configured" reference."""
    members = list(members)
    shared = dict(shared or {})

    def value(model: str, key: str, default):
        found = (per_model.get(model) or {}).get(key, shared.get(key, default))
        return float(np.mean(found)) if isinstance(found, list) else float(found)  # gradients: their mean

    if method == conditional.KNOWLEDGE_WEIGHTED:
        defaults = knowledge_defaults()
        temperature = float(shared.get("temperature", defaults["temperature"]))
        known = np.array([value(m, "knowledge", 0.5) for m in members])
        logits = (1 - known) / temperature
        shares = np.exp(logits - logits.max()) * np.array([value(m, "weight", 1.0) for m in members])
        shares /= shares.sum()
        return conditional.Merge(
            method,
            density=float(np.mean([value(m, "density", defaults["density"]) for m in members])),
            temperature=temperature,
            ties=bool(shared.get("ties", defaults["ties"])),
            by_knowledge=bool(shared.get("density_by_knowledge", defaults["by_knowledge"])),
            scale=float(shared.get("scale", 1.0)),
            weights=tuple(zip(members, shares.tolist())),
        )
    if method in (conditional.TASK_ARITHMETIC, conditional.TIES, conditional.LINEAR):
        weights = np.array([value(m, "weight", 1.0) for m in members])
        if method == conditional.LINEAR:  # mergekit's linear normalises the weights
            weights = weights / weights.sum()
        return conditional.Merge(
            method,
            density=float(np.mean([value(m, "density", 1.0) for m in members])),
            scale=float(shared.get("lambda", 1.0)),
            weights=tuple(zip(members, weights.tolist())),
        )
    raise UserError(f"{method}: the plan models task_arithmetic, linear, ties and knowledge_weighted merges")


def configured(document: Mapping[str, Any], names: Sequence[str]) -> Tuple[Optional[conditional.Merge], Optional[str]]:
    """The config's own merge of every expert, or why the plan cannot predict it."""
    method = document.get("merge_method")
    per_model = {}
    for entry in document.get("models") or ():
        per_model[str(entry.get("model"))] = dict(entry.get("parameters") or {})
    try:
        return merge_of(method, document.get("parameters") or {}, per_model, names), None
    except UserError:
        return (
            None,
            f"{method} as configured: not predicted (the plan models task_arithmetic, linear, ties, knowledge_weighted)",
        )


@dataclass
class Planned:
    members: Tuple[int, ...]
    merge: conditional.Merge
    values: np.ndarray  # per member, its predicted score there (its own score when alone)
    rule: str  # the fitted model that predicted it ("alone" for one member)
    fallback: bool
    outside: List[List[str]]


@dataclass
class Reference:
    label: str
    values: np.ndarray  # per expert of the pool
    merge: Optional[conditional.Merge] = None
    rule: Optional[str] = None
    fallback: bool = False
    note: Optional[str] = None

    @property
    def total(self) -> float:
        return float(np.nansum(self.values))


@dataclass
class Decision:
    pool: conditional.Pool
    calibration: conditional.ConditionalCalibration
    merges: List[conditional.Merge]
    search: Result
    planned: List[Planned]
    values: np.ndarray  # per expert: what the plan keeps of its task
    references: Dict[str, Reference]
    per_method: Dict[str, Result] = field(default_factory=dict)  # the best plan with one method only
    notes: List[str] = field(default_factory=list)

    def objective_of(self, assignment: Sequence[Tuple[Sequence[int], conditional.Merge]]) -> float:
        """The predicted objective of any assignment: (members, merge) per model."""
        values = self.outside.copy()
        for members, merge in assignment:
            values[list(members)] = self.calibration.predict(self.pool, list(members), merge).values
        return float(values.sum())

    @property
    def outside(self) -> np.ndarray:
        return np.nan_to_num(self.pool.base_score, nan=0.0)

    @property
    def objective(self) -> float:
        return float(self.values.sum())


def decide(
    report: Mapping[str, Any],
    calibration: conditional.ConditionalCalibration,
    merges: Sequence[conditional.Merge],
    models: int = 1,
    names: Optional[Sequence[str]] = None,
    configured_document: Optional[Mapping[str, Any]] = None,
    per_method: bool = True,
    progress=lambda done: None,
    seed: int = 0,
    expert_scores: Optional[Mapping[str, float]] = None,
    base_scores: Optional[Mapping[str, float]] = None,
) -> Decision:
    """Search the assignment of experts to at most ``models`` merged models that keeps most.
    ``progress(n)`` is called as the search advances (``steps`` says how often in all)."""
    if models < 1:
        raise UserError(f"--models {models}: plan at least one merged model")
    pool = conditional.from_report(report, names, knowledge_feature(calibration), expert_scores, base_scores)
    outside = np.nan_to_num(pool.base_score, nan=0.0)

    def score(members, merge):
        return calibration.predict(pool, list(members), merge, domain=False).values

    notes = []
    if np.isnan(pool.base_score).any():
        missing = [pool.names[i] for i in np.flatnonzero(np.isnan(pool.base_score))]
        notes.append(f"base score unknown (no probe) for {len(missing)} experts, counted as 0 when left out")
    memo: Dict = {}
    result = search(len(pool), list(merges), models, score, outside, seed=seed, progress=progress, memo=memo)
    planned = []
    values = outside.copy()
    for slot in result.slots:
        if not slot.members:
            continue
        prediction = calibration.predict(pool, list(slot.members), slot.merge)
        planned.append(
            Planned(
                slot.members, slot.merge, prediction.values, prediction.rule, prediction.fallback, prediction.outside
            )
        )
        values[list(slot.members)] = prediction.values
    everyone = list(range(len(pool)))
    references = {
        "alone": Reference("each expert alone (one model per task)", pool.expert_score.copy()),
        "base": Reference("nothing merged (the base model)", outside.copy()),
    }
    ties = conditional.Merge(conditional.TIES, density=TIES_DENSITY)
    references["ties"] = _reference("every expert merged with TIES (density 0.5)", pool, calibration, everyone, ties)
    if configured_document is not None:
        merge, why = configured(configured_document, pool.names)
        if merge is None:
            references["configured"] = Reference(
                "every expert merged as configured", np.full(len(pool), np.nan), note=why
            )
        else:
            references["configured"] = _reference(
                f"every expert merged as configured ({configured_document.get('merge_method')})",
                pool,
                calibration,
                everyone,
                merge,
            )
    best_single = {}
    if per_method and len({m.method for m in merges}) > 1:
        for method in dict.fromkeys(m.method for m in merges):
            only = [m for m in merges if m.method == method]
            best_single[method] = search(len(pool), only, models, score, outside, seed=seed, kicks=0, memo=memo)
            progress(1)
    return Decision(pool, calibration, list(merges), result, planned, values, references, best_single, notes)


def steps(n: int, merges: Sequence[conditional.Merge]) -> int:
    """How many times ``decide`` calls ``progress``: the search's starts and kicks, then one
    search per method."""
    from mergekit_mergeability.planner.search import kicks_for

    methods = len({m.method for m in merges})
    return 2 + kicks_for(n) + (methods if methods > 1 else 0)


def _reference(label, pool, calibration, members, merge) -> Reference:
    prediction = calibration.predict(pool, members, merge)
    return Reference(label, prediction.values, merge, prediction.rule, prediction.fallback)


def knowledge_feature(calibration: conditional.ConditionalCalibration) -> str:
    return str(calibration.document.get("knowledge_feature", conditional.KNOWLEDGE_FEATURE))


def mergekit_parameters(
    pool: conditional.Pool, members: Sequence[int], merge: conditional.Merge
) -> Tuple[str, Dict[str, Any], Dict[str, Dict[str, Any]]]:
    """(method, top-level parameters, per-model parameters by name) that make mergekit run
    ``merge`` on ``members``: the planned config, and the in-memory check of it."""
    members = list(members)
    names = [pool.names[i] for i in members]
    if len(members) == 1:  # a model of one expert: the expert itself
        return conditional.TASK_ARITHMETIC, {}, {names[0]: {"weight": 1.0}}
    weights = conditional.member_weights(pool, members, merge)
    shared: Dict[str, Any] = {}
    per_model: Dict[str, Dict[str, Any]] = {}
    if merge.method in (conditional.TASK_ARITHMETIC, conditional.LINEAR):
        per_model = {n: {"weight": round(float(w), 6)} for n, w in zip(names, weights)}
    elif merge.method == conditional.TIES:
        per_model = {n: {"weight": 1.0, "density": merge.density} for n in names}
        if merge.scale != 1:
            shared["lambda"] = merge.scale
    elif merge.method == conditional.KNOWLEDGE_WEIGHTED:
        shared = {"temperature": merge.temperature, "ties": merge.ties, "scale": merge.scale}
        per_model = {n: {"knowledge": round(float(pool.knowledge[i]), 6)} for n, i in zip(names, members)}
        if merge.ties:
            shared["density_by_knowledge"] = merge.by_knowledge
            for n in names:
                per_model[n]["density"] = merge.density
    elif merge.method == conditional.LAYER_SELECTIVE:
        shared = {"cutoff": merge.cutoff, "inner": conditional.TASK_ARITHMETIC}
        upper = pool.names[conditional.upper_member(pool, members)]
        per_model = {n: {"weight": round(float(w), 6)} for n, w in zip(names, weights)}
        per_model[upper]["upper"] = True
    return (conditional.TASK_ARITHMETIC if len(members) == 1 else merge.method), shared, per_model
