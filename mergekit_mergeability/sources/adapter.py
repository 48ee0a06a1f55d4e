"""PEFT LoRA adapters as pool members: an adapter folder on its base, read as low-rank factors.

An adapter folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` with
peft's key names (``base_model.model.<module>.lora_A.weight``). Each LoRA module is the
update ΔW = scale·B·A of the base tensor ``<module>.weight``, with scale = lora_alpha / r
(lora_alpha / √r under rsLoRA; ``alpha_pattern`` overrides per module). Nothing larger
than the factors is read: the base stays memory-mapped, and a tensor of base + ΔW is
formed only when a caller asks for that one tensor (``AdapterReader``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths.lowrank import LowRank
from mergekit_mergeability.sources.base import ModelSource, TensorInfo
from mergekit_mergeability.sources.folder import TensorReader, read_header, source_of

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_KEY = re.compile(r"(?P<module>.+)\.lora_(?P<factor>[AB])(?:\.[^.]+)?\.weight")  # peft may keep the adapter's name


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / CONFIG).is_file()


def read_config(folder: Path) -> dict:
    path = Path(folder) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not JSON; save the adapter again with peft's save_pretrained") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a peft adapter config (a JSON object)")
    kind = str(config.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise UserError(f"{path}: peft_type {kind}; only LoRA adapters can be pool members")
    for flag in ("use_dora", "lora_bias"):
        if config.get(flag):
            raise UserError(
                f"{path}: {flag} is set; only plain LoRA updates (scale·B·A) are supported, merge this adapter first"
            )
    return config


class AdapterModel(ModelSource):
    """A PEFT LoRA adapter folder applied to a base model (a folder or a hub model).

    ``str()`` is mergekit's ``base+adapter`` reference, so a recommended config written
    from it runs as is with ``mergekit-yaml``. Factors are read one module at a time
    (``update``): a pool of adapters holds one tensor's factors per adapter, not all.
    """

    def __init__(self, base, folder: Path, named: Optional[str] = None):
        self.base = base
        self.folder = Path(folder)
        self.named = named  # the adapter as the config names it, where that is a hub id (its folder: the snapshot)
        self.config = read_config(self.folder)
        self._targets: Optional[Dict[str, Tuple[str, str]]] = None
        self._handle = None

    def __str__(self) -> str:
        return f"{self.base}+{self.named or self.folder}"

    def __repr__(self) -> str:
        return f"AdapterModel({self.base!r}, {self.folder!r})"

    def __getstate__(self):  # sent to a Ray worker: the open file stays behind, reopened there
        return {**self.__dict__, "_handle": None}

    @property
    def update_of(self):
        return self.base

    # what a whole model answers: the base's, the update added where it reads or loads tensors

    def file(self, name: str) -> Optional[Path]:
        return source_of(self.base).file(name)

    def tensor_index(self) -> Dict[str, TensorInfo]:
        return source_of(self.base).tensor_index()

    def tensors(self) -> "AdapterReader":
        return AdapterReader(self)

    def files(self) -> List[Path]:
        """Its base's, then its adapter_config.json and weights."""
        return [*source_of(self.base).files(), self.folder / CONFIG, self.folder / WEIGHTS]

    def check(self) -> "AdapterModel":
        """Checked with its base, and returned as it is."""
        source_of(self.base).check()
        self.targets()
        return self

    def load(self, device: str, dtype: str, tokenizer_from=None):
        """Its base, with the update added in place."""
        model, tokenizer = source_of(self.base).load(device, dtype, tokenizer_from)
        state = model.state_dict()
        with torch.no_grad():
            for name, tensor in self.merged(state).items():
                state[name].copy_(tensor)
        return model, tokenizer

    def inferred_architecture(self) -> Optional[str]:
        """None: mergekit reads a model+adapter's architecture from its base."""
        return None

    def targets(self) -> Dict[str, Tuple[str, str]]:
        """Base tensor name -> (its lora_A key, its lora_B key), from the header alone,
        checked against the base's tensor shapes."""
        if self._targets is None:
            shapes = {name: info.shape for name, info in self.tensor_index().items()}
            found = modules(self.folder, self.config)
            for name, (shape, _) in found.items():
                if name not in shapes:
                    raise UserError(
                        f"adapter {self.folder}: its module for {name} has no tensor in the base {self.base}; was it trained on another model?"
                    )
                if tuple(shapes[name]) != shape:
                    raise UserError(
                        f"adapter {self.folder}: {name} is {list(shape)}, in the base {self.base} {list(shapes[name])}; was it trained on another model?"
                    )
            self._targets = {name: keys for name, (_, keys) in found.items()}
        return self._targets

    def update(self, name: str) -> LowRank:
        """The factors of the update of base tensor ``name``."""
        from safetensors import safe_open

        key_a, key_b = self.targets()[name]
        if self._handle is None:
            self._handle = safe_open(str(self.folder / WEIGHTS), framework="pt")
        a, b = self._handle.get_tensor(key_a), self._handle.get_tensor(key_b)
        rank = a.shape[0]
        if self.config.get("fan_in_fan_out"):  # the base stores this weight transposed (GPT-2's Conv1D): ΔWᵀ = Aᵀ·Bᵀ
            a, b = b.T, a.T
        return LowRank(a, b, scale(self.config, name[: -len(".weight")], rank))

    def merged(self, tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The targeted tensors of ``tensors`` (the base's, by name) with the update added."""
        missing = [name for name in self.targets() if name not in tensors]
        if missing:
            raise UserError(
                f"adapter {self.folder}: tensor {missing[0]} is not in the loaded base {self.base}; was it trained on another model?"
            )
        return {name: add(tensors[name], self.update(name)) for name in self.targets()}


class AdapterReader(TensorReader):
    """A ``TensorReader`` of base + ΔW: the base's bytes, the update added to the rows read."""

    def __init__(self, model: AdapterModel):
        super().__init__(model.base)
        self.model = model
        self.targets = model.targets()

    def __getitem__(self, name: str):
        tensor = super().__getitem__(name)
        return add(tensor, self.model.update(name)) if name in self.targets else tensor

    def rows(self, name: str, start: int, stop: int):
        tensor = super().rows(name, start, stop)
        return add(tensor, self.model.update(name), start, stop) if name in self.targets else tensor

    def known_update(self) -> "FormedUpdate":
        return FormedUpdate(self)


class FormedUpdate(Mapping):
    """An adapter's targeted tensors, each base + ΔW formed when read: a pool of adapters in
    memory holds its factors, not its tensors (``evaluation.inmemory`` merges from it)."""

    def __init__(self, reader: AdapterReader):
        self.reader = reader

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.reader.targets:
            raise KeyError(name)
        return self.reader[name]

    def __iter__(self):
        return iter(self.reader.targets)

    def __len__(self) -> int:
        return len(self.reader.targets)


def add(tensor: torch.Tensor, update: LowRank, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
    """Rows ``start:stop`` of ``tensor`` + ΔW, in the tensor's dtype (as peft's merge_and_unload)."""
    rows = update.b[start:stop].float()
    return (tensor.float() + update.scale * (rows @ update.a.float())).to(tensor.dtype)


def modules(folder: Path, config: dict) -> Dict[str, Tuple[Tuple[int, int], Tuple[str, str]]]:
    """Base tensor name -> (the shape of its update, (key of lora_A, key of lora_B)), from the header alone."""
    folder = Path(folder)
    file = folder / WEIGHTS
    if not file.is_file():
        others = sorted(p.name for p in folder.glob("adapter_model.*"))
        hint = (
            f"only {others[0]}; re-save it with safe_serialization=True" if others else "is it a peft adapter folder?"
        )
        raise UserError(f"adapter {folder}: no {WEIGHTS} ({hint})")
    halves: Dict[str, Dict[str, Tuple[str, tuple]]] = {}
    for key, info in read_header(file).items():  # a truncated or damaged file is named here, in one line
        if key == "__metadata__":
            continue
        match = _KEY.fullmatch(key[len(_PREFIX) :] if key.startswith(_PREFIX) else key)
        if match is None:
            raise UserError(
                f"adapter {folder}: tensor {key} is not a LoRA factor (lora_A / lora_B); only LoRA updates of linear layers are supported"
            )
        halves.setdefault(match["module"], {})[match["factor"]] = (key, tuple(info["shape"]))
    found = {}
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise UserError(
                f"adapter {folder}: module {module} has lora_{next(iter(pair))} but not its other factor; save the adapter again"
            )
        (key_a, shape_a), (key_b, shape_b) = pair["A"], pair["B"]
        if len(shape_a) != 2 or len(shape_b) != 2 or shape_a[0] != shape_b[1]:
            raise UserError(
                f"adapter {folder}: module {module} has factors {list(shape_b)} · {list(shape_a)}, which do not multiply"
            )
        shape = (shape_a[1], shape_b[0]) if config.get("fan_in_fan_out") else (shape_b[0], shape_a[1])
        found[f"{module}.weight"] = (shape, (key_a, key_b))
    if not found:
        raise UserError(f"adapter {folder}: {WEIGHTS} holds no LoRA factors")
    return found


def scale(config: dict, module: str, rank: int) -> float:
    """peft's scaling of one module: lora_alpha / r, or / √r with use_rslora."""
    alpha = float(_pattern(config.get("alpha_pattern"), module, config.get("lora_alpha", 8)))
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def _pattern(patterns: Optional[dict], module: str, default):
    """A per-module override as peft matches it: the pattern matches the module name's end."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def materialise(model: AdapterModel, folder: Path) -> Path:
    """base + ΔW written as a model folder (what peft's ``merge_and_unload`` then ``save_pretrained``
    gives): the base's config and tokenizer files, every tensor in one safetensors file. Written
    beside ``folder`` and renamed into place, so a reader never sees half of it."""
    import shutil

    from safetensors.torch import save_file

    from mergekit_mergeability.files import atomic_folder

    folder = Path(folder)
    if folder.exists():
        raise UserError(f"{folder}: already exists; materialise into a new folder")
    with atomic_folder(folder) as partial:
        shutil.copytree(
            Path(model.base),
            partial,
            ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", "*.bin", "*.pt", "*.pth"),
        )
        reader = AdapterReader(model)
        save_file(
            {name: reader[name].contiguous() for name in reader.index},
            partial / "model.safetensors",
            metadata={"format": "pt"},
        )
    return folder
