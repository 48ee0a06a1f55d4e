"""Tiny real Hugging Face models with an offline tokenizer: a public utility for trying
mergekit-mergeability (and testing a plugin's methods or diagnostics) without a download.

``demo --quick`` runs the whole pipeline on these, the package's tests and examples use
them, and a plugin's tests can too::

    from mergekit_mergeability.tiny import make_family
    family = make_family(tmp_path / "models", "llama", experts=2)   # {"base": Path, "expert0": ...}

Models are built from transformers config classes with small sizes (tens of thousands
of parameters; any of ``ARCHITECTURES``); the tokenizer is a byte-level BPE trained on a few
sentences. A family is written with ``save_pretrained`` in about a second. The numbers
such models produce mean nothing: they exercise the mechanics, not the predictions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

import torch
import transformers

ARCHITECTURES: Dict[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "mistral": "MistralConfig",
    "gemma": "GemmaConfig",
    "gpt2": "GPT2Config",
}

CORPUS = [
    "The capital of France is Paris.",
    "Water boils at one hundred degrees.",
    "The quick brown fox jumps over the lazy dog.",
    "Merging models keeps what each fine-tune learned, sometimes.",
]


def train_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``CORPUS``, in memory. Saving is the caller's
    ``save_pretrained(folder)``: a function that writes wherever its argument points turns
    a string passed by mistake (a prompt) into a folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def config(arch: str, vocab_size: int, layers: int = 4):
    cls = getattr(transformers, ARCHITECTURES[arch])
    if arch == "gpt2":
        return cls(
            vocab_size=vocab_size, n_embd=32, n_layer=layers, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0
        )
    extra = {"head_dim": 8} if arch == "gemma" else {}
    return cls(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **extra,
    )


def make_family(
    root: Path, arch: str = "llama", experts: int = 2, layers: int = 4, seed: int = 0, scale: float = 0.02
) -> Dict[str, Path]:
    """A base model and ``experts`` fine-tunes (base + seeded noise), as local folders."""
    root.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_config(config(arch, len(tok), layers))
    paths = {"base": _save(base, tok, root / "base")}
    for i in range(experts):
        generator = torch.Generator().manual_seed(seed * 1000 + i + 1)
        expert = transformers.AutoModelForCausalLM.from_config(base.config)
        expert.load_state_dict(
            {k: v + scale * torch.randn(v.shape, generator=generator) for k, v in base.state_dict().items()}
        )
        paths[f"expert{i}"] = _save(expert, tok, root / f"expert{i}")
    return paths


def _save(model, tok, directory: Path) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory


def state_dict(path: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: Dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def derive(base: Path, folder: Path, update: Callable[[str, torch.Tensor], torch.Tensor]) -> Path:
    """A copy of the model folder ``base`` with ``update(name, tensor)`` added to every tensor."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(base, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    tensors = {name: (tensor + update(name, tensor)).contiguous() for name, tensor in state_dict(base).items()}
    save_file(tensors, Path(folder) / "model.safetensors", metadata={"format": "pt"})
    return Path(folder)


def make_adapter(
    base: Path,
    folder: Path,
    tensors,
    rank: int = 4,
    alpha: float = 8.0,
    seed: int = 0,
    scale: float = 0.05,
    base_name=None,
) -> Path:
    """A PEFT LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, peft's
    key names) with seeded random factors for the base tensors named in ``tensors``
    (``model.layers.0.mlp.up_proj.weight``...); its config names ``base_name`` (default: ``base``)."""
    import json

    from safetensors.torch import save_file

    from mergekit_mergeability.sources import tensor_index

    shapes = {name: info.shape for name, info in tensor_index(base).items()}
    generator = torch.Generator().manual_seed(seed)
    factors = {}
    for name in tensors:
        module = name[: -len(".weight")]
        rows, columns = shapes[name]
        factors[f"base_model.model.{module}.lora_A.weight"] = scale * torch.randn(rank, columns, generator=generator)
        factors[f"base_model.model.{module}.lora_B.weight"] = scale * torch.randn(rows, rank, generator=generator)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(factors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base if base_name is None else base_name),
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted({n.split(".")[-2] for n in tensors}),
        "use_rslora": False,
        "fan_in_fan_out": False,
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def shaped(folder: Path, model_config, dtype: str = "bfloat16", tokenizer=None) -> Path:
    """A model folder of any size on almost no disk: ``model_config``'s config.json, ``tokenizer``
    (default: the tiny one), and one safetensors file whose header lists every tensor of that architecture and
    whose data is a sparse run of zeros (nothing written). For what must read headers only, such
    as a 7B-shape ``--dry-run``; reading its tensors gives zeros."""
    import json
    import os
    import struct

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        shapes = {
            n: tuple(t.shape)
            for n, t in transformers.AutoModelForCausalLM.from_config(model_config).state_dict().items()
        }
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        length = size * int(torch.Size(shape).numel())
        header[name] = {
            "dtype": {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + length],
        }
        offset += length
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(folder / "model.safetensors", "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
    os.truncate(folder / "model.safetensors", 8 + len(encoded) + offset)
    model_config.torch_dtype = dtype
    model_config.save_pretrained(folder)
    (tokenizer or train_tokenizer()).save_pretrained(folder)
    return folder
