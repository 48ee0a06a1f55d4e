"""Model folders: where they are, what their headers say, and loading them.

Nothing here reads a tensor before it is needed: ``tensor_index`` parses only the
safetensors headers, ``TensorReader`` maps one tensor at a time. Every header is
checked against its file's size first, so a cut-off download or a damaged file is
named in one line instead of failing deep inside safetensors. A hub id becomes a
``HubModel``: its config and headers come over HTTP, and its weights download only
when something uses it as a folder.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple, Union

from mergekit_mergeability.errors import UserError

if TYPE_CHECKING:
    from mergekit_mergeability.lora import AdapterModel

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


class TensorInfo(NamedTuple):
    file: Path
    shape: Tuple[int, ...]
    dtype: str


class HubModel(os.PathLike):
    """A model on the Hugging Face hub, fetched no more than the caller needs.

    ``file`` and ``tensor_index`` read config.json, tokenizer files and the safetensors
    headers without any weight; used as a path (``Path(model)``, ``open``)
    it downloads the snapshot, once. ``str()`` stays the hub id, so reports and
    recommended configs name the model as the user did.
    """

    def __init__(self, repo_id: str):
        self.repo_id = repo_id
        self._folder: Optional[Path] = None

    def __str__(self) -> str:
        return self.repo_id

    def __repr__(self) -> str:
        return f"HubModel({self.repo_id!r})"

    def __getstate__(self):  # sent to a Ray worker: it downloads into its own cache
        return {**self.__dict__, "_folder": None}

    def __fspath__(self) -> str:
        return str(self.folder)

    def __truediv__(self, name: str) -> Path:
        return self.folder / name

    @property
    def folder(self) -> Path:
        if self._folder is None:
            patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
            self._folder = Path(self._hub("snapshot_download", self.repo_id, allow_patterns=patterns))
        return self._folder

    def file(self, name: str) -> Optional[Path]:
        """One small file of the repo (None if the hub says it has none by that name)."""
        from huggingface_hub.errors import RemoteEntryNotFoundError  # not Local…: offline is an error

        try:
            return Path(self._hub("hf_hub_download", self.repo_id, name, missing_ok=RemoteEntryNotFoundError))
        except RemoteEntryNotFoundError:
            return None

    def tensor_index(self) -> Dict[str, TensorInfo]:
        metadata = self._hub("get_safetensors_metadata", self.repo_id)
        return {
            name: TensorInfo(Path(file), tuple(info.shape), info.dtype)
            for file, header in metadata.files_metadata.items()
            for name, info in header.tensors.items()
        }

    def _hub(self, function: str, *args, missing_ok=(), **kwargs):
        import huggingface_hub  # looked up at call time, so tests can stand in for the hub

        try:
            return getattr(huggingface_hub, function)(*args, **kwargs)
        except missing_ok:
            raise
        except Exception as error:  # offline, gated, missing: all the user can act on is the message
            raise UserError(
                f"model {self.repo_id}: no such folder, and not on the hub ({type(error).__name__}); "
                "relative paths resolve against the working directory"
            ) from None


Source = Union[Path, HubModel, "AdapterModel"]  # an AdapterModel: mergekit_mergeability.lora


def resolve(
    reference: str, relative_to: Optional[Path] = None, base: Optional[Source] = None, adapters: bool = True
) -> Source:
    """A model reference as written in a mergekit config: a local folder, a ``HubModel``, or a
    ``lora.AdapterModel``.

    Local paths resolve like mergekit's (against the working directory), then against
    the config's folder. A PEFT LoRA adapter is accepted as mergekit's ``model+adapter``
    or as the adapter folder alone (its adapter_config.json names the base); ``base``
    (the config's base model) refuses an adapter trained on another base. Commands that
    cannot measure adapters pass ``adapters=False`` and refuse them in one line.
    """
    from mergekit_mergeability import lora

    folder = local_folder(reference, relative_to)
    if folder is not None and not lora.is_adapter(folder):
        return folder
    if folder is None and "+" in reference:
        model, adapter = reference.split("+", 1)
        if not adapters:
            raise UserError(
                f"model {reference}: a model+adapter reference; measured as is it would be {model} without {adapter}. "
                "Merge the adapter first (peft's merge_and_unload(), or mergekit-yaml with merge_method: passthrough) "
                "and name the merged folder instead"
            )
        folder = local_folder(adapter, relative_to)
        if folder is None or not lora.is_adapter(folder):
            raise UserError(
                f"model {reference}: {adapter} is not a peft adapter folder (adapter_config.json + adapter_model.safetensors)"
            )
        found = lora.AdapterModel(resolve(model, relative_to, adapters=False), folder)
    elif folder is not None:
        if not adapters:
            raise UserError(
                f"model {reference}: a peft adapter folder, not a model; merge it first (peft's merge_and_unload()) and name the merged folder instead"
            )
        named = lora.read_config(folder).get("base_model_name_or_path")
        if not named:
            raise UserError(
                f"adapter {reference}: its {lora.CONFIG} names no base_model_name_or_path; write it as BASE+{reference}"
            )
        found = lora.AdapterModel(resolve(str(named), relative_to, adapters=False), folder)
    else:
        if not is_hub_id(reference):
            raise UserError(
                f"model {reference}: no such folder, nor a hub id (namespace/name); relative paths resolve against the working directory"
            )
        return HubModel(reference)
    if base is not None and not same_model(found.base, base):
        raise UserError(
            f"adapter {found.folder}: trained on {found.base}, but the config's base_model is {base}; "
            f"use an adapter of {base} (or write it as {base}+{found.folder} to apply it there anyway)"
        )
    found.targets()  # its header against the base's shapes: a mismatch is named now, before any work
    return found


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


def is_hub_id(reference: str) -> bool:
    """Whether ``reference`` could name a hub model: ``namespace/name`` (an ``@revision`` aside)
    by the hub's own rules; a path (``./``, ``/``, ``~``) never does."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if reference.startswith((".", "/", "~")) or reference.count("/") != 1:
        return False
    try:
        validate_repo_id(reference.split("@", 1)[0])
    except HFValidationError:
        return False
    return True


def same_model(a: Source, b: Source) -> bool:
    """Whether two resolved references are one model (a folder by its real path, a hub model by id)."""
    if isinstance(a, Path) and isinstance(b, Path):
        return a.resolve() == b.resolve()
    return str(a) == str(b)


def small_file(model: Source, name: str) -> Optional[Path]:
    """A small file of a model (config, tokenizer) without fetching its weights; None if absent.
    An adapter's are its base's."""
    model = _base_of(model)
    if isinstance(model, HubModel):
        return model.file(name)
    path = Path(model) / name
    return path if path.is_file() else None


def model_config(model: Source) -> dict:
    """A model's config.json; one without an ``architectures`` list gets the class transformers
    loads it as (see ``inferred_architecture``), so models compare by what they are."""
    path, config = _config_json(model)
    if not config.get("architectures"):
        config["architectures"] = [_causal_lm_class(path, config)]
    return config


def inferred_architecture(model: Source) -> Optional[str]:
    """For a config.json without ``architectures`` (transformers then loads the model by its
    ``model_type``): the class it loads, which mergekit needs named (``override_architecture``);
    None when the file names it."""
    path, config = _config_json(model)
    return None if config.get("architectures") else _causal_lm_class(path, config)


def _causal_lm_class(path: Path, config: dict) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    if name is None:
        raise UserError(
            f'{path}: no "architectures" list, and model_type {model_type!r} is no causal LM transformers knows; add "architectures": ["<its model class>"]'
        )
    return name


def _config_json(model: Source) -> Tuple[Path, dict]:
    path = small_file(model, "config.json")
    if path is None:
        raise UserError(f"model {model}: no config.json; every model folder needs one (is it a model folder?)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not JSON; a model's config.json must be") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a JSON object; a model's config.json must be one")
    return path, config


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


def model_files(source: Source) -> List[Path]:
    """The files that make a local model what it is: its weight files and config.json; an
    adapter's are its base's, then its adapter_config.json and weights."""
    from mergekit_mergeability import lora

    if isinstance(source, lora.AdapterModel):
        return [*model_files(source.base), source.folder / lora.CONFIG, source.folder / lora.WEIGHTS]
    config = Path(source) / "config.json"
    return [*weight_files(source), *([config] if config.is_file() else [])]


def weight_files(folder: Source) -> List[Path]:
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


def tensor_index(model: Source) -> Dict[str, TensorInfo]:
    """Every tensor's file, shape and dtype, from the safetensors headers (a hub model's over HTTP);
    an adapter has its base's tensors."""
    model = _base_of(model)
    if isinstance(model, HubModel):
        return model.tensor_index()
    files = sorted(Path(model).glob("*.safetensors"))
    if not files:
        others = [f.name for f in weight_files(model)]  # raises for a folder without any weights
        raise UserError(
            f"{model}: no .safetensors files (only {others[0]}); re-save it with save_pretrained(..., safe_serialization=True)"
        )
    index: Dict[str, TensorInfo] = {}
    for file in files:
        for name, info in read_header(file).items():
            if name != "__metadata__":
                index[name] = TensorInfo(file, tuple(info["shape"]), info["dtype"])
    return index


class TensorReader:
    """Reads single tensors from a model folder, keeping each file memory-mapped once."""

    def __init__(self, folder: Source):
        self.index = tensor_index(Path(folder))  # a hub model is downloaded here: its tensors are read
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


def tensors(model: Source) -> TensorReader:
    """A ``TensorReader`` of a model; an adapter's reads its base with the update added."""
    from mergekit_mergeability import lora

    return lora.AdapterReader(model) if isinstance(model, lora.AdapterModel) else TensorReader(model)


def _base_of(model: Source) -> Source:
    from mergekit_mergeability import lora

    return model.base if isinstance(model, lora.AdapterModel) else model


def check_model(model: Source) -> Path:
    """The local folder of a model that has a config.json and undamaged weights: checked before
    anything loads it, so a bad folder is named in one line, not deep inside transformers.
    An adapter is checked with its base, and returned as it is."""
    from mergekit_mergeability import lora

    if isinstance(model, lora.AdapterModel):
        check_model(model.base)
        model.targets()
        return model
    folder = Path(model)
    model_config(folder)
    weight_files(folder)
    return folder


LOADABLE_DTYPES = ("float32", "bfloat16", "float16", "float64")


def load_dtype(requested: str, model: Source, configured: Optional[str] = None) -> str:
    """The dtype to load ``model`` in: ``requested``, unless it is ``auto``: then ``configured``
    (a merge config's ``dtype:``, what mergekit will compute in), else the checkpoint's own
    (config.json's ``dtype``, ``torch_dtype`` before transformers 5), else float32. An adapter's
    is its base's."""
    if requested != "auto":
        return requested

    def candidates():
        yield configured
        config = _config_json(_base_of(model))[1]
        yield config.get("dtype")
        yield config.get("torch_dtype")

    for candidate in candidates():
        name = candidate.removeprefix("torch.") if isinstance(candidate, str) else None
        if name in LOADABLE_DTYPES:
            return name
    return "float32"


def load_causal_lm(
    folder: Source, device: str = "cpu", dtype: str = "float32", tokenizer_from: Optional[Source] = None
):
    """(model, tokenizer) in eval mode, in ``dtype`` (``auto``: see ``load_dtype``); the tokenizer
    falls back to ``tokenizer_from`` (mergekit output folders written with --no-copy-tokenizer have
    none). An adapter is loaded as its base with the update added in place."""
    import torch
    import transformers
    from safetensors import SafetensorError

    from mergekit_mergeability import lora

    dtype = load_dtype(dtype, folder)
    if isinstance(folder, lora.AdapterModel):
        model, tokenizer = load_causal_lm(folder.base, device, dtype, tokenizer_from)
        state = model.state_dict()
        with torch.no_grad():
            for name, tensor in folder.merged(state).items():
                state[name].copy_(tensor)
        return model, tokenizer
    folder = check_model(folder)
    tokenizer_from = tokenizer_from and Path(tokenizer_from)
    transformers.utils.logging.disable_progress_bar()
    try:
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


def auto_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
