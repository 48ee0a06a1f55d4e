"""Signal 2: where the models' representations stop being shared (arXiv 2604.02881).

Every model (the base included) reads the same rows: the probe instances of all
models, prompt + gold continuation, teacher-forced. Per layer (index 0 the
embedding output, then one per decoder block) each row is the mean hidden state
over the continuation span, and separately over the prompt span. Linear CKA is
computed for every pair, biased and unbiased. Adapters run on their base, loaded once:
each adapter's update is added in place for its pass, then the base's tensors restored.
Where the neuron selectivity runs too, the same pass counts its active neurons (``rows``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Dict, List, Optional, Set

import torch

from mergekit_mergeability import distributed
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need, stored
from mergekit_mergeability.diagnostics.activations import hidden_means
from mergekit_mergeability.diagnostics.rows import MIN_ROWS, SELECTIVITY, counted_together, probe_rows, row_groups
from mergekit_mergeability.diagnostics.selectivity import ActiveNeurons, as_kept
from mergekit_mergeability.maths.cka import layerwise
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import PairLayers
from mergekit_mergeability.sources import load_causal_lm, merged, patched, update_of


class Representations:
    name = "representations"
    unit = "row"  # its passes read a probe's prompt and answer whole
    needs = frozenset({Need.PROBES})

    def passes(self, inputs: DiagnosticInputs, tokenizer=None) -> int:
        """Every probe row through the base and each model (0 where too few rows to compare)."""
        rows = sum(len(m.probes or ()) for m in inputs.models)
        return 0 if rows < MIN_ROWS else rows * len([m for m in (inputs.base, *inputs.models) if m is not None])

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        rows = probe_rows(inputs.models)
        if len(rows) < MIN_ROWS:
            result.findings.append(
                Finding(
                    "warning", f"representations: {len(rows)} probe instances; CKA needs at least {MIN_ROWS}, skipped"
                )
            )
            return result
        members = [m for m in (inputs.base, *inputs.models) if m is not None]
        if distributed.active():  # one task per model, each loading its own
            pooled = dict(
                zip(
                    (m.name for m in members),
                    distributed.each(pooled_states, members, rows, inputs, gpus=distributed.gpus(inputs.settings)),
                )
            )
        else:
            loaded = _Loaded(inputs, {str(update_of(m.path)) for m in members if update_of(m.path) is not None})
            counting = counted_together(inputs)  # the selectivity's neurons, counted in the same pass
            pooled = {m.name: pooled_states(m, rows, inputs, loaded, counting) for m in members}
        selected: Optional[Set[int]] = inputs.settings.layers
        batch = inputs.settings.cka_batch_size
        for a, b in itertools.combinations(pooled, 2):
            (answer_a, prompt_a), (answer_b, prompt_b) = pooled[a], pooled[b]
            curves = PairLayers(
                cka=layerwise(answer_a, answer_b),
                cka_unbiased=layerwise(answer_a, answer_b, unbiased=True, batch_size=batch),
                cka_prompt=layerwise(prompt_a, prompt_b),
            )
            result.per_layer[(a, b)] = {k: _only(v, selected) for k, v in curves.json().items()}
        depth = len(next(iter(pooled.values()))[0])
        if selected is not None and max(selected) >= depth:
            outside = sorted(i for i in selected if i >= depth)
            result.findings.append(
                Finding(
                    "warning",
                    f"--layers: {', '.join(map(str, outside[:5]))}{' …' if len(outside) > 5 else ''} beyond these models' layers 0–{depth - 1} (0 = embedding output); compared only those within",
                )
            )
        return result


def pooled_states(
    member: ModelInput, rows, inputs: DiagnosticInputs, loaded: Optional["_Loaded"] = None, selectivity: bool = False
):
    """``member``'s hidden states over ``rows`` (``rows.probe_rows``), mean-pooled over the answer and
    over the prompt: two (layers, rows, hidden) tensors. ``loaded`` keeps bases loaded between
    models. ``selectivity`` (the selectivity runs after it in this process: ``rows.counted_together``):
    the same pass counts its active neurons, passed on to it (``DiagnosticInputs.passed_on``)."""
    settings = inputs.settings

    def compute():
        answers: List[torch.Tensor] = []
        prompts: List[torch.Tensor] = []
        with (loaded or _Loaded(inputs, set())).model(member.path, member.load_dtype(settings)) as (model, tokenizer):
            labels, groups = row_groups(inputs.models)
            counting = ActiveNeurons.on(model, labels, len(groups), settings.selectivity_span) if selectivity else None
            with (
                task(
                    f"representations: {inputs.names.get(member.name, member.name)}", len(rows), settings.quiet
                ) as advance,
                counting or contextlib.nullcontext(),
            ):
                before = counting and counting.before
                for prompt, answer in hidden_means(model, tokenizer, rows, settings.batch_size, advance, before):
                    answers.append(answer)
                    prompts.append(prompt)
            if counting:
                inputs.passed_on[SELECTIVITY, member.name] = as_kept(counting.probabilities())
        return {"answers": torch.stack(answers, dim=1), "prompts": torch.stack(prompts, dim=1)}

    computed_from = (rows, member.load_dtype(settings), settings.batch_size)
    pooled = stored.kept(settings.cache_dir, "representations", member.path, computed_from, compute)
    return pooled["answers"], pooled["prompts"]


class _Loaded:
    """Loads each model for its pass; the bases of adapters stay loaded, and an adapter is its
    base with the update patched in (``sources.patched``), no reload per adapter."""

    def __init__(self, inputs: DiagnosticInputs, shared: Set[str]):
        self.settings = inputs.settings
        self.tokenizer_from = inputs.base.path if inputs.base else None
        self.shared = shared  # str() of the sources to keep loaded
        self.kept: Dict[str, tuple] = {}

    def _load(self, source, dtype: str):
        return load_causal_lm(source, self.settings.device, dtype, self.tokenizer_from)

    def _kept(self, source, dtype: str):
        if (str(source), dtype) not in self.kept:
            self.kept[str(source), dtype] = self._load(source, dtype)
        return self.kept[str(source), dtype]

    @contextlib.contextmanager
    def model(self, source, dtype: str):
        if update_of(source) is not None:
            model, tokenizer = self._kept(update_of(source), dtype)
            with patched(model, merged(source, model.state_dict())):
                yield model, tokenizer
        elif str(source) in self.shared:
            yield self._kept(source, dtype)
        else:
            yield self._load(source, dtype)


def _only(curve: List[float], selected: Optional[Set[int]]) -> List[float]:
    return [v if selected is None or i in selected else math.nan for i, v in enumerate(curve)]
