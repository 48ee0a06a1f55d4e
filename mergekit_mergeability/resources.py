"""Files shipped under ``configs/`` (tasks, demo data): in the wheel as ``mergekit_mergeability/_configs``."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped(relative: str) -> Path:
    packaged = _PACKAGE / "_configs" / relative
    return packaged if packaged.exists() else _PACKAGE.parent / "configs" / relative
