"""Rehearsals of many merges of one base share the layers none of them touches.

Every candidate the menu rehearses merges the same updates, so where no update touches a tensor
below decoder layer L, layers 0..L-1 compute exactly the same thing for every candidate on the
same input. The first pass of an input keeps what layer L-1 hands on, by what layer 0 handed on;
a later pass of the same input, under any merge, replays it and skips layers 1..L-1. Layer 0
still runs: it says which input this is, and the key/value cache's length and the attention mask
are read from its entry. LoRA experts on the upper half of a model then cost about half a pass
each after the first.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Dict, Iterable, Iterator, Optional, Tuple

import torch

from mergekit_mergeability.sources.architecture import UnknownTensorError, tensor_position

KEPT_BYTES = 1 << 30  # activations kept for replay at most


def first_touched(names: Iterable[str], layers: int, tied: bool = False) -> int:
    """The lowest of ``layers`` decoder layers a tensor of ``names`` sits in; 0 where one sits at
    the embedding, or at the head of a model whose head is its embedding (``tied``), or where a
    name is not known."""
    lowest = layers
    for name in names:
        try:
            position = tensor_position(name)
        except UnknownTensorError:
            return 0
        if position.part == "embedding" or (position.part == "head" and tied):
            return 0
        if position.part == "layer":
            lowest = min(lowest, position.layer)
    return lowest


def blocks_run(first: int, layers: int) -> int:
    """Blocks a replayed pass runs: layer 0 and those from ``first`` up (all where under two are shared)."""
    return layers if first < 2 else 1 + layers - first


def share(repeats: float, first: int, layers: int) -> float:
    """The share of a whole pass's blocks run on average where each input is passed ``repeats``
    times (under as many merges), the first whole, with layers below ``first`` untouched."""
    return (layers + (repeats - 1) * blocks_run(first, layers)) / (repeats * layers) if repeats > 1 else 1.0


def blocks_of(module: torch.nn.Module) -> Optional[torch.nn.ModuleList]:
    decoder = module.get_decoder() if hasattr(module, "get_decoder") else None
    blocks = getattr(decoder, "layers", None)
    return blocks if isinstance(blocks, torch.nn.ModuleList) else None


class Shared:
    """What layer L-1 handed on, and the keys and values layers 1..L-1 cached, kept by what layer 0
    handed on (the same input, the same lower layers: the same activations, whichever merge is
    patched in above)."""

    def __init__(self, budget: int = KEPT_BYTES) -> None:
        self.kept: Dict[Tuple, Tuple[object, Dict[int, Tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.key: Optional[Tuple] = None  # the pass in flight: its key, where it was kept
        self.pending: Optional[Tuple] = None  # or where it is being run, to keep
        self.cached: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # what it cached, layer by layer
        self.replayed, self.left, self.first = 0, budget, 0

    def keep(self, out) -> None:
        tensors = [*(out if isinstance(out, tuple) else (out,)), *(t for kv in self.cached.values() for t in kv)]
        size = sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
        if size <= self.left:  # past the budget, a new input's layers run whole every time
            self.kept[self.pending], self.left = (out, self.cached), self.left - size

    def seen(self, hidden: torch.Tensor, cache) -> bool:
        """At layer 1: whether this input's lower layers were run before (and so are skipped now,
        their keys and values put in ``cache`` as they would have been)."""
        digest = hashlib.blake2b(hidden.detach().float().cpu().numpy().tobytes(), digest_size=16).hexdigest()
        key = (self.first, tuple(hidden.shape), str(hidden.dtype), digest)
        if key in self.kept and (cache is None or self.kept[key][1]):
            self.key = key
            self.replayed += 1
            for layer, (keys, values) in (self.kept[key][1] if cache is not None else {}).items():
                cache.update(keys, values, layer)
            return True
        if cache is not None and cache.get_seq_length(1) == 0 < cache.get_seq_length(0) - hidden.shape[1]:
            raise RuntimeError("a pass reads the keys and values of lower layers that were replayed, not run")
        self.key, self.pending, self.cached = None, key, {}
        return False


def _cache(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _added(cache, layer: int, tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The keys and values a pass of ``tokens`` tokens just cached at ``layer``."""
    entry = cache.layers[layer] if hasattr(cache, "layers") else None  # transformers >= 4.56
    keys, values = (
        (entry.keys, entry.values) if entry is not None else (cache.key_cache[layer], cache.value_cache[layer])
    )
    return keys[..., -tokens:, :].clone(), values[..., -tokens:, :].clone()


@contextlib.contextmanager
def shared_below(module: torch.nn.Module, names: Iterable[str], shared: Optional[Shared] = None) -> Iterator[Shared]:
    """``module`` with its untouched lower layers (below the first of ``names``) run once per input
    for every merge rehearsed inside: a pass whose input was seen before replays what they handed
    on and cached. ``shared`` carries what was kept from one such block to the next (where the
    base is the same). Where fewer than two layers are untouched there is nothing to share and
    every pass runs whole."""
    shared = shared if shared is not None else Shared()
    blocks = blocks_of(module)
    tied = bool(getattr(module.config, "tie_word_embeddings", False))
    first = first_touched(names, len(blocks), tied) if blocks is not None else 0
    if first < 2:
        yield shared
        return
    shared.first = first  # what layer L-1 hands on is kept per L

    def wrapped(index: int, run):
        def forward(hidden, *args, **kwargs):
            cache = _cache(kwargs)
            if index == 1 and not shared.seen(hidden, cache) or index > 1 and shared.key is None:
                out = run(hidden, *args, **kwargs)
                if cache is not None:
                    shared.cached[index] = _added(cache, index, hidden.shape[1])
                if index == first - 1:
                    shared.keep(out)
                return out
            return shared.kept[shared.key][0]  # replaying: below L-1 its output is thrown away

        return forward

    with forwards_wrapped(blocks, range(1, first), wrapped):
        yield shared


@contextlib.contextmanager
def forwards_wrapped(blocks: torch.nn.ModuleList, indices: Iterable[int], wrap) -> Iterator[None]:
    """While in it, each of ``blocks[indices]`` runs ``wrap(index, its forward)``; a wrapper already
    on the instance (a hook's, another rehearsal's) is the forward wrapped, and is put back after."""
    indices = list(indices)
    own = {i: blocks[i].__dict__.get("forward") for i in indices}
    try:
        for i in indices:
            blocks[i].forward = wrap(i, blocks[i].forward)
        yield
    finally:
        for i, forward in own.items():
            del blocks[i].forward
            if forward is not None:
                blocks[i].forward = forward
