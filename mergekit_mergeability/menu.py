"""Method choice by rehearsal: beside the config as written, a small menu of merges (``advice.menu``:
the mean merge, TIES, DARE-TIES, knowledge_weighted's defaults), each built in memory exactly as its
``recommended.yml`` would be written (mergekit's plan, ``planned``; ``dilution.as_written``), every
member's own probe asked on each and read item by item as its task is scored: p(gold) where its
options are listed, right or wrong otherwise.

``decide.verdict.choose_method`` then recommends the candidate whose members keep most, over the
config as written only where a paired bootstrap over the probe items puts the margin above 0.
Rehearsed where the config has 2 to 8 models (a pool keeps paper 1's expected-partner rehearsal),
every one with a probe, and its merge can be built on the loaded base. One merge and one pass over
every probe per candidate.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult
from mergekit_mergeability.diagnostics.dilution import PARTNERS, as_written
from mergekit_mergeability.planned import writable
from mergekit_mergeability.diagnostics.knowledge import scores
from mergekit_mergeability.sources import TensorReader
from mergekit_mergeability.records import KnowledgeStats
from mergekit_mergeability.tasks.probes import OPTIONS

NAME = "menu"  # its results sit beside the diagnostics' in precheck.json


def rehearse(measured, inputs: DiagnosticInputs) -> Optional[DiagnosticResult]:
    """Per candidate (``as_written`` and the menu), per member: its probe's items as scored, in
    ``per_instance`` (member -> one record per item: candidate -> value) and their mean in
    ``per_model``; None where the menu is not rehearsed."""
    from mergekit_mergeability.merge_config import absolute
    from mergekit_mergeability.decide.advice import menu
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.planned import plan
    from mergekit_mergeability.progress import task
    from mergekit_mergeability.sources import load_causal_lm

    models, settings = inputs.models, inputs.settings
    if inputs.base is None or not 2 <= len(models) <= PARTNERS or not all(m.probes for m in models):
        return None
    base = TensorReader(inputs.base.path)
    names = set().union(*inputs.touched.values())
    if measured.errors() or not inputs.written:
        return None
    known = (measured.results.get("knowledge") or DiagnosticResult()).per_model
    knowledge = {m.name: KnowledgeStats.of(known.get(m.name)).scored_mean_p_gold for m in models}
    sources = {m.name: m.path for m in (inputs.base, *models)}
    plans = {AS_WRITTEN: inputs.merge}
    for name, advice in menu(measured.spec.document, knowledge).items():
        candidate = plan(absolute(advice.config, sources), measured.spec.source)
        if writable(candidate, base.index, names):
            plans[name] = candidate
    module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
    paths = list(sources.values())
    items: Dict[str, Dict[str, List[float]]] = {m.name: {} for m in models}
    lines = sum(len(i.continuations) for m in models for i in m.probes)
    with task(
        f"menu: the config as written and {len(plans) - 1} other merges", len(plans) * lines, settings.quiet
    ) as advance:
        for name, candidate in plans.items():
            with as_written(module, candidate, paths, names):
                for model in models:
                    asked = scores(module, tokenizer, list(model.probes), advance)
                    items[model.name][name] = [
                        s.p_gold if i.format == OPTIONS else float(s.correct) for s, i in zip(asked, model.probes)
                    ]
    result = DiagnosticResult()
    for model, by_candidate in items.items():
        result.per_model[model] = {c: sum(v) / len(v) for c, v in by_candidate.items()}
        result.per_instance[model] = [dict(zip(by_candidate, row)) for row in zip(*by_candidate.values())]
    return result


def passes(inputs: DiagnosticInputs) -> int:
    """Probe sequences over the config as written and the menu's four candidates at most (0 where
    the menu will not be rehearsed)."""
    models = inputs.models
    if inputs.base is None or not 2 <= len(models) <= PARTNERS or not all(m.probes for m in models):
        return 0
    if not inputs.written:
        return 0
    return 5 * sum(len(i.continuations) for m in models for i in m.probes)


def scored(result: DiagnosticResult) -> Dict[str, Dict[str, List[float]]]:
    """``rehearse``'s items as ``choose_method`` takes them: candidate -> member -> items."""
    candidates = next(iter(result.per_model.values())).keys()
    return {c: {m: [row[c] for row in rows] for m, rows in result.per_instance.items()} for c in candidates}
