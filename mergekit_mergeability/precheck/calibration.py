"""The prediction's features, and the calibration that turns them into predicted mergeability.

Features of model i (each with its prior direction: + means higher is more mergeable):

    p_gold                 +  the base's p(gold) over the options, few-shot (Will it Merge?)
    gap                    −  p(top) − p(gold)
    accuracy               +  the base's accuracy
    letter_p_gold          +  p(gold) over the options' letters
    gold_logprob_per_token +  the gold answer's log-prob per token
    task_p_gold            +  p(gold) with the probe asked as its task scores it
    task_accuracy          +  accuracy, likewise
    task_gap               −  gap, likewise
    relative_norm          −  log(‖τ_i‖ / median over the config's models)
    relative_top_sv        −  log(σ_max(τ_i) / median)
    pool_cosine            +  cos(τ_i, Σ_{j≠i} τ_j): the others pull along (+) or against (−)
    mean_sign_conflict     −  mean TIES sign-conflict rate with the others

``calibrate`` fits ``maths.calibration.fit`` on measured pools (precheck.json +
mergeability.json pairs) and writes a calibration file; ``precheck --calibration``
reads one; ``calibration.json`` beside this file is the default, with its provenance
and out-of-sample numbers inside, and which knowledge feature (the better predictor of
p_gold and task_p_gold on the fitted pools) supplies knowledge_weighted's values.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, read_report
from mergekit_mergeability.maths import calibration as fitting
from mergekit_mergeability.maths.stats import correlate

DEFAULT = Path(__file__).with_name("calibration.json")
FEATURES: Dict[str, int] = {
    "p_gold": +1,
    "gap": -1,
    "accuracy": +1,
    "letter_p_gold": +1,
    "gold_logprob_per_token": +1,
    "task_p_gold": +1,
    "task_accuracy": +1,
    "task_gap": -1,
    "relative_norm": -1,
    "relative_top_sv": -1,
    "pool_cosine": +1,
    "mean_sign_conflict": -1,
}
Features = Dict[str, Optional[float]]
KNOWLEDGE_VALUES = ("p_gold", "task_p_gold")  # candidates for knowledge_weighted's knowledge: in [0, 1]
PRECHECK_FIELDS = ("path", "role", "knowledge", "weights")
# How a reason names each feature's value; the relative_* features are log ratios to the pool median
SAY = {
    "p_gold": "p(gold) {:.2f}",
    "gap": "gap {:.2f}",
    "accuracy": "accuracy {:.2f}",
    "letter_p_gold": "p(gold letter) {:.2f}",
    "gold_logprob_per_token": "log p(gold)/token {:.2f}",
    "task_p_gold": "p(gold) as the task asks {:.2f}",
    "task_accuracy": "accuracy as the task asks {:.2f}",
    "task_gap": "gap as the task asks {:.2f}",
    "relative_norm": "size {:.2g}× median",
    "relative_top_sv": "σ_max {:.2g}× median",
    "pool_cosine": "cos(rest) {:+.2f}",
    "mean_sign_conflict": "sign conflict {:.2f}",
}


def say(feature: str, value: float) -> str:
    return SAY[feature].format(math.exp(value) if feature.startswith("relative_") else value)


def features(models: Sequence[Mapping[str, Any]]) -> Dict[str, Features]:
    """Per expert of a precheck report's ``models``: every feature (None where not measured)."""
    experts = [m for m in models if m["role"] == "expert"]
    weights = {m["path"]: m.get("weights") or {} for m in experts}
    medians = {key: _median([w.get(key) for w in weights.values()]) for key in ("update_norm", "top_singular_value")}
    table = {}
    for model in experts:
        k, w = model.get("knowledge") or {}, weights[model["path"]]
        table[model["path"]] = {
            "p_gold": k.get("mean_p_gold"),
            "gap": k.get("mean_gap"),
            "accuracy": k.get("accuracy"),
            "letter_p_gold": k.get("mean_letter_p_gold"),
            "gold_logprob_per_token": k.get("mean_gold_logprob_per_token"),
            "task_p_gold": k.get("task_mean_p_gold"),
            "task_accuracy": k.get("task_accuracy"),
            "task_gap": k.get("task_mean_gap"),
            "relative_norm": _log_ratio(w.get("update_norm"), medians["update_norm"]),
            "relative_top_sv": _log_ratio(w.get("top_singular_value"), medians["top_singular_value"]),
            "pool_cosine": w.get("pool_cosine"),
            "mean_sign_conflict": w.get("mean_sign_conflict"),
        }
    return table


def _median(values) -> Optional[float]:
    known = [v for v in values if v]
    return statistics.median(known) if known else None


def _log_ratio(value: Optional[float], median: Optional[float]) -> Optional[float]:
    return math.log(value / median) if value and median else None


@dataclass(frozen=True)
class Calibration:
    model: fitting.Linear
    document: Dict[str, Any]  # the whole file: target, method, provenance, out-of-sample numbers
    path: Path

    @property
    def knowledge_feature(self) -> str:
        """Which knowledge feature knowledge_weighted's ``knowledge`` values come from."""
        return self.document.get("knowledge_feature", "p_gold")

    @classmethod
    def load(cls, path: Optional[Path] = None) -> "Calibration":
        path = Path(path or DEFAULT)
        try:
            document = json.loads(path.read_text())
            return cls(fitting.Linear.from_dict(document["model"]), document, path)
        except FileNotFoundError:
            raise UserError(f"--calibration {path}: no such file; write one with `mergekit-mergeability calibrate`") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise UserError(f"--calibration {path}: not a calibration file (written by `mergekit-mergeability calibrate`)") from None

    def predict(self, values: Features) -> Tuple[Optional[float], List[str]]:
        """Predicted mergeability in [0, 1], and what drove it (the largest contributions)."""
        names = list(self.model.names)
        x = np.array([[np.nan if values.get(n) is None else values[n] for n in names]])
        if np.isnan(x).all():
            return None, ["nothing measured: no probes and no weights"]
        value = float(np.clip(self.model.predict(x)[0], 0.0, 1.0))
        z = np.nan_to_num((x[0] - self.model.means) / self.model.stds) * self.model.directions * self.model.weights
        drivers = sorted((i for i in range(len(names)) if self.model.weights[i] > 0), key=lambda i: -abs(z[i]))
        reasons = [f"{'↑' if z[i] >= 0 else '↓'} {say(names[i], values[names[i]])}" for i in drivers[:2] if values.get(names[i]) is not None and abs(z[i]) >= 0.02]
        missing = [names[i] for i in drivers if values.get(names[i]) is None]
        if missing:
            reasons.append(f"not measured, taken as typical: {', '.join(missing)}")
        return value, reasons


def measured_pool(precheck_path: Path, mergeability_path: Path, target: str = "mergeability") -> Tuple[List[str], np.ndarray, np.ndarray, dict]:
    """(models, features (n × f), targets, mergeability report) for the models both files share."""
    precheck = read_report(precheck_path, "precheck", PRECHECK_FIELDS)
    measured = read_report(mergeability_path, "mergeability", ("path",))
    table = features(precheck.get("models", []))
    outcome = {m["path"]: m.get(target) for m in measured.get("models", [])}
    common = [m for m in table if outcome.get(m) is not None]
    if len(common) < 3:
        raise UserError(f"{precheck_path} and {mergeability_path} share {len(common)} models (matched by path as written); need at least 3")
    x = np.array([[np.nan if table[m][f] is None else table[m][f] for f in FEATURES] for m in common], dtype=float)
    return common, x, np.array([outcome[m] for m in common], dtype=float), measured


def calibrate(pairs: Sequence[Tuple[Path, Path]], target: str = "mergeability", permutations: int = 500, seed: int = 0) -> Dict[str, Any]:
    """Fit on every pool, and judge the fit out of sample (leave one model out, leave one
    pool out) against each feature alone and a permutation null of the whole procedure."""
    names, directions = list(FEATURES), list(FEATURES.values())
    pools, rows, targets, groups, methods = [], [], [], [], set()
    for index, (precheck_path, mergeability_path) in enumerate(pairs):
        models, x, y, measured = measured_pool(precheck_path, mergeability_path, target)
        methods.add((measured.get("method"), measured.get("partners")))
        pools.append({"precheck": str(precheck_path), "mergeability": str(mergeability_path), "models": len(models), "method": measured.get("method"), "partners": measured.get("partners"), "trials": measured.get("trials")})
        rows.append(x)
        targets.append(y)
        groups += [f"pool{index}"] * len(models)
    x, y = np.vstack(rows), np.concatenate(targets)
    usable = [j for j in range(len(names)) if (~np.isnan(x[:, j])).sum() >= 3]
    names, directions, x = [names[j] for j in usable], [directions[j] for j in usable], x[:, usable]
    singles = fitting.single_features(x, y, groups, names, directions)
    held_out = {"leave_one_model_out": _out_of_sample(x, y, groups, names, directions, singles, permutations, seed, by_group=False)}
    if len(pairs) > 1:
        held_out["leave_one_pool_out"] = _out_of_sample(x, y, groups, names, directions, singles, permutations, seed, by_group=True)
    model = fitting.fit(x, y, names, directions)
    knowing = {f: singles[f] for f in KNOWLEDGE_VALUES if f in singles}
    return {
        "target": target,
        "knowledge_feature": max(knowing, key=knowing.get) if knowing else "p_gold",
        "method": sorted(m for m, _ in methods if m),
        "partners": sorted(p for _, p in methods if p),
        "model": model.as_dict(),
        "pools": pools,
        "models": len(y),
        "single_features": singles,
        "out_of_sample": held_out,
        "beats_best_single_feature": all(r["beats_best_single_feature"] for r in held_out.values()),
    }


def _out_of_sample(x, y, groups, names, directions, singles, permutations, seed, by_group: bool) -> Dict[str, Any]:
    predicted = fitting.held_out_predictions(x, y, groups, names, directions, by_group=by_group)
    observed = fitting.within_pools(predicted, y, groups)
    null = fitting.permutation_null(x, y, groups, names, directions, permutations, seed, by_group=by_group)
    best = fitting.best(singles)
    interval = correlate(predicted, y, permutations=100, seed=seed).interval if len(set(groups)) == 1 else None
    return {
        "spearman": observed,
        "p_permutation": fitting.p_value(observed, null),
        "null_95th_percentile": float(np.percentile(null, 95)),
        "permutations": permutations,
        "interval": interval,
        "best_single_feature": best,
        "best_single_spearman": singles.get(best),
        "beats_best_single_feature": best is None or observed > singles[best],
    }


def write(report: Dict[str, Any], out: Path, sources: Sequence[str]) -> Path:
    """The calibration file: the fit, how it was made, and how it did out of sample."""
    from datetime import datetime, timezone
    from importlib.metadata import version

    from mergekit_mergeability.files import write_atomic

    document = {
        "schema_version": SCHEMA_VERSION,
        **report,
        "provenance": {
            "command": "mergekit-mergeability calibrate " + " ".join(sources),
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tool": f"mergekit-mergeability {version('mergekit-mergeability')}",
        },
    }
    return write_atomic(Path(out), json.dumps(document, indent=2) + "\n")
