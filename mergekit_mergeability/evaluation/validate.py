"""``validate``: does the precheck's prediction rank models the way measured mergeability does?

Spearman between predicted and measured mergeability, with a permutation p-value
and a bootstrap 95% interval, next to each of its inputs alone (each feature in its
prior direction, nothing fitted: what a user could compute without the combination),
and one line saying whether the combination beats the best single input, with a
paired bootstrap interval of the difference.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, read_report, write_atomic
from mergekit_mergeability.maths.stats import correlate, difference
from mergekit_mergeability.decide.calibration import PRECHECK_FIELDS
from mergekit_mergeability.decide.features import FEATURES, features

PREDICTION = "precheck prediction"


def validate(
    precheck_path: Path,
    mergeability_path: Path,
    target: str = "mergeability",
    permutations: int = 10_000,
    seed: int = 0,
) -> Dict[str, Any]:
    precheck = read_report(precheck_path, "precheck", (*PRECHECK_FIELDS, "predicted_mergeability"))
    measured = read_report(mergeability_path, "mergeability", ("path",))
    predicted = {m["path"]: m for m in precheck["models"] if m["role"] == "expert"}
    outcome = {m["path"]: m[target] for m in measured["models"] if m.get(target) is not None}
    common = [p for p in predicted if p in outcome]
    if len(common) < 3:
        raise UserError(
            f"{precheck_path} and {mergeability_path} share {len(common)} models (matched by path as written); need at least 3"
        )
    table = features(list(predicted.values()))
    predictors = {PREDICTION: {p: predicted[p]["predicted_mergeability"] for p in common}}
    for name, direction in FEATURES.items():
        values = {p: table[p][name] for p in common}
        if sum(v is not None for v in values.values()) >= 3:
            predictors[f"{'−' if direction < 0 else ''}{name} alone"] = {
                p: None if v is None else direction * v for p, v in values.items()
            }
    rows = []
    for label, values in predictors.items():
        known = [p for p in common if values[p] is not None]
        if len(known) >= 3:
            result = correlate(
                [values[p] for p in known], [outcome[p] for p in known], permutations=permutations, seed=seed
            )
            rows.append({"predictor": label, **asdict(result)})
    report = {
        "schema_version": SCHEMA_VERSION,
        "precheck": str(precheck_path),
        "mergeability": str(mergeability_path),
        "target": target,
        "models": len(common),
        "method": measured.get("method"),
        "correlations": rows,
    }
    report["versus_best_single"] = _versus_best(rows, predictors, outcome, common, seed)
    return report


def _versus_best(rows, predictors, outcome, common, seed) -> Dict[str, Any] | None:
    """The prediction minus the best single input other than one it equals (a rehearsal it reads
    as is cannot lose to itself), over the models both rank."""
    prediction = predictors[PREDICTION]
    same = [
        r["predictor"]
        for r in rows
        if r["predictor"] != PREDICTION and all(predictors[r["predictor"]][p] == prediction[p] for p in common)
    ]
    singles = [r for r in rows if r["predictor"] not in (PREDICTION, *same)]
    if not singles or not any(r["predictor"] == PREDICTION for r in rows):
        return None
    best = max(singles, key=lambda r: r["spearman"])["predictor"]
    known = [p for p in common if predictors[PREDICTION][p] is not None and predictors[best][p] is not None]
    delta, interval = difference(
        [predictors[PREDICTION][p] for p in known],
        [predictors[best][p] for p in known],
        [outcome[p] for p in known],
        seed=seed,
    )
    return {
        "best_single": best,
        "difference": delta,
        "interval": list(interval),
        "beats": interval[0] > 0,
        "n": len(known),
        "same_as": same,
    }


def write(report: Dict[str, Any], out: Path) -> List[Path]:
    return [write_atomic(Path(out) / "validation.json", json.dumps(report, indent=2) + "\n")]
