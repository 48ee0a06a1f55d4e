"""Signal 4: what each model's own probe keeps when its update is diluted as a mean merge dilutes it.

A mean merge of paper 1's protocol (the model and 8 random partners, weights 1/9) hands each
update a ninth of its size. Before any merge, the base plus that share of τ_i is asked model
i's own probe in the format its task is scored in (as ``knowledge``'s ``scored_*`` view):

    θ_base + s·τ_i,   s = 1 / (partners + 1)

A fact the base already knows keeps its answer whatever the share; a fact it does not know is
kept only as far as the update overshoots what teaching it needed. The base's knowledge alone
does not say that overshoot, and for an update spread over many matrices its size says it
poorly (docs/prediction.md). One pass per model over its probe lines, every model's share
rehearsed in one walk up the blocks (``rehearsal.stream``, the share built by ``rehearsal.sums``):
each block built for one model at a time and swapped in, the base's own tensors never written.

Beside it, each model alone (``alone_*``: share 1) and the base are asked the same probe: a model
that scores on its own probe no better than the base does gets a warning (``untaught``), since a
fine-tune trained on its task, asked as it was trained, beats the base on it.

A second pass (``partnered_*``) adds what the model's partners do to its own answer: the rest of
the merge split evenly among the config's other models, paper 1's expected partner,

    θ_base + s'·τ_i + (1 − s')/(N − 1)·Σ_{j≠i} τ_j,   s' = max(s, 1/N)

A config of fewer than 9 models has at most N − 1 partners to draw (``mergeability`` refuses
more), so there the rehearsal is the merge as written: mergekit's plan of the config
(``planned``: its method, parameters, gradients and slices, tensor by tensor) built in memory on
the tensors the updates touch, every model's probe asked on it (``rehearsed``: "written"). Where
the plan is not at hand (a hub model), or its output is not the base's architecture (slices that
drop or repeat layers), or a touched tensor's vocabulary is rebuilt by ``tokenizer_source``: the
merge as configured where the method is a plain weighted sum (task_arithmetic, linear:
θ_base + Σ_j share_j·τ_j, ``ModelInput.share``; "configured"), else the mean merge of all N
("mean"). Each output tensor of the written merge is built whole, as mergekit builds it: the
pass holds every model's copy of one tensor in float32 at a time, besides the merged tensors.

A third pass (``knowledge_weighted_*``, ``ties_*``), where every model has a probe, rehearses the
choice the verdict makes between two methods (one walk, ``rehearsal.sums.ties``): the whole config merged as each would be recommended,
knowledge_weighted's defaults (shares by the base's p(gold) on each probe, times the configured
weights) and TIES (density 0.5, the configured weights, normalised), both at the configured update
size, each model's own probe asked on both.

The partnered pass holds Σ_j τ_j summed once, in float32, where it takes at most SUM_SHARE of the
loaded base's memory and SUM_BUDGET (with the copy each pass builds, a precheck's peak of a full
fine-tune at 1.1B measured 1.16× one model, docs/scale.md's target 1.3×); above that, each patch
reads every model that changes a tensor a row block at a time: N² block reads for N models.
"""

from __future__ import annotations

import contextlib
import math
from functools import partial
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Set, Tuple

import torch

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need
from mergekit_mergeability.diagnostics.knowledge import scores
from mergekit_mergeability.rehearsal.shared_layers import shared_below
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths import choice_scores
from mergekit_mergeability.maths.merging import COMPARED, DEFAULT_DENSITY, DEFAULT_TEMPERATURE
from mergekit_mergeability.maths.merging import knowledge_weights
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import DilutionStats
from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
from mergekit_mergeability.rehearsal.sums import summed as summed_candidate, ties
from mergekit_mergeability.sources import (
    Source,
    TensorReader,
    changed,
    empty_like_each,
    load_causal_lm,
    patched,
    tensors,
)
from mergekit_mergeability.sources.heap import map_large_allocations

PARTNERS = 8  # paper 1's protocol, and `mergeability --partners`'s default: the share is 1/9
BLOCK = 1 << 20  # values per block of rows patched at once
SUM_BUDGET = 1 << 30  # bytes the partners' summed update may take in memory (float32)
SUM_SHARE = 0.25  # and at most this share of the loaded base's bytes


Shares = Sequence[Tuple[Source, float, Set[str]]]  # each model, its share, the tensors it changes


def summed(base: TensorReader, shares: Shares, limit: float = SUM_BUDGET) -> Optional[Dict[str, torch.Tensor]]:
    """Σ share_j·τ_j per tensor in float32, or None where that would take more than ``limit``
    bytes (then each patch reads every model instead)."""
    names = set().union(*(touched for _, _, touched in shares))
    if 4 * sum(math.prod(base.index[name].shape) for name in names) > limit:
        return None
    readers = [(tensors(model), share, touched) for model, share, touched in shares]
    total = {}
    for name in names:
        total[name] = torch.zeros(tuple(base.index[name].shape))
        for start, stop in base.blocks(name, BLOCK):
            mine = base.rows(name, start, stop).float()
            for reader, share, touched in readers:
                if name in touched:
                    total[name][start:stop] += share * (reader.rows(name, start, stop).float() - mine)
    return total


def update(base: TensorReader, model: TensorReader, name: str) -> Callable[[], Iterator[torch.Tensor]]:
    """A tensor's update θ_model − θ_base, as its row blocks of ~BLOCK values in float32, each call anew."""
    return lambda: (model.rows(name, a, b).float() - base.rows(name, a, b).float() for a, b in base.blocks(name, BLOCK))


@contextlib.contextmanager
def mixed(
    module: torch.nn.Module, base: TensorReader, shares: Shares, plus: Optional[Dict[str, torch.Tensor]] = None
) -> Iterator[torch.nn.Module]:
    """``module`` (the loaded base) as θ_base + Σ share_j·(θ_j − θ_base) over ``shares``, plus
    ``plus`` (a ``summed`` update) where given, its own tensors back on exit. Written in row
    blocks of ~1M values, so no model's tensor is ever held whole in float32."""
    state, plus = module.state_dict(), plus or {}
    readers = [(tensors(model), share, touched) for model, share, touched in shares]
    names = set(plus).union(*(touched for _, _, touched in shares))
    for model, _, touched in shares:
        for name in sorted(touched - set(state)):
            raise UserError(
                f"model {model}: tensor {name} is not in the loaded base; the config's models share one architecture"
            )
    fresh = empty_like_each({name: state[name] for name in names})
    with torch.no_grad():
        for name in names:
            for start, stop in base.blocks(name, BLOCK):
                mine = base.rows(name, start, stop).float()
                moved = mine + plus[name][start:stop] if name in plus else mine.clone()
                for reader, share, touched in readers:
                    if name in touched:
                        moved += share * (reader.rows(name, start, stop).float() - mine)
                fresh[name][start:stop].copy_(moved)
    with patched(module, fresh):
        yield module


def _asked(module, tokenizer, advance, model: ModelInput) -> choice_scores.TaskKnowledge:
    """``model``'s own probe asked on ``module`` as it stands."""
    return choice_scores.aggregate(scores(module, tokenizer, list(model.probes), advance))


def diluted(module: torch.nn.Module, base: TensorReader, model: Source, share: float):
    """``module`` as θ_base + share·τ_model (``mixed`` with one model)."""
    return mixed(module, base, [(model, share, changed(base, model))])


def partnered(
    module, tokenizer, model: ModelInput, advance, settings, items_out: Optional[list] = None
) -> Dict[str, Any]:
    """A model's own probe on the rehearsed merge ``module`` is: asked as the precheck asks it
    (``partnered_*``), and where the probe is an lm-eval task, also scored with the task's own metric
    on the module in memory (``partnered_task_score``, ``task_metric``: acc, acc_norm, exact_match,
    bleu or chrF through sacrebleu, the last two over 100 so that every score lies in [0, 1]),
    ``--limit`` items: a multiple-choice task read by acc or acc_norm from its choices' summed
    log-probs as lm-eval reads them, any other through lm-eval's own requests (``task_scores.score_all``).

    Each score's noise over the probe's items is kept twice: its standard error (``*_stderr``, as
    lm-eval reports it; 0 where every item is right) and a 95% interval that a probe of that many
    items honestly allows (``*_interval``: Wilson's for a share of items right, ``maths.stats``)."""
    from mergekit_mergeability.diagnostics.task_scores import score_all
    from mergekit_mergeability.maths.stats import mean_score_interval, standard_error
    from mergekit_mergeability.tasks.harness import TRANSLATION_METRICS

    items = scores(module, tokenizer, list(model.probes), advance)
    if items_out is not None:  # item by item, as the report's diagnostics keep them
        items_out[:] = [{"partnered_p_gold": i.p_gold, "partnered_correct": i.correct} for i in items]
    view = choice_scores.aggregate(items)
    found: Dict[str, Any] = dict(
        partnered_accuracy=view.accuracy,
        partnered_mean_p_gold=view.mean_p_gold,
        partnered_accuracy_stderr=standard_error([i.correct for i in items]),
        partnered_mean_p_gold_stderr=standard_error([i.p_gold for i in items]),
        partnered_accuracy_interval=_listed(mean_score_interval([i.correct for i in items])),
        partnered_mean_p_gold_interval=_listed(mean_score_interval([i.p_gold for i in items])),
        partnered_items=len(items),
    )
    if model.task is not None:
        (scored,) = score_all(module, tokenizer, [model.task], settings.limit, settings.batch_size, str(module.device))
        scale = 100 if scored["primary"] in TRANSLATION_METRICS else 1
        stderr = scored["stderr"] and scored["stderr"] / scale
        value = scored["score"] / scale
        found.update(
            partnered_task_score=value,
            task_metric=scored["primary"],
            partnered_task_score_stderr=stderr,
            partnered_task_score_interval=_task_interval(value, stderr, scored["samples"], scale != 1),
        )
    return found


def _listed(interval: Optional[Tuple[float, float]]) -> Optional[list]:
    return None if interval is None else list(interval)


def _task_interval(value: float, stderr: Optional[float], n: int, corpus: bool) -> Optional[list]:
    """An lm-eval task score's 95% interval: Wilson's over its ``n`` samples where the score is a
    mean over items in [0, 1] (acc, acc_norm, exact_match); lm-eval's own stderr where it is a
    corpus-level metric (BLEU, chrF), whose items have no score of their own."""
    from mergekit_mergeability.maths.stats import Z95, wilson_interval

    if not corpus:
        return _listed(wilson_interval(min(max(value, 0.0), 1.0) * n, n))
    if not stderr:
        return None
    return [max(0.0, value - Z95 * stderr), min(1.0, value + Z95 * stderr)]


def untaught(
    model: ModelInput, alone: choice_scores.TaskKnowledge, baseline: choice_scores.TaskKnowledge
) -> Sequence[Finding]:
    """A warning where a model scores on its own probe no better than the base does, read as its
    task is scored (accuracy where it is cloze or an lm-eval task's, else p(gold)): a fine-tune that
    learnt its task beats the base on it, so the probe is likely asked otherwise than it was trained."""
    from mergekit_mergeability.tasks.probes import CLOZE, LM_EVAL

    by_accuracy = all(i.format in (CLOZE, LM_EVAL) for i in model.probes)
    metric, mine, theirs = (
        ("the share of items right", alone.accuracy, baseline.accuracy)
        if by_accuracy
        else ("p(gold)", alone.mean_p_gold, baseline.mean_p_gold)
    )
    if mine > theirs or theirs >= 1:  # better than the base, or nothing left to learn
        return []
    return [
        Finding(
            "warning",
            f"{model.name}: on its own probe it scores {metric} {mine:.2f}, the base {theirs:.2f}: "
            "the probe may not be asked the way this model was trained (check its format, shots, fewshot: file, "
            "prompt and chat: true)",
        )
    ]


class Dilution:
    name = "dilution"
    needs = frozenset({Need.BASE_MODEL, Need.PROBES, Need.WEIGHTS})
    shares_layers = True  # each probe under several merges: the untouched layers run once (the cost line)

    def __init__(self, share: float = 1 / (PARTNERS + 1)):
        self.share = share

    def rehearsed(
        self, everyone: Sequence[ModelInput], written: bool = False
    ) -> Tuple[str, Dict[str, float], Dict[str, float]]:
        """The partnered pass's merge for each model i, θ_base + Σ_j c_j·τ_j + e_i·τ_i, as (which merge,
        c, e); c empty for one model. A config of more models than the protocol's partners: paper 1's expected
        partner, c_j = (1 − s')/(N − 1), s' = max(s, 1/N), e_i = s' − c_i. One with fewer has no eight
        partners to draw: the merge as written where it can be built (``written``: "written", c and e
        empty, the merge is mergekit's), else where its method is a plain sum (``ModelInput.share``)
        its merge as configured (c_j its share, e = 0), else the mean merge of all N."""
        count = len(everyone)
        if count < 2:
            return "none", {}, {}
        if count <= PARTNERS and written:
            return "written", {}, {}
        if count <= PARTNERS and all(m.share is not None for m in everyone):
            return "configured", {m.name: m.share for m in everyone}, {m.name: 0.0 for m in everyone}
        mine = max(self.share, 1 / count)
        others = (1 - mine) / (count - 1)
        return "mean", {m.name: others for m in everyone}, {m.name: mine - others for m in everyone}

    def schedule(self, inputs: DiagnosticInputs):
        """(which merge, c, e as ``rehearsed`` says, whether knowledge_weighted and TIES are compared,
        passes over every probe line)."""
        probed = [m for m in inputs.models if m.probes]
        merge, in_sum, extra = self.rehearsed(inputs.models, inputs.written)
        # knowledge_weighted's shares need every model's knowledge, and weights it takes (≥ 0, not all 0)
        weights = [m.weight for m in inputs.models]
        # (a config whose merge as written is rehearsed has its method chosen by the menu instead: ``menu``)
        compare = len(probed) == len(inputs.models) > 1 and min(weights) >= 0 < max(weights) and merge != "written"
        # + 2: each model alone and the base, on its own probe (``ALONE``)
        passes = (4 if in_sum or merge == "written" else 3) + (1 + len(COMPARED) if compare else 0)
        return merge, in_sum, extra, compare, passes

    def passes(self, inputs: DiagnosticInputs, tokenizer=None) -> int:
        """The sequences it scores (``measure``'s cost line), a plain task's second read included."""
        lines = sum(i.sequences for m in inputs.models if m.probes for i in m.probes)
        return lines and lines * self.schedule(inputs)[-1] + sum(i.sequences for i in self.scored_again(inputs)[0])

    def whole(self, inputs: DiagnosticInputs) -> list:
        """The items lm-eval's own requests score besides its counted passes (the cost line)."""
        return self.scored_again(inputs)[1]

    def scored_again(self, inputs: DiagnosticInputs) -> Tuple[list, list]:
        """The items of each member's lm-eval task probe, scored again by the task's metric on its
        rehearsed merge (``partnered``): (those of a multiple-choice task read by acc or acc_norm,
        which its choices' log-probs give: ``lmeval.plain``; those of any other, which lm-eval's own
        requests score, each option whole)."""
        from mergekit_mergeability.tasks.lmeval import plain

        merge, in_sum, *_ = self.schedule(inputs)
        tasks = [m for m in inputs.models if (in_sum or merge == "written") and m.probes and m.task is not None]
        read = {m.name for m in tasks if plain(m.task, inputs.settings.limit) is not None}
        return (
            [i for m in tasks if m.name in read for i in m.probes],
            [i for m in tasks if m.name not in read for i in m.probes],
        )

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        models = [m for m in inputs.models if m.probes]
        if not models:
            return result
        settings = inputs.settings
        map_large_allocations(4 * BLOCK)  # each pass's float32 blocks go back to the system, not to the heap
        module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
        base = TensorReader(inputs.base.path)
        touched = inputs.touched
        names = set().union(*touched.values())
        merge, in_sum, extra, compare, passes = self.schedule(inputs)
        lines = sum(i.sequences for m in models for i in m.probes)
        loaded = sum(p.numel() * p.element_size() for p in module.parameters())
        limit = min(SUM_BUDGET, SUM_SHARE * loaded)
        mixture_of = lambda ms: [(m.path, in_sum[m.name], touched[m.name]) for m in ms]  # noqa: E731
        per_item = lambda m: result.per_instance.setdefault(m.name, [])  # noqa: E731
        every = summed(base, mixture_of(inputs.models), limit) if in_sum else None
        with (
            task(f"dilution: each model at {self.share:.3g} of its update", passes * lines, settings.quiet) as advance,
            shared_below(module, names),  # each probe under several merges: the untouched layers run once
        ):
            asked = partial(_asked, module, tokenizer, advance)
            everyone = [inputs.base.path, *(m.path for m in inputs.models)]
            # each model at its share of its update and alone, every one in one walk up the blocks
            shifted = [(m, kind, share) for m in models for kind, share in (("diluted", self.share), ("alone", 1.0))]
            candidates = [
                summed_candidate(f"{kind} {m.name}", str(inputs.base.path), [(str(m.path), share, touched[m.name])])
                for m, kind, share in shifted
            ]
            jobs = [Job(c.name, partial(asked, m)) for c, (m, _, _) in zip(candidates, shifted)]
            found = {
                (m.name, kind): v for (m, kind, _), v in zip(shifted, walk(module, candidates, jobs, everyone, names))
            }
            for model in models:
                view, alone = found[model.name, "diluted"], found[model.name, "alone"]
                baseline = asked(model)
                result.findings.extend(untaught(model, alone, baseline))
                result.per_model[model.name] = dict(
                    share=self.share,
                    diluted_accuracy=view.accuracy,
                    diluted_mean_p_gold=view.mean_p_gold,
                    diluted_mean_margin=view.mean_margin,
                    alone_accuracy=alone.accuracy,
                    alone_mean_p_gold=alone.mean_p_gold,
                )
                if not in_sum:
                    continue
                # Σ_j c_j·τ_j (summed once, or read model by model for this model alone) plus its own extra share
                mixture = [(model.path, extra[model.name], touched[model.name])] if extra[model.name] else []
                with mixed(module, base, mixture if every is not None else mixture + mixture_of(inputs.models), every):
                    view = partnered(module, tokenizer, model, advance, settings, per_item(model))
                others = [in_sum[m.name] for m in inputs.models if m is not model]
                result.per_model[model.name].update(
                    rehearsed=merge,
                    partnered_share=in_sum[model.name] + extra[model.name],
                    partner_share=sum(others) / len(others),
                    **view,
                )
            if merge == "written":
                jobs = [
                    Job(merge, partial(partnered, module, tokenizer, m, advance, settings, per_item(m))) for m in models
                ]
                for model, view in zip(models, walk(module, [as_planned(merge, inputs.merge)], jobs, everyone, names)):
                    result.per_model[model.name].update(
                        rehearsed=merge, **view, **({} if model.share is None else dict(partnered_share=model.share))
                    )
            if compare:
                self.compare(asked, module, inputs, models, everyone, names, result)
        # each model's values, named as its record names them (a misspelt one fails here)
        result.per_model = {name: DilutionStats(**values).json() for name, values in result.per_model.items()}
        return result

    def compare(
        self, asked, module, inputs: DiagnosticInputs, models, everyone, names, result: DiagnosticResult
    ) -> None:
        """The whole config merged as the advice would write each method, each model's own probe
        asked on both (``knowledge_weighted_*``, ``ties_*``): knowledge_weighted's defaults, its shares
        from the base's p(gold) on each probe times the configured weights, and TIES at density 0.5
        with the configured weights; both at the configured update size, in one walk."""
        known = [asked(model).mean_p_gold for model in models]
        weights = [m.weight for m in models]
        shares = {
            "knowledge_weighted": knowledge_weights(known, DEFAULT_TEMPERATURE, weights).tolist(),
            "ties": weights,
        }
        touched, base = inputs.touched, str(inputs.base.path)
        candidates = [
            ties(method, base, [(str(m.path), w, touched[m.name]) for m, w in zip(models, shares[method])],
                 DEFAULT_DENSITY, inputs.update_size)
            for method in COMPARED
        ]  # fmt: skip
        jobs = [Job(method, partial(asked, model)) for method in COMPARED for model in models]
        views = iter(walk(module, candidates, jobs, everyone, names))
        for method in COMPARED:
            for model in models:
                view = next(views)
                result.per_model[model.name].update(
                    {f"{method}_accuracy": view.accuracy, f"{method}_mean_p_gold": view.mean_p_gold}
                )
