"""Signal 4: which MLP neurons serve one probe group only, and whether the models agree on them.

Paper 3 (arXiv 2604.02881) explains multilingual merge failures with span-conditioned
neuron selectivity (LAPE, ``maths.selectivity``). Groups are the probes' ``group`` fields
(a language, a task), else one group per model's probe set (models with the same probe
set share one). Every model, the base included, reads every group's rows (prompt + gold
continuation, teacher-forced); per group, layer and neuron it counts the span tokens
(``selectivity_span``: ``answer``, the default, or ``prompt``) on which the neuron's
activation is > 0. A neuron's activation is its MLP activation function's output:
act(gate_proj(x)) in gated MLPs (Llama, Qwen2, Mistral, Gemma; paper 3's SiLU(gate) > 0),
act(c_fc(x)), the output projection's input, in plain ones (GPT-2). Counts are summed
batch by batch; no activation outlives its batch.

Per model: the group-specific neurons per layer (``specific_<group>``, one entry per
decoder block). Per pair: the mean Jaccard overlap of their specific-neuron sets
(``specific_overlap``), and for two experts ``specific_collisions``: neurons specific in
both but to different groups, which a merge averages across two groups' uses, and
``specific_union``: neurons specific (to any group) in either. The
experts' specific neurons *collide* in a layer when such neurons are at least
``COLLISION_SHARE`` of the neurons specific (to any group) in either expert there.
"""

from __future__ import annotations

import inspect
import itertools
import re
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from mergekit_mergeability import distributed
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need, stored
from mergekit_mergeability.diagnostics.activations import batches
from mergekit_mergeability.diagnostics.rows import SELECTIVITY, counted_together, probe_groups
from mergekit_mergeability.maths import lape
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import PairLayers
from mergekit_mergeability.settings import SELECTIVITY_SPANS as SPANS
from mergekit_mergeability.sources import load_causal_lm

SPECIFIC = "specific_"  # per-model metric prefix: specific_<group>
COLLISION_SHARE = 0.1
_ACTIVATION = re.compile(r"\.(\d+)\.mlp\.(act_fn|act)$")  # transformers' names: Llama-likes, GPT-2


class Selectivity:
    name = "selectivity"
    unit = "row"  # its passes read a probe's prompt and answer whole
    needs = frozenset({Need.PROBES})

    def passes(self, inputs: DiagnosticInputs, tokenizer=None) -> int:
        """Every probe row through the base and each model (0 where fewer than two groups, or where
        the representations' pass counts them: ``rows.counted_together``)."""
        rows, _, groups = probe_groups(inputs.models)
        if len(groups) < 2 or counted_together(inputs):
            return 0
        return len(rows) * len([m for m in (inputs.base, *inputs.models) if m is not None])

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        settings = inputs.settings
        result = DiagnosticResult()
        rows, labels, groups = probe_groups(inputs.models)
        if len(groups) < 2:
            result.findings.append(
                Finding(
                    "info",
                    f"selectivity: {len(groups)} probe group(s); LAPE compares at least 2 (a group: field per probe line, or probes for two models), skipped",
                )
            )
            return result
        quantiles = (settings.lape_entropy_quantile, settings.lape_activation_quantile)
        members = [m for m in (inputs.base, *inputs.models) if m is not None]
        probabilities: Dict[str, np.ndarray] = {}
        for member, p in zip(
            members,
            distributed.each(
                member_probabilities, members, rows, labels, len(groups), inputs, gpus=distributed.gpus(settings)
            ),
        ):  # Ray: one task per model
            if p is None:
                result.findings.append(
                    Finding(
                        "warning",
                        f"selectivity: model {member.name}: no MLP activation module per decoder block (…mlp.act_fn or …mlp.act); skipped",
                    )
                )
                return result
            probabilities[member.name] = p
        bar, cut = lape.thresholds(list(probabilities.values()), *quantiles)
        masks = {name: lape.specific(p, bar, cut) for name, p in probabilities.items()}
        if not any(mask.any() for mask in masks.values()):
            result.findings.append(
                Finding(
                    "info",
                    f"selectivity: no MLP neuron is specific to one of the {len(groups)} probe groups in any model; no overlap to compare (more probe lines per group may separate them)",
                )
            )
        for name, mask in masks.items():
            result.per_layer[name] = {f"{SPECIFIC}{g}": c.tolist() for g, c in zip(groups, lape.counts(mask))}
        experts = {m.name for m in inputs.models}
        for a, b in itertools.combinations(masks, 2):
            layers = PairLayers(specific_overlap=lape.overlap(masks[a], masks[b]).tolist())
            if a in experts and b in experts:
                collisions = lape.collisions(masks[a], masks[b]).tolist()
                union = lape.specific_union(masks[a], masks[b]).tolist()
                layers = replace(layers, specific_collisions=collisions, specific_union=union)
                hit = colliding_layers(collisions, union)
                if hit:
                    result.findings.append(
                        Finding(
                            "warning",
                            f"selectivity: {a} and {b}: specific neurons collide in block{'s' if len(hit) > 1 else ''} {', '.join(map(str, hit))} (≥ {COLLISION_SHARE:.0%} of them specific to different groups in the two)",
                        )
                    )
            result.per_layer[(a, b)] = layers.json()
        return result


def member_probabilities(
    member: ModelInput, rows, labels, groups: int, inputs: DiagnosticInputs
) -> Optional[np.ndarray]:
    """``member``'s activation probabilities (``activation_probabilities``): counted by the
    representations' pass where it ran first (``rows.counted_together``), else the model loaded for
    this pass alone."""
    settings = inputs.settings
    base_path = inputs.base.path if inputs.base else None
    span = settings.selectivity_span

    def compute():
        if (SELECTIVITY, member.name) in inputs.passed_on:
            return inputs.passed_on.pop((SELECTIVITY, member.name))
        model, tokenizer = load_causal_lm(member.path, settings.device, member.load_dtype(settings), base_path)
        with task(f"selectivity: {inputs.names.get(member.name, member.name)}", len(rows), settings.quiet) as advance:
            p = activation_probabilities(model, tokenizer, rows, labels, groups, span, settings.batch_size, advance)
        return as_kept(p)

    computed_from = (rows, list(labels), groups, span, member.load_dtype(settings), settings.batch_size)
    found = stored.kept(settings.cache_dir, "selectivity", member.path, computed_from, compute)
    return found["probabilities"].numpy() if "probabilities" in found else None


def colliding_layers(collided: Sequence[float], specific: Sequence[float]) -> List[int]:
    """Blocks where neurons specific to different groups are ≥ COLLISION_SHARE of those specific in either model."""
    return [layer for layer, (c, s) in enumerate(zip(collided, specific)) if s and c >= COLLISION_SHARE * s]


def activation_modules(model) -> Optional[List[torch.nn.Module]]:
    """Each decoder block's MLP activation module, in block order; None if the model has no such modules."""
    found = {int(m.group(1)): module for name, module in model.named_modules() if (m := _ACTIVATION.search(name))}
    if not found or sorted(found) != list(range(len(found))) or len({id(m) for m in found.values()}) != len(found):
        return None  # missing, or one module shared by the blocks: its hook could not tell them apart
    return [found[i] for i in range(len(found))]


def as_kept(probabilities: Optional[np.ndarray]) -> dict:
    """A member's pass as kept (``stored.kept``): its probabilities, or nothing (no activation module)."""
    return {} if probabilities is None else {"probabilities": torch.from_numpy(probabilities)}


class ActiveNeurons:
    """While in use, counts on ``model``'s forward passes, per group, layer and neuron, the span
    tokens on which each MLP neuron is active (> 0); ``before(rows, ids)`` names each batch's rows
    (their prompt and continuation ids) and right-padded ids before its forward pass. ``labels``:
    each row's group, in the order the rows come (None: not counted). Counts are summed per batch
    inside forward hooks: no activation outlives its batch."""

    def __init__(self, model, modules, labels, groups: int, span: str = "answer"):
        if span not in SPANS:
            raise ValueError(f"span must be one of {SPANS}, got {span!r}")
        self.modules, self.span, self.groups = modules, span, groups
        self.owned = iter(labels)
        self.device = next(model.parameters()).device
        # MPS has no float64: exact to 2^24 tokens
        self.exact = torch.float32 if self.device.type == "mps" else torch.float64
        self.active: List[Optional[torch.Tensor]] = [None] * len(modules)
        self.tokens = torch.zeros(groups, dtype=self.exact, device=self.device)
        self.batch: Dict[str, torch.Tensor] = {}  # the span tokens' flat positions and their groups (one-hot)

    @classmethod
    def on(cls, model, labels, groups: int, span: str = "answer") -> Optional["ActiveNeurons"]:
        """A counter on ``model``'s MLP activation modules; None where it has none per block."""
        modules = activation_modules(model)
        return None if modules is None else cls(model, modules, labels, groups, span)

    def counter(self, layer: int):
        def count(module, args, output):
            flat = output.reshape(-1, output.shape[-1])[self.batch["positions"]]
            # counts per batch stay below 2^24: exact in float32
            counts = (self.batch["onehot"] @ (flat > 0).float()).to(self.exact)
            self.active[layer] = counts if self.active[layer] is None else self.active[layer] + counts

        return count

    def __enter__(self) -> "ActiveNeurons":
        self.handles = [m.register_forward_hook(self.counter(i)) for i, m in enumerate(self.modules)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def before(self, rows, ids: torch.Tensor) -> None:
        positions, owners = [], []
        for row, (p, c) in enumerate(rows):
            label = next(self.owned)
            low, high = (len(p), len(p) + len(c)) if self.span == "answer" else (0, len(p))
            if label is not None:
                positions.extend(range(row * ids.shape[1] + low, row * ids.shape[1] + high))
                owners.extend([label] * (high - low))
        onehot = torch.zeros(self.groups, len(positions))
        onehot[owners, range(len(positions))] = 1
        self.batch.update(
            positions=torch.tensor(positions, dtype=torch.long, device=self.device), onehot=onehot.to(self.device)
        )
        self.tokens += onehot.sum(dim=1).to(self.device, self.exact)

    def probabilities(self) -> np.ndarray:
        """(groups, layers, neurons): the share of each group's span tokens each neuron is active on."""
        counts = torch.stack(self.active, dim=1)
        return (counts / self.tokens.clamp(min=1)[:, None, None]).cpu().numpy()


@torch.inference_mode()
def activation_probabilities(
    model,
    tokenizer,
    rows: Sequence[Tuple[str, str]],
    labels: Sequence[int],
    groups: int,
    span: str = "answer",
    batch_size: int = 16,
    progress=None,
) -> Optional[np.ndarray]:
    """(groups, layers, neurons): the share of each group's span tokens on which each MLP neuron is
    active (> 0), counted by ``ActiveNeurons``; memory stays one batch's activations however many
    rows there are. None where the model has no activation module per block."""
    counted = ActiveNeurons.on(model, labels, groups, span)
    if counted is None:
        return None
    keep = (
        {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    )  # the span needs no logits
    with counted:
        for chunk, ids, mask in batches(tokenizer, rows, batch_size):
            counted.before(chunk, ids)
            model(input_ids=ids.to(counted.device), attention_mask=mask.to(counted.device), **keep)
            if progress is not None:
                progress(len(chunk))
    return counted.probabilities()
