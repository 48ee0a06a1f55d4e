"""Output files: written whole or not at all, readable as any file the user writes."""

import os

import pytest

from mergekit_mergeability.files import write_atomic


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
    before = os.umask(umask)
    try:
        path = write_atomic(tmp_path / "report" / "precheck.json", "{}\n")
    finally:
        os.umask(before)
    assert path.read_text() == "{}\n"
    assert path.stat().st_mode & 0o777 == mode
    assert [p.name for p in path.parent.iterdir()] == ["precheck.json"]  # no temporary left beside it


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "out.json", None)
    assert list(tmp_path.iterdir()) == []
