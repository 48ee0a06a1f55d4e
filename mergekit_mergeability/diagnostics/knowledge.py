"""Signal 1: how well the base model already knows each model's probe set.

Will it Merge? (arXiv 2601.06672): updates on what the base nearly knows merge
well; updates on what it struggles with are lost. Asked two ways, both kept:

- as the paper asks it: a few-shot prompt with the options listed and lettered, each
  option scored by its summed log-prob as a continuation (``probes.with_shots``);
- as the task is scored (``task_*``): the probe in its own format, which is what
  ``evaluate`` and ``mergeability`` score (a JSONL line zero-shot as question and
  answer; an lm-eval task with its own shots and formatting, where both ways coincide).

A small model can know a fact it cannot pick out of a lettered list (SmolLM2-135M:
README, "How the prediction was fitted"); which way predicts is the calibration's call.
"""

from __future__ import annotations

from dataclasses import asdict

from mergekit_mergeability import probes
from mergekit_mergeability import distributed
from mergekit_mergeability.checkpoints import load_causal_lm
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Need
from mergekit_mergeability.diagnostics.activations import choice_logprobs
from mergekit_mergeability.maths import knowledge
from mergekit_mergeability.progress import task

# Solved examples before each question; chosen by measurement on the project's fit pool
# (benchmarks/pools.py, README "How the prediction was fitted"), never on the held-out pool.
DEFAULT_FEWSHOT = 3


class Knowledge:
    name = "knowledge"
    needs = frozenset({Need.BASE_MODEL, Need.PROBES})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        (result,) = distributed.each(base_knowledge, [inputs], gpus=distributed.gpus(inputs.options))  # on Ray: one task, the base model alone
        return result


def base_knowledge(inputs: DiagnosticInputs) -> DiagnosticResult:
    """The base model's scores on every model's probe set."""
    options = inputs.options
    shots = options.get("fewshot", DEFAULT_FEWSHOT)
    result = DiagnosticResult()
    asked = {m.name: probes.with_shots(m.probes, shots, m.shots or ()) for m in inputs.models if m.probes}
    if not asked:
        return result
    model, tokenizer = load_causal_lm(inputs.base.path, options.get("device", "cpu"), inputs.base.load_dtype(options))
    sequences = sum(len(i.continuations) + len(i.letters) for instances in asked.values() for i in instances)
    own = {m.name: m.probes for m in inputs.models if m.probes}
    sequences += sum(len(i.continuations) for name, instances in own.items() for i, a in zip(instances, asked[name]) if a is not i)
    with task("knowledge: base model on probes", sequences, options.get("quiet", False)) as advance:
        for name, instances in asked.items():
            scores = _scores(model, tokenizer, instances, advance)
            # the probe as the task scores it, where that is another prompt than the one just asked
            recast = [i for i, a in zip(own[name], instances) if a is not i]
            scored = iter(_scores(model, tokenizer, recast, advance))
            as_task = [next(scored) if a is not i else s for i, a, s in zip(own[name], instances, scores)]
            task_view = asdict(knowledge.aggregate(as_task))
            result.per_model[name] = {
                **asdict(knowledge.aggregate(scores)),
                "fewshot": shots,
                **{f"task_{key}": task_view[key] for key in ("accuracy", "mean_p_gold", "mean_gap")},
            }
            result.per_instance[name] = [{**asdict(s), "task_p_gold": t.p_gold, "task_correct": t.correct} for s, t in zip(scores, as_task)]
    return result


def _scores(model, tokenizer, instances, advance):
    return [
        knowledge.multiple_choice(scored[0], instance.label, scored[1]) if instance.kind == probes.MULTIPLE_CHOICE else knowledge.generation(*scored)
        for instance, scored in zip(instances, choice_logprobs(model, tokenizer, instances, progress=advance))
    ]
