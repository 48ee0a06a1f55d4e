"""The config as ``mergekit-yaml`` would merge it: planned by mergekit, merged one tensor at a time in memory.

mergekit's planner resolves, for each output tensor, the method, its parameters (global, per
model, per slice, gradients over the layers, filters) and which tensor of each model it reads;
its ``ExecuteMergeMethodTask`` merges them. ``merged`` runs that same task on tensors the caller
reads (so an adapter's are formed from its factors, and a hub model's come from its files), for
the output tensors the caller asks for: the merge as written, with nothing written to disk.

Methods that draw at random (DARE, DELLA) draw from a generator seeded per tensor (``SEED``):
the rehearsal is one draw of the merge ``mergekit-yaml`` would make, the same draw each time,
not the draw a given ``mergekit-yaml --random-seed`` run makes (that depends on the order its
executor visits the tensors).
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Iterator, Mapping, Optional, Set, Tuple

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.progress import quiet_config_warnings

SEED = 0  # the random methods' seed, mixed with each tensor's name

_planning = [0]  # the precheck's own plans of a merge in progress
MASK_BYTES = 1 << 30  # the magnitude masks kept across merges (one bit a value), the oldest let go first
_masks: "OrderedDict[tuple, Any]" = OrderedDict()
_kept = [0]  # their bytes
_together: list = [()]  # the densities an update's one sort gives masks at (``sorted_together``)


def dry_running() -> bool:
    """Whether the planner at work is the precheck's own (the pre-merge gate then stays out: it
    would precheck the precheck)."""
    return _planning[0] > 0


@contextlib.contextmanager
def _ours() -> Iterator[None]:
    _planning[0] += 1
    try:
        yield
    finally:
        _planning[0] -= 1


@dataclass(frozen=True)
class Planned:
    """One output tensor of the merge: what mergekit would read and how it would merge it."""

    name: str
    reads: Tuple[Tuple[Any, Tuple[str, ...], bool], ...]  # (mergekit's ModelReference, its tensor's names, optional)
    task: Any  # mergekit's ExecuteMergeMethodTask for this tensor
    dtype: Optional[str]  # what the inputs are cast to (the config's dtype:)
    out_dtype: Optional[str]  # what the result is cast to (out_dtype:)
    plain: bool  # read as stored: no vocabulary permuted by a tokenizer_source, none truncated


def plan(document: Mapping[str, Any], source: Any) -> Dict[str, Planned]:
    """Every output tensor of ``document`` (a config whose model references mergekit can read:
    local folders, ``base+adapter``, hub ids) as mergekit plans it, reading only the models'
    config.json files. A config the merge would refuse is refused here in one line naming
    ``source`` (an unknown method, a missing base or parameter, a cut-off beyond the model)."""
    from mergekit.architecture import get_architecture_info
    from mergekit.config import MergeConfiguration
    from mergekit.io.tasks import GatherTensors
    from mergekit.merge import _model_out_config
    from mergekit.options import MergeOptions
    from mergekit.plan import MergePlanner

    options = MergeOptions()
    try:
        config = MergeConfiguration.model_validate(dict(document))
        architecture = get_architecture_info(config, options)
        with _ours(), _indexed_as_we_read(config), quiet_config_warnings():
            planner = MergePlanner(config, architecture, options, _model_out_config(config, architecture))
            # mergekit 0.1.5's plan_in_memory wraps each task in a ReturnTensor that pydantic refuses
            # (Task[Optional[Tensor]] is not a Task[Tensor]); its plan is the same list of tasks
            planner._plan()  # tasks only: nothing runs until they are executed
    except UserError as error:
        raise UserError(f"{source}: the merge would stop: {error}") from None
    except (ValueError, RuntimeError, KeyError, AssertionError) as error:
        line = (str(error).splitlines() or [type(error).__name__])[0]
        raise UserError(f"{source}: mergekit would refuse this merge: {line}") from None
    planned = {}
    for weight, task in planner._tensors:
        gather = task.gather_tensors
        plain = isinstance(gather, GatherTensors)
        weights = gather.weight_info if plain else gather.gather_tensors.weight_info
        reads = tuple(
            (model, (info.name, *(info.aliases or ()), *(info.tied_names or ())), bool(info.optional))
            for model, info in weights.items()
        )
        dtype = (gather if plain else gather.gather_tensors).dtype
        out_dtype = weight.force_dtype or config.out_dtype
        planned[weight.name] = Planned(weight.name, reads, task, dtype, out_dtype, plain and not _forced(weights))
    return planned


@contextlib.contextmanager
def _indexed_as_we_read(config) -> Iterator[None]:
    """While planning, mergekit looks up whether an optional tensor (a tied head) exists in each
    model's index: for a ``base+adapter`` it would first merge the adapter into a copy of its base
    on disk, and for a hub model mergekit 0.1.5 asks the hub for the repo's file list, offline too.
    A hub model's index is its snapshot's as the precheck reads it (``HubModel``: downloaded once
    into the Hugging Face cache, or found there offline), and an adapter has its base's tensors, so
    its base's index answers; nothing is written."""
    from mergekit.common import ModelReference
    from mergekit.io.lazy_tensor_loader import LazyTensorLoader, ShardedTensorIndex
    from mergekit.io.tasks import LoaderCache

    from mergekit_mergeability.sources.hub import HubModel

    cache = LoaderCache()
    added = []
    models = list(config.referenced_models())
    for model in [ModelReference(model=m.model) for m in models if m.lora is not None] + models:
        if model in cache.loaders or (model.lora is None and os.path.exists(model.model.path)):
            continue
        if model.lora is not None:
            cache.loaders[model] = cache.get(ModelReference(model=model.model))
        else:
            snapshot = HubModel(model.model.path, model.model.revision).folder
            cache.loaders[model] = LazyTensorLoader(ShardedTensorIndex.from_disk(str(snapshot)), lazy_unpickle=True)
        added.append(model)
    try:
        yield
    finally:
        for model in added:
            cache.loaders.pop(model, None)


def _forced(weights) -> bool:
    return any(info.force_dtype for info in weights.values())


def merged(planned: Planned, read: Callable[[str, str], Optional[Any]]) -> Any:
    """The merged tensor, as mergekit's task computes it, from the inputs ``read(model reference,
    tensor name)`` gives (None: the model has no tensor of that name)."""
    import torch
    from mergekit.common import dtype_from_name

    if not planned.plain:
        raise UserError(f"tensor {planned.name}: its vocabulary is rebuilt by tokenizer_source; not rehearsed")
    inputs = {}
    for model, names, optional in planned.reads:
        tensor = next((t for t in (read(str(model), name) for name in names) if t is not None), None)
        if tensor is None:
            if optional:
                continue
            raise UserError(f"model {model}: has no tensor {names[0]}, which the merge reads")
        if planned.dtype:
            tensor = tensor.to(dtype_from_name(planned.dtype))
        inputs[model] = tensor
    with torch.random.fork_rng(), shared_masks():
        torch.manual_seed(SEED + zlib.crc32(planned.name.encode()))
        result = planned.task.execute(tensors=inputs)
    if result is not None and planned.out_dtype:
        result = result.to(dtype_from_name(planned.out_dtype))
    return result


@contextlib.contextmanager
def shared_masks() -> Iterator[None]:
    """mergekit's magnitude pruning (TIES's, DELLA's base) sorts every update tensor it prunes, and
    the candidates a rehearsal builds prune the same updates at the same densities again and again.
    While merging, each mask the pruning in force computes on the CPU (mergekit's, or plan's
    selection: ``inmemory.selected_magnitudes``) is kept by the update's bytes and the density and
    used again, so the same merge; where ``sorted_together`` names more densities, one sort, as
    mergekit's, gives the masks at all of them. Masks are kept a bit a value, so a plan's merges of
    a hundred adapters' updates keep every one of them."""
    import mergekit.sparsify as sparsify
    import numpy as np
    import torch
    import xxhash

    computed = sparsify.magnitude

    def magnitude(tensor, density: float, rescale_norm=None):
        if tensor.device.type != "cpu" or not 0 < density < 1 or tensor.numel() == 0:
            return computed(tensor, density, rescale_norm)
        bytes_ = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        digest = (xxhash.xxh3_128_digest(bytes_), tuple(tensor.shape), str(tensor.dtype))
        key = lambda at: (*digest, float(at))  # noqa: E731
        bits = _masks.get(key(density))
        if bits is None:  # the density asked comes last: the newest kept
            others = [d for d in _together[-1] if d != density and key(d) not in _masks]
            found = (  # kept where the pruning in force kept (a kept zero reads the same as one let go)
                _kept_bits(tensor, [*others, density])
                if others
                else [(density, np.packbits((computed(tensor, density, None) != 0).reshape(-1).numpy()))]
            )
            for each, bits in found:
                _masks[key(each)] = bits
                _kept[0] += bits.nbytes
            while _kept[0] > MASK_BYTES:
                _kept[0] -= _masks.popitem(last=False)[1].nbytes
        else:
            _masks.move_to_end(key(density))
        mask = torch.from_numpy(np.unpackbits(bits, count=tensor.numel())).view(tensor.shape)
        return sparsify.rescaled_masked_tensor(tensor, mask.to(tensor.dtype), rescale_norm)

    sparsify.magnitude = magnitude
    try:
        yield
    finally:
        sparsify.magnitude = computed


@contextlib.contextmanager
def sorted_together(densities: Collection[float]) -> Iterator[None]:
    """While in it, an update pruned by magnitude at one density is sorted once, as mergekit's own
    ``sparsify.magnitude`` sorts it, for its masks at each of ``densities`` too: the densities the
    merges about to be built prune it at."""
    _together.append(tuple(densities))
    try:
        yield
    finally:
        _together.pop()


def _kept_bits(tensor, densities) -> Iterator[Tuple[float, Any]]:
    """The values mergekit's ``sparsify.magnitude`` keeps at each density, a bit a value, from one
    sort: its lines (the same sort, so the same values kept where magnitudes tie), each density the
    sort's first ``max(1, int(density × n))``."""
    import numpy as np
    import torch

    order = torch.argsort(tensor.abs().reshape(-1).float(), descending=True)
    for density in densities:
        kept = torch.zeros(tensor.numel(), dtype=torch.bool)
        kept[order[: max(1, int(density * tensor.numel()))]] = True
        yield density, np.packbits(kept.numpy())


def writable(plan: Optional[Dict[str, Planned]], base_tensors: Collection[str], names: Set[str]) -> bool:
    """Whether the merge as planned can be built on the loaded base: its output has the base's
    tensors (``base_tensors``), and each tensor the updates touch (``names``) is read as stored."""
    return plan is not None and set(plan) == set(base_tensors) and all(plan[name].plain for name in names)
