import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from mergekit_mergeability.tiny import ARCHITECTURES, make_family  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """Tiny base + two experts per architecture, built once per session."""
    root = tmp_path_factory.mktemp("models")
    return {arch: make_family(root / arch, arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def llama(families):
    return families["llama"]


def shipped_config(name: str, family, tmp_path: Path, edit=None) -> Path:
    """A config from configs/ (with ``edit = (old, new)`` applied) pointed at a tiny family."""
    text = (REPO / "configs" / name).read_text()
    if edit:
        assert edit[0] in text, edit
        text = text.replace(*edit)
    text = text.replace("./models/expert_a", str(family["expert0"])).replace(
        "./models/expert_b", str(family["expert1"])
    ).replace("./models/base", str(family["base"]))
    path = tmp_path / name
    path.write_text(text)
    return path
