"""The precheck report: ``precheck.json`` (schema: ``schema.json`` beside this file),
``recommended.yml`` (runs as is with the stock ``mergekit-yaml``) and ``report.html``."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.precheck import Measurements
from mergekit_mergeability.precheck.config import model_entries
from mergekit_mergeability.precheck.predict import (
    KNOWLEDGE_WEIGHTED,
    LAYER_SELECTIVE,
    cutoff_from_curve,
    divergence_curve,
    predict,
    recommend,
)

SCHEMA_VERSION = "1.0"
SCHEMA = Path(__file__).with_name("schema.json")
DEFAULT_THRESHOLD = 0.9


def build(measured: Measurements, options: Dict[str, Any]) -> Dict[str, Any]:
    from importlib.metadata import version

    spec, results = measured.spec, measured.results
    threshold = options.get("cka_threshold", DEFAULT_THRESHOLD)
    knowledge = {m.name: _metrics(results, "knowledge", m.name) for m in measured.models}
    weights = {m.name: _metrics(results, "weights", m.name) for m in measured.models}
    predictions = predict(knowledge, {m: (w or {}).get("update_norm") for m, w in weights.items()})
    curves = {pair: layers["cka"] for pair, layers in _per_layer(results, "representations").items()}
    curve = divergence_curve(curves, spec.base_model)
    cutoff = cutoff_from_curve(curve, threshold)
    recommendation = recommend(spec.merge_method, predictions, knowledge, cutoff, measured.errors())
    layer_norms = {m: v.get("update_norm") for m, v in _per_layer(results, "weights", pairs=False).items()}
    models = [_model(measured.base.name, "base")] if measured.base else []
    for m in measured.models:
        probe = measured.probe_specs.get(m.name)
        models.append(_model(m.name, "expert", probe, knowledge[m.name], predictions[m.name], weights[m.name], layer_norms.get(m.name)))
    report = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mergekit-mergeability", "version": version("mergekit-mergeability")},
        "config": str(spec.source),
        "merge_method": spec.merge_method,
        "base_model": spec.base_model,
        "options": {k: sorted(v) if isinstance(v, set) else v for k, v in options.items() if k != "quiet"},
        "models": models,
        "pairs": _pairs(results),
        "layers": {"cka_threshold": threshold, "divergence": curve, "cutoff": cutoff},
        "recommendation": {
            "verdict": recommendation.verdict,
            "method": recommendation.method,
            "cutoff": recommendation.cutoff,
            "weights": _weights(recommendation, spec),
            "knowledge": recommendation.knowledge or None,
            "reasons": recommendation.reasons,
        },
        "findings": [{"diagnostic": name, "severity": f.severity, "message": f.message} for name, f in measured.findings()],
        "skipped_diagnostics": measured.skipped,
        "diagnostics": {name: _raw(result) for name, result in results.items()},
    }
    return _json_safe(report)


def _metrics(results, diagnostic: str, model: str) -> Optional[Dict[str, float]]:
    return results[diagnostic].per_model.get(model) if diagnostic in results else None


def _per_layer(results, diagnostic: str, pairs: bool = True) -> Dict:
    """A diagnostic's per-layer values keyed by pair (``pairs``) or by model."""
    if diagnostic not in results:
        return {}
    return {k: v for k, v in results[diagnostic].per_layer.items() if isinstance(k, tuple) == pairs}


def _model(name, role, probe=None, knowledge=None, prediction=None, weights=None, layer_norms=None) -> Dict[str, Any]:
    return {
        "path": name,
        "role": role,
        "probe": probe,
        "knowledge": None if knowledge is None else {k: knowledge[k] for k in ("accuracy", "mean_gap", "mean_gold_logprob", "instances")},
        "weights": None if weights is None else {**weights, "layer_update_norm": layer_norms},
        "predicted_mergeability": None if prediction is None else prediction.value,
        "reasons": [] if prediction is None else prediction.reasons,
    }


def _pairs(results) -> List[Dict[str, Any]]:
    pairs: Dict[tuple, Dict[str, Any]] = {}
    for pair, layers in _per_layer(results, "representations").items():
        pairs.setdefault(pair, {}).update(layers)
    if "weights" in results:
        for pair, values in results["weights"].per_pair.items():
            pairs.setdefault(pair, {}).update(values)
    return [{"a": a, "b": b, **values} for (a, b), values in pairs.items()]


def _weights(recommendation, spec) -> Optional[Dict[str, float]]:
    if recommendation.verdict == KNOWLEDGE_WEIGHTED:
        from mergekit_mergeability.methods.knowledge_weighted import knowledge_weights

        names = list(recommendation.knowledge)
        shares = knowledge_weights([recommendation.knowledge[n] for n in names])
        return {n: float(w) for n, w in zip(names, shares)}
    configured = {str(e["model"]): (e.get("parameters") or {}).get("weight") for e in model_entries(spec.document)}
    numeric = {m: float(w) for m, w in configured.items() if isinstance(w, (int, float))}
    return numeric or None


def _raw(result) -> Dict[str, Any]:
    key = lambda k: "|".join(k) if isinstance(k, tuple) else k  # noqa: E731
    return {
        "per_model": result.per_model,
        "per_pair": {key(k): v for k, v in result.per_pair.items()},
        "per_layer": {key(k): v for k, v in result.per_layer.items()},
    }


def _json_safe(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def recommended_config(report: Dict[str, Any], document: Dict[str, Any], resolved: Dict[str, Path]) -> Dict[str, Any]:
    """The user's config with the recommended method and parameters; local model paths made absolute."""
    config = copy.deepcopy(document)
    recommendation = report["recommendation"]
    for entry in model_entries(config):
        entry["model"] = str(resolved.get(str(entry["model"]), entry["model"]))
    if config.get("base_model") in resolved:
        config["base_model"] = str(resolved[config["base_model"]])
    old_method = config["merge_method"]
    parameters = config.setdefault("parameters", {}) or {}
    config["parameters"] = parameters
    if recommendation["verdict"] == KNOWLEDGE_WEIGHTED:
        config["merge_method"] = "knowledge_weighted"
        by_path = {str(resolved.get(m, m)): k for m, k in recommendation["knowledge"].items()}
        for entry in model_entries(config):
            if entry["model"] in by_path:
                entry.setdefault("parameters", {})["knowledge"] = round(by_path[entry["model"]], 4)
        if old_method in ("ties", "dare_ties"):
            parameters["ties"] = True
    elif recommendation["verdict"] == LAYER_SELECTIVE:
        config["merge_method"] = "layer_selective"
        parameters["cutoff"] = recommendation["cutoff"]
        parameters["inner"] = old_method if old_method in ("task_arithmetic", "linear", "ties") else "task_arithmetic"
    return config


def write(report: Dict[str, Any], measured: Measurements, out: Path) -> List[Path]:
    """Write the three files into ``out`` (each atomically); returns their paths."""
    import yaml

    resolved = {m.name: m.path for m in ([measured.base] if measured.base else []) + list(measured.models)}
    header = (
        f"# Written by mergekit-mergeability precheck from {measured.spec.source}\n"
        f"# verdict: {report['recommendation']['verdict']}. " + " ".join(report["recommendation"]["reasons"]) + "\n"
    )
    config = recommended_config(report, measured.spec.document, resolved)
    from mergekit_mergeability.precheck.html import render

    return [
        write_atomic(out / "precheck.json", json.dumps(report, indent=2) + "\n"),
        write_atomic(out / "recommended.yml", header + yaml.safe_dump(config, sort_keys=False)),
        write_atomic(out / "report.html", render(report)),
    ]
