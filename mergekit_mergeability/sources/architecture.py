"""Where a tensor sits in a model, from mergekit's own architecture definitions.

One source of truth for layer indices: the weight-name templates mergekit ships
for every architecture it supports (``model.layers.${layer_index}.mlp.up_proj.weight``),
so ``layers.1`` never matches ``layers.11`` and GPT-2's ``transformer.h.3`` is layer 3.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Literal, Optional, Pattern, Tuple

Part = Literal["embedding", "layer", "head"]


@dataclass(frozen=True)
class TensorPosition:
    """``embedding`` (before the first block), ``layer`` (with its index) or ``head``."""

    part: Part
    layer: Optional[int] = None


class UnknownTensorError(ValueError):
    pass


def _names(weight) -> Iterable[str]:
    yield weight.name
    yield from weight.aliases or ()


_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def _template_regex(template: str) -> Tuple[Pattern[str], int]:
    """``h.${layer_index+1}.b`` -> (regex capturing the number, offset back to the index)."""
    parts = _PLACEHOLDER.split(template)  # literal, placeholder, literal, ...
    pattern, offset = "", 0
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part.startswith("layer_index"):
            pattern += r"(?P<layer>\d+)"
            offset = -int(part[len("layer_index") :] or 0)
        else:
            pattern += r"\d+"
    return re.compile(pattern), offset


@functools.cache
def _templates() -> Tuple[Dict[str, Part], List[Tuple[Pattern[str], int]]]:
    from mergekit.architecture.json_definitions import JSON_ARCHITECTURES

    fixed: Dict[str, Part] = {}
    layers: Dict[str, Tuple[Pattern[str], int]] = {}
    for architecture in JSON_ARCHITECTURES:
        for module in architecture.modules.values():
            definition = module.architecture.definition
            prefix = module.weight_prefix or ""
            for part, weights in (("embedding", definition.pre_weights), ("head", definition.post_weights)):
                for weight in weights:
                    for name in _names(weight):
                        fixed.setdefault(prefix + name, part)
            for weight in definition.layer_templates.weights:
                for name in _names(weight):
                    layers.setdefault(prefix + name, _template_regex(prefix + name))
    return fixed, list(layers.values())


@functools.lru_cache(maxsize=65536)
def tensor_position(name: str) -> TensorPosition:
    """Locate a tensor by name; raise UnknownTensorError if no architecture knows it."""
    fixed, layer_patterns = _templates()
    for pattern, offset in layer_patterns:
        match = pattern.fullmatch(name)
        if match:
            return TensorPosition("layer", int(match.group("layer")) + offset)
    if name in fixed:
        return TensorPosition(fixed[name])
    raise UnknownTensorError(
        f"tensor {name!r} is not in any architecture mergekit knows; cannot tell which layer it belongs to"
    )


def num_layers(names: Iterable[str]) -> int:
    """Depth implied by a set of tensor names (1 + the highest layer index)."""
    indices = [p.layer for p in map(tensor_position, names) if p.layer is not None]
    return max(indices, default=-1) + 1
