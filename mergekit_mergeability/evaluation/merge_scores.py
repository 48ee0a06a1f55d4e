"""``evaluate``: the base, the merged model and each expert on that expert's task.

Per task: raw scores, retention = merged / expert and normalised gain =
(merged − base) / (expert − base), the expert being the model whose probe the
task is (with ``--tasks``, every expert's score is kept and the best one is used).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.evaluation.scorer import Scorer
from mergekit_mergeability.files import SCHEMA_VERSION, write_atomic
from mergekit_mergeability.maths.retention import normalised_gain, retention
from mergekit_mergeability.merge_config import MergeSpec
from mergekit_mergeability.progress import task as progress
from mergekit_mergeability.settings import RunSettings
from mergekit_mergeability.sources import check_model
from mergekit_mergeability.sources.cache import Cache
from mergekit_mergeability.tasks import lmeval
from mergekit_mergeability.tasks.harness import runnable


def owned_tasks(spec: MergeSpec, overrides: Optional[List[str]]) -> Dict[str, Optional[str]]:
    """task spec -> the model it belongs to (None for --tasks, which belong to every model)."""
    if overrides:
        return dict.fromkeys(overrides)
    if not spec.probes:
        raise UserError(f"{spec.source}: no model declares a probe: key; name tasks with --tasks")
    return {probe: model for model, probe in spec.probes.items()}


def evaluate(
    spec: MergeSpec, merged: Path, overrides: Optional[List[str]], settings: RunSettings, cache: Cache
) -> Dict[str, Any]:
    if not spec.base_model:
        raise UserError(f"{spec.source}: evaluate needs a base_model to compare against")
    if not Path(merged).is_dir():
        raise UserError(f"--merged {merged}: no such folder; run the merge first")
    folders = spec.sources()
    folders["merged"] = Path(merged).resolve()
    for folder in folders.values():
        check_model(folder)  # a damaged or empty folder fails here, before any scoring
    owners = owned_tasks(spec, overrides)
    resolved = lmeval.resolve_all(owners, spec)  # a bad task fails here, before work
    runnable(resolved.values(), settings.confirm_run_unsafe_code)
    scorer = Scorer(folders[spec.base_model], settings, cache)
    # each task on the base, the merge, and its own expert (every expert for --tasks)
    plan = [
        (name, s)
        for s in resolved
        for name in (spec.base_model, "merged", *([owners[s]] if owners[s] else spec.models))
    ]
    scores: Dict[str, Dict[str, Any]] = {}
    with progress("evaluate", len(plan), settings.quiet) as advance:
        for name, spec_text in plan:
            scores.setdefault(name, {})[spec_text] = scorer.folder(folders[name], resolved[spec_text])
            advance(1)
    rows = [_row(s, t, owners[s], spec, scores) for s, t in resolved.items()]
    return {
        "schema_version": SCHEMA_VERSION,
        "config": str(spec.source),
        "merged": str(merged),
        "tasks": rows,
        "scores": scores,
    }


def _row(spec_text: str, task, owner: Optional[str], spec: MergeSpec, scores) -> Dict[str, Any]:
    base = scores[spec.base_model][spec_text]["score"]
    merged = scores["merged"][spec_text]["score"]
    candidates = [owner] if owner else spec.models
    expert_name = max(candidates, key=lambda m: scores[m][spec_text]["score"])
    expert = scores[expert_name][spec_text]["score"]
    return {
        "task": spec_text,
        "lm_eval_task": task.name,
        "metric": scores["merged"][spec_text]["primary"],
        "expert_model": expert_name,
        "base": base,
        "expert": expert,
        "merged": merged,
        "retention": retention(merged, expert),
        "normalised_gain": normalised_gain(merged, expert, base),
        "signatures": scores["merged"][spec_text].get("signatures"),
    }


def write(report: Dict[str, Any], out: Path) -> List[Path]:
    return [
        write_atomic(out / "evaluation.json", json.dumps(report, indent=2) + "\n"),
        write_atomic(out / "evaluation.png", plot(report)),
    ]


def plot(report: Dict[str, Any]) -> bytes:
    from mergekit_mergeability.output.plots import png

    rows = report["tasks"]

    def draw(fig, ax):
        for offset, key in zip((-0.27, 0, 0.27), ("base", "expert", "merged")):
            bars = ax.bar([i + offset for i in range(len(rows))], [r[key] for r in rows], width=0.27, label=key)
            if len(rows) <= 12:  # each value written on its bar: a 0 shows too
                ax.bar_label(bars, fmt="%.2g", fontsize=7)
        ax.set_xticks(
            range(len(rows)), [f"{Path(r['task']).stem}\n({r['metric']})" for r in rows], rotation=30, ha="right"
        )
        ax.set_ylabel("score (its metric; chrF, BLEU 0–100)")
        ax.legend(fontsize="small")

    title = f"What the merge of {Path(report['config']).name} kept, per task"
    return png(draw, title, width=max(6, 1.2 * len(rows) + 2))
