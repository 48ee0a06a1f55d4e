"""Signal 2: where the models' representations stop being shared (arXiv 2604.02881).

Every model (the base included) reads the same rows: the probe instances of all
models, prompt + gold continuation, teacher-forced. Per layer (index 0 the
embedding output, then one per decoder block) each row is the mean hidden state
over the continuation span, and separately over the prompt span. Linear CKA is
computed for every pair, biased and unbiased.
"""

from __future__ import annotations

import itertools
import math
from typing import List, Optional, Set

import torch

from mergekit_mergeability.checkpoints import load_causal_lm
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need
from mergekit_mergeability.diagnostics.activations import score
from mergekit_mergeability.maths.cka import layerwise
from mergekit_mergeability.progress import task

MIN_ROWS = 4  # the unbiased estimator's minimum; fewer rows say little anyway


class Representations:
    name = "representations"
    needs = frozenset({Need.PROBES})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        rows = [(i.prompt, i.gold) for m in inputs.models for i in (m.probes or ())]
        if len(rows) < MIN_ROWS:
            result.findings.append(Finding("warning", f"representations: {len(rows)} probe instances; CKA needs at least {MIN_ROWS}, skipped"))
            return result
        members = [m for m in (inputs.base, *inputs.models) if m is not None]
        pooled = {m.name: self._pool(m, rows, inputs) for m in members}
        selected: Optional[Set[int]] = inputs.options.get("layers")
        batch = inputs.options.get("cka_batch_size", 0)
        for a, b in itertools.combinations(pooled, 2):
            (answer_a, prompt_a), (answer_b, prompt_b) = pooled[a], pooled[b]
            curves = {
                "cka": layerwise(answer_a, answer_b),
                "cka_unbiased": layerwise(answer_a, answer_b, unbiased=True, batch_size=batch),
                "cka_prompt": layerwise(prompt_a, prompt_b),
            }
            result.per_layer[(a, b)] = {k: _only(v, selected) for k, v in curves.items()}
        return result

    def _pool(self, member: ModelInput, rows, inputs: DiagnosticInputs):
        options = inputs.options
        base_path = inputs.base.path if inputs.base else None
        model, tokenizer = load_causal_lm(member.path, options.get("device", "cpu"), options.get("dtype", "float32"), base_path)
        answers: List[torch.Tensor] = []
        prompts: List[torch.Tensor] = []
        with task(f"representations: {member.name}", len(rows), options.get("quiet", False)) as advance:
            for scored in score(model, tokenizer, rows, options.get("batch_size", 16), hidden_states=True, progress=advance):
                answers.append(scored.continuation_pool)
                prompts.append(scored.prompt_pool)
        del model
        # (layers, rows, hidden)
        return torch.stack(answers, dim=1), torch.stack(prompts, dim=1)


def _only(curve: List[float], selected: Optional[Set[int]]) -> List[float]:
    return [v if selected is None or i in selected else math.nan for i, v in enumerate(curve)]
