"""Each model's results of the precheck's model passes, kept on disk (``precheck --cache-dir``).

A killed precheck then restarts where it stopped, and a lost Ray worker costs only its model:
every model whose pass finished is read back instead of run again. A result is filed under the
pass, the model's files as they are now (resolved path, each file's size and modification
time: cheap to check, unlike hashing every weight again), the probe rows and the settings that
change the numbers. Hub models are not kept (their files live in the hub's own cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.sources import base_of, model_files
from mergekit_mergeability.sources.cache import Cache

Tensors = Dict[str, torch.Tensor]


def files_stamp(source) -> Optional[list]:
    """What identifies a local model's files now (each file's path, size and modification time);
    None for a hub model, or an adapter of one."""
    if not isinstance(base_of(source), Path):
        return None
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in model_files(source)]


def kept(folder: Optional[Path], kind: str, source, settings: Any, compute: Callable[[], Tensors]) -> Tensors:
    """``compute()``'s tensors, read from ``folder`` when this model's pass already ran there."""
    stamp = files_stamp(source) if folder else None
    if stamp is None:
        return compute()
    from safetensors.torch import load_file, save

    path = Path(folder) / f"{kind}-{Cache.key(kind, stamp, settings)}.safetensors"
    if path.is_file():
        return load_file(path)
    result = compute()
    write_atomic(path, save({k: v.contiguous() for k, v in result.items()}))
    return result
