"""Method choice by rehearsal: beside the config as written, the menu of merges (``advice.menu``:
the mean merge, TIES, DARE-TIES, knowledge_weighted's defaults) and a grid over their knobs
(``decide.tuning``: update scale, density, one expert's weight), each built in memory exactly as its
``recommended.yml`` would be written (mergekit's plan, ``planned``; ``dilution.as_written``), every
member's own probe asked on each and read item by item as its task is scored (``knowledge.read``):
p(gold) where its options are listed or it gives a reference answer, right or wrong otherwise.

``decide.verdict.choose_method`` then picks the candidate whose members keep most, and checks the
pick on items it was not made on (cross-fitted over two halves of every probe). Rehearsed where the
config has 2 to 8 models (a pool keeps paper 1's expected-partner rehearsal), every one with a
probe, and its merge can be built on the loaded base. One merge and one pass over every probe per
candidate, the layers below the first one the updates touch run once for all of them
(``shared_layers``); ``--tune-budget`` caps the grid's passes.

Where the representations part at a block some update reaches (the verdict would be
``layer_selective``), the layer patch is one more candidate (``patches``): each member's probe is
asked on its own patched model (the blocks below merged, its own above), so the choice weighs one
model per expert against one merged model on the same reads
(research/pools/prereg/patch.txt).
"""

from __future__ import annotations

from functools import partial
from typing import Dict, List, Optional

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult
from mergekit_mergeability.diagnostics.dilution import PARTNERS, Dilution
from mergekit_mergeability.rehearsal.planned import sorted_together, writable
from mergekit_mergeability.diagnostics.knowledge import as_read, read
from mergekit_mergeability.rehearsal.shared_layers import shared_below
from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
from mergekit_mergeability.sources import TensorReader, on_hub
from mergekit_mergeability.decide.tuning import PRUNED_AT
from mergekit_mergeability.decide.verdict import AS_WRITTEN, MENU, PATCH
from mergekit_mergeability.records import DilutionStats, KnowledgeStats
from mergekit_mergeability.settings import TUNE_CANDIDATES

NAME = "menu"  # its results sit beside the diagnostics' in precheck.json
MENU_SIZE = len(MENU)  # advice.menu's candidates at most
GRID_SIZE = 9  # decide.tuning's grid at most, besides one candidate per expert


def rehearse(measured, inputs: DiagnosticInputs, cutoff: Optional[int] = None) -> Optional[DiagnosticResult]:
    """Per candidate (``as_written``, the menu, as much of the grid as ``--tune-budget`` pays for and
    the layer patch at ``cutoff``, where one acts: ``patches``), per member: its probe's items as
    scored, in ``per_instance`` (member -> one record per item: candidate -> value) and their mean in
    ``per_model``; None where the menu is not rehearsed."""
    from mergekit_mergeability.progress import task
    from mergekit_mergeability.sources import load_causal_lm

    models, settings = inputs.models, inputs.settings
    if not _rehearsed(inputs) or measured.errors():
        return None
    known = (measured.results.get("knowledge") or DiagnosticResult()).per_model
    plans = merges(measured, inputs, {m.name: KnowledgeStats.of(known.get(m.name)).scored_mean_p_gold for m in models})
    names = set().union(*inputs.touched.values())
    sources = {m.name: m.path for m in (inputs.base, *models)}
    lines = _lines(inputs)
    patched = patches(measured.spec, inputs, cutoff) if cutoff else {}  # none, or 0: nothing shared
    module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
    paths = list(sources.values())
    read_before = written_reads(measured, models)  # the config as written: the dilution read it
    items: Dict[str, Dict[str, List[float]]] = {
        m.name: {AS_WRITTEN: read_before[m.name]} if read_before else {} for m in models
    }
    others = f"{len(plans) - 1} other merges" + (" and the layer patch" if patched else "")
    said = f"menu: as written{',' if patched else ' and'} {others}"
    asked = [(name, plan) for name, plan in plans.items() if not (name == AS_WRITTEN and read_before)]
    with (
        task(said, (len(asked) + bool(patched)) * lines, settings.quiet) as advance,
        shared_below(module, names),
        sorted_together(PRUNED_AT),
    ):
        ask = lambda model: partial(as_read, module, tokenizer, list(model.probes), advance)  # noqa: E731
        jobs = [(m.name, name, Job(name, ask(m))) for name, _ in asked for m in models]
        # each member's probe on its own patched model
        jobs += [(m.name, PATCH, Job(f"{PATCH}: {m.name}", ask(m))) for m in models if patched]
        candidates = [as_planned(n, p) for n, p in asked] + [as_planned(f"{PATCH}: {m}", p) for m, p in patched.items()]
        reads = walk(module, candidates, [job for *_, job in jobs], paths, names)
    for (model, name, _), found in zip(jobs, reads):
        items[model][name] = found
    result = DiagnosticResult()
    for model, by_candidate in items.items():
        result.per_model[model] = {c: sum(v) / len(v) for c, v in by_candidate.items()}
        result.per_instance[model] = [dict(zip(by_candidate, row)) for row in zip(*by_candidate.values())]
    return result


def written_reads(measured, models) -> Optional[Dict[str, List[float]]]:
    """Each member's probe items on the config as written, as the dilution's partnered pass read them
    where it rehearsed that merge (``Dilution.rehearsed``: "written"; it does wherever the menu is
    rehearsed, unless skipped): the same merge, asked the same, so not built again. None elsewhere."""
    found = measured.results.get(Dilution.name)
    if found is None or any(
        DilutionStats.of(found.per_model.get(m.name)).rehearsed != "written"
        or len(found.per_instance.get(m.name) or ()) != len(m.probes)
        for m in models
    ):
        return None
    return {
        m.name: [
            read(i, r["partnered_p_gold"], r["partnered_correct"]) for i, r in zip(m.probes, found.per_instance[m.name])
        ]
        for m in models
    }


def merges(measured, inputs: DiagnosticInputs, knowledge: Dict[str, Optional[float]]) -> Dict[str, dict]:
    """The merges ``rehearse`` builds, by candidate, each mergekit's plan (``planned.plan``): the
    config as written, the menu, then the grid as far as ``--tune-budget`` pays, each where it can
    be built on the loaded base. ``knowledge``: each member's base knowledge (None: not measured)."""
    from mergekit_mergeability.decide.tuning import candidates
    from mergekit_mergeability.merge_config import absolute
    from mergekit_mergeability.rehearsal.planned import plan

    base, names = TensorReader(inputs.base.path), set().union(*inputs.touched.values())
    sources = {m.name: m.path for m in (inputs.base, *inputs.models)}
    lines = _lines(inputs)
    left = _budget(inputs, lines)
    plans = {AS_WRITTEN: inputs.merge}
    for name, candidate in candidates(measured.spec.document, knowledge).items():
        on_grid = name not in MENU
        if on_grid and left < lines:
            break
        merge = plan(absolute(candidate.advice.config, sources), measured.spec.source)
        if writable(merge, base.index, names):
            plans[name] = merge
            left -= lines if on_grid else 0
    return plans


def patches(spec, inputs: DiagnosticInputs, cutoff: int) -> Dict[str, dict]:
    """Each member's layer patch at ``cutoff`` on the config ``spec`` as mergekit plans it
    (``advice.patches``), by member; empty where one cannot be built on the loaded base."""
    from mergekit_mergeability.decide.advice import patches as configs
    from mergekit_mergeability.merge_config import absolute
    from mergekit_mergeability.rehearsal.planned import plan

    sources = {m.name: m.path for m in (inputs.base, *inputs.models)}
    base, names = TensorReader(inputs.base.path), set().union(*inputs.touched.values())
    written = configs(cutoff, spec.document)
    planned = {m.name: plan(absolute(written[m.name], sources), spec.source) for m in inputs.models}
    return planned if all(writable(p, base.index, names) for p in planned.values()) else {}


def _rehearsed(inputs: DiagnosticInputs) -> bool:
    return unrehearsed(inputs) is None


def unrehearsed(inputs: DiagnosticInputs) -> Optional[str]:
    """Why the menu will not be rehearsed (None: it will), for the cost line."""
    models = inputs.models
    unprobed = [inputs.names[m.name] for m in models if not m.probes]
    if inputs.base is None:
        return "no base model"
    if not 2 <= len(models) <= PARTNERS:
        return f"{len(models)} models (it rehearses configs of 2 to {PARTNERS})"
    if unprobed:
        more = f" and {len(unprobed) - 1} more" if len(unprobed) > 1 else ""
        return f"{unprobed[0]}{more} without a probe"
    if inputs.merge is None and any(on_hub(m.path) for m in (inputs.base, *models)):
        return "a dry run downloads no hub model to plan the merge with"
    if not inputs.written:
        return "the merge as written cannot be built here"
    return None


def _lines(inputs: DiagnosticInputs) -> int:
    """Probe sequences of one candidate: every member's probe, each option and letter."""
    return sum(i.sequences for m in inputs.models for i in m.probes)


def _budget(inputs: DiagnosticInputs, lines: int) -> int:
    budget = inputs.settings.tune_budget
    return TUNE_CANDIDATES * lines if budget is None else budget


def passes(inputs: DiagnosticInputs) -> int:
    """Probe sequences over the config as written, the menu's four candidates, the grid's share of
    ``--tune-budget`` and the layer patch (where a cut-off is found), at most (0 where the menu will
    not be rehearsed)."""
    if not _rehearsed(inputs):
        return 0
    lines = _lines(inputs)
    return (_as_written(inputs) + MENU_SIZE + _grid(inputs, lines) + 1) * lines


def _as_written(inputs: DiagnosticInputs) -> int:
    """The config as written's passes, in candidates: none where the dilution reads it (``written_reads``)."""
    return int(Dilution.name in inputs.settings.skip)


def _grid(inputs: DiagnosticInputs, lines: int) -> int:
    return min(_budget(inputs, lines) // max(lines, 1), GRID_SIZE + len(inputs.models))


def said(inputs: DiagnosticInputs) -> str:
    """What the menu's count is made of, for the cost line."""
    lines = _lines(inputs)
    grid = _grid(inputs, lines)
    budget = "default" if inputs.settings.tune_budget is None else f"{inputs.settings.tune_budget:,}"
    searched = f"up to {grid} of the knob grid" if grid > 0 else "no knob grid"
    written = "the config as written" + ("" if _as_written(inputs) else " (read in the dilution's pass)")
    return (
        f"menu: {written}, {MENU_SIZE} other merges, {searched} and a layer patch where one is"
        f" found ({lines:,} passes each; --tune-budget {budget})"
    )


def scored(result: DiagnosticResult) -> Dict[str, Dict[str, List[float]]]:
    """``rehearse``'s items as ``choose_method`` takes them: candidate -> member -> items."""
    candidates = next(iter(result.per_model.values())).keys()
    return {c: {m: [row[c] for row in rows] for m, rows in result.per_instance.items()} for c in candidates}
