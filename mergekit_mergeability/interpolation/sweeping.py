"""``sweep``: the models between A and B along λ, scored, staged, and the sweet spot.

Everything the user can get wrong (models, task, marker, layers, modules) is checked
before any tensor is read. Then one model is loaded, and each λ point is built in
memory (``models.interpolate``), answered through lm-eval (``answers``) and cached by
content: the models' fingerprints, λ, the interpolated tensors, the task and the
decoding settings. The marker is applied to the cached answers, so changing it costs
no evaluation, and a rerun or a refinement reuses every finished point.
"""

from __future__ import annotations

import re
from pathlib import Path
from statistics import fmean
from typing import Any, Dict, List, Mapping, Optional, Pattern, Tuple

from mergekit_mergeability import distributed
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, atomic_folder
from mergekit_mergeability.maths import sampling, stages
from mergekit_mergeability.settings import SweepSettings
from mergekit_mergeability.sources.cache import Cache
from mergekit_mergeability.interpolation.models import Endpoints, Selection, endpoints, interpolate, plan
from mergekit_mergeability.tasks import lmeval


def grid(text: str) -> Tuple[float, ...]:
    """``START:STOP:STEP`` (both ends included) or a comma list, as sorted distinct λ."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or stop <= start:
                raise ValueError
            count = int((stop - start) / step + 10**-stages.DIGITS)
            values = [start + i * step for i in range(count + 1)] + [stop]
        else:
            values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--lambdas {text}: expected START:STOP:STEP with STOP > START and STEP > 0 (e.g. 0:1:0.1), or a list like 0,0.5,1"
        ) from None
    lambdas = tuple(sorted({round(v, stages.DIGITS) for v in values}))
    if len(lambdas) < 2:
        raise UserError(f"--lambdas {text}: a sweep needs at least two λ")
    return lambdas


def marker_pattern(marker: str) -> Pattern[str]:
    try:
        return re.compile(marker)
    except re.error as error:
        raise UserError(f"--marker {marker!r}: not a regular expression ({error})") from None


class Sweep:
    def __init__(self, a: str, b: str, base: Optional[str], task: str, settings: SweepSettings, cache: Cache):
        from mergekit_mergeability.interpolation.answers import GenerationTask

        self.s, self.task_spec, self.cache = settings, task, cache
        self.marker = marker_pattern(settings.marker)
        if "," in task:
            raise UserError(f"--tasks {task}: the sweep scores one task; name one")
        self.ends: Endpoints = endpoints(a, b, base)
        self.task = lmeval.resolve(task)
        self.task.check()
        self.generation = GenerationTask(self.task, settings.samples, settings.temperature)
        self.selection = Selection(frozenset(settings.layers) if settings.layers else None, settings.modules)
        self.interpolated, self.differing = plan(self.ends, self.selection)
        self.metric: Optional[str] = None  # the task's metric, as the first answers name it
        self._lm = None
        self.spec = (a, b, base, task, settings)  # what a Ray worker rebuilds it from
        self._answered: Dict[float, Dict[str, Any]] = {}  # records that Ray workers returned

    def lm(self):
        """The loaded module (A, or the base for task vectors) wrapped for lm-eval, once."""
        if self._lm is None:
            from lm_eval.models.huggingface import HFLM

            from mergekit_mergeability.sources import auto_device, load_causal_lm

            module, tokenizer = load_causal_lm(self.ends.origin, self.s.device, self.s.dtype)
            with lmeval.quiet_harness():
                self._lm = HFLM(
                    pretrained=module,
                    tokenizer=tokenizer,
                    device=auto_device(self.s.device),
                    batch_size=self.s.batch_size,
                )
        return self._lm

    def key(self, lam: float) -> str:
        decoding = (self.s.samples, self.s.temperature if self.s.samples > 1 else None, self.s.seed)
        return self.cache.key(
            "sweep",
            self.ends.fingerprints,
            lam,
            self.interpolated,
            self.task.fingerprint,
            decoding,
            self.s.limit,
            self.s.dtype,
        )

    def record(self, lam: float) -> Dict[str, Any]:
        """The answers of the λ-model, from the cache or evaluated."""
        from mergekit_mergeability.sources import patched

        key = self.key(lam)
        cached = self._answered.get(lam) or self.cache.get(key)
        if cached is not None:
            return cached
        lm = self.lm()
        with patched(lm.model, interpolate(self.ends, self.interpolated, lam)):
            result = self.generation.answer(lm, self.s.limit, self.s.seed)
        for problem in result["problems"]:
            problem["tokens"] = [len(lm.tokenizer.encode(r, add_special_tokens=False)) for r in problem["responses"]]
        return self.cache.put(key, {"lambda": lam, **result})

    def point(self, lam: float) -> Dict[str, Any]:
        record = self.record(lam)
        self.metric = self.metric or record["metric"]
        return summarise(record, self.marker, self.s.samples)

    def run(self) -> Dict[str, Any]:
        from mergekit_mergeability.progress import task as progress

        quiet = self.s.quiet
        points: Dict[float, Dict[str, Any]] = {}
        with progress(f"sweep: {len(self.s.lambdas)} λ points", len(self.s.lambdas), quiet) as advance:
            self.answer_on_ray(self.s.lambdas, advance)
            for lam in self.s.lambdas:
                points[lam] = self.point(lam)
                if not distributed.active():
                    advance(1)
        with progress("sweep: refining where the curves change fastest", self.s.refine, quiet) as advance:

            def measure(lam: float) -> Dict[str, Any]:
                self.answer_on_ray([lam], lambda n: None)
                point = self.point(lam)
                advance(1)
                return point

            added = stages.refine(points, measure, self.s.resolution, self.s.refine)
        return self.report(points, added)

    def answer_on_ray(self, lambdas, advance) -> None:
        """With ``--ray``: every λ not in the cache as one task, side by side; each worker loads A
        once and keeps it for its next λ. The records come back here and into the cache."""
        if not distributed.active():
            return
        missing = [lam for lam in lambdas if lam not in self._answered and self.cache.get(self.key(lam)) is None]
        advance(len(lambdas) - len(missing))
        records = distributed.each(
            _answer, missing, *self.spec, done=lambda i, r: advance(1), gpus=distributed.gpus(self.s)
        )
        for lam, record in zip(missing, records):
            self._answered[lam] = self.cache.put(self.key(lam), record)

    def report(self, points: Dict[float, Dict[str, Any]], added: List[float]) -> Dict[str, Any]:
        from importlib.metadata import version

        lambdas = sorted(points)
        curves = {name: [points[lam][name] for lam in lambdas] for name in stages.CURVES}
        found = stages.detect(lambdas, curves)
        spot = stages.sweet_spot(
            lambdas, curves["accuracy"], [points[lam]["tokens"] for lam in lambdas], self.s.tolerance, self.s.budget
        )
        rows = [{"lambda": lam, "stage": found.stage(lam), "refined": lam in added, **points[lam]} for lam in lambdas]
        s, layers = self.s, self.selection.layers
        settings = {
            "task": self.task_spec,
            "lambdas": list(s.lambdas),
            **{
                k: getattr(s, k) for k in ("marker", "budget", "samples", "temperature", "seed", "refine", "resolution")
            },
            "tolerance": s.tolerance,
            "layers": sorted(layers) if layers else None,
            "modules": self.selection.modules,
            "limit": s.limit,
            "dtype": s.dtype,
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "mergekit-mergeability", "version": version("mergekit-mergeability")},
            "models": {
                role: {"name": self.ends.names[role], "path": str(source)} for role, source in self.ends.sources.items()
            },
            "task_vectors": self.ends.vectors,
            "task": self.task_spec,
            "lm_eval_task": self.generation.name,
            "metric": self.metric,
            "settings": settings,
            "tensors": {"differing": self.differing, "interpolated": len(self.interpolated)},
            "points": rows,
            "stages": stage_table(found, rows),
            "refinement": refinement(self.s.lambdas, added, lambdas, found, self.s.resolution),
            "sweet_spot": {
                "lambda": spot.lam,
                "reason": spot.reason,
                **(
                    {k: points[spot.lam][k] for k in ("accuracy", "tokens", "marker_rate")}
                    if spot.lam is not None
                    else {}
                ),
            },
        }

    def save_model(self, lam: float, folder: Path) -> Path:
        """The λ-model as a model folder (written to a temporary folder, renamed when complete)."""
        from mergekit_mergeability.sources import patched

        lm = self.lm()
        with atomic_folder(folder) as partial:
            with patched(lm.model, interpolate(self.ends, self.interpolated, lam)):
                lm.model.save_pretrained(partial)
            lm.tokenizer.save_pretrained(partial)
        return folder


_sweeps: Dict[str, Sweep] = {}  # in a Ray worker process: the sweeps it has served, A loaded once each


def _answer(lam: float, a: str, b: str, base: Optional[str], task: str, settings: SweepSettings) -> Dict[str, Any]:
    """One λ point's answers, in a Ray worker (``distributed.each``); the driver caches them."""
    key = repr((a, b, base, task, settings))
    if key not in _sweeps:
        _sweeps[key] = Sweep(a, b, base, task, settings, Cache(None))
    return _sweeps[key].record(lam)


def summarise(record: Mapping[str, Any], marker: Pattern[str], samples: int) -> Dict[str, Any]:
    """One λ point's numbers from its answers (pure: the marker and metrics apply to cached answers)."""
    problems = record["problems"]
    scores = [p["scores"] for p in problems]
    responses = [r for p in problems for r in p["responses"]]
    tokens = fmean(t for p in problems for t in p["tokens"])
    accuracy = sampling.mean_at(scores)
    # Pass@k and Vote@k count correct answers: only a right/wrong metric (exact_match) has them
    binary = samples > 1 and all(s in (0.0, 1.0) for row in scores for s in row)
    correct = [[s == 1.0 for s in row] for row in scores]
    return {
        "accuracy": accuracy,
        "pass_at": {str(k): sampling.pass_at(correct, k) for k in sampling.reported_ks(samples)} if binary else None,
        "vote": sampling.vote_at([p["answers"] for p in problems], correct) if binary else None,
        "tokens": tokens,
        "marker_rate": fmean(bool(marker.search(r)) for r in responses),
        "accuracy_per_token": stages.per_token(accuracy, tokens),
        "problems": len(problems),
    }


def stage_table(found: stages.Stages, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    table = []
    for stage in (1, 2, 3):
        members = [r for r in rows if r["stage"] == stage]
        if members:
            table.append(
                {
                    "stage": stage,
                    "from": members[0]["lambda"],
                    "to": members[-1]["lambda"],
                    "points": len(members),
                    **{
                        f"{k}_range": [min(r[k] for r in members), max(r[k] for r in members)]
                        for k in ("accuracy", "tokens", "marker_rate")
                    },
                }
            )
    return {
        "found": found.leading is not None,
        "leading": found.leading,
        "jumping": list(found.jumping),
        "stage2_from": found.stage2,
        "stage3_from": found.stage3,
        "transition": list(found.transition) if found.transition else None,
        "table": table,
    }


def refinement(
    coarse: Tuple[float, ...], added: List[float], lambdas: List[float], found: stages.Stages, resolution: float
) -> Dict[str, Any]:
    uniform = stages.uniform_points(lambdas[0], lambdas[-1], resolution)
    half_width = (found.transition[1] - found.transition[0]) / 2 if found.transition else None
    return {
        "coarse": len(coarse),
        "added": added,
        "evaluated": len(lambdas),
        "resolution": resolution,
        "transition_half_width": half_width,
        "located": half_width is not None and half_width <= resolution + 10**-stages.DIGITS,
        "uniform_grid": uniform,  # points a uniform grid needs for the same resolution
        "saved": uniform - len(lambdas),
    }


def run(
    a: str,
    b: str,
    base: Optional[str],
    task: str,
    settings: SweepSettings,
    cache: Cache,
    save_chosen: Optional[Path] = None,
) -> Tuple[Dict[str, Any], Sweep]:
    sweep = Sweep(a, b, base, task, settings, cache)
    report = sweep.run()
    lam = report["sweet_spot"]["lambda"]
    report["chosen_model"] = str(sweep.save_model(lam, save_chosen)) if save_chosen and lam is not None else None
    return report, sweep
