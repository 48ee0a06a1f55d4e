"""The precheck's files: ``precheck.json`` (schema: ``precheck.schema.json`` beside this file),
the recommended configs (``recommended.yml``, and ``recommended/<expert>.yml`` for
layer_selective; each runs as is with the stock ``mergekit-yaml``) and ``report.html``."""

from __future__ import annotations

import json
from dataclasses import asdict
import math
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from mergekit_mergeability.decide import Decision
from mergekit_mergeability.decide.advice import MAIN, PER_EXPERT, Advice, advise, configured_update
from mergekit_mergeability.decide.calibration import Calibration
from mergekit_mergeability.decide.features import FEATURES as FEATURE_NAMES
from mergekit_mergeability.decide.verdict import RELATIVE_DROP
from mergekit_mergeability.diagnostics.selectivity import COLLISION_SHARE, SPECIFIC, colliding_layers
from mergekit_mergeability.files import SCHEMA_VERSION, write_atomic
from mergekit_mergeability.names import short_names
from mergekit_mergeability.measuring import Measurements, blocks, per_layer
from mergekit_mergeability.records import PairLayers
from mergekit_mergeability.merge_config import absolute
from mergekit_mergeability.settings import PrecheckSettings

SCHEMA = Path(__file__).with_name("precheck.schema.json")


def _search(choice, document, cutoff: Optional[int]) -> List[Dict[str, Any]]:
    """Every rehearsed candidate: its knobs, and what its models keep on each half of their probes
    and on all their items (``verdict.choose_method``); the layer patch at ``cutoff`` among them
    where it was rehearsed."""
    from mergekit_mergeability.decide.tuning import candidates
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, PATCH

    found = candidates(document, choice.knowledge)
    written = {"method": document["merge_method"], "line": "as written, lambda ×", "scale": 1.0, "density": None}
    knobs = {
        AS_WRITTEN: written,
        PATCH: {"method": "layer_selective", "line": PATCH, "density": None, "cutoff": cutoff},
        **{name: candidate.knobs() for name, candidate in found.items()},
    }
    return [
        {
            "name": name,
            **knobs.get(name, {}),
            "kept": choice.kept[name],
            "half_a": choice.halves[name][0],
            "half_b": choice.halves[name][1],
            "picked_on": [half for half, pick in zip("ab", choice.picked) if pick == name],
        }
        for name in choice.kept
    ]


def build(measured: Measurements, settings: PrecheckSettings, decision: Decision) -> Dict[str, Any]:
    """precheck.json: the measurements, and the decision taken on them (``measure.decision``)."""
    from importlib.metadata import version

    spec, results = measured.spec, measured.results
    names = short_names([m.name for m in ([measured.base] if measured.base else []) + list(measured.models)])
    specific = {
        m: {k[len(SPECIFIC) :]: v for k, v in layers.items()}
        for m, layers in per_layer(results, "selectivity", pairs=False).items()
    }
    instances = results["knowledge"].per_instance if "knowledge" in results else {}
    models = [_model(measured.base.name, names, "base")] if measured.base else []
    for m in measured.models:
        record = _model(m.name, names, "expert", measured.probe_specs.get(m.name), blocks(results, m.name))
        if record["knowledge"] is not None:
            record["knowledge"]["per_instance"] = instances.get(m.name, [])
        models.append(record)
    loaded_in = {m.name: m.dtype for m in ([measured.base] if measured.base else []) + list(measured.models)}
    for record in models:
        record["specific_neurons"] = specific.get(record["path"])
        record["dtype"] = loaded_in[record["path"]]
    # outside the calibration's domain: said of a prediction, so not of a model without one
    predicted = {m for m, p in decision.predictions.items() if p.value is not None}
    outside = {m: why for m, why in decision.outside.items() if m in predicted}
    for record in models:
        if record["role"] == "expert":
            prediction = decision.predictions[record["path"]]
            record.update(
                features=decision.features[record["path"]],
                kept_share=decision.kept.get(record["path"]),
                predicted_mergeability=prediction.value,
                predicted_interval=prediction.interval,
                reasons=prediction.reasons,
            )
            record["out_of_domain"] = outside.get(record["path"])

    recommendation = decision.recommendation
    rec = {
        "verdict": recommendation.verdict,
        "method": recommendation.method,
        "cutoff": recommendation.cutoff,
        "weights": decision.weights,
        "knowledge": recommendation.knowledge or None,
        "reasons": recommendation.reasons,
        "pairs": [list(p) for p in recommendation.pairs],
        "left_out": recommendation.left_out,
        "lost": recommendation.lost,
        "knowledge_weighted_against_ties": None
        if decision.against_ties is None
        else {**dict(zip(("knowledge_weighted", "ties"), decision.against_ties)), "by": decision.against_ties_by},
        "configured_update": configured_update(spec.document),
        "method_choice": None if recommendation.choice is None else asdict(recommendation.choice),
        "search": None
        if recommendation.choice is None
        else _search(recommendation.choice, spec.document, decision.cutoff),
    }
    predicted = {m["path"]: m["predicted_mergeability"] for m in models}
    rec["models"] = [
        _describe(a) for a in advise(rec, spec.document, names, predicted, _rehearsed(rec, spec.document, names))
    ]
    report = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mergekit-mergeability", "version": version("mergekit-mergeability")},
        "config": str(spec.source),
        "merge_method": spec.merge_method,
        "base_model": spec.base_model,
        "settings": settings.to_json(),
        "models": models,
        "pairs": _pairs(results),
        "layers": {
            "cka_estimator": "unbiased",
            "cka_threshold": decision.threshold,
            "cka_relative_drop": RELATIVE_DROP,
            "cka_effective_threshold": decision.effective_threshold,
            "divergence": decision.curve,
            "cutoff": decision.cutoff,
            "cutoff_signal": decision.signal,
            "decided_by": decision.decided_by,
            "selectivity": _selectivity(
                results, settings, specific, decision.overlap, decision.overlap_threshold, decision.selectivity_cutoff
            ),
        },
        "calibration": _calibration_summary(decision.calibration),
        "recommendation": rec,
        "findings": [
            {"diagnostic": name, "severity": f.severity, "message": f.message} for name, f in measured.findings()
        ]
        + _domain_findings(outside, names)
        + _few_items(models),
        "skipped_diagnostics": measured.skipped,
        "failed_diagnostics": measured.failed,
        "diagnostics": {name: _raw(result) for name, result in results.items()},
    }
    return _json_safe(report)


FEW_ITEMS = 16  # a probe's items below which a rehearsal's read of it is coarse (docs: at least 16 held out)


def _few_items(models: List[Dict[str, Any]]) -> List[Dict[str, str]]:
    """One warning naming the experts whose probes have fewer than ``FEW_ITEMS`` items (the base's
    read of each, item by item)."""
    few = [
        (m["name"], n)
        for m in models
        if m["role"] == "expert" and (n := len((m.get("knowledge") or {}).get("per_instance") or ())) and n < FEW_ITEMS
    ]
    if not few:
        return []
    who = ", ".join(f"{name} ({n})" for name, n in few[:3]) + (f" and {len(few) - 3} more" if len(few) > 3 else "")
    return [
        {
            "diagnostic": "probes",
            "severity": "warning",
            "message": f"probes of fewer than {FEW_ITEMS} items: {who}; one item moves a read of such a probe by"
            f" 1/n, so close merges cannot be told apart (for a task, give at least {FEW_ITEMS} held-out items)",
        }
    ]


def _domain_findings(outside: Dict[str, List[str]], names: Dict[str, str]) -> List[Dict[str, str]]:
    """One warning per distinct reason a prediction lies outside the calibration's domain."""
    by_reason: Dict[str, List[str]] = {}
    for model, reasons in outside.items():
        for reason in reasons:
            kind = reason.split(" ")[0] if " outside the fitted " in reason else reason
            by_reason.setdefault(kind, []).append(names.get(model, model))
    findings = []
    for kind, models in by_reason.items():
        who = ", ".join(models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else "")
        what = f"{kind} beyond the fitted range" if kind in FEATURE_NAMES else kind
        findings.append(
            {
                "diagnostic": "calibration",
                "severity": "warning",
                "message": f"prediction outside the calibration's domain ({what}) for {who}: read it as a rough guide",
            }
        )
    return findings


def _model(path, names, role, probe=None, measured: Mapping[str, Any] = {}) -> Dict[str, Any]:
    """A model's entry in precheck.json; ``measured``: its records (``measuring.blocks``), written
    here as JSON."""
    written = {name: None if record is None else record.json() for name, record in measured.items()}
    return {
        "path": path,
        "name": names[path],
        "role": role,
        "probe": probe,
        "knowledge": written.get("knowledge"),
        "weights": written.get("weights"),
        "dilution": written.get("dilution"),
        "fluency": written.get("fluency"),
        "features": None,
        "kept_share": None,
        "predicted_mergeability": None,
        "predicted_interval": None,
        "out_of_domain": None,
        "reasons": [],
    }


def _selectivity(
    results,
    settings: PrecheckSettings,
    specific: Dict[str, Dict[str, List[float]]],
    overlap,
    threshold: float,
    cutoff,
) -> Optional[Dict[str, Any]]:
    """The LAPE settings, the groups, per pair of experts the blocks where their specific neurons
    collide, and the cut-off the overlap would set."""
    if not specific:
        return None
    collisions = [
        {"a": a, "b": b, "blocks": colliding_layers(pair.specific_collisions, pair.specific_union)}
        for (a, b), layers in per_layer(results, "selectivity").items()
        for pair in [PairLayers.of(layers)]
        if pair.specific_collisions is not None
    ]
    return {
        "span": settings.selectivity_span,
        "entropy_quantile": settings.lape_entropy_quantile,
        "activation_quantile": settings.lape_activation_quantile,
        "collision_share": COLLISION_SHARE,
        "groups": list(next(iter(specific.values()))),
        "collisions": collisions,
        "overlap": overlap,
        "overlap_threshold": threshold,
        "cutoff": cutoff,
    }


def _pairs(results) -> List[Dict[str, Any]]:
    pairs: Dict[tuple, Dict[str, Any]] = {}
    for diagnostic in ("representations", "selectivity"):
        for pair, layers in per_layer(results, diagnostic).items():
            pairs.setdefault(pair, {}).update(layers)
    if "weights" in results:
        for pair, values in results["weights"].per_pair.items():
            pairs.setdefault(pair, {}).update(values)
    return [{"a": a, "b": b, **values} for (a, b), values in pairs.items()]


def _describe(advice: Advice) -> Dict[str, Any]:
    return {
        "file": advice.file,
        "expert": advice.expert,
        "keeps": advice.keeps,
        "drops": advice.drops,
        "notes": advice.notes,
    }


def _calibration_summary(calibration: Calibration) -> Dict[str, Any]:
    document = calibration.document
    held_out = document.get("out_of_sample", {}).get("leave_one_model_out", {})
    return {
        "path": str(calibration.path),
        "target": document.get("target"),
        "method": document.get("method"),
        "partners": document.get("partners"),
        "fitted_on_models": document.get("models"),
        "domain": document.get("domain"),
        "knowledge_feature": calibration.knowledge_feature,
        "reads_first": calibration.reads_first,
        "leave_one_out_spearman": held_out.get("spearman"),
        "provenance": document.get("provenance"),
    }


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


def remove_recommended(out: Path) -> None:
    (out / MAIN).unlink(missing_ok=True)
    shutil.rmtree(out / PER_EXPERT, ignore_errors=True)


def recommended(report: Dict[str, Any], measured: Measurements) -> List[Tuple[Advice, Dict[str, Any]]]:
    """Each recommended config (none on ``do_not_merge``) with its model paths absolute, as written."""
    resolved = {m.name: m.path for m in ([measured.base] if measured.base else []) + list(measured.models)}
    names = {m["path"]: m["name"] for m in report["models"]}
    predicted = {m["path"]: m["predicted_mergeability"] for m in report["models"]}
    return [
        (advice, absolute(advice.config, resolved, measured.spec.folder))
        for advice in advise(
            report["recommendation"],
            measured.spec.document,
            names,
            predicted,
            _rehearsed(report["recommendation"], measured.spec.document, names),
        )
    ]


def _rehearsed(recommendation, document, names) -> Dict[str, Advice]:
    """The merges the rehearsal chose among, by name, as ``advise`` writes the chosen one."""
    from mergekit_mergeability.decide.tuning import candidates

    if recommendation.get("method_choice") is None:
        return {}
    knowledge = recommendation["method_choice"].get("knowledge") or {}
    return {name: c.advice for name, c in candidates(document, knowledge, names).items()}


def parsed(configs: List[Tuple[Advice, Dict[str, Any]]]) -> Dict[str, Any]:
    """file -> the config as mergekit parses it (a ``MergeConfiguration``)."""
    from mergekit.config import MergeConfiguration

    return {advice.file: MergeConfiguration.model_validate(config) for advice, config in configs}


def write(
    report: Dict[str, Any],
    measured: Measurements,
    out: Path,
    configs: Optional[List[Tuple[Advice, Dict[str, Any]]]] = None,
) -> List[Path]:
    """Write the report and the recommended configs (``recommended``) into ``out`` (each file atomically).

    Recommended configs of an earlier run are removed first: a ``do_not_merge`` leaves
    nothing runnable behind."""
    import yaml

    from mergekit_mergeability.output.html import render

    out = Path(out)
    remove_recommended(out)
    rec = report["recommendation"]
    written = [write_atomic(out / "precheck.json", json.dumps(report, indent=2) + "\n")]
    for advice, config in recommended(report, measured) if configs is None else configs:
        header = [
            f"Written by mergekit-mergeability precheck from {measured.spec.source}",
            f"verdict: {rec['verdict']}. " + "; ".join(rec["reasons"]),
            f"keeps: {advice.keeps}",
            f"drops: {advice.drops}",
            *advice.notes,
        ]
        text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(config, sort_keys=False)
        written.append(write_atomic(out / advice.file, text))
    written.append(write_atomic(out / "report.html", render(report)))
    return written
