"""Model folders: where they are, what their headers say, and loading them.

Nothing here reads a tensor before it is needed: ``tensor_index`` parses only the
safetensors headers, ``TensorReader`` maps one tensor at a time.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Dict, NamedTuple, Optional, Tuple

from mergekit_mergeability.errors import UserError


class TensorInfo(NamedTuple):
    file: Path
    shape: Tuple[int, ...]
    dtype: str


def resolve(reference: str, relative_to: Optional[Path] = None) -> Path:
    """A local folder for a model reference as written in a mergekit config.

    Local paths resolve like mergekit's (against the working directory), then
    against the config's folder; anything else is a Hugging Face hub id,
    downloaded (safetensors and configs only) to the usual hub cache.
    """
    path = reference.split("+")[0]  # mergekit's "model+lora" syntax: the model part
    for candidate in (Path(path).expanduser(), *([relative_to / path] if relative_to else [])):
        if candidate.is_dir():
            return candidate.resolve()
    if path.startswith((".", "/", "~")) or path.count("/") != 1:
        raise UserError(f"model {reference}: no such folder (relative paths resolve against the working directory)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as error:  # offline, gated, missing: all the user can act on is the message
        raise UserError(f"model {reference}: not a local folder and not downloadable from the hub ({type(error).__name__})") from None


def model_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing; every model folder needs its config.json") from None


def tensor_index(folder: Path) -> Dict[str, TensorInfo]:
    """Every tensor's file, shape and dtype, from the safetensors headers in ``folder``."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder}: no .safetensors files; mergeability reads safetensors checkpoints")
    index: Dict[str, TensorInfo] = {}
    for file in files:
        try:
            with open(file, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (struct.error, ValueError, UnicodeDecodeError):
            raise UserError(f"{file}: not a safetensors file (unreadable header)") from None
        for name, info in header.items():
            if name != "__metadata__":
                index[name] = TensorInfo(file, tuple(info["shape"]), info["dtype"])
    return index


class TensorReader:
    """Reads single tensors from a model folder, keeping each file memory-mapped once."""

    def __init__(self, folder: Path):
        self.index = tensor_index(folder)
        self._handles: Dict[Path, object] = {}

    def _handle(self, name: str):
        from safetensors import safe_open

        file = self.index[name].file
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), framework="pt")
        return self._handles[file]

    def __getitem__(self, name: str):
        return self._handle(name).get_tensor(name)

    def rows(self, name: str, start: int, stop: int):
        """Rows ``start:stop`` of a tensor (along its first dimension), reading only those bytes."""
        return self._handle(name).get_slice(name)[start:stop]

    def blocks(self, name: str, elements: int = 1 << 16):
        """``(start, stop)`` row ranges of about ``elements`` values each, covering the tensor."""
        shape = self.index[name].shape
        per_row = math.prod(shape[1:]) if len(shape) > 1 else 1
        step = max(1, elements // max(per_row, 1))
        rows = shape[0] if shape else 1
        return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def load_causal_lm(folder: Path, device: str = "cpu", dtype: str = "float32", tokenizer_from: Optional[Path] = None):
    """(model, tokenizer) in eval mode; the tokenizer falls back to ``tokenizer_from``
    (mergekit output folders written with --no-copy-tokenizer have none)."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as error:
        raise UserError(f"model {folder}: transformers cannot load it ({str(error).splitlines()[0]})") from None
    for source in (folder, tokenizer_from):
        if source is None:
            continue
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source)
            break
        except (OSError, ValueError):
            continue
    else:
        raise UserError(f"model {folder}: no tokenizer in the folder (nor in the base model's)")
    return model.to(device).eval(), tokenizer


def auto_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
