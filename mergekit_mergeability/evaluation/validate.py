"""``validate``: does the precheck's prediction rank models the way measured mergeability does?

Spearman between predicted and measured mergeability, with a permutation p-value
and a bootstrap 95% interval, next to the naive baselines a user could compute
without us: the update norm (smaller = more mergeable, so its negative) and the
base model's accuracy alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.maths.stats import correlate

PREDICTORS: Dict[str, Callable[[dict], Optional[float]]] = {
    "precheck prediction": lambda m: m["predicted_mergeability"],
    "base accuracy (knowledge only)": lambda m: (m["knowledge"] or {}).get("accuracy"),
    "− mean gap (knowledge only)": lambda m: None if not m["knowledge"] else -m["knowledge"]["mean_gap"],
    "− update norm (weights only)": lambda m: None if not m["weights"] else -m["weights"]["update_norm"],
}


def _read(path: Path, kind: str, fields: tuple) -> dict:
    """``kind``'s JSON output, checked to have ``models`` entries with ``fields``."""
    try:
        document = json.loads(Path(path).read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: no such file; run `mergekit-mergeability {kind}` first") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not JSON; expected {kind}'s output") from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) and set(fields) <= m.keys() for m in models):
        raise UserError(f"{path}: not {kind}'s output (needs models with {', '.join(fields)})")
    return document


def validate(precheck_path: Path, mergeability_path: Path, target: str = "mergeability", permutations: int = 10_000, seed: int = 0) -> Dict[str, Any]:
    precheck = _read(precheck_path, "precheck", ("path", "role", "predicted_mergeability", "knowledge", "weights"))
    measured = _read(mergeability_path, "mergeability", ("path",))
    predicted = {m["path"]: m for m in precheck["models"] if m["role"] == "expert"}
    outcome = {m["path"]: m[target] for m in measured["models"] if m.get(target) is not None}
    common = [p for p in predicted if p in outcome]
    if len(common) < 3:
        raise UserError(f"{precheck_path} and {mergeability_path} share {len(common)} models (matched by path as written); need at least 3")
    rows = []
    for name, predictor in PREDICTORS.items():
        pairs = [(predictor(predicted[p]), outcome[p]) for p in common]
        pairs = [(x, y) for x, y in pairs if x is not None]
        if len(pairs) < 3:
            continue
        result = correlate([x for x, _ in pairs], [y for _, y in pairs], permutations=permutations, seed=seed)
        rows.append({"predictor": name, **asdict(result)})
    return {"schema_version": "1.0", "precheck": str(precheck_path), "mergeability": str(mergeability_path), "target": target, "models": len(common), "method": measured.get("method"), "correlations": rows}


def write(report: Dict[str, Any], out: Path) -> List[Path]:
    return [write_atomic(Path(out) / "validation.json", json.dumps(report, indent=2) + "\n")]
