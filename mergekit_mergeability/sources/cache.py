"""Results kept on disk by what they were computed from, and a model's content hash to key them by."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Optional

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.sources import Source, model_files


class Cache:
    """One JSON file per result under ``folder``; ``None`` folder caches nothing."""

    def __init__(self, folder: Optional[Path]):
        self.folder = Path(folder) if folder else None

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, key: str) -> Optional[dict]:
        if self.folder is None:
            return None
        path = self.folder / f"{key}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def put(self, key: str, value: dict) -> dict:
        if self.folder is not None:
            write_atomic(self.folder / f"{key}.json", json.dumps(value))
        return value


def fingerprint(folder: Source) -> str:
    """A model folder's content hash: its config.json and every weight file, whatever the
    format (``sources.model_files``; a folder without weights is refused);
    memoised by size and mtime. An adapter's: its base's and its own files'."""
    digest = hashlib.sha256()
    for file in model_files(folder):
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}".encode())
        digest.update(_file_digest(file, stat.st_size, stat.st_mtime_ns).encode())
    return digest.hexdigest()


_digests: Dict[tuple, str] = {}


def _file_digest(file: Path, size: int, mtime: int) -> str:
    key = (str(file.resolve()), size, mtime)
    if key not in _digests:
        with open(file, "rb") as handle:
            _digests[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _digests[key]
