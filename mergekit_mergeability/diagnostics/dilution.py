"""Signal 4: what each model's own probe keeps when its update is diluted as a mean merge dilutes it.

A mean merge of paper 1's protocol (the model and 8 random partners, weights 1/9) hands each
update a ninth of its size. Before any merge, the base plus that share of τ_i is asked model
i's own probe in the format its task is scored in (as ``knowledge``'s ``scored_*`` view):

    θ_base + s·τ_i,   s = 1 / (partners + 1)

A fact the base already knows keeps its answer whatever the share; a fact it does not know is
kept only as far as the update overshoots what teaching it needed. The base's knowledge alone
does not say that overshoot, and for an update spread over many matrices its size says it
poorly (docs/prediction.md). One pass per model over its probe lines, on the loaded base with
the share patched in a tensor at a time and restored from the base's files: no merge, no
partner, and no second copy of any model in memory.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Iterator

import torch

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Need
from mergekit_mergeability.diagnostics.knowledge import scores
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths import knowledge
from mergekit_mergeability.progress import task
from mergekit_mergeability.sources import Source, TensorReader, load_causal_lm, tensors

PARTNERS = 8  # paper 1's protocol, and `mergeability --partners`'s default: the share is 1/9
BLOCK = 1 << 20  # values per block of rows patched at once


@contextlib.contextmanager
def diluted(module: torch.nn.Module, base: TensorReader, model: Source, share: float) -> Iterator[torch.nn.Module]:
    """``module`` (the loaded base) as θ_base + share·(θ_model − θ_base), restored from ``base`` on
    exit. Written in row blocks of ~1M values, so no tensor is ever held whole in float32."""
    state, theirs = module.state_dict(), tensors(model)
    update = theirs.known_update()  # an adapter's targets; a whole model's changes are found by comparing
    changed = set()
    try:
        with torch.no_grad():
            for name in update if update is not None else base.index:
                if name not in state:
                    raise UserError(
                        f"model {model}: tensor {name} is not in the loaded base; the config's models share one architecture"
                    )
                for start, stop in base.blocks(name, BLOCK):
                    mine, tensor = base.rows(name, start, stop), theirs.rows(name, start, stop)
                    if torch.equal(mine, tensor):
                        continue
                    changed.add(name)
                    state[name][start:stop].copy_(torch.lerp(mine.float(), tensor.float(), share))
        yield module
    finally:
        with torch.no_grad():
            for name in changed:
                state[name].copy_(base[name])


class Dilution:
    name = "dilution"
    needs = frozenset({Need.BASE_MODEL, Need.PROBES, Need.WEIGHTS})

    def __init__(self, share: float = 1 / (PARTNERS + 1)):
        self.share = share

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        models = [m for m in inputs.models if m.probes]
        if not models:
            return result
        settings = inputs.settings
        module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
        base = TensorReader(inputs.base.path)
        lines = sum(len(i.continuations) for m in models for i in m.probes)
        with task(f"dilution: each model at {self.share:.3g} of its update", lines, settings.quiet) as advance:
            for model in models:
                with diluted(module, base, model.path, self.share):
                    view = asdict(knowledge.aggregate(scores(module, tokenizer, list(model.probes), advance)))
                result.per_model[model.name] = {
                    "share": self.share,
                    "diluted_accuracy": view["accuracy"],
                    "diluted_mean_p_gold": view["mean_p_gold"],
                    "diluted_mean_margin": view["mean_margin"],
                }
        return result
