"""The two ends of a sweep and the models between them, built in memory.

A and B are model folders or hub ids, or, with a base, task vectors: folders of
``.safetensors`` files holding θ − θ_base for the tensors they change. One model is
loaded (A, or the base for task vectors); each λ-model is that module with the
tensors it differs in patched in, each merged by mergekit's own ``linear``
(``merge_tensors``) with weights 1 − λ for A and λ for B. ``--layers`` and
``--modules`` narrow which tensors are interpolated; every other tensor is A's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

import torch

from mergekit_mergeability.diagnostics import ModelInput
from mergekit_mergeability.diagnostics.compatibility import require_compatible
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths.stages import DIGITS
from mergekit_mergeability.sources import HubModel, Source, TensorReader, resolve, tensor_index
from mergekit_mergeability.sources.architecture import UnknownTensorError, num_layers, tensor_position
from mergekit_mergeability.sources.cache import fingerprint

MODULES = ("mlp", "attention")
# transformers names its blocks' classes after what they are (LlamaMLP, GPT2Attention,
# MixtralSparseMoeBlock): the model's own structure says which tensor is which, not its name
_KIND_SUFFIXES = {"attention": ("Attention",), "mlp": ("MLP", "Mlp", "MoE", "MoeBlock", "FeedForward")}


def weights(lam: float) -> Dict[str, float]:
    """mergekit ``linear`` weights of the λ-model, by endpoint: the in-memory merge and chosen.yml use these."""
    return {"a": round(1 - lam, DIGITS), "b": lam}


@dataclass
class Endpoints:
    names: Dict[str, str]  # "a", "b" (and "base" for task vectors) -> as the user wrote them
    sources: Dict[str, Source]  # the same roles -> folders or hub models
    vectors: bool  # A and B are task vectors of sources["base"]

    @property
    def origin(self) -> Source:
        """The model loaded once and patched: A, or the base that A and B are task vectors of."""
        return self.sources["base" if self.vectors else "a"]

    @functools.cached_property
    def readers(self) -> Dict[str, TensorReader]:
        return {role: TensorReader(source) for role, source in self.sources.items()}

    @functools.cached_property
    def fingerprints(self) -> Dict[str, str]:
        return {role: fingerprint(Path(source)) for role, source in self.sources.items()}

    def tensor(self, role: str, name: str) -> torch.Tensor:
        reader = self.readers[role]
        if not self.vectors:
            return reader[name]
        base = self.readers["base"][name]
        return base + reader[name].to(base.dtype) if name in reader.index else base

    def names_of(self) -> List[str]:
        """Every tensor of the models (of the base, for task vectors)."""
        return list(tensor_index(self.origin))

    def shifted(self) -> List[str]:
        """Tensors where A differs from the loaded module (A's own task vector)."""
        return sorted(self.readers["a"].index) if self.vectors else []

    def differing(self) -> List[str]:
        """Tensors where A and B differ: the only ones an interpolation changes."""
        if self.vectors:
            candidates = sorted(set(self.readers["a"].index) | set(self.readers["b"].index))
        else:
            candidates = list(self.readers["a"].index)
        return [name for name in candidates if not torch.equal(self.tensor("a", name), self.tensor("b", name))]


def endpoints(a: str, b: str, base: Optional[str] = None) -> Endpoints:
    """Resolve A and B (and the base), refusing models that cannot be interpolated, before any tensor is read."""
    names = {"a": a, "b": b, **({"base": base} if base else {})}
    sources = {role: resolve(name, adapters=False) for role, name in names.items()}
    if base:
        for role in ("a", "b"):
            _check_vector(names[role], sources[role], names["base"], sources["base"])
    else:
        require_compatible(ModelInput(a, sources["a"]), [ModelInput(b, sources["b"])])
    return Endpoints(names, sources, bool(base))


def _check_vector(name: str, source, base_name: str, base) -> None:
    if isinstance(source, HubModel) or (Path(source) / "config.json").is_file():
        raise UserError(
            f"{name}: a model, but with --base A and B are task vectors (folders of .safetensors holding θ − θ_base); drop --base to interpolate models"
        )
    shapes = {n: info.shape for n, info in tensor_index(base).items()}
    for tensor, info in tensor_index(source).items():
        if tensor not in shapes:
            raise UserError(f"task vector {name}: tensor {tensor} is not in the base {base_name}")
        if info.shape != shapes[tensor]:
            raise UserError(
                f"task vector {name}: tensor {tensor} is {list(info.shape)}, in the base {base_name} {list(shapes[tensor])}"
            )


def module_kinds(config_source: Source) -> Dict[str, str]:
    """Tensor name -> "mlp" or "attention", from the model's module classes (built on the
    meta device: no weights read). Tensors in neither (norms, embeddings) are absent."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(Path(config_source))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    kinds: Dict[str, str] = {}
    for prefix, module in model.named_modules():  # parents first: the outermost block decides
        kind = next((k for k, suffixes in _KIND_SUFFIXES.items() if type(module).__name__.endswith(suffixes)), None)
        if kind:
            for name, _ in module.named_parameters(prefix=prefix):
                kinds.setdefault(name, kind)
    return kinds


@dataclass(frozen=True)
class Selection:
    """Which tensors may be interpolated: ``None`` fields select everything."""

    layers: Optional[FrozenSet[int]] = None
    modules: Optional[str] = None  # "mlp" | "attention"

    def check(self, names: List[str], kinds: Mapping[str, str]) -> None:
        """Refuse layers the model lacks and module kinds it has no tensors of, by name."""
        if self.layers:
            depth = num_layers(_known(names))
            beyond = sorted(layer for layer in self.layers if layer >= depth)
            if beyond:
                raise UserError(f"--layers: layer {beyond[0]} is beyond the model's {depth} layers (0–{depth - 1})")
        if self.modules and self.modules not in kinds.values():
            raise UserError(
                f"--modules {self.modules}: the model has no {self.modules} blocks that transformers names as such"
            )

    def keeps(self, name: str, kinds: Mapping[str, str]) -> bool:
        if self.modules and kinds.get(name) != self.modules:
            return False
        if self.layers is None:
            return True
        position = tensor_position(name)  # _known() has vouched for every name already
        return position.part == "layer" and position.layer in self.layers


def _known(names: List[str]) -> List[str]:
    for name in names:
        try:
            tensor_position(name)
        except UnknownTensorError as error:
            raise UserError(f"--layers: {error}") from None
    return names


def interpolate(ends: Endpoints, interpolated: List[str], lam: float) -> Dict[str, torch.Tensor]:
    """The tensors to patch into the loaded module to make the λ-model: the interpolated ones
    merged by mergekit's ``linear``, and A's own where the module is the base."""
    from mergekit.merge_methods import merge_tensors

    chosen = set(interpolated)
    tensors = {name: ends.tensor("a", name) for name in ends.shifted() if name not in chosen}
    parameters = {"weight": weights(lam)}
    for name in interpolated:
        pair = [ends.tensor("a", name), ends.tensor("b", name)]
        tensors[name] = merge_tensors(pair, "linear", ids=["a", "b"], parameters=parameters, name=name)
    return tensors


def plan(ends: Endpoints, selection: Selection) -> Tuple[List[str], int]:
    """(the tensors to interpolate, how many differ between A and B); refuses a selection that
    leaves nothing to interpolate."""
    names = ends.names_of()
    kinds = module_kinds(ends.origin) if selection.modules else {}
    selection.check(names, kinds)
    differing = ends.differing()
    if not differing:
        raise UserError(f"{ends.names['a']} and {ends.names['b']} are identical: there is nothing to interpolate")
    interpolated = [name for name in differing if selection.keeps(name, kinds)]
    if not interpolated:
        raise UserError(
            f"--layers/--modules select none of the {len(differing)} tensors where A and B differ (first: {differing[0]})"
        )
    return interpolated, len(differing)
