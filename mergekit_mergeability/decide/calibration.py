"""The calibration that turns a model's features (``features``) into predicted mergeability.

``calibrate`` fits ``maths.calibration.fit`` on measured pools (precheck.json +
mergeability.json pairs) and writes a calibration file; ``precheck --calibration``
reads one; ``calibration.json`` beside this file is the default, with its provenance
and out-of-sample numbers inside, which knowledge feature (the better predictor of
p_gold and scored_p_gold on the fitted pools) supplies knowledge_weighted's values, and
the domain it was fitted on (``domain``: probe kinds, scored formats and their shots, items
per probe, feature ranges), which ``domain_check`` compares a precheck against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.decide.features import (
    CALIBRATED,
    KNOWLEDGE_VALUES,
    RENAMED,
    Features,
    features,
    fitted_with,
    say,
)
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, read_report
from mergekit_mergeability.maths import fitting
from mergekit_mergeability.maths.stats import correlate
from mergekit_mergeability.records import KnowledgeStats

DEFAULT = Path(__file__).with_name("calibration.json")
# What the shipped prediction reads first, where the precheck measured it: the model's own probe on a
# rehearsal of the merge (``dilution``'s partnered pass: paper 1's mean merge with its expected partner,
# or a small config's merge as configured). Decided on a family defined before it was trained
# (docs/prediction.md, "a rehearsal of the merge").
REHEARSAL = "rehearsal"
REHEARSED = "rehearsed merge: "  # the first reason of a prediction that is the rehearsal
PRECHECK_FIELDS = ("path", "role", "knowledge", "weights")


@dataclass(frozen=True)
class Calibration:
    model: fitting.Linear
    document: Dict[str, Any]  # the whole file: target, method, provenance, out-of-sample numbers
    path: Path

    @property
    def knowledge_feature(self) -> str:
        """Which knowledge feature knowledge_weighted's ``knowledge`` values come from."""
        feature = self.document.get("knowledge_feature", "p_gold")
        return RENAMED.get(feature, feature)

    @classmethod
    def load(cls, path: Optional[Path] = None) -> "Calibration":
        path = Path(path or DEFAULT)
        try:
            document = json.loads(path.read_text())
            for feature in document["model"]["features"]:
                feature["name"] = RENAMED.get(feature["name"], feature["name"])
            return cls(fitting.Linear.from_dict(document["model"]), document, path)
        except FileNotFoundError:
            raise UserError(
                f"--calibration {path}: no such file; write one with `mergekit-mergeability calibrate`"
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise UserError(
                f"--calibration {path}: not a calibration file (written by `mergekit-mergeability calibrate`)"
            ) from None

    @property
    def reads_first(self) -> Optional[str]:
        """The measured feature the prediction is, where the precheck measured it (``REHEARSAL``);
        None: the fitted model alone (calibration files written before 2026-12-03)."""
        return self.document.get("reads_first")

    def predict(self, values: Features) -> Tuple[Optional[float], List[str]]:
        """Predicted mergeability in [0, 1], and what drove it: the rehearsal where it was measured
        (``reads_first``), else the fitted model's largest contributions."""
        first = values.get(self.reads_first) if self.reads_first else None
        if first is None:
            return self.fitted(values)
        alone, _ = self.fitted(values)
        reasons = [REHEARSED + say(self.reads_first, first)]
        if alone is not None:
            reasons.append(f"knowledge and weights alone: {alone:.2f}")
        return float(np.clip(first, 0.0, 1.0)), reasons

    def fitted(self, values: Features) -> Tuple[Optional[float], List[str]]:
        """The fitted model's prediction in [0, 1], and its largest contributions."""
        names = list(self.model.names)
        x = np.array([[np.nan if values.get(n) is None else values[n] for n in names]])
        if np.isnan(x).all():
            return None, ["nothing measured: no probes and no weights"]
        value = float(np.clip(self.model.predict(x)[0], 0.0, 1.0))
        z = np.nan_to_num((x[0] - self.model.means) / self.model.stds) * self.model.directions * self.model.weights
        drivers = sorted((i for i in range(len(names)) if self.model.weights[i] > 0), key=lambda i: -abs(z[i]))
        reasons = [
            f"{'↑' if z[i] >= 0 else '↓'} {say(names[i], values[names[i]])}"
            for i in drivers[:2]
            if values.get(names[i]) is not None and abs(z[i]) >= 0.02
        ]
        missing = [names[i] for i in drivers if values.get(names[i]) is None]
        if missing:
            reasons.append(f"not measured, taken as typical: {', '.join(missing)}")
        return value, reasons


def measured_pool(
    precheck_path: Path, mergeability_path: Path, target: str = "mergeability", names: Sequence[str] = tuple(CALIBRATED)
) -> Tuple[List[str], np.ndarray, np.ndarray, dict]:
    """(models, features (n × f, columns ``names``), targets, mergeability report) for the models both files share."""
    precheck = read_report(precheck_path, "precheck", PRECHECK_FIELDS)
    measured = read_report(mergeability_path, "mergeability", ("path",))
    table = features(precheck.get("models", []))
    outcome = {m["path"]: m.get(target) for m in measured.get("models", [])}
    common = [m for m in table if outcome.get(m) is not None]
    if len(common) < 3:
        raise UserError(
            f"{precheck_path} and {mergeability_path} share {len(common)} models (matched by path as written); need at least 3"
        )
    x = np.array([[np.nan if table[m][f] is None else table[m][f] for f in names] for m in common], dtype=float)
    return common, x, np.array([outcome[m] for m in common], dtype=float), measured


def probe_domain(models: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Per expert of a precheck report: how its probe is scored and how many lines it has
    (a single fact has one or two phrasings; a task-level probe dozens)."""
    described = []
    for model in models:
        if model["role"] != "expert":
            continue
        k = KnowledgeStats.of(model.get("knowledge"))
        measured = model.get("knowledge") is not None
        described.append(
            {
                "path": model["path"],
                "format": k.format if measured else None,
                "shots": k.scored_shots,
                "lines": k.instances,
            }
        )
    return described


def domain(precheck_paths: Sequence[Path], x: np.ndarray, names: Sequence[str]) -> Dict[str, Any]:
    """What a calibration was fitted on: scored formats, probe lines per model, feature ranges."""
    probes = [
        d for path in precheck_paths for d in probe_domain(read_report(path, "precheck", PRECHECK_FIELDS)["models"])
    ]
    lines = [d["lines"] for d in probes if d["lines"]]
    ranges = {}
    for j, name in enumerate(names):
        column = x[:, j][~np.isnan(x[:, j])]
        if column.size:
            ranges[name] = [float(column.min()), float(column.max())]
    return {
        "formats": sorted({d["format"] for d in probes if d["format"]}),
        "scored_as": sorted({_scored_as(d) for d in probes if d["format"] and d["shots"] is not None}),
        "probe_lines": [min(lines), max(lines)] if lines else None,
        "features": ranges,
    }


def _scored_as(probe: Mapping[str, Any]) -> str:
    """A probe's format with its shots, as the domain records it: ``options, 3-shot``."""
    return f"{probe['format']}, {probe['shots']}-shot"


# How far past the fitted range a feature may lie, as a share of that range, before it is named
RANGE_SLACK = 0.25
# Probes this many times longer (or shorter) than any fitted on, or more, are another granularity
LINES_FACTOR = 4


def domain_check(
    calibration: "Calibration", models: Sequence[Mapping[str, Any]], table: Mapping[str, Features]
) -> Dict[str, List[str]]:
    """Per expert, where its probe or features lie outside what the calibration was fitted
    on (empty lists: inside, or predicted by the rehearsal the calibration reads first; no entry
    at all: the calibration records no domain)."""
    fitted = calibration.document.get("domain")
    if not fitted:
        return {}
    checked = {}
    for probe in probe_domain(models):
        outside = []
        if calibration.reads_first and table.get(probe["path"], {}).get(calibration.reads_first) is not None:
            checked[probe["path"]] = outside  # predicted by the rehearsal: nothing fitted to lie outside of
            continue
        if probe["format"] and fitted["formats"] and probe["format"] not in fitted["formats"]:
            outside.append(f"probe scored as {probe['format']}; fitted on {', '.join(fitted['formats'])} probes only")
        elif probe["format"] and probe["shots"] is not None and fitted.get("scored_as"):
            if _scored_as(probe) not in fitted["scored_as"]:  # the format fitted on, with other shots
                outside.append(
                    f"probe scored as {_scored_as(probe)}; fitted on {' and '.join(fitted['scored_as'])} probes only"
                )
        low, high = fitted.get("probe_lines") or (None, None)
        if probe["lines"] and low and (probe["lines"] >= LINES_FACTOR * high or probe["lines"] * LINES_FACTOR <= low):
            fitted_lines = f"{low}" if low == high else f"{low}–{high}"
            outside.append(
                f"{probe['lines']} probe lines; fitted on probes of {fitted_lines} lines (another granularity)"
            )
        weighed = {n for n, w in zip(calibration.model.names, calibration.model.weights) if w > 0}
        for feature, (least, most) in fitted.get("features", {}).items():
            if feature not in weighed:
                continue
            value, slack = table.get(probe["path"], {}).get(feature), RANGE_SLACK * (most - least)
            if value is not None and not least - slack <= value <= most + slack:
                outside.append(f"{feature} {value:.2f} outside the fitted {least:.2f}–{most:.2f}")
        checked[probe["path"]] = outside
    return checked


def calibrate(
    pairs: Sequence[Tuple[Path, Path]],
    target: str = "mergeability",
    permutations: int = 500,
    seed: int = 0,
    within: bool = False,
    also: Sequence[str] = (),
    rehearsal: bool = True,
) -> Dict[str, Any]:
    """Fit on every pool, and judge the fit out of sample (leave one model out, leave one
    pool out) against each feature alone and a permutation null of the whole procedure;
    ``within``: the weights fitted within pools (``maths.calibration.fit``); ``also``: features
    measured but not fitted (``features.UNFITTED``) fitted too, to test them; ``rehearsal``: the
    prediction reads ``REHEARSAL`` first where the precheck measured it (the fitted model elsewhere)."""
    chosen = fitted_with(also)
    names, directions = list(chosen), list(chosen.values())
    pools, rows, targets, groups, methods = [], [], [], [], set()
    for index, (precheck_path, mergeability_path) in enumerate(pairs):
        models, x, y, measured = measured_pool(precheck_path, mergeability_path, target, names)
        methods.add((measured.get("method"), measured.get("partners")))
        pools.append(
            {
                "precheck": str(precheck_path),
                "mergeability": str(mergeability_path),
                "models": len(models),
                "method": measured.get("method"),
                "partners": measured.get("partners"),
                "trials": measured.get("trials"),
            }
        )
        rows.append(x)
        targets.append(y)
        groups += [f"pool{index}"] * len(models)
    x, y = np.vstack(rows), np.concatenate(targets)
    usable = [j for j in range(len(names)) if (~np.isnan(x[:, j])).sum() >= 3]
    names, directions, x = [names[j] for j in usable], [directions[j] for j in usable], x[:, usable]
    singles = fitting.single_features(x, y, groups, names, directions)
    held_out = {
        "leave_one_model_out": _out_of_sample(
            x, y, groups, names, directions, singles, permutations, seed, by_group=False, within=within
        )
    }
    if len(pairs) > 1:
        held_out["leave_one_pool_out"] = _out_of_sample(
            x, y, groups, names, directions, singles, permutations, seed, by_group=True, within=within
        )
    model = fitting.fit(x, y, names, directions, groups=groups if within else None)
    knowing = {f: singles[f] for f in KNOWLEDGE_VALUES if f in singles}
    return {
        "target": target,
        "fitted": "within pools" if within else "pooled",
        "knowledge_feature": max(knowing, key=knowing.get) if knowing else "scored_p_gold",
        "reads_first": REHEARSAL if rehearsal else None,
        "method": sorted(m for m, _ in methods if m),
        "partners": sorted(p for _, p in methods if p),
        "model": model.as_dict(),
        "pools": pools,
        "models": len(y),
        "single_features": singles,
        "domain": domain([p for p, _ in pairs], x, names),
        "out_of_sample": held_out,
        "beats_best_single_feature": all(r["beats_best_single_feature"] for r in held_out.values()),
    }


def _out_of_sample(
    x, y, groups, names, directions, singles, permutations, seed, by_group: bool, within: bool
) -> Dict[str, Any]:
    predicted = fitting.held_out_predictions(x, y, groups, names, directions, by_group, within)
    observed = fitting.within_pools(predicted, y, groups)
    null = fitting.permutation_null(x, y, groups, names, directions, permutations, seed, by_group, within)
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
