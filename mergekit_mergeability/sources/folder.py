"""A local model folder (a Hugging Face folder of safetensors, config and tokenizer files).

Nothing here reads a tensor before it is needed: ``Folder.tensor_index`` parses only the
safetensors headers, ``TensorReader`` maps one tensor at a time. Every header is
checked against its file's size first, so a cut-off download or a damaged file is
named in one line instead of failing deep inside safetensors.
"""

from __future__ import annotations

import json
import math
import struct
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.progress import quiet_config_warnings
from mergekit_mergeability.sources.base import ModelSource, TensorInfo

if TYPE_CHECKING:
    import torch

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def local_folder(reference: str, relative_to: Optional[Path]) -> Optional[Path]:
    if not reference.strip():
        return None  # Path("") is the working directory, never what an empty field meant
    for candidate in (Path(reference), *([relative_to / reference] if relative_to else [])):
        try:
            if candidate.expanduser().is_dir():
                return candidate.expanduser().resolve()
        except (OSError, RuntimeError):  # a name too long for the file system, ~nobody: no such folder
            continue
    return None


def read_header(file: Path) -> dict:
    """A safetensors file's header, checked against the file: its tensors' data must end
    exactly where the file does (a cut-off download, or bytes lost, fails here)."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size - 8:
                raise ValueError
            header = json.loads(handle.read(length))
        spans = {
            name: (tuple(info["shape"]), info["dtype"], info["data_offsets"])
            for name, info in header.items()
            if name != "__metadata__"
        }
    except (struct.error, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise UserError(f"{file}: not a safetensors file (unreadable header); download or save it again") from None
    data = size - 8 - length
    end = max((stop for _, _, (_, stop) in spans.values()), default=0)
    if end != data:
        short = f"{end - data} bytes short" if end > data else f"{data - end} bytes too long"
        raise UserError(
            f"{file}: truncated or corrupted ({short} of what its header describes); download or save it again"
        )
    for name, (shape, dtype, (start, stop)) in spans.items():
        if dtype in _DTYPE_BYTES and stop - start != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise UserError(
                f"{file}: corrupted header (tensor {name}: {stop - start} bytes for shape {list(shape)} {dtype}); download or save it again"
            )
    return header


def weight_files(folder: Path) -> List[Path]:
    """Every weight file of a local model folder, in any format transformers saves (and
    shard indexes), safetensors headers checked. Refuses a folder without weights."""
    folder = Path(folder)
    files = (
        sorted(
            f
            for f in folder.iterdir()
            if f.is_file() and (f.suffix in WEIGHT_SUFFIXES or f.name.endswith(".index.json"))
        )
        if folder.is_dir()
        else []
    )
    if not any(f.suffix in WEIGHT_SUFFIXES for f in files):
        raise UserError(f"{folder}: no weights (*.safetensors, *.bin, *.pt, *.pth); is it a model folder?")
    for file in files:
        if file.suffix == ".safetensors":
            read_header(file)
    return files


class _Mapped:
    """One safetensors file, memory-mapped once for every reader of it in the process: a pool of a
    hundred adapters reads its base through a hundred readers, and each mapping of the same pages
    counts again in the process's resident size (a plan of a hundred SmolLM2-135M adapters peaked
    at 8.0 GB resident with a mapping each, 2.6 GB with one). A class of its own because safetensors'
    handles take no weak reference."""

    def __init__(self, file: Path):
        from safetensors import safe_open

        self.handle = safe_open(str(file), framework="pt")


_mapped: "weakref.WeakValueDictionary[tuple, _Mapped]" = weakref.WeakValueDictionary()  # unmapped with its last reader


def mapped(file: Path) -> _Mapped:
    """``file`` mapped, shared while some reader holds it; a file rewritten since is mapped anew."""
    stat = file.stat()
    key = (str(file), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    found = _mapped.get(key)
    if found is None:
        found = _mapped[key] = _Mapped(file)
    return found


class TensorReader:
    """Reads single tensors from a model folder, each file memory-mapped once in the process."""

    def __init__(self, folder: Path):
        self.index = Folder(Path(folder)).tensor_index()  # a hub model is downloaded here: its tensors are read
        self._handles: Dict[Path, _Mapped] = {}

    def _handle(self, name: str):
        file = self.index[name].file
        if file not in self._handles:
            self._handles[file] = mapped(file)
        return self._handles[file].handle

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

    def known_update(self) -> Optional[Mapping[str, "torch.Tensor"]]:
        """The tensors this model changes, when it knows them without comparing them with its
        base's (an adapter's targets, each formed when read); None for a whole model."""
        return None


class Folder(ModelSource):
    """A local model folder; ``str()`` is the path as given."""

    def __init__(self, path):
        self.path = Path(path)
        self._name = str(path)

    def __str__(self) -> str:
        return self._name

    def file(self, name: str) -> Optional[Path]:
        path = self.path / name
        return path if path.is_file() else None

    def tensor_index(self) -> Dict[str, TensorInfo]:
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            others = [f.name for f in weight_files(self.path)]  # raises for a folder without any weights
            raise UserError(
                f"{self}: no .safetensors files (only {others[0]}); re-save it with save_pretrained(..., safe_serialization=True)"
            )
        index: Dict[str, TensorInfo] = {}
        for file in files:
            for name, info in read_header(file).items():
                if name != "__metadata__":
                    index[name] = TensorInfo(file, tuple(info["shape"]), info["dtype"])
        return index

    def tensors(self) -> TensorReader:
        return TensorReader(self.path)

    def files(self) -> List[Path]:
        """Its weight files and config.json."""
        config = self.path / "config.json"
        return [*weight_files(self.path), *([config] if config.is_file() else [])]

    def check(self) -> Path:
        self.model_config()
        weight_files(self.path)
        return self.path

    def load(self, device: str, dtype: str, tokenizer_from=None):
        import torch
        import transformers
        from safetensors import SafetensorError

        folder = self.check()
        tokenizer_from = tokenizer_from and Path(tokenizer_from)
        transformers.utils.logging.disable_progress_bar()
        try:
            with quiet_config_warnings():
                model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
        except (OSError, ValueError, SafetensorError) as error:
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


def source_of(model) -> ModelSource:
    """The source that answers for ``model``: a hub model or an adapter is its own; a path is a local folder."""
    return model if isinstance(model, ModelSource) else Folder(model)
