"""Signal 1: how well the base model already knows each model's probe set.

Will it Merge? (arXiv 2601.06672): updates on what the base nearly knows merge
well; updates on what it struggles with are lost. Scored zero-shot, teacher-forced.
"""

from __future__ import annotations

from dataclasses import asdict

from mergekit_mergeability.checkpoints import load_causal_lm
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Need
from mergekit_mergeability.diagnostics.activations import choice_logprobs
from mergekit_mergeability.maths import knowledge
from mergekit_mergeability.progress import task


class Knowledge:
    name = "knowledge"
    needs = frozenset({Need.BASE_MODEL, Need.PROBES})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        options = inputs.options
        result = DiagnosticResult()
        probed = [m for m in inputs.models if m.probes]
        if not probed:
            return result
        model, tokenizer = load_causal_lm(inputs.base.path, options.get("device", "cpu"), options.get("dtype", "float32"))
        sequences = sum(len(i.continuations) for m in probed for i in m.probes)
        with task("knowledge: base model on probes", sequences, options.get("quiet", False)) as advance:
            for member in probed:
                scores = [
                    knowledge.multiple_choice(scored, instance.label)
                    if instance.kind == "multiple_choice"
                    else knowledge.generation(*scored)
                    for instance, scored in zip(
                        member.probes,
                        choice_logprobs(model, tokenizer, member.probes, options.get("batch_size", 16), advance),
                    )
                ]
                result.per_model[member.name] = asdict(knowledge.aggregate(scores))
        return result
