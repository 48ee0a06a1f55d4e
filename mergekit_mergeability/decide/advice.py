"""The verdict as mergekit configs a user can run blind, and what each one keeps and drops.

Every recommended config is the user's own config with the method and parameters
changed, local paths made absolute, and the configured update size kept: the
total weight the user's method gives the task vectors,

    total = lambda · (Σ_i weight_i, or 1 where the method normalises the weights)

becomes ``scale`` (knowledge_weighted, whose shares sum to 1) or ``lambda`` (ties, with
``normalize: true``: its disjoint mean, as the precheck rehearses it), or stays as the weights and
``normalize`` (layer_selective's lower blocks).

``layer_selective`` gives one model per expert (paper 3's layer patch): blocks below
the cut-off merged across all experts, that expert's own blocks, final norm and head
above. ``recommended.yml`` is the one for the model the config marks ``upper: true``,
else for the expert predicted to lose most.
"""

from __future__ import annotations

import copy
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from mergekit_mergeability.methods.knowledge_weighted import (
    DEFAULT_DENSITY,
    DEFAULT_DENSITY_BY_KNOWLEDGE,
    DEFAULT_TEMPERATURE,
    DEFAULT_TIES,
)
from mergekit_mergeability.merge_config import model_entries
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.decide.verdict import (
    DO_NOT_MERGE,
    KNOWLEDGE_WEIGHTED,
    LAYER_SELECTIVE,
    LEAVE_OUT,
    METHOD_BY_REHEARSAL,
    SIGN_ELECTION,
)

MAIN = "recommended.yml"
PER_EXPERT = "recommended"  # folder of layer_selective's per-expert configs
SUMMING = (
    "task_arithmetic",
    "ties",
    "dare_ties",
    "dare_linear",
    "breadcrumbs",
    "breadcrumbs_ties",
    "della",
    "della_linear",
    "linear",
)


@dataclass
class Advice:
    file: str  # relative to the precheck's --out folder
    config: Dict[str, Any]  # model references as written (made absolute when written)
    keeps: str
    drops: str
    expert: Optional[str] = None  # the expert whose upper blocks it keeps (layer_selective)
    notes: List[str] = field(default_factory=list)


def configured_update(document: Mapping[str, Any]) -> Dict[str, Any]:
    """The total weight the configured method gives the task vectors, and how it was read."""
    from mergekit import merge_methods

    method = document["merge_method"]
    spec = {p.name: p.default for p in merge_methods.get(method).spec.parameters}
    shared = document.get("parameters") or {}
    if method not in SUMMING or "weight" not in spec:
        return {"total": None, "note": f"{method} does not add up task vectors; recommendations use scale 1"}
    weights = list(configured_weights(document).values())
    lam = as_number(shared.get("lambda", spec.get("lambda", 1.0)), "parameters.lambda")
    normalize = bool(shared.get("normalize", spec.get("normalize", False)))
    total = round(lam * (1.0 if normalize else sum(weights)), 4)  # weights of 1/n are written rounded
    how = f"lambda {lam:g} × " + ("1 (weights normalised)" if normalize else f"Σ weight {round(sum(weights), 4):g}")
    return {
        "total": total,
        "lambda": lam,
        "normalize": normalize,
        "sum_weights": sum(weights),
        "note": f"{method}: {how} = {total:g}",
    }


def update_size(document: Mapping[str, Any]) -> float:
    """The scale both recommended merges write (knowledge_weighted's ``scale``, TIES's ``lambda``):
    the configured update size, 1 where the method does not add task vectors."""
    return _size(configured_update(document))


def _size(update: Mapping[str, Any]) -> float:
    return 1.0 if update["total"] is None else update["total"]


def configured_weights(document: Mapping[str, Any]) -> Dict[str, float]:
    """Each expert's ``weight`` as configured (per model, else global, else 1)."""
    shared = (document.get("parameters") or {}).get("weight", 1.0)
    return {
        str(e["model"]): as_number((e.get("parameters") or {}).get("weight", shared), f"model {e['model']}: weight")
        for e in _experts(document)
    }


EXACT_SUMS = ("task_arithmetic", "linear")  # θ_base + Σ share_i·τ_i exactly: the merge itself can be rehearsed


def configured_shares(document: Mapping[str, Any]) -> Dict[str, float]:
    """Each expert's share of its update in the configured merge, θ_base + Σ share_i·τ_i, where the
    method is that plain sum over one ``models:`` list (lambda × weight, over Σ weight where the
    method normalises); empty for any other method or layout."""
    if document.get("merge_method") not in EXACT_SUMS or document.get("slices") or document.get("modules"):
        return {}
    update, weights = configured_update(document), configured_weights(document)
    if update["normalize"] and not update["sum_weights"]:
        return {}
    scale = update["lambda"] / (update["sum_weights"] if update["normalize"] else 1.0)
    return {name: scale * weight for name, weight in weights.items()}


def as_number(value, field: str = "a parameter") -> float:
    """A parameter as one number: gradient lists by their mean. A value that is none (a word, an
    empty list, a mapping) is one line naming ``field``."""
    try:
        if isinstance(value, list):
            return statistics.fmean(float(v) for v in value)
        if isinstance(value, (bool, dict)) or value is None:
            raise TypeError
        return float(value)
    except (TypeError, ValueError, statistics.StatisticsError):
        raise UserError(f"{field} is {value!r}; give a number, or a list of numbers for a gradient") from None


def _experts(document) -> List[Dict[str, Any]]:
    base = document.get("base_model")
    return [e for e in model_entries(document) if e.get("model") != base]


def advise(
    recommendation: Mapping[str, Any],
    document: Mapping[str, Any],
    names: Mapping[str, str],
    predicted: Mapping[str, Optional[float]],
    rehearsed: Mapping[str, Advice] = {},
) -> List[Advice]:
    """One ``Advice`` per recommended model; none for ``do_not_merge``. ``rehearsed``: the merges the
    precheck rehearsed beside the config as written, by name (``decide.tuning.candidates``), of
    which ``method_by_rehearsal`` writes the chosen one."""
    verdict = recommendation["verdict"]
    if verdict == DO_NOT_MERGE:
        return []
    update = configured_update(document)
    if verdict == KNOWLEDGE_WEIGHTED:
        return [_knowledge_weighted(recommendation, document, names, update)]
    if verdict == SIGN_ELECTION:
        return [_sign_election(recommendation, document, names, predicted, update)]
    if verdict == METHOD_BY_REHEARSAL:
        return [rehearsed[recommendation["method_choice"]["chosen"]]]
    if verdict == LAYER_SELECTIVE:
        return _layer_selective(recommendation["cutoff"], document, names, predicted)
    if verdict == LEAVE_OUT:
        lost = recommendation["left_out"]
        return [_leave_out(lost, document, names, predicted), *(_alone(m, document, names) for m in lost)]
    every = ", ".join(names.get(str(e["model"]), str(e["model"])) for e in _experts(document))
    keeps = f"the configured {document['merge_method']} merge of {every}"
    return [
        Advice(
            MAIN,
            copy.deepcopy(dict(document)),
            keeps,
            _dropped(recommendation, names, predicted) or "nothing the precheck can predict",
        )
    ]


def _dropped(recommendation, names, predicted) -> str:
    """The tasks the merge is predicted to lose (models predicted under 0.3), or ''."""
    lost = recommendation.get("lost") or []
    return ", ".join(f"most of {names.get(m, m)}'s task (predicted {predicted[m]:.2f})" for m in lost)


def _with_method(
    document, method: str, shared: Mapping[str, Any], per_model: Mapping[str, Mapping[str, Any]]
) -> Tuple[Dict[str, Any], List[str]]:
    """The config with another method: parameters it does not declare are dropped (and listed)."""
    from mergekit import merge_methods

    config = copy.deepcopy(dict(document))
    declared = {p.name for p in merge_methods.get(method).spec.parameters}
    config["merge_method"] = method
    dropped = sorted(k for k in (config.get("parameters") or {}) if k not in declared and k not in shared)
    config["parameters"] = {**{k: v for k, v in (config.get("parameters") or {}).items() if k in declared}, **shared}
    for entry in model_entries(config):
        parameters = {k: v for k, v in (entry.get("parameters") or {}).items() if k in declared}
        dropped += sorted(
            k
            for k in (entry.get("parameters") or {})
            if k not in declared and k not in per_model.get(str(entry["model"]), {})
        )
        parameters.update(per_model.get(str(entry["model"]), {}))
        if parameters:
            entry["parameters"] = parameters
        else:
            entry.pop("parameters", None)
    notes = [f"{method} has no parameter {', '.join(sorted(set(dropped)))}: dropped"] if dropped else []
    return config, notes


def knowledge_weighted_defaults() -> Dict[str, Any]:
    """knowledge_weighted's global parameters as a recommended config writes them."""
    return {
        "temperature": DEFAULT_TEMPERATURE,
        "ties": DEFAULT_TIES,
        "density": DEFAULT_DENSITY,
        "density_by_knowledge": DEFAULT_DENSITY_BY_KNOWLEDGE,
    }


def _knowledge_weighted(recommendation, document, names, update) -> Advice:
    knowledge = recommendation["knowledge"]
    scale = _size(update)
    shared = {**knowledge_weighted_defaults(), "scale": round(scale, 6)}
    per_model = {m: {"knowledge": round(k, 4)} for m, k in knowledge.items()}
    config, notes = _with_method(document, "knowledge_weighted", shared, per_model)
    shares = recommendation.get("weights") or {}
    order = sorted(shares, key=shares.get, reverse=True)
    keeps = "every expert's update, shares by how little the base knows its task: " + ", ".join(
        f"{names.get(m, m)} {shares[m]:.2f}" for m in order[:5]
    )
    if len(order) > 5:
        keeps += f" … ({len(order)} experts)"
    trimmed = f"each update's smallest {1 - DEFAULT_DENSITY:.0%} of entries"
    if DEFAULT_DENSITY_BY_KNOWLEDGE:
        trimmed = (
            f"up to {1 - DEFAULT_DENSITY:.0%} of each update's smallest entries, the less the better its task is known"
        )
    drops = "nothing wholly; well-known experts get smaller shares" + (
        f", and {trimmed} (ties)" if DEFAULT_TIES else ""
    )
    notes.append(f"scale {scale:g} keeps the configured update size ({update['note']})")
    return Advice(MAIN, config, keeps, drops, notes=notes)


def menu(document, knowledge: Mapping[str, float], names: Mapping[str, str] = {}) -> Dict[str, Advice]:
    """The merges the precheck rehearses beside the config as written to choose a method, each as
    ``recommended.yml`` would write it: the mean merge (task_arithmetic, each update 1/N), TIES and
    DARE-TIES (density 0.5, the configured weights, normalised, lambda the configured update size),
    and knowledge_weighted's defaults where ``knowledge`` (the base's p(gold)) covers every expert."""
    update = configured_update(document)
    found = {
        "mean": _mean(document, names),
        "ties": _sign_election({}, document, names, {}, update),
        "dare_ties": _sign_election({}, document, names, {}, update, "dare_ties"),
    }
    experts = [str(e["model"]) for e in _experts(document)]
    weights = configured_weights(document)
    # knowledge_weighted's shares need every expert's knowledge, and weights it takes (≥ 0, not all 0)
    if experts and all(knowledge.get(e) is not None and weights[e] >= 0 for e in experts) and max(weights.values()) > 0:
        from mergekit_mergeability.methods.knowledge_weighted import knowledge_weights

        shares = knowledge_weights([knowledge[e] for e in experts], DEFAULT_TEMPERATURE, [weights[e] for e in experts])
        recommendation = {
            "knowledge": {e: knowledge[e] for e in experts},
            "weights": dict(zip(experts, shares.tolist())),
        }
        found["knowledge_weighted"] = _knowledge_weighted(recommendation, document, names, update)
    return found


def _mean(document, names) -> Advice:
    """The mean merge: task_arithmetic, each update 1/N (paper 1's merge, at N models)."""
    experts = list(dict.fromkeys(str(e["model"]) for e in _experts(document)))
    per_model = {e: {"weight": round(1 / len(experts), 6)} for e in experts}
    config, notes = _with_method(document, "task_arithmetic", {"lambda": 1.0, "normalize": False}, per_model)
    for scope in (config, *model_entries(config)):  # every update whole: no configured density trims it
        (scope.get("parameters") or {}).pop("density", None)
    every = ", ".join(names.get(e, e) for e in experts)
    return Advice(
        MAIN,
        config,
        f"the mean of every update ({every}): each at 1/{len(experts)}",
        "(N − 1)/N of each update",
        notes=notes,
    )


def _sign_election(
    recommendation, document, names, predicted, update, method: str = "ties", density: float = DEFAULT_DENSITY
) -> Advice:
    """TIES as the precheck rehearses it and the pools measured it: each update trimmed to its
    largest ``density`` (half), signs elected, the disjoint mean (normalize: true) at the configured
    update size; DARE-TIES (``method``) the same with a random share dropped and the rest rescaled instead."""
    scale = _size(update)
    shared = {"density": density, "normalize": True, "lambda": round(scale, 6)}
    config, notes = _with_method(document, method, shared, {})
    if "weight" not in config["parameters"]:  # mergekit's ties needs one; a global weight stays the models' own
        for entry in _experts(config):
            entry.setdefault("parameters", {}).setdefault("weight", 1.0)
    lost = _dropped(recommendation, names, predicted)
    notes.append(f"lambda {scale:g} keeps the configured update size ({update['note']})")
    if method == "dare_ties":
        notes.append(
            "DARE drops entries at random: the precheck rehearsed one draw, and each mergekit-yaml run draws anew"
        )
        keeps = f"a random {density:.0%} of every expert's entries, rescaled, where its sign wins the per-entry vote"
        drops = f"a random {1 - density:.0%} of each update's entries, and the entries whose sign loses the vote"
    else:
        keeps = "every expert's largest entries where its sign wins the per-entry vote"
        drops = f"each update's smallest {1 - density:.0%} of entries, and the entries whose sign loses the vote"
    return Advice(MAIN, config, keeps, drops + (f"; {lost}" if lost else ""), notes=notes)


def _leave_out(lost, document, names, predicted) -> Advice:
    """The configured merge without the models predicted to lose their task; their weights
    are not handed to the others (the rest keep their configured shares)."""
    config = copy.deepcopy(dict(document))
    for scope in [config, *(config.get("modules") or {}).values()]:  # wherever model_entries finds them
        if scope.get("models"):
            scope["models"] = [e for e in scope["models"] if str(e.get("model")) not in lost]
        for output_slice in scope.get("slices") or ():
            output_slice["sources"] = [e for e in output_slice.get("sources") or () if str(e.get("model")) not in lost]
    kept = ", ".join(names.get(str(e["model"]), str(e["model"])) for e in _experts(config))
    apart = ", ".join(f"{names.get(m, m)} (predicted {predicted[m]:.2f} in the merge)" for m in lost)
    notes = [
        f"serve {names.get(m, m)} on its own: merged, it is predicted to score {predicted[m]:.2f} on its task"
        for m in lost
    ]
    return Advice(
        MAIN,
        config,
        f"the configured {document['merge_method']} merge of {kept}",
        f"{apart}: kept apart, not merged",
        notes=notes,
    )


def _alone(model: str, document, names) -> Advice:
    """A model kept apart, as a config that gives it back unchanged (mergekit's ``linear`` of
    it alone), so every recommended model has a file the stock ``mergekit-yaml`` runs."""
    config = {
        key: copy.deepcopy(value)
        for key, value in document.items()
        if key not in ("models", "slices", "modules", "parameters", "base_model", "merge_method")
    }
    entry = next(e for e in model_entries(document) if str(e.get("model")) == model)
    config.update(
        merge_method="linear",
        models=[{**{k: v for k, v in entry.items() if k != "parameters"}, "parameters": {"weight": 1.0}}],
    )
    name = names.get(model, model)
    return Advice(
        f"{PER_EXPERT}/{file_name(name)}.yml",
        config,
        f"{name} as it is (merged with nothing)",
        "nothing of its own; the others' tasks",
        expert=model,
    )


def _layer_selective(cutoff: int, document, names, predicted) -> List[Advice]:
    experts = [str(e["model"]) for e in _experts(document)]
    marked = [str(e["model"]) for e in _experts(document) if (e.get("parameters") or {}).get("upper")]
    inner = (
        document["merge_method"]
        if document["merge_method"] in ("task_arithmetic", "linear", "ties")
        else "task_arithmetic"
    )
    advice = []
    for expert in dict.fromkeys(experts):
        others = [names.get(e, e) for e in experts if e != expert]
        config, notes = _with_method(document, "layer_selective", {"cutoff": cutoff, "inner": inner}, {})
        for entry in model_entries(config):
            parameters = entry.setdefault("parameters", {})
            parameters.pop("upper", None)
            if str(entry["model"]) == expert:
                parameters["upper"] = True
        name = names.get(expert, expert)
        keeps = f"blocks 0–{cutoff - 1} merged ({inner}) across every expert; blocks ≥ {cutoff}, final norm and head of {name}"
        drops = f"blocks ≥ {cutoff} of {', '.join(others)}" if others else "nothing"
        advice.append(Advice(f"{PER_EXPERT}/{file_name(name)}.yml", config, keeps, drops, expert=expert, notes=notes))
    if marked:
        chosen, why = marked[0], f"the config marks {names.get(marked[0], marked[0])} upper: true"
    else:
        known = {e: predicted[e] for e in experts if predicted.get(e) is not None}
        chosen = min(known, key=known.get) if known else experts[0]
        why = (
            f"{names.get(chosen, chosen)} is predicted to lose most ({known[chosen]:.2f})"
            if known
            else f"no predictions: the first expert, {names.get(chosen, chosen)}"
        )
    main = next(a for a in advice if a.expert == chosen)
    return [
        Advice(
            MAIN,
            main.config,
            main.keeps,
            main.drops,
            chosen,
            [*main.notes, f"{MAIN} is the model for {names.get(chosen, chosen)}: {why}"],
        ),
        *advice,
    ]


def patches(cutoff: int, document) -> Dict[str, Dict[str, Any]]:
    """Each expert's layer patch at ``cutoff``, as ``recommended/`` writes it, by the expert as written."""
    return {advice.expert: advice.config for advice in _layer_selective(cutoff, document, {}, {})[1:]}


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
