"""``mergeability``: paper 1's protocol over a pool (see ``protocol.py``), merged in memory.

The pool is a mergekit config: ``base_model``, ``models`` each with its ``probe:``
(its own task) and optional ``parameters:``, top-level ``parameters:`` for the
method. Each trial merges one model with its drawn partners using any registered
method and scores the model's own task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping

from mergekit_mergeability.checkpoints import TensorReader
from mergekit_mergeability.diagnostics import ModelInput
from mergekit_mergeability.diagnostics.compatibility import require_compatible
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.evaluation import harness, tasks as task_specs
from mergekit_mergeability.evaluation.inmemory import load_update, merge_updates
from mergekit_mergeability.evaluation.protocol import TrialLog, partners, summarise
from mergekit_mergeability.evaluation.scorer import Scorer
from mergekit_mergeability.files import SCHEMA_VERSION, write_atomic
from mergekit_mergeability.maths.retention import normalised_gain
from mergekit_mergeability.precheck.config import MergeSpec, model_entries
from mergekit_mergeability.progress import task as progress



def check_pool(spec: MergeSpec, partner_count: int, method: str) -> None:
    from mergekit.merge_methods import registered_methods

    if not spec.base_model:
        raise UserError(f"{spec.source}: a pool needs a base_model")
    missing = [m for m in spec.models if m not in spec.probes]
    if missing:
        raise UserError(f"{spec.source}: model {missing[0]} has no probe: key; each pool model needs its own task")
    if partner_count >= len(spec.models):
        raise UserError(f"--partners {partner_count}: the pool has {len(spec.models)} models, so at most {len(spec.models) - 1} partners")
    if method not in {m.spec.name for m in registered_methods()}:
        raise UserError(f"--method {method}: not a registered merge method; see `mergekit-mergeability methods`")


def measure(spec: MergeSpec, method: str, partner_count: int, trials: int, seed: int, options: Mapping[str, Any], cache: harness.Cache, out: Path) -> Dict[str, Any]:
    check_pool(spec, partner_count, method)
    folders = spec.sources()
    require_compatible(ModelInput(spec.base_model, folders[spec.base_model]), [ModelInput(m, folders[m]) for m in spec.models])
    tasks = task_specs.resolve_all(dict.fromkeys(spec.probes[m] for m in spec.models), spec.folder)
    own_task = {m: tasks[spec.probes[m]] for m in spec.models}
    shared = dict(spec.document.get("parameters") or {})
    per_model = {str(e["model"]): dict(e.get("parameters") or {}) for e in model_entries(spec.document)}
    fingerprints = {name: harness.fingerprint(folder) for name, folder in folders.items()}
    base = TensorReader(folders[spec.base_model])
    scorer = Scorer(folders[spec.base_model], options, cache)
    # a resumed run reuses a trial only if nothing that changes its score has changed
    settings = {"method": method, "partners": partner_count, "seed": seed, "parameters": shared, "per_model": per_model, "fingerprints": fingerprints}
    log = TrialLog(Path(out) / "trials.jsonl", settings, {m: scorer.settings(own_task[m]) for m in spec.models})
    updates: Dict[str, Any] = {}

    def update(name):
        if name not in updates:
            updates[name] = load_update(base, folders[name], name)
        return updates[name]

    rows = []
    with progress(f"mergeability ({method}, {partner_count} partners × {trials} trials)", len(spec.models) * (trials + 2), options.get("quiet", False)) as advance:
        for model in spec.models:
            task = own_task[model]
            base_result = scorer.folder(folders[spec.base_model], task)
            base_score = base_result["score"]
            advance(1)
            expert_score = scorer.patch(("update", fingerprints[model]), task, lambda: update(model))["score"]
            advance(1)
            results = []
            for trial in range(trials):
                row = log.get(model, trial)
                if row is None:
                    drawn = partners(spec.models, model, partner_count, trial, seed)
                    members = [model, *drawn]
                    recipe = (method, shared, [(fingerprints[m], per_model.get(m)) for m in members])
                    merged = scorer.patch(recipe, task, lambda: merge_updates(base, {m: update(m) for m in members}, method, shared, per_model))
                    row = log.add({"model": model, "trial": trial, "partners": drawn, "score": merged["score"]})
                results.append(row)
                advance(1)
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


def write(report: Dict[str, Any], out: Path) -> List[Path]:
    return [write_atomic(Path(out) / "mergeability.json", json.dumps(report, indent=2) + "\n")]
