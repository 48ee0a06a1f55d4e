"""``mergeability``: paper 1's protocol over a pool (see ``protocol.py``), merged in memory.

The pool is a mergekit config: ``base_model``, ``models`` each with its ``probe:``
(its own task) and optional ``parameters:``, top-level ``parameters:`` for the
method. Each trial merges one model with its drawn partners using any registered
method and scores the model's own task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from mergekit_mergeability import distributed
from mergekit_mergeability.diagnostics import ModelInput
from mergekit_mergeability.diagnostics.compatibility import require_compatible
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.rehearsal.inmemory import load_update, merge_updates
from mergekit_mergeability.evaluation.protocol import TrialLog, partners, summarise
from mergekit_mergeability.evaluation.scorer import Scorer
from mergekit_mergeability.files import SCHEMA_VERSION, write_atomic
from mergekit_mergeability.maths.retention import normalised_gain
from mergekit_mergeability.merge_config import MergeSpec, model_entries
from mergekit_mergeability.progress import task as progress
from mergekit_mergeability.settings import RunSettings
from mergekit_mergeability.sources import TensorReader
from mergekit_mergeability.sources.cache import Cache, fingerprint
from mergekit_mergeability.tasks import lmeval
from mergekit_mergeability.tasks.harness import runnable


def check_pool(spec: MergeSpec, partner_count: int, method: str) -> None:
    from mergekit.merge_methods import registered_methods

    if not spec.base_model:
        raise UserError(f"{spec.source}: a pool needs a base_model")
    spec.require_probes(spec.probes, "each pool model needs its own task", option=False)
    if partner_count >= len(spec.models):
        raise UserError(
            f"--partners {partner_count}: the pool has {len(spec.models)} models, so at most {len(spec.models) - 1} partners"
        )
    if method not in {m.spec.name for m in registered_methods()}:
        raise UserError(f"--method {method}: not a registered merge method; see `mergekit-mergeability methods`")


def measure(
    spec: MergeSpec,
    method: str,
    partner_count: int,
    trials: int,
    seed: int,
    settings: RunSettings,
    cache: Cache,
    out: Path,
) -> Dict[str, Any]:
    check_pool(spec, partner_count, method)
    folders = spec.sources()
    require_compatible(
        ModelInput(spec.base_model, folders[spec.base_model]), [ModelInput(m, folders[m]) for m in spec.models]
    )
    tasks = lmeval.resolve_all(dict.fromkeys(spec.probes[m] for m in spec.models), spec)
    runnable(tasks.values(), settings.confirm_run_unsafe_code)
    own_task = {m: tasks[spec.probes[m]] for m in spec.models}
    shared = dict(spec.document.get("parameters") or {})
    per_model = {str(e["model"]): dict(e.get("parameters") or {}) for e in model_entries(spec.document)}
    fingerprints = {name: fingerprint(folder) for name, folder in folders.items()}
    trials_of = Trials(folders, spec.base_model, method, shared, per_model, fingerprints, own_task, settings, cache)
    scorer = trials_of.scorer()
    # a resumed run reuses a trial only if nothing that changes its score has changed
    resumed_by = {
        "method": method,
        "partners": partner_count,
        "seed": seed,
        "parameters": shared,
        "per_model": per_model,
        "fingerprints": fingerprints,
    }
    log = TrialLog(Path(out) / "trials.jsonl", resumed_by, {m: scorer.settings(own_task[m]) for m in spec.models})
    to_run = [
        (m, t, partners(spec.models, m, partner_count, t, seed))
        for m in spec.models
        for t in range(trials)
        if log.get(m, t) is None
    ]

    rows = []
    with progress(
        f"mergeability ({method}, {partner_count} partners × {trials} trials)",
        len(spec.models) * (trials + 2),
        settings.quiet,
    ) as advance:
        advance(len(spec.models) * trials - len(to_run))

        def finished(index, score):  # appended as it arrives: a killed run resumes from here
            model, trial, drawn = to_run[index]
            log.add({"model": model, "trial": trial, "partners": drawn, "score": score})
            advance(1)

        gpus = distributed.gpus(settings)
        try:
            distributed.each(run_trial, to_run, trials_of, done=finished, gpus=gpus)  # on Ray: one task per trial
            ends = distributed.each(run_ends, spec.models, trials_of, done=lambda i, r: advance(2), gpus=gpus)
        finally:
            _kept.pop(trials_of.key, None)  # run in this process: its loaded base and updates go with it
        for model, (base_result, expert_score) in zip(spec.models, ends):
            base_score = base_result["score"]
            results = [log.get(model, trial) for trial in range(trials)]
            scores = [r["score"] for r in results]
            summary = summarise(scores, seed)
            rows.append(
                {
                    "path": model,
                    "task": spec.probes[model],
                    "metric": base_result["primary"],
                    "base_score": base_score,
                    "expert_score": expert_score,
                    **summary,
                    "normalised": normalised_gain(summary["mergeability"], expert_score, base_score),
                    "trials": [{"partners": r["partners"], "score": r["score"]} for r in results],
                }
            )
    return {
        "schema_version": SCHEMA_VERSION,
        "pool": str(spec.source),
        "method": method,
        "parameters": shared,
        "partners": partner_count,
        "trials": trials,
        "seed": seed,
        "models": rows,
    }


class Trials:
    """What a merge+evaluate trial needs, by path. In one process it keeps the loaded base and
    the models' updates from trial to trial; sent to a Ray worker, it leaves them behind and
    the worker loads its own, once per worker process (``_kept``)."""

    def __init__(self, folders, base, method, shared, per_model, fingerprints, own_task, settings, cache):
        self.folders, self.base, self.method = folders, base, method
        self.shared, self.per_model, self.fingerprints = shared, per_model, fingerprints
        self.own_task, self.settings, self.cache = own_task, settings, cache
        self.key = Cache.key(fingerprints, method, shared, per_model, settings.to_json())
        self._scorer, self._reader, self._updates = None, None, {}

    def __getstate__(self):
        return {**self.__dict__, "_scorer": None, "_reader": None, "_updates": {}}

    def scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.folders[self.base], self.settings, self.cache)
        return self._scorer

    def reader(self) -> TensorReader:
        if self._reader is None:
            self._reader = TensorReader(self.folders[self.base])
        return self._reader

    def update(self, name: str):
        if name not in self._updates:
            self._updates[name] = load_update(self.reader(), self.folders[name], name)
        return self._updates[name]

    def ends(self, model: str):
        """The base's result on ``model``'s own task, and ``model``'s own score there."""
        task = self.own_task[model]
        base = self.scorer().folder(self.folders[self.base], task)
        return base, self.scorer().patch(("update", self.fingerprints[model]), task, lambda: self.update(model))[
            "score"
        ]

    def score(self, model: str, drawn: List[str]) -> float:
        """Model ``model``'s own-task score after merging it with ``drawn``."""
        members = [model, *drawn]
        recipe = (self.method, self.shared, [(self.fingerprints[m], self.per_model.get(m)) for m in members])
        return self.scorer().patch(recipe, self.own_task[model], self.merge(members))["score"]

    def scores(self, members: List[str]) -> List[float]:
        """Each member's own-task score in the merge of ``members``, built once for all of them."""
        tasks = [self.own_task[m] for m in members]
        return [r["score"] for r in self.scorer().patch_many(self.recipe(members), tasks, self.merge(members))]

    def recipe(self, members: List[str]):
        """What identifies the merge of ``members`` (a cache key's part)."""
        return (
            self.method,
            self.shared,
            sorted(((self.fingerprints[m], self.per_model.get(m)) for m in members), key=str),
        )

    def merge(self, members: List[str]):
        """What builds the merge of ``members``' updates, when a score is not in the cache."""
        return lambda: merge_updates(
            self.reader(), {m: self.update(m) for m in members}, self.method, self.shared, self.per_model
        )


_kept: Dict[str, Trials] = {}  # in a Ray worker process: the pool's loaded base and updates, between tasks


def run_trial(job, trials: Trials) -> float:
    """One trial, ``job`` = (model, trial, drawn partners): its score."""
    model, _, drawn = job
    return _kept.setdefault(trials.key, trials).score(model, drawn)


def run_ends(model: str, trials: Trials):
    """``Trials.ends``: a task per model on Ray, so the driver needs no device."""
    return _kept.setdefault(trials.key, trials).ends(model)


def write(report: Dict[str, Any], out: Path) -> List[Path]:
    return [write_atomic(Path(out) / "mergeability.json", json.dumps(report, indent=2) + "\n")]
