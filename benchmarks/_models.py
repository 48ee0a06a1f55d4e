"""~100M-parameter Llama-style models (base + experts = base + seeded noise) for the benchmarks."""

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import torch
import transformers


def build_models(root: Path, experts: int = 2, layers: int = 8) -> dict:
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    paths = {}
    for name in ["base", *(f"expert{i}" for i in range(experts))]:
        if name != "base":
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p), alpha=0.01)
        paths[name] = root / name
        model.save_pretrained(paths[name])
    print(f"models: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters each, in {root}")
    return paths


@contextlib.contextmanager
def workdir(given: Optional[Path], prefix: str) -> Iterator[Path]:
    """``--work DIR`` as given (kept), or a temporary folder removed afterwards."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        yield Path(folder)
