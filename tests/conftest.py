import shutil
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
    text = (
        text.replace("./models/expert_a", str(family["expert0"]))
        .replace("./models/expert_b", str(family["expert1"]))
        .replace("./models/base", str(family["base"]))
    )
    path = tmp_path / name
    path.write_text(text)
    return path


def noise(seed: int, scale: float, where=lambda name: True):
    """An update for ``tiny.derive``: seeded Gaussian noise on the tensors ``where`` selects."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return lambda name, tensor: scale * torch.randn(tensor.shape, generator=generator) * where(name)


def ranked_probes(path: Path, model_dir: Path, questions, choices, pick: int) -> Path:
    """Multiple-choice probes whose gold answer is the choice the model ranks ``pick``-th (0 = its
    favourite), asked as the task scores them (the knowledge the shipped calibration reads)."""
    import json

    import torch

    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.diagnostics.activations import choice_logprobs
    from mergekit_mergeability.tasks.probes import Instance

    model, tok = load_causal_lm(model_dir)
    instances = [Instance(f"{q}\nAnswer:", tuple(f" {c}" for c in choices), 0) for q in questions]
    labels = [int(torch.argsort(s, descending=True)[pick]) for s, _ in choice_logprobs(model, tok, instances)]
    path.write_text(
        "".join(
            json.dumps({"question": q, "choices": list(choices), "label": l}) + "\n" for q, l in zip(questions, labels)
        )
    )
    return path


# Damaged and mismatched copies of a model folder, as users end up with them.


def truncated(source: Path, folder: Path, cut: int = 7) -> Path:
    """A copy whose safetensors file lost its last bytes, as an interrupted download does."""
    shutil.copytree(source, folder)
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-cut])
    return folder


def garbled(source: Path, folder: Path) -> Path:
    """A copy whose safetensors header is overwritten with junk."""
    shutil.copytree(source, folder)
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:24] = b"\x00garbage\xff\xfe!!!!!!!"
    file.write_bytes(bytes(data))
    return folder


def relabelled(source: Path, folder: Path, swap=(5, 6)) -> Path:
    """A copy whose tokenizer gives two token ids each other's tokens: same shapes, other words."""
    import json

    shutil.copytree(source, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = (next(t for t, i in vocab.items() if i == n) for n in swap)
    vocab[first], vocab[second] = swap[1], swap[0]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def widened(source: Path, folder: Path, hidden_size: int = 48) -> Path:
    """A random model like ``source`` but wider, with ``source``'s tokenizer."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(source)
    config.hidden_size = hidden_size
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for tokenizer_file in source.glob("tokenizer*"):
        shutil.copy(tokenizer_file, folder)
    return folder


def precheck_cli(config: Path, out: Path, *extra: str):
    """``mergekit-mergeability precheck CONFIG --out OUT --quiet EXTRA…`` through click's test runner."""
    from click.testing import CliRunner

    from mergekit_mergeability.cli import main

    return CliRunner().invoke(main, ["precheck", str(config), "--out", str(out), "--quiet", *extra])
