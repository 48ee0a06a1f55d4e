"""Writing results so that a reader never sees half a file."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Sequence, Union

from mergekit_mergeability.errors import UserError

# Every JSON this package writes (precheck, evaluation, mergeability, validation,
# calibration) carries it: minor versions only add fields, a major one renames or removes
# (3.0: precheck.json's options, the options given, became settings, every setting as used).
SCHEMA_VERSION = "3.1"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def writable_folder(out: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output folder that is a file or cannot be made or written in:
    a temporary folder is made in its nearest existing ancestor (or in it) and removed at once."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {out}: is a file; pass a folder (created if missing)")
    ancestor = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not ancestor.is_dir():
        raise UserError(f"{option} {out}: {ancestor} is a file, so the folder cannot be made; pass another")
    try:
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".mergeability-check."))
    except OSError as error:
        raise UserError(
            f"{option} {out}: cannot write in {ancestor} ({error.strerror}); pass a folder you can write"
        ) from None


def write_atomic(path: Path, data: Union[str, bytes]) -> Path:
    """Write to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(raw)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0600 would hide the report from the user's group
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_folder(folder: Path) -> Iterator[Path]:
    """A temporary folder beside ``folder`` to fill, renamed to ``folder`` (replacing it) when the
    block ends, removed if it fails: a reader never sees half a model."""
    folder = Path(folder)
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def read_report(path: Path, kind: str, fields: Sequence[str]) -> dict:
    """``kind``'s JSON output, checked to have ``models`` entries with ``fields``."""
    try:
        document = json.loads(Path(path).read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: no such file; run `mergekit-mergeability {kind}` first") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not JSON; expected {kind}'s output") from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) and set(fields) <= m.keys() for m in models):
        raise UserError(f"{path}: not {kind}'s output (needs models with {', '.join(fields)})")
    return document


def default_cache_dir() -> Path:
    """The user's cache for this tool ($XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mergekit-mergeability"
