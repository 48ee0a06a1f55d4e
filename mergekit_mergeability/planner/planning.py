"""``plan``: which fine-tunes of a pool should share a merged model, with which merge.

load (a pool config, or a folder of adapters/models with a probe each) → measure (the precheck's
weights and knowledge diagnostics, or a precheck.json already written: ``api.plan`` runs or reads
it) → decide (``decide``) → optionally check the best candidates with real evaluations
(``--budget-evals``) → write (``report``). The imports of the rest of the package sit here and in
``Measurer``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import read_report
from mergekit_mergeability.planner import conditional
from mergekit_mergeability.planner.deciding import REFERENCE, Decision, Planned, decide, mergekit_parameters
from mergekit_mergeability import merge_config
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import WeightStats
from mergekit_mergeability.settings import PrecheckSettings, RunSettings

PRECHECK_FIELDS = ("path", "role", "knowledge", "weights")
SKIPPED = ("dilution", "fluency", "menu", "selectivity")  # the plan reads weights and knowledge
CUT_OFF = "representations"  # layer-wise CKA: only layer_selective's cut-off (``--representations``)


def read_precheck(path: Path, spec: merge_config.MergeSpec) -> Dict[str, Any]:
    """A precheck.json written earlier, checked to measure every expert of the pool."""
    report = read_report(path, "precheck", PRECHECK_FIELDS)
    experts = {m["path"]: m for m in report["models"] if m["role"] == "expert"}
    for name in spec.models:
        where = spec.fields.get(name, "models")
        if name not in experts:
            raise UserError(
                f"--precheck {path}: no measurements of {name} ({where} of {spec.source}); run the precheck on this pool, or leave --precheck out"
            )
        if not WeightStats.of(experts[name].get("weights")).update_norm:
            raise UserError(f"--precheck {path}: {name} has no weight statistics (was the weights diagnostic skipped?)")
    return report


def expert_scores(path: Optional[Path]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Measured own-task scores of each expert and of the base from a mergeability.json."""
    if path is None:
        return {}, {}
    measured = read_report(path, "mergeability", ("path", "expert_score", "base_score"))
    return (
        {m["path"]: m["expert_score"] for m in measured["models"] if m["expert_score"] is not None},
        {m["path"]: m["base_score"] for m in measured["models"] if m["base_score"] is not None},
    )


class Measurer:
    """Real scores of candidate merges, in memory, exactly as ``mergeability`` scores a trial:
    the members' updates merged with mergekit's ``merge_tensors``, patched into one loaded base,
    each member scored on its own task (``scores``), or its probe read item by item as the
    precheck's rehearsal reads it (``items``); cached by content (``--cache-dir``)."""

    def __init__(
        self,
        spec: merge_config.MergeSpec,
        settings: RunSettings,
        cache,
        pool: Optional[conditional.Pool] = None,
        probes: Optional[Dict[str, List[Any]]] = None,
    ):
        """``probes``: each member's probe items as the precheck loads them (``measuring.load_inputs``)."""
        from mergekit_mergeability.tasks import lmeval
        from mergekit_mergeability.sources.cache import fingerprint
        from mergekit_mergeability.evaluation.pool_trials import Trials, check_pool

        check_pool(spec, 1, conditional.TASK_ARITHMETIC)
        folders = spec.sources()
        tasks = lmeval.resolve_all(dict.fromkeys(spec.probes[m] for m in spec.models), spec)
        own_task = {m: tasks[spec.probes[m]] for m in spec.models}
        fingerprints = {name: fingerprint(folder) for name, folder in folders.items()}
        self.probes = probes or {}
        self.spec, self.pool, self.quiet = spec, pool, settings.quiet
        self.trials = Trials(
            folders, spec.base_model, conditional.TASK_ARITHMETIC, {}, {}, fingerprints, own_task, settings, cache
        )
        self.evaluations = 0

    def _set_merge(self, members: Sequence[int], merge: conditional.Merge) -> List[str]:
        """The members' names, with the trials set to merge them as ``merge`` does."""
        method, shared, per_model = mergekit_parameters(self.pool, members, merge)
        # one Trials for every merge: its loaded base and updates are reused, the recipe changes
        self.trials.method, self.trials.shared, self.trials.per_model = method, shared, per_model
        self.evaluations += 1
        return [self.pool.names[i] for i in members]

    def scores(self, members: Sequence[int], merge: conditional.Merge) -> np.ndarray:
        """Each member's own-task score inside the merge of ``members`` (pool indices)."""
        return np.array(self.trials.scores(self._set_merge(members, merge)))

    def items(self, members: Sequence[int], merge: conditional.Merge) -> List[List[float]]:
        """Each member's probe items inside the merge of ``members``, read as the precheck's rehearsal
        reads them (``knowledge.read``): p(gold) where the options are listed or an answer is given,
        right or wrong otherwise."""
        names = self._set_merge(members, merge)
        recipe, make = self.trials.recipe(names), self.trials.merge(names)
        return self.trials.scorer().read_many(recipe, [self.probes[n] for n in names], make)

    def base_scores(self) -> np.ndarray:
        return np.array([self.trials.ends(name)[0]["score"] for name in self.pool.names])

    def base_items(self, report: Optional[Dict[str, Any]] = None) -> List[List[float]]:
        """Each expert's probe items on the base, read as ``items`` reads them: from the precheck's
        ``report`` where it holds every item's (its knowledge pass asked the base the same probes,
        as each is scored), else asked on the base."""
        from mergekit_mergeability.diagnostics.knowledge import read

        names = self.pool.names
        stored = {m["path"]: (m.get("knowledge") or {}).get("per_instance") for m in (report or {}).get("models", [])}
        if all(stored.get(n) and len(stored[n]) == len(self.probes[n]) for n in names):
            return [
                [read(i, r["scored_p_gold"], r["scored_correct"]) for r, i in zip(stored[n], self.probes[n])]
                for n in names
            ]
        return self.trials.scorer().read_many("base", [self.probes[n] for n in names], None)


def references(decision: Decision) -> List[Tuple[str, List[Tuple[Tuple[int, ...], conditional.Merge]]]]:
    """What merging everything would give, as plans to measure beside the finalists: every expert
    in one model with TIES, with the mean merge, and as the config says (where the plan models it)."""
    everyone = tuple(range(len(decision.pool)))
    found = [(f"{REFERENCE}everything with TIES", decision.references["ties"].merge)]
    found.append((f"{REFERENCE}everything, the mean merge", conditional.Merge(conditional.TASK_ARITHMETIC)))
    configured = decision.references.get("configured")
    if configured is not None and configured.merge is not None:
        found.append((f"{REFERENCE}everything as configured", configured.merge))
    return [(label, [(everyone, merge)]) for label, merge in found]


Assignment = List[Tuple[Tuple[int, ...], conditional.Merge]]


SEARCHED = "the search's plan"  # the rehearsal's label for the plan the search found, before it is checked


def finalists(decision: Decision) -> List[Tuple[str, Assignment]]:
    """The plans worth a real evaluation, as the search found them: the plan, the best plan with each
    method alone, and the plan one move away (each member left out of its model), so that a plan the
    conditional model over-rates (two updates that cancel, merged) has its repairs measured too."""
    names = decision.pool.names
    planned = [(tuple(s.members), s.merge) for s in decision.search.slots if s.members]
    found = [(SEARCHED, planned)]
    for method, result in decision.per_method.items():
        found.append((f"{method} only", [(tuple(s.members), s.merge) for s in result.slots if s.members]))
    for k, (members, merge) in enumerate(planned):
        for i in members:
            rest = tuple(m for m in members if m != i)
            found.append(
                (
                    f"{SEARCHED}, {Path(names[i]).name} left out",
                    planned[:k] + [(rest, merge)] * bool(rest) + planned[k + 1 :],
                )
            )
    return found


def built(pool: conditional.Pool, assignment: Assignment) -> Tuple[str, ...]:
    """What mergekit builds for ``assignment``, model by model, as text: two plans that build the same
    models (the config's equal weights and the mean merge, say) are measured once."""
    return tuple(
        sorted(
            json.dumps([sorted(map(int, m)), *mergekit_parameters(pool, m, merge)], sort_keys=True)
            for m, merge in assignment
        )
    )


def verify(
    decision: Decision, measurer: Measurer, budget: int, report: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """Spend up to ``budget`` real evaluations (one = one merged model read on its members' probes)
    on the ``finalists``, best predicted first, and read the references (``references``: merging
    everything) beside them whatever the budget (an expert left out reads its probe on the base:
    ``report``'s, where it holds it). Then choose as the precheck chooses the merge to
    write (``verdict.choose_method``): the candidate whose experts keep most, over the reference that
    measures best only where that choice holds on the probe items it was not made on (cross-fitted
    over two halves of every probe), beyond their noise: the gain's 95% interval above 0, where the
    precheck asks the gain alone to be (a plan that leaves an expert out costs its task when it is
    wrong); of candidates measured alike, the earlier (the references, then the better predicted)."""
    from mergekit_mergeability.decide.verdict import choose_method

    seen, ranked = set(), []
    fixed = references(decision)
    for label, assignment in fixed + sorted(finalists(decision), key=lambda c: -decision.objective_of(c[1])):
        key = built(decision.pool, assignment)
        if key not in seen:
            seen.add(key)
            ranked.append((label, assignment))
    measured, spent, started = [], 0, time.perf_counter()
    for label, assignment in ranked:
        reference = label.startswith(REFERENCE)
        if reference or spent + len(assignment) <= budget:
            spent += 0 if reference else len(assignment)
            measured.append((label, assignment))
    base, names = measurer.base_items(report), decision.pool.names
    checked, read = [], {}
    merges = sum(len(assignment) for _, assignment in measured)
    with task("plan: checking by rehearsal (merged models)", merges, measurer.quiet) as advance:
        for label, assignment in measured:
            items = list(base)  # an expert left out: its probe on the base
            for members, merge in assignment:
                for i, found in zip(members, measurer.items(members, merge)):
                    items[i] = found
                advance(1)
            read[label] = dict(zip(names, items))
            values = np.array([float(np.mean(found)) for found in items])
            checked.append(
                {
                    "label": label,
                    "assignment": assignment,
                    "predicted": decision.objective_of(assignment),
                    "measured": float(values.sum()),
                    "values": values,
                }
            )
    seconds = time.perf_counter() - started
    baseline = max((c for c in checked if c["label"].startswith(REFERENCE)), key=lambda c: c["measured"])["label"]
    choice = choose_method({baseline: read[baseline], **read}, baseline=baseline, sure=True)
    chosen = next(c for c in checked if c["label"] == choice.chosen)
    return {
        "budget": budget,
        "spent": spent,
        "candidates": checked,
        "chosen": chosen,
        "choice": choice,
        "seconds": seconds,
    }


def choose(decision: Decision, assignment: Sequence[Tuple[Sequence[int], conditional.Merge]]) -> None:
    """Make ``assignment`` the decision's plan (what ``verify`` measured best)."""
    values = np.nan_to_num(decision.pool.base_score, nan=0.0)
    planned: List[Planned] = []
    for members, merge in assignment:
        prediction = decision.calibration.predict(decision.pool, list(members), merge)
        planned.append(
            Planned(tuple(members), merge, prediction.values, prediction.rule, prediction.fallback, prediction.outside)
        )
        values[list(members)] = prediction.values
    decision.planned, decision.values = planned, values


def run(
    spec: merge_config.MergeSpec,
    out: Path,
    measure: Callable[[str], Dict[str, Any]],
    *,
    settings: PrecheckSettings = PrecheckSettings(),
    precheck: Optional[Path] = None,
    calibration: Optional[Path] = None,
    methods: Optional[Sequence[str]] = None,
    knobs: str = "defaults",
    models: int = 1,
    budget_evals: int = 0,
    measured: Optional[Path] = None,
    cache=None,
    probes: Optional[Callable[[], Dict[str, List[Any]]]] = None,
) -> Tuple[Dict[str, Any], Decision]:
    """The whole plan: the precheck's report on the pool (``precheck``'s, else ``measure(feature)``'s, a
    precheck.json document; ``feature``: the knowledge view the calibration reads), decide, check
    with real evaluations if asked, write ``out``."""
    from mergekit_mergeability.planner import conditional_fit, reports
    from mergekit_mergeability.planner.deciding import candidate_merges, knowledge_feature, steps

    reports.check_out(out)
    fitted = conditional_fit.load(calibration)
    experts, bases = expert_scores(measured)
    report = read_precheck(precheck, spec) if precheck else measure(knowledge_feature(fitted))
    merges, notes = candidate_merges(report, methods, knobs)
    notes += [f["message"] for f in report.get("findings", ()) if f["diagnostic"] == "probes"]  # probes too small
    with task("plan: searching", steps(len(spec.models), merges), settings.quiet) as advance:
        decision = decide(
            report,
            fitted,
            merges,
            models,
            names=spec.models,
            configured_document=spec.document,
            progress=advance,
            expert_scores=experts,
            base_scores=bases,
        )
    decision.notes = notes + decision.notes
    checked = None
    if budget_evals:
        from mergekit_mergeability.sources.cache import Cache

        measurer = Measurer(spec, settings, cache or Cache(None), decision.pool, probes() if probes else None)
        checked = verify(decision, measurer, budget_evals, report)
        if checked["chosen"] is not None:
            choose(decision, checked["chosen"]["assignment"])
    document = reports.document(
        decision,
        spec,
        report,
        fitted,
        {
            "precheck": str(precheck) if precheck else None,
            "measured": str(measured) if measured else None,
            "methods": list(methods or []) or None,
            "knobs": knobs,
            "models": models,
            "budget_evals": budget_evals,
        },
        checked,
    )
    reports.write(out, document, decision, spec, report)
    return document, decision
