"""Signal 1: how well the base model already knows each model's probe set.

Will it Merge? (arXiv 2601.06672): updates on what the base nearly knows merge
well; updates on what it struggles with are lost. Asked as the paper asks it: a
few-shot prompt with the options listed and lettered, each option scored by its
summed log-prob as a continuation (``probes.with_shots``, ``maths.knowledge``).
"""

from __future__ import annotations

from dataclasses import asdict

from mergekit_mergeability import probes
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
        options = inputs.options
        shots = options.get("fewshot", DEFAULT_FEWSHOT)
        result = DiagnosticResult()
        asked = {m.name: probes.with_shots(m.probes, shots, m.shots or ()) for m in inputs.models if m.probes}
        if not asked:
            return result
        model, tokenizer = load_causal_lm(inputs.base.path, options.get("device", "cpu"), options.get("dtype", "float32"))
        sequences = sum(len(i.continuations) + len(i.letters) for instances in asked.values() for i in instances)
        with task("knowledge: base model on probes", sequences, options.get("quiet", False)) as advance:
            for name, instances in asked.items():
                scores = [
                    knowledge.multiple_choice(scored[0], instance.label, scored[1]) if instance.kind == probes.MULTIPLE_CHOICE else knowledge.generation(*scored)
                    for instance, scored in zip(instances, choice_logprobs(model, tokenizer, instances, progress=advance))
                ]
                result.per_model[name] = {**asdict(knowledge.aggregate(scores)), "fewshot": shots}
                result.per_instance[name] = [asdict(s) for s in scores]
        return result
