"""Where a model comes from, behind one small interface: a local folder (``folder``), a hub id
(``hub``), a peft LoRA adapter on its base (``adapter``).

``resolve`` turns a reference as a mergekit config writes it into a source; the functions below
take any source (a plain path is a local folder) and ask it (``base.ModelSource``): its tensor
names and shapes, a reader of its tensors, its small files, its files to fingerprint, and the
model loaded for a forward pass. No caller looks at which kind of source it has.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Mapping, Optional, Set, Union

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources.base import ModelSource, TensorInfo
from mergekit_mergeability.sources.folder import TensorReader, local_folder, source_of
from mergekit_mergeability.sources.hub import HubModel, is_hub_id

if TYPE_CHECKING:
    import torch

    from mergekit_mergeability.sources.adapter import AdapterModel

__all__ = [
    "LOADABLE_DTYPES",
    "HubModel",
    "ModelSource",
    "Source",
    "TensorInfo",
    "TensorReader",
    "auto_device",
    "base_of",
    "check_model",
    "empty_like_each",
    "inferred_architecture",
    "load_causal_lm",
    "load_dtype",
    "merged",
    "model_config",
    "model_files",
    "on_hub",
    "patched",
    "resolve",
    "same_model",
    "small_file",
    "tensor_index",
    "tensors",
    "update_of",
]

Source = Union[Path, HubModel, "AdapterModel"]  # an AdapterModel: sources.adapter


def resolve(
    reference: str, relative_to: Optional[Path] = None, base: Optional[Source] = None, adapters: bool = True
) -> Source:
    """A model reference as written in a mergekit config: a local folder, a ``HubModel``, or an
    ``adapter.AdapterModel``.

    Local paths resolve like mergekit's (against the working directory), then against
    the config's folder. A PEFT LoRA adapter is accepted as mergekit's ``model+adapter``
    or as the adapter folder alone (its adapter_config.json names the base); ``base``
    (the config's base model) refuses an adapter trained on another base. Commands that
    cannot measure adapters pass ``adapters=False`` and refuse them in one line.
    """
    from mergekit_mergeability.sources.adapter import CONFIG, AdapterModel, is_adapter, read_config

    folder = local_folder(reference, relative_to)
    if folder is not None and not is_adapter(folder):
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
        on_hub = folder is None and is_hub_id(adapter)
        if on_hub:  # an adapter repo: its snapshot, downloaded once (or found in the cache offline)
            folder = HubModel(adapter).folder
        if folder is None or not is_adapter(folder):
            raise UserError(
                f"model {reference}: {adapter} is not a peft adapter folder (adapter_config.json + adapter_model.safetensors)"
            )
        found = AdapterModel(resolve(model, relative_to, adapters=False), folder, adapter if on_hub else None)
    elif folder is not None:
        if not adapters:
            raise UserError(
                f"model {reference}: a peft adapter folder, not a model; merge it first (peft's merge_and_unload()) and name the merged folder instead"
            )
        named = read_config(folder).get("base_model_name_or_path")
        if not named:
            raise UserError(
                f"adapter {reference}: its {CONFIG} names no base_model_name_or_path; write it as BASE+{reference}"
            )
        found = AdapterModel(resolve(str(named), relative_to, adapters=False), folder)
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


def same_model(a: Source, b: Source) -> bool:
    """Whether two resolved references are one model (a folder by its real path, a hub model by id)."""
    if isinstance(a, Path) and isinstance(b, Path):
        return a.resolve() == b.resolve()
    return str(a) == str(b)


def update_of(model: Source) -> Optional[Source]:
    """The base ``model`` is an update of (an adapter's); None for a whole model."""
    return source_of(model).update_of


def on_hub(model: Source) -> bool:
    """Whether a model's weights come from the hub: a hub id, or an adapter on one."""
    return not isinstance(base_of(model), Path)


def base_of(model: Source) -> Source:
    """The whole model whose files ``model`` reads: an adapter's base, any other model itself."""
    base = update_of(model)
    return model if base is None else base


def small_file(model: Source, name: str) -> Optional[Path]:
    """A small file of a model (config, tokenizer) without fetching its weights; None if absent.
    An adapter's are its base's."""
    return source_of(model).file(name)


def model_config(model: Source) -> dict:
    """A model's config.json; one without an ``architectures`` list gets the class transformers
    loads it as (see ``inferred_architecture``), so models compare by what they are."""
    return source_of(model).model_config()


def inferred_architecture(model: Source) -> Optional[str]:
    """For a config.json without ``architectures`` (transformers then loads the model by its
    ``model_type``): the class it loads, which mergekit needs named (``override_architecture``);
    None when the file names it, and for an adapter (mergekit reads its base's)."""
    return source_of(model).inferred_architecture()


def model_files(model: Source) -> List[Path]:
    """The files that make a local model what it is: its weight files and config.json; an
    adapter's are its base's, then its adapter_config.json and weights."""
    return source_of(model).files()


def tensor_index(model: Source) -> Dict[str, TensorInfo]:
    """Every tensor's file, shape and dtype, from the safetensors headers (a hub model's over HTTP);
    an adapter has its base's tensors."""
    return source_of(model).tensor_index()


def tensors(model: Source) -> TensorReader:
    """A ``TensorReader`` of a model; an adapter's reads its base with the update added."""
    return source_of(model).tensors()


def merged(model: Source, tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An update's targeted tensors of ``tensors`` (its base's, by name) with the update added."""
    return source_of(model).merged(tensors)


def check_model(model: Source) -> Source:
    """The local folder of a model that has a config.json and undamaged weights: checked before
    anything loads it, so a bad folder is named in one line, not deep inside transformers.
    An adapter is checked with its base, and returned as it is."""
    return source_of(model).check()


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
        config = source_of(base_of(model)).config_json()[1]
        for key in ("dtype", "torch_dtype"):  # torch_dtype before transformers 5
            yield config.get(key)

    for candidate in candidates():
        name = candidate.removeprefix("torch.") if isinstance(candidate, str) else None
        if name in LOADABLE_DTYPES:
            return name
    return "float32"


def changed(base: TensorReader, model: Source, block: int = 1 << 20) -> Set[str]:
    """The tensors a model's update touches: an adapter's targets, or those of a whole model that
    differ from the base's (compared ``block`` values at a time)."""
    import torch

    theirs = tensors(model)
    update = theirs.known_update()
    if update is not None:
        return set(update)
    return {
        name
        for name in base.index
        if any(not torch.equal(base.rows(name, a, b), theirs.rows(name, a, b)) for a, b in base.blocks(name, block))
    }


def load_causal_lm(
    folder: Source, device: str = "cpu", dtype: str = "float32", tokenizer_from: Optional[Source] = None
):
    """(model, tokenizer) in eval mode, in ``dtype`` (``auto``: see ``load_dtype``); the tokenizer
    falls back to ``tokenizer_from`` (mergekit output folders written with --no-copy-tokenizer have
    none). An adapter is loaded as its base with the update added in place. ``device`` may be
    ``auto`` (``auto_device``)."""
    return source_of(folder).load(auto_device(device), load_dtype(dtype, folder), tokenizer_from)


def empty_like_each(tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An uninitialised tensor like each of ``tensors``, all cut from one allocation per dtype and
    device. Freed, the allocation goes back to the system whole; a model's worth of separate
    tensors of a few MB each would come from the C heap, which keeps much of what they leave
    (measured: 1.7 GiB of a 2 GiB pass, docs/scale.md)."""
    import torch

    groups: Dict = {}
    for name, tensor in tensors.items():
        groups.setdefault((tensor.dtype, tensor.device), []).append(name)
    fresh = {}
    for (dtype, device), names in groups.items():
        buffer = torch.empty(sum(tensors[n].numel() for n in names), dtype=dtype, device=device)
        for name, piece in zip(names, buffer.split([tensors[n].numel() for n in names])):
            fresh[name] = piece.view(tensors[name].shape)
    return fresh


@contextlib.contextmanager
def patched(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> Iterator[torch.nn.Module]:
    """``module`` with some tensors replaced (by state-dict name), its own put back on exit.

    The given tensors are swapped in, not copied over the module's own: a model mapped from its
    files stays mapped, where a write in place would copy every page it touches into the
    process's memory for good (docs/scale.md). Assigning ``.data`` records no gradient."""
    slots = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers())
    unknown = [n for n in tensors if n not in slots]
    if unknown:
        raise UserError(f"tensor {unknown[0]} is not in the loaded model; is the pool's base the same architecture?")
    own: List = []
    try:
        for name, value in tensors.items():
            slot = slots[name]
            if tuple(value.shape) != tuple(slot.shape):
                raise UserError(f"tensor {name}: shape {tuple(value.shape)}, the loaded model's {tuple(slot.shape)}")
            own.append((slot, slot.data))
            slot.data = value.to(slot.device, slot.dtype)
        yield module
    finally:
        for slot, data in reversed(own):  # reversed: a tied tensor named twice gets its first (own) value back
            slot.data = data


def auto_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
