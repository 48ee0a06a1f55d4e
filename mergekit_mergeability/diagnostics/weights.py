"""Signal 3: the task vectors τ_i = θ_i − θ_base, streamed tensor by tensor.

Per model: the update norm per decoder layer (and for embeddings and head), the
total norm, NaN/Inf counts. Per pair: cosine between task vectors and the TIES
sign-conflict rate (share of coordinates, non-zero in both, where signs differ).
Only one tensor name is in memory at a time (the base's and each model's copy).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Dict, List

import torch

from mergekit_mergeability.architecture import UnknownTensorError, tensor_position
from mergekit_mergeability.checkpoints import TensorReader
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, Need
from mergekit_mergeability.progress import task


class WeightStatistics:
    name = "weights"
    needs = frozenset({Need.WEIGHTS, Need.BASE_MODEL})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        base = TensorReader(inputs.base.path)
        readers = {m.name: TensorReader(m.path) for m in inputs.models}
        names = [n for n in base.index if all(n in r.index for r in readers.values())]
        squares: Dict[str, Dict[str, float]] = {m: defaultdict(float) for m in readers}  # model -> part -> Σ τ²
        bad: Dict[str, int] = dict.fromkeys(readers, 0)
        dots = defaultdict(float)
        agree = defaultdict(int)
        disagree = defaultdict(int)
        with task("weights: task vectors", len(names), inputs.options.get("quiet", False)) as advance:
            for name in names:
                reference = base[name].float()
                signs = {}
                deltas = {}
                part = _part(name)
                for model, reader in readers.items():
                    delta = reader[name].float() - reference
                    bad[model] += int((~torch.isfinite(delta)).sum())
                    squares[model][part] += float(delta.square().sum())
                    deltas[model], signs[model] = delta, torch.sign(delta).to(torch.int8)
                for a, b in itertools.combinations(readers, 2):
                    dots[a, b] += float(torch.dot(deltas[a].flatten(), deltas[b].flatten()))
                    product = signs[a] * signs[b]
                    agree[a, b] += int((product > 0).sum())
                    disagree[a, b] += int((product < 0).sum())
                advance(1)
        return self._result(squares, bad, dots, agree, disagree)

    @staticmethod
    def _result(squares, bad, dots, agree, disagree) -> DiagnosticResult:
        result = DiagnosticResult()
        norms = {m: math.sqrt(sum(parts.values())) for m, parts in squares.items()}
        for model, parts in squares.items():
            depth = 1 + max((p for p in parts if isinstance(p, int)), default=-1)
            result.per_model[model] = {
                "update_norm": norms[model],
                "nonfinite": float(bad[model]),
                "embedding_norm": math.sqrt(parts.get("embedding", 0.0)),
                "head_norm": math.sqrt(parts.get("head", 0.0)),
            }
            result.per_layer[model] = {"update_norm": [math.sqrt(parts.get(i, 0.0)) for i in range(depth)]}
            if bad[model]:
                result.findings.append(Finding("error", f"{model}: {bad[model]} NaN/Inf values in its weights; re-export the checkpoint"))
        for pair in dots:
            a, b = pair
            both = agree[pair] + disagree[pair]
            result.per_pair[pair] = {
                "cosine": dots[pair] / (norms[a] * norms[b]) if norms[a] * norms[b] > 0 else 0.0,
                "sign_conflict": disagree[pair] / both if both else 0.0,
            }
        return result


def _part(name: str):
    """The decoder layer index, or "embedding" / "head"; unknown tensors count as "other"."""
    try:
        position = tensor_position(name)
    except UnknownTensorError:
        return "other"
    return position.layer if position.part == "layer" else position.part
