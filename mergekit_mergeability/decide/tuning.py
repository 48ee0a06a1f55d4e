"""The merges the precheck rehearses to choose what to write: the menu (``advice.menu``), then a
grid over the knobs users ask about (the update scale, TIES's and DARE's density, one expert's
weight), each written as ``recommended.yml`` would write it.

The grid is fixed before any probe is read (its order is pre-registered in
``research/pools/prereg/tuning.txt``), so a choice made on some of a probe's items can be checked on
the others (``verdict.choose_method``). ``--tune-budget`` takes it in this order, a candidate whole
or not at all; a candidate whose merge equals one already listed (the config as written included)
costs nothing and is left out.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from mergekit_mergeability.decide.advice import (
    Advice,
    _experts,
    _mean,
    _sign_election,
    configured_update,
    menu,
)
from mergekit_mergeability.merge_config import model_entries
from mergekit_mergeability.methods.knowledge_weighted import DEFAULT_DENSITY

MEAN_SCALES = (1.5, 2.0)  # each update s/N: between the mean merge (1) and the sum of N updates (N)
TIES_DENSITIES = (0.7, 0.3)
PRUNED_AT = (DEFAULT_DENSITY, *TIES_DENSITIES)  # the densities the menu and grid prune by magnitude at
LOWER_MEAN = 0.75
TIES_LAMBDA = 1.5
DARE_DENSITY = 0.7
BOOST = 2.0  # one expert's update at BOOST/N in the mean merge
WRITTEN_LAMBDAS = (0.75, 1.5)  # the config as written, its lambda scaled


@dataclass
class Candidate:
    """A merge to rehearse, and where it sits on the landscape the report draws."""

    advice: Advice
    method: str  # the merge_method it writes
    line: str  # the landscape's line: the menu's merge it varies ("mean", "ties", "as written, lambda ×", ...)
    scale: float  # its update size against that line's first point (1: as the menu writes it)
    density: Optional[float] = None  # TIES's and DARE's, where it has one

    def knobs(self) -> Dict[str, Any]:
        """What was tuned, as precheck.json lists it."""
        config = self.advice.config
        weights = {str(e["model"]): (e.get("parameters") or {}).get("weight") for e in _experts(config)}
        shared = config.get("parameters") or {}
        return {
            "method": self.method,
            "line": self.line,
            "scale": self.scale,
            "density": self.density,
            "lambda": shared.get("lambda", shared.get("scale")),
            "weights": weights if any(w is not None for w in weights.values()) else None,
        }


def candidates(document, knowledge: Mapping[str, float], names: Mapping[str, str] = {}) -> Dict[str, Candidate]:
    """The menu, then the grid, in order; each merge once (the config as written counts as listed)."""
    seen = {_merge_key(document)}
    found: Dict[str, Candidate] = {}
    for name, candidate in _all(document, knowledge, names):
        key = _merge_key(candidate.advice.config)
        if key not in seen:
            seen.add(key)
            found[name] = candidate
    return found


def methods(document, knowledge: Mapping[str, float]) -> Dict[str, str]:
    """Each candidate's merge_method, by name."""
    return {name: candidate.method for name, candidate in candidates(document, knowledge).items()}


def _all(document, knowledge, names) -> Iterator[Tuple[str, Candidate]]:
    from mergekit import merge_methods

    update = configured_update(document)
    menu_density = {"ties": DEFAULT_DENSITY, "dare_ties": DEFAULT_DENSITY}
    for name, advice in menu(document, knowledge, names).items():
        method = advice.config["merge_method"]
        yield name, Candidate(advice, method, name, 1.0, menu_density.get(name))
    for scale in MEAN_SCALES:
        yield f"mean x{scale:g}", _mean_at(document, names, scale)
    for density in TIES_DENSITIES:
        yield (
            f"ties d{density:g}",
            Candidate(_sign_election({}, document, names, {}, update, density=density), "ties", "ties", 1.0, density),
        )
    yield f"mean x{LOWER_MEAN:g}", _mean_at(document, names, LOWER_MEAN)
    ties = _sign_election({}, document, names, {}, update)
    ties.config["parameters"]["lambda"] = round(ties.config["parameters"]["lambda"] * TIES_LAMBDA, 6)
    ties.notes.append(f"lambda ×{TIES_LAMBDA:g} the configured update size")
    yield f"ties lambda x{TIES_LAMBDA:g}", Candidate(ties, "ties", "ties", TIES_LAMBDA, DEFAULT_DENSITY)
    dare = _sign_election({}, document, names, {}, update, "dare_ties", density=DARE_DENSITY)
    yield f"dare_ties d{DARE_DENSITY:g}", Candidate(dare, "dare_ties", "dare_ties", 1.0, DARE_DENSITY)
    experts = list(dict.fromkeys(str(e["model"]) for e in _experts(document)))
    for index, expert in enumerate(experts):
        yield f"mean, expert {index + 1} x{BOOST:g}", _boosted(document, names, experts, expert)
    method = document["merge_method"]
    if "lambda" in {p.name for p in merge_methods.get(method).spec.parameters}:
        for factor in WRITTEN_LAMBDAS:
            yield f"as written, lambda x{factor:g}", _written_at(document, method, factor)


def _mean_at(document, names, scale: float) -> Candidate:
    """The mean merge with each update at scale/N."""
    advice = _mean(document, names)
    entries = _experts(advice.config)
    for entry in entries:
        entry["parameters"]["weight"] = round(scale / len(entries), 6)
    advice.keeps = advice.keeps.replace(f"each at 1/{len(entries)}", f"each at {scale:g}/{len(entries)}")
    return Candidate(advice, "task_arithmetic", "mean", scale)


def _boosted(document, names, experts, expert: str) -> Candidate:
    """The mean merge with one expert's update at BOOST/N: where the probes disagree, the one that loses most."""
    advice = _mean(document, names)
    for entry in _experts(advice.config):
        if str(entry["model"]) == expert:
            entry["parameters"]["weight"] = round(BOOST / len(experts), 6)
    advice.keeps += f"; {names.get(expert, expert)}'s at {BOOST:g}/{len(experts)}"
    return Candidate(advice, "task_arithmetic", f"mean, {names.get(expert, Path(expert).name)} x{BOOST:g}", 1.0)


def _written_at(document, method: str, factor: float) -> Candidate:
    """The config as written with its lambda scaled."""
    config = copy.deepcopy(dict(document))
    parameters = config.setdefault("parameters", {})
    lam = configured_update(document).get("lambda") or 1.0
    parameters["lambda"] = round(lam * factor, 6)
    advice = Advice("recommended.yml", config, f"the configured {method} merge, lambda ×{factor:g}", "nothing else")
    return Candidate(advice, method, "as written, lambda ×", factor)


def _merge_key(document) -> str:
    """What makes two configs the same merge: the method, and each model's parameters as mergekit
    reads them (its own, else the config's, else the method's default); for task_arithmetic, each
    update's coefficient in place of its weight and lambda (``_coefficients``)."""
    from mergekit import merge_methods

    method = document.get("merge_method")
    declared = {p.name: p.default for p in merge_methods.get(method).spec.parameters if not p.required}
    shared = {**declared, **(document.get("parameters") or {})}
    models = [[str(e["model"]), {**shared, **(e.get("parameters") or {})}] for e in model_entries(document)]
    if method == "task_arithmetic":
        models = _coefficients(models)
    return json.dumps(
        {"method": method, "models": models, "slices": document.get("slices")}, sort_keys=True, default=str
    )


def _coefficients(models):
    """task_arithmetic adds lambda · weight of each update (over the weights' sum with normalize), so
    weights 0.75 at lambda 1 and weights 1 at lambda 0.75 are one merge: each model's parameters with
    that product in place of the three. Left as they are where any of them is not one number (a
    per-tensor list or filter)."""
    numbers = [[p.get(k) for k in ("weight", "lambda")] for _, p in models]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for pair in numbers for v in pair):
        return models
    total = sum(weight for weight, _ in numbers)
    found = []
    for (model, parameters), (weight, lam) in zip(models, numbers):
        kept = {k: v for k, v in parameters.items() if k not in ("weight", "lambda", "normalize")}
        divisor = total if parameters.get("normalize") and abs(total) >= 1e-8 else 1.0
        found.append([model, {**kept, "coefficient": round(lam * weight / divisor, 9)}])
    return found
