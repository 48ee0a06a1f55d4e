"""Signal 3: the task vectors τ_i = θ_i − θ_base, streamed block by block.

Per model: the update norm per decoder layer (and for embeddings and head), the
total norm, the largest top singular value of any updated matrix (a one-pass Nyström
sketch, ``maths.spectral``), NaN/Inf counts, and its interference with the rest of
the pool: the cosine between τ_i and Σ_{j≠i} τ_j, and its mean cosine and sign
conflict with the others. Per pair: cosine between task vectors and the TIES
sign-conflict rate (share of coordinates, non-zero in both, where signs differ).
Tensors are read in row blocks of 1M values, so memory holds a few blocks whatever the model's size;
on a CUDA ``--device`` each block is copied there and its products run there (the sums stay on the CPU). Every sum is an entry of a Gram matrix over the stacked block (one BLAS pass each):
    ‖τ‖² = τ·τ,   agree − disagree = sign(τ_a)·sign(τ_b),   agree + disagree = |sign(τ_a)|·|sign(τ_b)|

A pool of LoRA adapters on the config's base is measured from the factors (``maths.lowrank``):
norms, dot products and σ_max through r × r products, one module's factors per adapter in memory
at a time; only the sign counts stream ΔW, in row blocks of the product. No base weight is read.
The numbers equal those of the same pool materialised as model folders.

Sums are gathered per tensor and added in tensor order (``_Sums.merge``): a pass split into
shards of tensors over Ray workers (``distributed``) gives the same numbers, bit for bit.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

import torch

from mergekit_mergeability import distributed
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, Need
from mergekit_mergeability.maths import lowrank
from mergekit_mergeability.maths.spectral import TopSingularValue
from mergekit_mergeability.progress import task
from mergekit_mergeability.records import LAYERS, PairWeights, Record, WeightStats
from mergekit_mergeability.sources import Source, TensorReader, same_model, tensor_index, tensors, update_of
from mergekit_mergeability.sources.architecture import UnknownTensorError, tensor_position

# Values per block of rows read from every model at once: 4 MiB of float32 each. Memory stays
# flat (a few blocks per model); fewer, larger blocks keep the per-operation overhead (and, on
# busy cores, the threads' synchronisation) small against the work (benchmarks/scale.py).
BLOCK = 1 << 20


class _Sums:
    def __init__(self, models, device: str = "cpu"):
        self.models = list(models)
        self.device = device
        self.squares: Dict[str, Dict] = {m: defaultdict(float) for m in models}  # model -> part -> Σ τ²
        self.nonfinite: Dict[str, int] = dict.fromkeys(models, 0)
        k = len(self.models)
        self.dots = torch.zeros(k, k, dtype=torch.float64)  # τ_a·τ_b
        self.sign_dots = torch.zeros(k, k, dtype=torch.float64)  # agree − disagree
        self.both_nonzero = torch.zeros(k, k, dtype=torch.float64)  # agree + disagree
        self.top_singular: Dict[str, float] = dict.fromkeys(models, 0.0)
        self._sketch: Optional[TopSingularValue] = None  # every model's, for the matrix being read

    def end_tensor(self) -> None:
        if self._sketch is not None:
            for model, value in zip(self.models, self._sketch.values()):
                self.top_singular[model] = max(self.top_singular[model], value)
        self._sketch = None

    def add(self, part, base: torch.Tensor, blocks: Dict[str, torch.Tensor]) -> None:
        """One block of rows of a tensor: the base's and each model's, in their stored dtype.
        Each model's rows are converted to float32 as they are copied into place and the base
        subtracted in place: the block is written once, not once per conversion."""
        deltas = torch.empty(len(self.models), base.numel(), device=self.device)  # (models, n), float32
        for row, model in zip(deltas, self.models):
            row.copy_(blocks[model].flatten())
        deltas -= base.flatten().to(self.device)
        gram = (deltas @ deltas.T).double().cpu()
        if not torch.isfinite(gram).all():  # NaN and Inf propagate: count exactly only then
            bad = (~torch.isfinite(deltas)).sum(dim=1)
            for model, count in zip(self.models, bad.tolist()):
                self.nonfinite[model] += count
            deltas = torch.nan_to_num(deltas, nan=0.0, posinf=0.0, neginf=0.0)
            gram = (deltas @ deltas.T).double().cpu()
        if not gram.diagonal().any():  # no model changed this block (most of a low-rank fine-tune)
            return
        for i, model in enumerate(self.models):
            self.squares[model][part] += float(gram[i, i])
        if base.ndim >= 2:  # a matrix: its rows go into every model's sketch at once
            rows = deltas.reshape(len(self.models), base.shape[0], -1)
            if self._sketch is None:
                self._sketch = TopSingularValue(rows.shape[2], count=len(self.models), device=self.device)
            self._sketch.add(rows)
        self.dots += gram
        self.add_signs(deltas)

    def add_signs(self, deltas: torch.Tensor, positions: Optional[List[int]] = None) -> None:
        """Sign agreement of the stacked ``deltas`` (their signs taken in place): every model's, or
        those at ``positions`` in the pool. Where no value is 0 (a changed tensor, mostly), every
        coordinate is non-zero in both: one Gram matrix instead of two."""
        signs = deltas.sign_()
        agree = (signs @ signs.T).double().cpu()
        if bool((agree.diagonal() == signs.shape[1]).all()):  # Σ sign² counts each row's non-zeros
            both = torch.full_like(agree, float(signs.shape[1]))
        else:
            nonzero = signs.abs_()
            both = (nonzero @ nonzero.T).double().cpu()
        if positions is None:
            self.sign_dots += agree
            self.both_nonzero += both
        else:
            index = torch.tensor(positions)
            self.sign_dots[index[:, None], index] += agree
            self.both_nonzero[index[:, None], index] += both

    def add_low_rank(self, part, updates: Dict[str, lowrank.LowRank]) -> None:
        """One tensor's updates as factors; a model absent from ``updates`` left the tensor as it was."""
        for model in self.models:  # as when streamed: a tensor some model changed is measured for every model
            self.squares[model][part] += 0.0
        for model, update in updates.items():
            bad = lowrank.nonfinite(update)
            if bad:
                self.nonfinite[model] += bad
                updates[model] = update = lowrank.finite(update)
            self.top_singular[model] = max(self.top_singular[model], lowrank.top_singular_value(update))
        positions = [self.models.index(m) for m in updates]
        dots = lowrank.gram(list(updates.values()), torch.float32).double()  # float32, as streamed blocks are
        index = torch.tensor(positions)
        self.dots[index[:, None], index] += dots
        for i, model in enumerate(updates):
            self.squares[model][part] += float(dots[i, i])
        for _, _, block in lowrank.stacked_row_blocks(list(updates.values())):
            self.add_signs(block.reshape(len(updates), -1), positions)

    def merge(self, other: "_Sums") -> None:
        """Add ``other``'s sums (the same models, other tensors): sums add, σ_max is the larger."""
        for model in self.models:
            for part, value in other.squares[model].items():
                self.squares[model][part] += value
            self.nonfinite[model] += other.nonfinite[model]
            self.top_singular[model] = max(self.top_singular[model], other.top_singular[model])
        self.dots += other.dots
        self.sign_dots += other.sign_dots
        self.both_nonzero += other.both_nonzero

    def pairs(self):
        for (i, a), (j, b) in itertools.combinations(enumerate(self.models), 2):
            yield (a, b), float(self.dots[i, j]), float(self.sign_dots[i, j]), float(self.both_nonzero[i, j])


class WeightStatistics:
    name = "weights"
    needs = frozenset({Need.WEIGHTS, Need.BASE_MODEL})

    def passes(self, inputs: DiagnosticInputs, tokenizer=None) -> int:
        """None: it streams the files' tensors and runs no model."""
        return 0

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        adapters = {
            m.name: m.path
            for m in inputs.models
            if update_of(m.path) is not None and same_model(update_of(m.path), inputs.base.path)
        }
        low_rank = len(adapters) == len(inputs.models)
        index = tensor_index(inputs.base.path)
        if low_rank:
            order = {name: i for i, name in enumerate(index)}
            names = sorted(set().union(*(a.targets() for a in adapters.values())), key=order.__getitem__)
        else:  # an adapter among full models: base + ΔW, row block by row block
            indexes = [tensor_index(m.path) for m in inputs.models]
            names = [n for n in index if all(n in other for other in indexes)]
        sources = {m.name: m.path for m in inputs.models}
        sums = _Sums(sources)
        # the products on the GPU when the precheck runs there (not under Ray: its workers read on their CPUs)
        device = inputs.settings.device if str(inputs.settings.device).startswith("cuda") else "cpu"
        description = "weights: low-rank updates" if low_rank else "weights: task vectors"
        with task(description, len(names), inputs.settings.quiet) as advance:
            if distributed.active():  # one task per shard of tensors; partial sums added in tensor order, as below
                runs = distributed.shards([math.prod(index[n].shape) for n in names], distributed.workers())
                shards = [[names[i] for i in run] for run in runs]
                for partials in distributed.each(
                    shard_sums, shards, inputs.base.path, sources, low_rank, done=lambda i, found: advance(len(found))
                ):
                    for partial in partials:
                        sums.merge(partial)
            else:
                for partial in tensor_sums(names, inputs.base.path, sources, low_rank, device):
                    sums.merge(partial)
                    advance(1)
        return _result(sums)


def tensor_sums(
    names: Sequence[str], base: Source, sources: Mapping[str, Source], low_rank: bool, device: str = "cpu"
) -> Iterator[_Sums]:
    """One partial ``_Sums`` per tensor of ``names``, each read from the models' files: from the
    adapters' factors when ``low_rank`` (every source an adapter of ``base``), else streamed, the
    blocks' products on ``device``."""
    if low_rank:
        for name in names:
            sums = _Sums(sources)
            sums.add_low_rank(_part(name), {m: a.update(name) for m, a in sources.items() if name in a.targets()})
            yield sums
        return
    reference = TensorReader(base)
    readers = {m: tensors(path) for m, path in sources.items()}
    for name in names:
        sums, part = _Sums(sources, device), _part(name)
        for start, stop in reference.blocks(name, BLOCK):
            sums.add(
                part,
                reference.rows(name, start, stop),
                {m: r.rows(name, start, stop) for m, r in readers.items()},
            )
        sums.end_tensor()
        yield sums


def shard_sums(names: Sequence[str], base: Source, sources: Mapping[str, Source], low_rank: bool) -> List[_Sums]:
    """A Ray task's share of the weight pass: the partial sums of its shard of tensors."""
    return list(tensor_sums(names, base, sources, low_rank))


def _result(sums: _Sums) -> DiagnosticResult:
    result = DiagnosticResult()
    norms = {m: math.sqrt(sum(parts.values())) for m, parts in sums.squares.items()}
    for (a, b), dot, sign_dot, both in sums.pairs():
        result.per_pair[a, b] = PairWeights(
            cosine=dot / (norms[a] * norms[b]) if norms[a] * norms[b] > 0 else 0.0,
            sign_conflict=(both - sign_dot) / (2 * both) if both else 0.0,
        ).json()
    pool = interference(sums.models, sums.dots, result.per_pair)
    for model, parts in sums.squares.items():
        depth = 1 + max((p for p in parts if isinstance(p, int)), default=-1)
        bad = sums.nonfinite[model]
        stats = WeightStats(
            update_norm=norms[model],
            top_singular_value=sums.top_singular[model],
            nonfinite=float(bad),
            embedding_norm=math.sqrt(parts.get("embedding", 0.0)),
            head_norm=math.sqrt(parts.get("head", 0.0)),
            **pool.get(model, {}),
        )
        result.per_model[model] = Record.json(stats)  # its layers go to per_layer: without the null
        result.per_layer[model] = {LAYERS: [math.sqrt(parts.get(i, 0.0)) for i in range(depth)]}
        if bad:
            result.findings.append(
                Finding("error", f"{model}: {bad} NaN/Inf values in its weights; re-export the checkpoint")
            )
    return result


def interference(models, dots: torch.Tensor, pairs) -> Dict[str, Dict[str, float]]:
    """How each update sits in the pool: cos(τ_i, Σ_{j≠i} τ_j) (negative: the others pull
    against it), and its mean pairwise cosine and sign conflict (``WeightStats``' fields)."""
    found = {}
    if len(models) < 2:
        return found
    total = dots.sum()
    for i, model in enumerate(models):
        others = [PairWeights.of(pairs[(a, b)]) for (a, b) in pairs if model in (a, b)]
        with_rest = float(dots[i].sum() - dots[i, i])
        rest_norm = math.sqrt(max(float(total - 2 * dots[i].sum() + dots[i, i]), 0.0))
        own_norm = math.sqrt(max(float(dots[i, i]), 0.0))
        found[model] = dict(
            pool_cosine=with_rest / (own_norm * rest_norm) if own_norm * rest_norm > 0 else 0.0,
            mean_cosine=sum(p.cosine for p in others) / len(others),
            mean_sign_conflict=sum(p.sign_conflict for p in others) / len(others),
        )
    return found


def _part(name: str):
    """The decoder layer index, or "embedding" / "head"; unknown tensors count as "other"."""
    try:
        position = tensor_position(name)
    except UnknownTensorError:
        return "other"
    return position.layer if position.part == "layer" else position.part
