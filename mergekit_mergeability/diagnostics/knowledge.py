"""Signal 1: how well the base model already knows each model's probe set.

Will it Merge? (arXiv 2601.06672): updates on what the base nearly knows merge
well; updates on what it struggles with are lost. Asked two ways, both kept:

- as the paper asks it: a few-shot prompt with the options listed and lettered, each
  option scored by its summed log-prob as a continuation (``probes.with_shots``);
- as the task is scored (``scored_*``): the probe in the format its lines declare
  (``cloze`` or ``options`` with their shots; an lm-eval task's own), which is exactly
  what ``evaluate`` and ``mergeability`` score. precheck.json records that format
  (``scored_format``, ``scored_shots``) and whether the probe said it or it was assumed.

A small model can know a fact in one format and not in another (SmolLM2-135M: README);
what predicts a fine-tune's mergeability is the base's knowledge in the format the
fine-tune is scored in, so the calibration reads ``scored_*`` whatever that format is.
``--skip lettered`` asks only that view (plan does, where its calibration reads it).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Sequence

from mergekit_mergeability import distributed
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, Need
from mergekit_mergeability.diagnostics.activations import choice_logprobs
from mergekit_mergeability.maths import choice_scores
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import MIXED, KnowledgeStats
from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.tasks import probes


LETTERED = "lettered"  # --skip lettered: the base asked only as each task scores its probe


class Knowledge:
    name = "knowledge"
    needs = frozenset({Need.BASE_MODEL, Need.PROBES})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        (result,) = distributed.each(
            base_knowledge, [inputs], gpus=distributed.gpus(inputs.settings)
        )  # on Ray: one task, the base model alone
        return result

    def passes(self, inputs: DiagnosticInputs, tokenizer=None) -> int:
        """The sequences it scores (``measure``'s cost line)."""
        return sequences(*requests(inputs))

    def asked(self, inputs: DiagnosticInputs) -> List[probes.Instance]:
        """The requests it asks (the cost line times their prompts and options): every probe
        lettered with its shots, and as its task scores it where that is another request."""
        return [
            i
            for pairs in paired(*requests(inputs)).values()
            for s, a in pairs
            for i in ((a,) if _same_request(s, a) else tuple(r for r in (a, s) if r is not None))
        ]


def requests(inputs: DiagnosticInputs):
    """Each probed model's probe as its task scores it, and as the paper asks it (lettered, few-shot:
    the model's ``fewshot:`` file's first ``--fewshot`` lines where it has one, else drawn from its
    probe's other lines and the shipped neutral set; none with ``--skip lettered``)."""
    scored = {m.name: list(m.probes) for m in inputs.models if m.probes}
    if LETTERED in inputs.settings.skip:
        return scored, {}
    neutral = probes.shots_from(None)
    lettered = {
        m.name: probes.with_shots(m.probes, inputs.settings.fewshot, neutral, fixed=m.shots)
        for m in inputs.models
        if m.probes
    }
    return scored, lettered


def paired(scored, lettered):
    """Per model, each probe item as its task scores it beside its lettered request (None where
    the lettered view is not asked)."""
    return {name: list(zip(items, lettered.get(name) or [None] * len(items))) for name, items in scored.items()}


def sequences(scored, lettered) -> int:
    """Sequences scored: every lettered option and letter, and the task's own request where it differs."""
    asked = sum(i.sequences for instances in lettered.values() for i in instances)
    return asked + sum(
        i.sequences for pairs in paired(scored, lettered).values() for i, a in pairs if not _same_request(i, a)
    )


def base_knowledge(inputs: DiagnosticInputs) -> DiagnosticResult:
    """The base model's scores on every model's probe set, asked both ways."""
    settings = inputs.settings
    shots = settings.fewshot
    result = DiagnosticResult()
    scored, lettered = requests(inputs)
    if not scored:
        return result
    model, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
    with task("knowledge: base model on probes", sequences(scored, lettered), settings.quiet) as advance:
        for name, pairs in paired(scored, lettered).items():
            asked = lettered.get(name, [])
            paper = scores(model, tokenizer, asked, advance) or [None] * len(pairs)
            # the probe as its task scores it, where that is another request than the one just asked
            again = iter(scores(model, tokenizer, [i for i, a in pairs if not _same_request(i, a)], advance))
            as_task = [s if _same_request(i, a) else next(again) for (i, a), s in zip(pairs, paper)]
            result.per_model[name] = KnowledgeStats.asked(
                asdict(choice_scores.aggregate(paper)) if asked else {},
                asdict(choice_scores.aggregate(as_task)),
                fewshot=shots if asked else None,
                **scored_format(scored[name]),
            ).json()
            result.per_instance[name] = [
                {**(asdict(s) if s else {}), "scored_p_gold": t.p_gold, "scored_correct": t.correct}
                for s, t in zip(paper, as_task)
            ]
        undeclared = [m for m, instances in scored.items() if not all(i.declared for i in instances)]
        if undeclared:
            result.findings.append(Finding("info", _assumed(undeclared)))
        coded = [m for m, instances in scored.items() if any(i.format == probes.CODE for i in instances)]
        if coded:
            result.findings.append(Finding("info", _read_not_run(coded)))
    return result


def _read_not_run(models: Sequence[str]) -> str:
    return (
        f"{', '.join(models)}: the probe's task scores by running the code a model writes (HumanEval, MBPP);"
        " the precheck runs no code and reads it as a generation probe, each item's reference solution's"
        " per-token p(gold) (evaluate scores it by its own metric with --confirm-run-unsafe-code)"
    )


def scored_format(instances) -> dict:
    """How a probe set is scored: its format (``mixed`` when lines differ), shots and
    whether every line said so itself."""
    formats = sorted({i.format for i in instances})
    shots = sorted({i.shots for i in instances})
    return dict(
        scored_format=formats[0] if len(formats) == 1 else MIXED,
        scored_shots=shots[0] if len(shots) == 1 else shots,
        scored_format_declared=all(i.declared for i in instances),
    )


def _assumed(models) -> str:
    names = ", ".join(Path(str(m)).name for m in models[:3]) + (
        f" and {len(models) - 3} more" if len(models) > 3 else ""
    )
    return (
        f'probe format assumed: cloze (question, then "Answer:" and each choice) for {names}, whose probe lines do not say; '
        'if the fine-tune was trained and is scored with the options listed, add "format": "options" (and its "shots") to each line'
    )


def _same_request(a: probes.Instance, b: Optional[probes.Instance]) -> bool:
    return b is not None and a.prompt == b.prompt and a.continuations == b.continuations and a.kind == b.kind


def scores(model, tokenizer, instances, advance):
    """Per instance, its knowledge scores (``maths.knowledge``) from ``model``; ``advance`` counts sequences."""
    return [
        choice_scores.multiple_choice(scored[0], instance.label, scored[1])
        if instance.kind == probes.MULTIPLE_CHOICE
        else choice_scores.generation(*scored)
        for instance, scored in zip(instances, choice_logprobs(model, tokenizer, instances, progress=advance))
    ]


def as_read(model, tokenizer, instances, advance=None) -> List[float]:
    """Per instance, one number as a rehearsal reads it (the precheck's menu, plan's finalists)."""
    return [read(i, s.p_gold, s.correct) for s, i in zip(scores(model, tokenizer, instances, advance), instances)]


def read(instance, p_gold: float, correct: bool) -> float:
    """An item as a rehearsal reads it: p(gold) where its options are listed or it is generation (a
    JSONL answer or an lm-eval generate_until task's target: per token, the geometric mean, as graded
    as the chrF, BLEU or exact match lm-eval reads off a generated text; every token right at once
    would read a translation as wrong), right or wrong otherwise."""
    return p_gold if instance.format == probes.OPTIONS or instance.kind == probes.GENERATION else float(correct)
