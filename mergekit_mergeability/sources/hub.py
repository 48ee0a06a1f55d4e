"""A model on the Hugging Face hub: its config, tokenizer files and safetensors headers over
HTTP, its weights downloaded only when something reads a tensor or loads it."""

from __future__ import annotations

import functools
import math
import os
import socket
from pathlib import Path
from typing import Dict, List, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources.base import ModelSource, TensorInfo
from mergekit_mergeability.sources.folder import Folder, TensorReader


class HubModel(ModelSource, os.PathLike):
    """A model on the Hugging Face hub, fetched no more than the caller needs.

    ``file`` and ``tensor_index`` read config.json, tokenizer files and the safetensors
    headers without any weight; used as a path (``Path(model)``, ``open``)
    it downloads the snapshot, once. ``str()`` stays the hub id, so reports and
    recommended configs name the model as the user did.
    """

    def __init__(self, reference: str, revision: Optional[str] = None):
        self.reference = reference  # as written: ``org/name`` or ``org/name@revision``
        self.repo_id, _, written = reference.partition("@")
        self.revision = revision or written or None
        self.where = ""  # where a config names it ("config.yml: models[0].model: "), for its errors
        self._folder: Optional[Path] = None

    def __str__(self) -> str:
        return self.reference

    def __repr__(self) -> str:
        return f"HubModel({self.reference!r})"

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
            if not any(self._folder.glob("*.safetensors")) and not offline():
                self._no_safetensors()
        return self._folder

    def file(self, name: str) -> Optional[Path]:
        """One small file of the repo (None if the hub says it has none by that name; offline, if
        the cached snapshot has none)."""
        from huggingface_hub.errors import RemoteEntryNotFoundError  # not Local…: offline is an error

        if offline():  # nothing more can come: the snapshot in the cache is the repo
            path = self.folder / name
            return path if path.is_file() else None
        try:
            return Path(self._hub("hf_hub_download", self.repo_id, name, missing_ok=RemoteEntryNotFoundError))
        except RemoteEntryNotFoundError:
            return None

    def tensor_index(self) -> Dict[str, TensorInfo]:
        if offline():  # the cached files' own headers (no tensor read)
            return Folder(self.folder).tensor_index()
        metadata = self._hub("get_safetensors_metadata", self.repo_id)
        return {
            name: TensorInfo(Path(file), tuple(info.shape), info.dtype)
            for file, header in metadata.files_metadata.items()
            for name, info in header.tensors.items()
        }

    def download(self) -> int:
        """The bytes of weights the first read of its tensors downloads: 0 where its snapshot is in
        the Hugging Face cache (or nothing can come), else the sum of its safetensors' tensors as
        the hub's metadata lists them (no weight fetched)."""
        import huggingface_hub

        if offline():
            return 0
        patterns = ["*.json", "*.safetensors"]
        try:
            cached = huggingface_hub.snapshot_download(
                self.repo_id, revision=self.revision, allow_patterns=patterns, local_files_only=True
            )
            if any(Path(cached).glob("*.safetensors")):
                return 0
        except Exception:  # not in the cache: the hub's metadata says what will come
            pass
        return sum(math.prod(i.shape) * BYTES.get(i.dtype.upper(), 1) for i in self.tensor_index().values())

    # reading tensors, hashing files, loading: the downloaded snapshot, as a local folder

    def tensors(self) -> TensorReader:
        return TensorReader(self.folder)

    def files(self) -> List[Path]:
        return Folder(self.folder).files()

    def check(self) -> Path:
        return Folder(self.folder).check()

    def load(self, device: str, dtype: str, tokenizer_from=None):
        return Folder(self.folder).load(device, dtype, tokenizer_from)

    def _hub(self, function: str, *args, missing_ok=(), **kwargs):
        import huggingface_hub  # looked up at call time, so tests can stand in for the hub

        cut_off = offline()
        if cut_off:  # files already in the hub's cache still serve; nothing else can
            if function not in ("hf_hub_download", "snapshot_download"):
                raise self._missing(_unreachable(self.repo_id, self.revision))
            kwargs["local_files_only"] = True
        if self.revision is not None:
            kwargs["revision"] = self.revision
        try:
            return getattr(huggingface_hub, function)(*args, **kwargs)
        except missing_ok:
            raise
        except Exception as error:  # offline, gated, missing: all the user can act on is the message
            if type(error).__name__ == "NotASafetensorsRepoError":
                self._no_safetensors()
            raise self._missing(_unreachable(self.repo_id, self.revision) if cut_off else _why(error)) from None

    def _missing(self, why: str) -> UserError:
        return UserError(
            f"{self.where}model {self.reference}: no such folder, and {why}; relative paths resolve against the working directory"
        )

    def _no_safetensors(self):
        """A repo of pickled weights only: mergekit reads them (``--lazy-unpickle``), the precheck does not."""
        raise UserError(
            f"{self.where}model {self.reference}: its weights on the hub are .bin files only; the precheck reads"
            " safetensors: convert them (transformers' save_pretrained(..., safe_serialization=True)) and name the folder"
        )


UNREACHABLE = "the hub ({}) cannot be reached to look it up"
BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}  # a safetensors dtype's; else 1 (8-bit)


def offline() -> bool:
    """Whether nothing can come from the hub: HF_HUB_OFFLINE is set, or its host does not resolve."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or not reachable()


def _unreachable(repo_id: str, revision: Optional[str] = None) -> str:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        asked = f"{repo_id} --revision {revision}" if revision else repo_id
        return (
            f"not in the Hugging Face cache ({constants.HF_HUB_CACHE}) with HF_HUB_OFFLINE set:"
            f" huggingface-cli download {asked}, where the hub can be reached"
        )
    return UNREACHABLE.format(_host())


def _why(error: Exception) -> str:
    """What the hub's refusal means to the user, and what to do."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, GatedRepoError):
        return "gated on the hub: accept its terms on its page, then huggingface-cli login"
    if isinstance(error, RevisionNotFoundError):
        return "the hub has no such revision of it"
    if isinstance(error, RepositoryNotFoundError):
        return "not on the hub, or private (huggingface-cli login, if it is yours)"
    return f"not on the hub ({type(error).__name__})"


def _host() -> str:
    from urllib.parse import urlparse

    from huggingface_hub import constants

    return urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT


@functools.lru_cache(maxsize=None)
def reachable() -> bool:
    """Whether the hub's host resolves (once per process). Unreachable, huggingface_hub retries
    each request with back-off for about 30 s before it gives up; with ``HF_HUB_OFFLINE`` set it
    answers from its cache at once (``offline`` says both)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    try:
        socket.getaddrinfo(_host(), 443)
    except OSError:
        return False
    return True


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
