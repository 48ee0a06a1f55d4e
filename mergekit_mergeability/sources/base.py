"""What every model source answers, whatever it is: a local folder, a hub model, an adapter on its base.

A source is asked, never inspected: callers use the functions of ``mergekit_mergeability.sources``
(a plain path is a local folder), and a new kind of source is one new subclass here, not a branch
in every caller.
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

from mergekit_mergeability.errors import UserError

if TYPE_CHECKING:
    import torch

    from mergekit_mergeability.maths.lowrank import LowRank


class TensorInfo(NamedTuple):
    file: Path
    shape: Tuple[int, ...]
    dtype: str


class ModelSource(abc.ABC):
    """Where one model comes from. ``str()`` names it as the user did (a report, a recommended config)."""

    #: None for a whole model; for an update applied to a base (an adapter), that base. An update
    #: also answers ``targets``, ``update`` and ``merged``.
    update_of: Optional[Union[Path, ModelSource]] = None

    @abc.abstractmethod
    def file(self, name: str) -> Optional[Path]:
        """One small file (config, tokenizer) without fetching any weight; None if absent."""

    @abc.abstractmethod
    def tensor_index(self) -> Dict[str, TensorInfo]:
        """Every tensor's file, shape and dtype, from the safetensors headers alone."""

    @abc.abstractmethod
    def tensors(self):
        """A ``folder.TensorReader`` of its tensors: one at a time, or rows of one."""

    @abc.abstractmethod
    def files(self) -> List[Path]:
        """The local files that make the model what it is (what its fingerprint hashes)."""

    @abc.abstractmethod
    def check(self) -> Union[Path, ModelSource]:
        """Checked before anything loads it (config.json, undamaged weights): what to load."""

    @abc.abstractmethod
    def load(self, device: str, dtype: str, tokenizer_from: Optional[Union[Path, ModelSource]]):
        """(model, tokenizer) in eval mode, in ``dtype`` (a concrete dtype, never ``auto``)."""

    def config_json(self) -> Tuple[Path, dict]:
        """Its config.json: where it is, and what it says."""
        path = self.file("config.json")
        if path is None:
            raise UserError(f"model {self}: no config.json; every model folder needs one (is it a model folder?)")
        try:
            config = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            where = f" (line {error.lineno}, column {error.colno})" if isinstance(error, json.JSONDecodeError) else ""
            raise UserError(
                f"{path}: not JSON{where}; a model's config.json must be a JSON object (save or download the model again)"
            ) from None
        if not isinstance(config, dict):
            raise UserError(f"{path}: not a JSON object; a model's config.json must be one")
        return path, config

    def model_config(self) -> dict:
        """Its config.json; one without an ``architectures`` list gets the class transformers
        loads it as (see ``inferred_architecture``), so models compare by what they are."""
        path, config = self.config_json()
        if not config.get("architectures"):
            config["architectures"] = [_causal_lm_class(path, config)]
        return config

    def inferred_architecture(self) -> Optional[str]:
        """For a config.json without ``architectures`` (transformers then loads the model by its
        ``model_type``): the class it loads, which mergekit needs named (``override_architecture``);
        None when the file names it."""
        path, config = self.config_json()
        return None if config.get("architectures") else _causal_lm_class(path, config)

    def targets(self) -> Dict[str, Tuple[str, str]]:
        raise TypeError(f"model {self}: a whole model, not an update of a base")

    def update(self, name: str) -> "LowRank":
        raise TypeError(f"model {self}: a whole model, not an update of a base")

    def merged(self, tensors: Mapping[str, "torch.Tensor"]) -> Dict[str, "torch.Tensor"]:
        raise TypeError(f"model {self}: a whole model, not an update of a base")


def _causal_lm_class(path: Path, config: dict) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    if name is None:
        raise UserError(
            f'{path}: no "architectures" list, and model_type {model_type!r} is no causal LM transformers knows; add "architectures": ["<its model class>"]'
        )
    return name
