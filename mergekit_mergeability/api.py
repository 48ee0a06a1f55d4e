"""The Python API: each command of the CLI as a typed function returning a result object.

    import mergekit_mergeability as mm

    result = mm.precheck("merge.yml")              # measure, predict, recommend; nothing written
    print(result.verdict, [m.predicted for m in result.experts])
    result.recommended["recommended.yml"]          # a mergekit MergeConfiguration

Every function takes its settings as one frozen object (``mergekit_mergeability.settings``; None:
the defaults) and writes its files only when given ``out``. This module is the one place that
wires load → measure → decide → write; the CLI is a shell over it. Importing it imports nothing
heavy: each function imports what it runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from mergekit_mergeability.results import (
    Calibration,
    Evaluation,
    Mergeability,
    Plan,
    PrecheckResult,
    Sweep,
    Validation,
)

if TYPE_CHECKING:
    from mergekit_mergeability.merge_config import MergeSpec
    from mergekit_mergeability.cost import Cost
    from mergekit_mergeability.describe import MethodRow
    from mergekit_mergeability.settings import PrecheckSettings, RunSettings, SweepSettings

PathLike = Union[str, "os.PathLike[str]"]
# a mergekit config file, its document, or (precheck) a folder of peft adapters on one base
Config = Union[PathLike, Mapping[str, Any], "MergeSpec"]

__all__ = [
    "precheck",
    "precheck_cost",
    "evaluate",
    "mergeability",
    "sweep",
    "calibrate",
    "install",
    "validate",
    "plan",
    "methods",
]


def precheck(
    config: Config,
    *,
    probes: Optional[Mapping[str, str]] = None,
    settings: Optional["PrecheckSettings"] = None,
    out: Optional[PathLike] = None,
    base: Optional[PathLike] = None,
    probe_folder: Optional[PathLike] = None,
) -> PrecheckResult:
    """Predict, before merging, how well each model of ``config`` will survive the merge.

    ``config`` is a mergekit config (a file, or its document as a dict; models may carry a
    ``probe:`` key), or a folder of peft adapters or model folders checked as their task_arithmetic
    mean (``base``: their base, which adapters may name themselves; ``probe_folder``: a probe per
    member, named after it).
    ``probes`` maps a model (as written, or its folder name) to a probe spec, over the config's
    ``probe:`` keys. Runs every plugin's diagnostic, predicts each expert's mergeability,
    recommends what to merge, and asks the plugins' report hooks whether to stop (their reasons
    and the verdict's are in ``result.stop``). With ``out``, writes precheck.json, the
    recommended configs and report.html there.

    Raises ``UserError`` for a bad config or setting, ``MeasurementError`` when a built-in
    diagnostic cannot measure (nothing is judged on no evidence).
    """
    from types import MappingProxyType

    from mergekit_mergeability import measuring
    from mergekit_mergeability.decide.verdict import DO_NOT_MERGE
    from mergekit_mergeability.errors import MeasurementError
    from mergekit_mergeability.output import precheck_report
    from mergekit_mergeability.plugins import results as answers_of
    from mergekit_mergeability.settings import PrecheckSettings

    _folder(out)
    spec = _spec(config, pools=True, base=base, probe_folder=probe_folder)
    settings = _resolved(settings or PrecheckSettings())
    try:
        measured = measuring.measure(spec, probes or {}, settings)
    except MeasurementError:
        if out is not None:  # an earlier run's advice must not outlive a failed measurement
            precheck_report.remove_recommended(Path(out))
        raise
    report = precheck_report.build(measured, settings, measuring.decision(measured, settings, _against_ties))
    failures: List[str] = []  # a plugin's bug must not cost the user the report: a warning, the others still answer
    answers = answers_of(
        measuring.REPORT_HOOK, failed=failures.append, report=MappingProxyType(report), config_path=str(spec.source)
    )
    report["findings"] += [
        {"diagnostic": measuring.REPORT_HOOK, "severity": "warning", "message": message} for message in failures
    ]
    reasons = [reason for _, reason in answers]
    if report["recommendation"]["verdict"] == DO_NOT_MERGE:
        reasons = ["; ".join(report["recommendation"]["reasons"]), *reasons]
    report["stop"] = [r for r in reasons if r]
    recommended = precheck_report.recommended(report, measured)
    if out is not None:
        precheck_report.write(report, measured, Path(out), recommended)
    return PrecheckResult.from_json(report, recommended=precheck_report.parsed(recommended))


_precheck = precheck  # for plan, whose parameter of that name is an earlier precheck.json


def precheck_cost(
    config: Config,
    *,
    probes: Optional[Mapping[str, str]] = None,
    settings: Optional["PrecheckSettings"] = None,
    base: Optional[PathLike] = None,
    probe_folder: Optional[PathLike] = None,
) -> "Cost":
    """What ``precheck`` would cost on ``config``, and nothing else run or written: the config read,
    the models checked to fit and the merge planned, then each diagnostic's forward passes counted
    and one pass of each kind timed on the base (``cost.Cost``; its ``line()`` says it)."""
    from dataclasses import replace

    from mergekit_mergeability import measuring
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.settings import PrecheckSettings

    settings = replace(_resolved(settings or PrecheckSettings()), quiet=True)
    spec = _spec(config, pools=True, base=base, probe_folder=probe_folder)
    measured = measuring.measure(spec, probes or {}, settings, dry_run=True)
    if measured.cost is None:
        raise UserError("dry run: the precheck would stop before its heavy passes: " + "; ".join(measured.errors()))
    return measured.cost


def evaluate(
    config: Config,
    merged: PathLike,
    *,
    tasks: Optional[Sequence[str]] = None,
    settings: Optional["RunSettings"] = None,
    out: Optional[PathLike] = None,
    cache_dir: Optional[PathLike] = None,
) -> Evaluation:
    """Score the base, the ``merged`` model folder and each expert on that expert's task.

    Tasks are each model's ``probe:`` (or ``tasks``, lm-eval task specs, for every model).
    Per task: raw scores, retention = merged / expert and normalised gain = (merged − base) /
    (expert − base). Scores are cached by content under ``cache_dir`` (None: not cached). With
    ``out``, writes evaluation.json and evaluation.png there.
    """
    from mergekit_mergeability.evaluation import merge_scores
    from mergekit_mergeability.settings import RunSettings

    _folder(out)
    report = merge_scores.evaluate(
        _spec(config),
        Path(merged),
        list(tasks) if tasks else None,
        _resolved(settings or RunSettings()),
        _cache(cache_dir),
    )
    if out is not None:
        merge_scores.write(report, Path(out))
    return Evaluation.from_json(report)


def mergeability(
    pool: Config,
    *,
    method: str = "task_arithmetic",
    partners: int = 8,
    trials: int = 5,
    seed: int = 0,
    settings: Optional["RunSettings"] = None,
    out: Optional[PathLike] = None,
    cache_dir: Optional[PathLike] = None,
) -> Mergeability:
    """Measure each pool model's mergeability: its own-task score after merging with random partners.

    Will it Merge? (arXiv 2601.06672): S_i = mean over ``trials`` draws of model i's score on its
    own task (its ``probe:``) after merging it with ``partners`` drawn from the pool by ``method``
    (any registered mergekit method; parameters from the pool config). Merges run in memory.
    With ``out``, finished trials go to out/trials.jsonl (an interrupted run resumes) and the
    report to out/mergeability.json; without it, nothing is kept.
    """
    import tempfile

    from mergekit_mergeability.evaluation import pool_trials
    from mergekit_mergeability.settings import RunSettings

    _folder(out)
    spec, settings = _spec(pool), _resolved(settings or RunSettings())
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(out) if out is not None else Path(scratch)
        report = pool_trials.measure(spec, method, partners, trials, seed, settings, _cache(cache_dir), folder)
        if out is not None:
            pool_trials.write(report, folder)
    return Mergeability.from_json(report)


def sweep(
    model_a: str,
    model_b: str,
    task: str,
    *,
    base: Optional[str] = None,
    settings: Optional["SweepSettings"] = None,
    out: Optional[PathLike] = None,
    save_chosen: bool = False,
    cache_dir: Optional[PathLike] = None,
) -> Sweep:
    """Interpolate ``model_a`` and ``model_b`` along λ; find the three stages and the sweet spot.

    Paper 2 (arXiv 2510.10977): θ(λ) = λ·B + (1 − λ)·A, each λ-model built in memory and scored
    on ``task`` (one lm-eval generation task); λ are added where the curves change fastest
    (``settings``). With ``base``, A and B are task vectors of it. With ``out``, writes sweep.json,
    sweep.png, report.html and chosen.yml there, and the sweet spot's model to out/chosen/ if
    ``save_chosen``.
    """
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.settings import SweepSettings
    from mergekit_mergeability.interpolation import outputs, sweeping

    if save_chosen and out is None:
        raise UserError("sweep: save_chosen writes the model into out/chosen/; name out")
    _folder(out)
    chosen = Path(out) / "chosen" if save_chosen else None
    report, done = sweeping.run(
        model_a, model_b, base, task, _resolved(settings or SweepSettings()), _cache(cache_dir), chosen
    )
    if out is not None:
        outputs.write(report, done, Path(out))
    return Sweep.from_json(report)


def calibrate(
    pairs: Sequence[Tuple[PathLike, PathLike]],
    *,
    target: str = "mergeability",
    permutations: int = 500,
    alpha: float = 0.05,
    within: bool = False,
    rehearsal: bool = True,
    out: Optional[PathLike] = None,
) -> Calibration:
    """Fit the precheck's prediction on measured pools: ``pairs`` of (precheck.json, mergeability.json).

    Fits a monotone, interpretable model (non-negative weights on standardised features, each in
    its prior direction) and judges it out of sample (leave one model out; leave one pool out
    with two pools or more), each against a permutation null of the whole fit. ``target``:
    mergeability (the raw own-task score after merging) or normalised (the share of the gain
    kept). A fit that loses to its best single feature, or whose p-value is not below ``alpha``,
    is refused: ``result.refusals`` says why, and nothing is written. ``within``: the weights are
    fitted within pools (each pool's features and scores centred on its own mean), so pools of
    different kinds and levels teach only how models rank inside a pool. ``rehearsal``: the
    prediction is each model's own probe on a rehearsal of the merge (``dilution``'s partnered pass),
    read as its task is scored (``features``' ``rehearsal``), where the precheck measured it; the
    fitted model elsewhere. Otherwise, with ``out``, the calibration file is written there
    (``precheck(settings=PrecheckSettings(calibration=...))`` reads it).
    """
    from mergekit_mergeability.decide.calibration import calibrate as fit, write

    pairs = [(Path(a), Path(b)) for a, b in pairs]
    report = fit(pairs, target, permutations, within=within, rehearsal=rehearsal)
    refusals = [
        f"{how}: p = {r['p_permutation']:.3f} is not below --alpha {alpha}"
        for how, r in report["out_of_sample"].items()
        if r["p_permutation"] >= alpha
    ]
    refusals += [
        f"{how}: Spearman {r['spearman']:+.2f} loses to {r['best_single_feature']} alone ({r['best_single_spearman']:+.2f})"
        for how, r in report["out_of_sample"].items()
        if not r["beats_best_single_feature"]
    ]
    written = None
    if out is not None and not refusals:
        written = str(write(report, Path(out), [str(p) for pair in pairs for p in pair]))
    return Calibration.from_json(report, refusals=refusals, written=written)


def install(calibration: PathLike, *, kind: str = "precheck") -> Path:
    """Make a fitted calibration the package's default: ``kind`` ``precheck`` (a ``calibrate``
    output, which every precheck then predicts with) or ``plan`` (a conditional calibration, which
    ``plan`` then predicts with). The file is read first as its reader reads it, so a wrong one is
    one line (``UserError``) and the default stays; written atomically. Returns where it went."""
    from mergekit_mergeability.decide.calibration import DEFAULT, Calibration
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.files import write_atomic
    from mergekit_mergeability.planner import conditional_fit

    readers = {"precheck": (Calibration.load, DEFAULT), "plan": (conditional_fit.load, conditional_fit.DEFAULT)}
    if kind not in readers:
        raise UserError(f"install: kind {kind!r}; use precheck or plan")
    read, target = readers[kind]
    read(Path(calibration))  # raises UserError for a missing or malformed file
    return write_atomic(target, Path(calibration).read_bytes())


def validate(
    precheck_json: PathLike,
    mergeability_json: PathLike,
    *,
    target: str = "mergeability",
    permutations: int = 10_000,
    out: Optional[PathLike] = None,
) -> Validation:
    """Check a precheck's predictions against measured mergeability.

    Spearman between predicted and measured ``target`` over the models both files share, with a
    two-sided permutation p-value and a bootstrap 95% interval, next to each of the prediction's
    inputs alone, and whether the prediction beats the best of them. With ``out``, writes
    validation.json there.
    """
    from mergekit_mergeability.evaluation.validate import validate as run_validation, write

    report = run_validation(Path(precheck_json), Path(mergeability_json), target, permutations)
    if out is not None:
        write(report, Path(out))
    return Validation.from_json(report)


def plan(
    pool: Config,
    out: PathLike,
    *,
    base: Optional[PathLike] = None,
    probe_folder: Optional[PathLike] = None,
    models: int = 1,
    methods: Optional[Sequence[str]] = ("task_arithmetic", "ties", "knowledge_weighted", "layer_selective"),
    knobs: str = "defaults",
    budget_evals: int = 4,
    precheck: Optional[PathLike] = None,
    measured: Optional[PathLike] = None,
    calibration: Optional[PathLike] = None,
    representations: bool = False,
    probes: Optional[Mapping[str, str]] = None,
    settings: Optional["PrecheckSettings"] = None,
    cache_dir: Optional[PathLike] = None,
) -> Plan:
    """Plan which fine-tunes of a pool share a merged model, with which method, and which stay apart.

    ``pool`` is a mergekit config whose models carry a ``probe:`` each, or a folder of adapters or
    model folders (with ``base`` for models, and ``probe_folder``: one probe per member, named
    after it). From one precheck (its weights and knowledge; ``precheck``: an earlier
    precheck.json instead) it predicts each expert's own-task score inside any candidate merge
    and searches for the plan of at most ``models`` merged models that keeps most of the pool's
    tasks; ``budget_evals`` merged models are built and scored in memory to check the best
    candidates (0: the prediction alone), and merging everything is measured beside them. Writes plan.json, models/*.yml, precheck.json and report.html into ``out``.
    """
    from dataclasses import replace

    from mergekit_mergeability import measuring
    from mergekit_mergeability.diagnostics.knowledge import LETTERED
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.planner import planning
    from mergekit_mergeability.settings import PrecheckSettings

    spec = _spec(pool, pools=True, base=base, probe_folder=probe_folder, given=probes or {})
    settings = _resolved(settings or PrecheckSettings())

    def measure(feature: str):
        """The precheck's report on the pool (nothing written), its weights and knowledge diagnostics
        at least; its verdict on the config is not the plan's business, its errors are. Where the
        calibration reads the probe as scored (``feature``; the shipped one does), the paper's lettered
        view is not asked: the plan does not read it, and it costs most of the base's passes."""
        skip = set(settings.skip) | set(planning.SKIPPED) | (set() if representations else {planning.CUT_OFF})
        skip |= {LETTERED} if feature.startswith("scored_") else set()
        report = _precheck(spec, probes=probes, settings=replace(settings, skip=tuple(sorted(skip)))).to_json()
        errors = [f["message"] for f in report["findings"] if f["severity"] == "error"]
        if errors:
            raise UserError(f"{spec.source}: the precheck found a problem with the pool: {errors[0]}")
        return report

    asked = measuring.probe_specs(spec, probes or {})  # --probe over the pool's, for the rehearsal too
    spec.require_probes(asked, "plan counts each fine-tune's task")  # one it cannot ask would count as lost
    document, _ = planning.run(
        replace(spec, probes=asked),
        Path(out),
        measure,
        settings=settings,
        precheck=precheck and Path(precheck),
        calibration=calibration and Path(calibration),
        methods=list(methods or []),
        knobs=knobs,
        models=models,
        budget_evals=budget_evals,
        measured=measured and Path(measured),
        cache=_cache(cache_dir),
        probes=lambda: probe_items(spec, settings, asked),
    )
    return Plan.from_json(document)


def methods() -> List["MethodRow"]:
    """Every merge method mergekit knows (plugins' included): name, where it comes from, its parameters."""
    from mergekit_mergeability.describe import describe_methods

    return describe_methods()


def _spec(
    config: Config,
    pools: bool = False,
    base: Optional[PathLike] = None,
    probe_folder: Optional[PathLike] = None,
    given: Optional[Mapping[str, str]] = None,
) -> "MergeSpec":
    """A config as the commands read it: a file, a document, a MergeSpec, or (``pools``) a folder of
    adapters or model folders (``merge_config.from_pool``; ``given``: the --probe pairs, where every
    member needs a probe)."""
    from mergekit_mergeability import merge_config

    if isinstance(config, merge_config.MergeSpec):
        return config
    if isinstance(config, Mapping):
        return merge_config.from_document(dict(config), Path.cwd())
    if pools and Path(config).is_dir():
        folders = base and Path(base), probe_folder and Path(probe_folder)
        return merge_config.from_pool(Path(config), *folders, given or (), need_probes=given is not None)
    return merge_config.read(Path(config))


def _resolved(settings):
    """``settings`` checked and with device auto resolved: cuda if available (inside
    ``distributed.cluster``, if the cluster has GPUs). A device torch does not know, or a limit
    under 1, is a ``UserError`` before any work."""
    from dataclasses import replace

    import torch

    from mergekit_mergeability import distributed
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.sources import auto_device

    device = distributed.device(settings.device) if distributed.active() else auto_device(settings.device)
    try:
        torch.device(device)
    except RuntimeError:
        raise UserError(f"device {settings.device!r}: not a device torch knows; use cpu, cuda, cuda:N or mps") from None
    if settings.limit is not None and settings.limit < 1:
        raise UserError(
            f"limit {settings.limit}: must be at least 1 (probe instances per model), or None for every instance"
        )
    return replace(settings, device=device)


def _folder(out: Optional[PathLike]) -> None:
    """Refuse, before any work, an ``out`` that is a file or cannot be written (``files.writable_folder``)."""
    from mergekit_mergeability.files import writable_folder

    if out is not None:
        writable_folder(Path(out), "out")


def _cache(folder: Optional[PathLike]):
    from mergekit_mergeability.sources.cache import Cache

    return Cache(Path(folder) if folder else None)


def _against_ties(report: Dict[str, Any]) -> Optional[Tuple[float, float]]:
    """knowledge_weighted's and TIES's predicted mean score on the precheck's merge (the plan's
    shipped conditional prediction): the precheck recommends knowledge_weighted only where it leads."""
    from mergekit_mergeability.planner import conditional_fit, deciding

    return deciding.knowledge_weighted_against_ties(report, conditional_fit.load())


def probe_items(spec, settings, asked: Optional[Mapping[str, str]] = None) -> Dict[str, List[Any]]:
    """Each member's probe items as the precheck loads them (plan's rehearsal reads them); ``asked``:
    the probe specs with ``--probe``'s applied (default: the config's)."""
    from mergekit_mergeability import measuring

    inputs = measuring.load_inputs(spec, spec.probes if asked is None else asked, settings.limit, settings.dtype)
    return {m.name: list(m.probes) for m in inputs[1]}
