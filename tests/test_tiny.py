"""The tiny-model utility (public: demo --quick, examples and plugin tests use it), and the
repository it lives in holding nothing it did not mean to."""

import re
import subprocess

import pytest

from conftest import REPO


def test_training_the_tiny_tokenizer_writes_nothing(tmp_path, monkeypatch):
    from mergekit_mergeability.tiny import CORPUS, train_tokenizer

    monkeypatch.chdir(tmp_path)
    tokenizer = train_tokenizer()
    assert list(tmp_path.iterdir()) == []
    assert tokenizer.decode(tokenizer(CORPUS[0])["input_ids"]) == CORPUS[0]


def test_every_tracked_path_is_a_plain_name():
    """A stray output (a tokenizer once saved into a folder named after a prompt) shows up here."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    assert [p for p in listed.stdout.splitlines() if not re.fullmatch(r"[\w./+-]+", p)] == []


def test_one_schema_version_for_every_json_the_package_writes():
    definitions = [
        p
        for p in (REPO / "mergekit_mergeability").rglob("*.py")
        if re.search(r"^SCHEMA_VERSION\s*=", p.read_text(), re.M)
    ]
    assert [p.name for p in definitions] == ["files.py"]
