"""Rehearsals of many merges of one base share the layers none of them touches.

Every candidate the menu rehearses merges the same updates, so where no update touches a tensor
below decoder layer L, layers 0..L-1 compute exactly the same thing for every candidate, over the
same probe sequences in the same order. The first candidate's passes record what layer L-1 hands
on; each later candidate replays it and skips layers 1..L-1. Layer 0 still runs: the key/value
cache's length and the attention mask are read from its entry. LoRA experts on the upper half of
a model then cost about half a pass each after the first.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, List, Optional

import torch

from mergekit_mergeability.sources.architecture import UnknownTensorError, tensor_position


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


def _blocks(module: torch.nn.Module) -> Optional[torch.nn.ModuleList]:
    decoder = module.get_decoder() if hasattr(module, "get_decoder") else None
    blocks = getattr(decoder, "layers", None)
    return blocks if isinstance(blocks, torch.nn.ModuleList) else None


class Shared:
    """What layer L-1 handed on, per forward call, recorded on the first candidate."""

    def __init__(self) -> None:
        self.recorded: List[object] = []
        self.replaying = False
        self.at = 0

    def next_candidate(self) -> None:
        """Call before each candidate's passes: the first records, every later one replays."""
        self.replaying = bool(self.recorded)
        self.at = 0

    def _replayed(self, hidden: torch.Tensor):
        if self.at >= len(self.recorded):
            raise RuntimeError("a rehearsed candidate ran more forward passes than the first one recorded")
        out = self.recorded[self.at]
        recorded = out if isinstance(out, torch.Tensor) else out[0]
        if recorded.shape != hidden.shape:
            raise RuntimeError(f"replayed activations {tuple(recorded.shape)} for a pass of {tuple(hidden.shape)}")
        return out


@contextlib.contextmanager
def shared_below(module: torch.nn.Module, names: Iterable[str]) -> Iterator[Shared]:
    """``module`` with its untouched lower layers (below the first of ``names``) run once for all
    the candidates rehearsed inside; ``Shared.next_candidate`` before each. Where fewer than two
    layers are untouched there is nothing to share and every pass runs whole."""
    shared = Shared()
    blocks = _blocks(module)
    tied = bool(getattr(module.config, "tie_word_embeddings", False))
    first = first_touched(names, len(blocks), tied) if blocks is not None else 0
    if first < 2:
        yield shared
        return
    last = blocks[first - 1]
    original = last.forward

    def handing_on(hidden, *args, **kwargs):
        if shared.replaying:
            out = shared._replayed(hidden)
            shared.at += 1
            return out
        out = original(hidden, *args, **kwargs)
        shared.recorded.append(out)
        return out

    def skipped(block):
        run = block.forward

        def forward(hidden, *args, **kwargs):
            # replaying, its output is thrown away: layer L-1 hands on the recorded one
            return shared._replayed(hidden) if shared.replaying else run(hidden, *args, **kwargs)

        return forward

    own = {block: block.__dict__.get("forward") for block in blocks[1:first]}  # a hook's wrapper, if any
    try:
        for block in blocks[1 : first - 1]:
            block.forward = skipped(block)
        last.forward = handing_on
        yield shared
    finally:
        for block, forward in own.items():
            del block.forward
            if forward is not None:
                block.forward = forward
