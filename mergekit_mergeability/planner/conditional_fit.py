"""Fitting the conditional prediction on measured merges, and judging it out of sample.

A measured pool is a precheck report (its weight and knowledge features) and a ``mergeability``
output folder (``trials.jsonl``: per trial the expert, its partners, the method, its parameters
and the expert's own-task score; or ``mergeability.json``). Every trial is one row: the
expert's features inside exactly that merge (``conditional.design``) and its score. One monotone
linear model per merge rule (``maths.calibration.fit``: non-negative weights on standardised
features, each in its prior direction), fitted on every trial of that rule from every pool.

Out of sample, as ``validate`` and ``calibrate`` do: each expert predicted by a fit that never
saw any of its trials in any pool (leave one expert out), and, with two families or more, by a
fit that never saw its family (pools sharing an expert are one family: a pool measured with two
methods or sizes, or a pool and a subset of it). Reported per rule and per merge size: Spearman
between the held-out prediction and the measured score, per expert (mean over its trials at
that size: its S), with a bootstrap 95% interval over experts; at trial level; within experts
(whether the prediction follows which partners a trial drew); and the same fit without the
merge-dependent features (the expert's own features only) and with every feature, so the gain
from conditioning and the cost of leaving features out are visible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, read_report, write_atomic
from mergekit_mergeability.maths import fitting
from mergekit_mergeability.planner import conditional
from mergekit_mergeability.planner.deciding import merge_of

DEFAULT = Path(__file__).with_name("conditional.json")
PRECHECK_FIELDS = ("path", "role", "knowledge", "weights")


@dataclass
class Rows:
    """Measured trials as design rows: one per trial (the expert's row in its merge)."""

    x: np.ndarray  # (trials, len(conditional.FEATURES))
    y: np.ndarray  # (trials,) the expert's own-task score in that trial
    expert: List[str]  # the expert's path: the unit held out (with all its trials, from every pool)
    pool: List[str]  # its family: pools that share experts, held out and ranked within together
    rule: List[str]
    size: np.ndarray  # |S| of each trial's merge
    sources: List[Dict[str, Any]]  # per pool: files, method, partners, trials, experts


def load(path: Optional[Path] = None) -> conditional.ConditionalCalibration:
    path = Path(path or DEFAULT)
    try:
        document = json.loads(path.read_text())
        return conditional.ConditionalCalibration.from_document({**document, "path": str(path)})
    except FileNotFoundError:
        raise UserError(f"--calibration {path}: no such file; leave --calibration out for the shipped one") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError):
        raise UserError(
            f"--calibration {path}: not a conditional calibration (plan's own, a JSON with its rules and features)"
        ) from None


def trials(folder: Path) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """A mergeability folder's trials (model, partners, score, method, parameters, per_model) and
    its mergeability.json (empty if not written yet: a run in progress is read from trials.jsonl)."""
    folder = Path(folder)
    summary_path = folder / "mergeability.json"
    summary = read_report(summary_path, "mergeability", ("path",)) if summary_path.is_file() else {}
    log = folder / "trials.jsonl"
    found: Dict[Tuple, Dict[str, Any]] = {}
    if log.is_file():
        for number, line in enumerate(log.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                settings = json.loads(entry["settings"]) if isinstance(entry.get("settings"), str) else {}
                row = {
                    "model": entry["model"],
                    "partners": list(entry["partners"]),
                    "score": float(entry["score"]),
                    "method": settings.get("method", summary.get("method")),
                    "parameters": settings.get("parameters", summary.get("parameters") or {}),
                    "per_model": settings.get("per_model") or {},
                }
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise UserError(f"{log}: line {number} is not a trial written by `mergekit-mergeability mergeability`")
            found[(row["model"], entry.get("trial"), entry.get("settings"))] = row
    elif summary:
        for model in summary["models"]:
            for trial in model.get("trials", []):
                found[(model["path"], len(found), None)] = {
                    "model": model["path"],
                    "partners": trial["partners"],
                    "score": float(trial["score"]),
                    "method": summary.get("method"),
                    "parameters": summary.get("parameters") or {},
                    "per_model": {},
                }
    else:
        raise UserError(
            f"{folder}: neither trials.jsonl nor mergeability.json; run `mergekit-mergeability mergeability`"
        )
    return list(found.values()), summary


def measured_rows(pairs: Sequence[Tuple[Path, Path]]) -> Rows:
    """Every trial of every (precheck.json, mergeability folder) pair, as design rows."""
    names = list(conditional.FEATURES)
    xs, ys, experts, pools, rules, sizes, sources = [], [], [], [], [], [], []
    for number, (precheck_path, folder) in enumerate(pairs):
        report = read_report(precheck_path, "precheck", PRECHECK_FIELDS)
        found, summary = trials(folder)
        measured = {m["path"]: m.get("expert_score") for m in summary.get("models", [])}
        pool = conditional.from_report(report, expert_scores={k: v for k, v in measured.items() if v is not None})
        label = f"{Path(precheck_path).parent.parent.name}/{Path(folder).name}"
        kept = 0
        for row in found:
            members = [row["model"], *row["partners"]]
            if any(m not in pool.names for m in members):
                continue  # a trial of a model this precheck did not measure
            merge = merge_of(row["method"], row["parameters"], row["per_model"], members)
            x = conditional.design(pool, [pool.index(m) for m in members], merge, names)[0]
            xs.append(x)
            ys.append(row["score"])
            experts.append(row["model"])
            pools.append(label)
            rules.append(merge.rule)
            sizes.append(len(members))
            kept += 1
        if kept == 0:
            raise UserError(f"{precheck_path} and {folder} share no trial (models matched by path as written)")
        sources.append(
            {
                "precheck": str(precheck_path),
                "mergeability": str(folder),
                "label": label,
                "method": summary.get("method") or found[0]["method"],
                "partners": summary.get("partners"),
                "trials": kept,
                "experts": len({e for e, p in zip(experts, pools) if p == label}),
                "sizes": sorted({s for s, p in zip(sizes, pools) if p == label}),
            }
        )
    families = _families(experts, pools)
    for source in sources:
        source["family"] = families[source["label"]]
    return Rows(np.array(xs), np.array(ys), experts, [families[p] for p in pools], rules, np.array(sizes), sources)


def _families(experts: Sequence[str], pools: Sequence[str]) -> Dict[str, str]:
    """Pools that share an expert (one pool measured with two methods or sizes, or a pool and a
    subset of it) are one family: held out together, ranked within together."""
    parent = {p: p for p in dict.fromkeys(pools)}

    def root(p):
        while parent[p] != p:
            p = parent[p]
        return p

    first: Dict[str, str] = {}
    for expert, pool in zip(experts, pools):
        if expert in first and root(first[expert]) != root(pool):
            parent[root(pool)] = root(first[expert])
        first.setdefault(expert, pool)
    members: Dict[str, List[str]] = {}
    for p in parent:
        members.setdefault(root(p), []).append(p)
    return {p: "+".join(members[root(p)]) for p in parent}


# Fitted only where a rule's trials span two merge sizes or more: at one size they carry what
# own_coefficient carries (c_i = (1 + ‖rest‖/‖τ_i‖ · partner_cosine) / |S| for a mean merge),
# so the fit cannot tell dilution from alignment and may give c_i nothing; a model without
# c_i predicts that a merge of 100 keeps as much as one of 9, against every measured merging
# result (returns fall roughly as 1/k: RESEARCH.md, "Choosing what to merge").
NEEDS_SIZES = ("partner_cosine", "partner_sign_conflict", "merged_count")


def features_for(sizes: Sequence[int]) -> List[str]:
    """The features a rule's model is fitted on, given the merge sizes its trials span."""
    several = len(set(sizes)) > 1
    return [name for name in conditional.FEATURES if several or name not in NEEDS_SIZES]


def fit(rows: Rows, permutations: int = 0, seed: int = 0, resamples: int = 1000) -> Dict[str, Any]:
    """One model per rule, and its out-of-sample numbers (see the module docstring)."""
    fitted, judged = {}, {}
    for rule in sorted(set(rows.rule)):
        at = np.array([r == rule for r in rows.rule])
        y, sizes = rows.y[at], rows.size[at]
        experts = np.array([e for e, keep in zip(rows.expert, at) if keep])
        pools = np.array([p for p, keep in zip(rows.pool, at) if keep])
        chosen = features_for(sizes.tolist())
        variants = {
            "fitted": chosen,
            "expert_features_only": [n for n in chosen if n in conditional.EXPERT],
            "all_features": list(conditional.FEATURES),
        }
        columns = {name: rows.x[at][:, list(conditional.FEATURES).index(name)] for name in conditional.FEATURES}
        x = np.column_stack([columns[n] for n in chosen])
        model = fitting.fit(x, y, chosen, [conditional.FEATURES[n] for n in chosen])
        ranges = {}
        for name, column in columns.items():
            column = column[~np.isnan(column)]
            if column.size:
                ranges[name] = [float(column.min()), float(column.max())]
        fitted[rule] = {
            "model": model.as_dict(),
            "ranges": ranges,
            "sizes": sorted({int(s) for s in sizes}),
            "trials": int(at.sum()),
            "experts": len(set(experts.tolist())),
            "pools": sorted(set(pools.tolist())),
        }
        held = {"leave_one_expert_out": experts}
        if len(set(pools.tolist())) > 1:
            held["leave_one_family_out"] = pools
        judged[rule] = {}
        for how, groups in held.items():
            predicted = {}
            for label, names in variants.items():
                xv = np.column_stack([columns[n] for n in names])
                directions = [conditional.FEATURES[n] for n in names]
                predicted[label] = _clip(fitting.held_out_predictions(xv, y, groups, names, directions, by_group=True))
            cells = {str(size): sizes == size for size in sorted(set(sizes.tolist()))}
            judged[rule][how] = {
                "by_size": {
                    size: _judge(
                        {k: v[inside] for k, v in predicted.items()},
                        y[inside],
                        experts[inside],
                        pools[inside],
                        resamples,
                        seed,
                    )
                    for size, inside in cells.items()
                },
                "all": _judge(predicted, y, experts, pools, resamples, seed),
            }
            if permutations and how == "leave_one_expert_out":
                judged[rule][how]["permutation"] = _null(
                    x,
                    y,
                    experts,
                    pools,
                    chosen,
                    [conditional.FEATURES[n] for n in chosen],
                    permutations,
                    seed,
                    judged[rule][how]["all"]["spearman"],
                )
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "conditional calibration",
        "target": "the expert's own-task score in one measured merge (a trial)",
        "features": dict(conditional.FEATURES),
        "knowledge_feature": conditional.KNOWLEDGE_FEATURE,
        "fitted_only_with_several_sizes": list(NEEDS_SIZES),
        "rules": fitted,
        "pools": rows.sources,
        "out_of_sample": judged,
    }


def _clip(values: np.ndarray) -> np.ndarray:
    return np.clip(values, 0.0, 1.0)


def _per_expert(values: np.ndarray, experts: np.ndarray) -> Tuple[np.ndarray, List[str]]:
    order = list(dict.fromkeys(experts.tolist()))
    return np.array([values[experts == e].mean() for e in order]), order


def _judge(predicted: Mapping[str, np.ndarray], y, experts, pools, resamples: int, seed: int) -> Dict[str, Any]:
    """For the fitted variant: Spearman per expert (within pools, sizes as weights) with its
    bootstrap interval over experts, at trial level, and within experts; for every variant
    (the fitted one, its expert features alone, all features) the Spearman per expert."""
    fitted = predicted["fitted"]
    order = list(dict.fromkeys(experts.tolist()))
    pool_of = np.array([pools[experts == e][0] for e in order])
    mean_y, _ = _per_expert(y, experts)
    variants = {label: _per_expert(values, experts)[0] for label, values in predicted.items()}
    mean_pred = variants["fitted"]
    enough = len(order) >= 3
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(resamples if len(order) >= 5 else 0):
        pick = np.concatenate([rng.choice(np.flatnonzero(pool_of == p), (pool_of == p).sum()) for p in set(pool_of)])
        boot.append(fitting.within_pools(mean_pred[pick], mean_y[pick], pool_of[pick]))
    within = []
    for e in order:
        at = experts == e
        if at.sum() >= 3 and np.std(y[at]) > 0 and np.std(fitted[at]) > 0:
            within.append(float(np.corrcoef(fitted[at], y[at])[0, 1]))
    return {
        "experts": len(order),
        "trials": int(len(y)),
        "spearman": fitting.within_pools(mean_pred, mean_y, pool_of) if enough else None,
        "interval": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))] if boot else None,
        "spearman_trials": fitting.within_pools(fitted, y, pools) if len(y) >= 3 else None,
        "within_expert_pearson": float(np.mean(within)) if within else None,
        "within_expert_count": len(within),
        "variants": {
            label: fitting.within_pools(v, mean_y, pool_of) if enough else None for label, v in variants.items()
        },
        "mean_predicted": float(np.mean(fitted)),
        "mean_measured": float(np.mean(y)),
    }


def _null(x, y, experts, pools, names, directions, permutations: int, seed: int, observed) -> Dict[str, Any]:
    """The whole procedure on scores shuffled between experts within pools (an expert's trials
    keep their order): how often it does as well per expert."""
    rng = np.random.default_rng(seed)
    order = list(dict.fromkeys(experts.tolist()))
    null = []
    for _ in range(permutations):
        shuffled = y.copy()
        for p in set(pools.tolist()):
            inside = [e for e in order if pools[experts == e][0] == p]
            for e, other in zip(inside, rng.permutation(inside)):
                source = y[experts == other]
                target = np.flatnonzero(experts == e)
                shuffled[target] = np.resize(source, len(target))
        predicted = _clip(fitting.held_out_predictions(x, shuffled, experts, names, directions, by_group=True))
        mean_pred, _ = _per_expert(predicted, experts)
        mean_y, _ = _per_expert(shuffled, experts)
        pool_of = np.array([pools[experts == e][0] for e in order])
        null.append(fitting.within_pools(mean_pred, mean_y, pool_of))
    null = np.array(null)
    return {
        "permutations": permutations,
        "p": float((1 + np.sum(null >= (observed or 0) - 1e-12)) / (permutations + 1)),
        "null_95th_percentile": float(np.percentile(null, 95)),
    }


def write(document: Dict[str, Any], out: Path, command: str) -> Path:
    from datetime import datetime, timezone
    from importlib.metadata import version

    document = {
        **document,
        "provenance": {
            "command": command,
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tool": f"mergekit-mergeability {version('mergekit-mergeability')}",
        },
    }
    return write_atomic(Path(out), json.dumps(document, indent=2) + "\n")
