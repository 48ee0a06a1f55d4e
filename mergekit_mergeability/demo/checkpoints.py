"""Demo model folders that cost little disk: one shard per editable matrix.

The base is saved with each decoder layer's ``mlp.up_proj`` in its own shard and
everything else in one. An expert that changed a few of those matrices is an
ordinary Hugging Face folder (transformers and mergekit load it as usual) whose
unchanged shards are hard links to the base's files: ~4 MB instead of ~540 MB.
A merge of such experts is rewritten the same way once mergekit has written it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Dict

import torch
from safetensors.torch import save_file

EDITABLE = ".mlp.up_proj.weight"
REST = "model-rest.safetensors"


def shard_of(name: str) -> str:
    return f"model-{name[: -len('.weight')].replace('.', '-')}.safetensors" if name.endswith(EDITABLE) else REST


def save_base(model, tokenizer, folder: Path) -> Path:
    """Save ``model`` in the sharded layout, atomically (a temporary folder renamed at the end)."""
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.config.architectures = [type(model).__name__]  # mergekit reads it; save_pretrained would set it
    model.config.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    _write_shards(state, partial)
    os.replace(partial, folder)
    return folder


def save_expert(base: Path, changed: Dict[str, torch.Tensor], folder: Path) -> Path:
    """A folder like ``base`` with the ``changed`` editable matrices replaced; the rest linked."""
    unknown = [n for n in changed if shard_of(n) == REST]
    if unknown:
        raise ValueError(f"{unknown[0]}: only {EDITABLE} matrices have their own shard")
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rewritten = {shard_of(n) for n in changed}
    for item in base.iterdir():
        if item.name not in rewritten:
            _link(item, partial / item.name)
    for name, tensor in changed.items():
        save_file({name: tensor.detach().contiguous()}, partial / shard_of(name), metadata={"format": "pt"})
    os.replace(partial, folder)
    return folder


def save_adapter(base: Path, factors: Dict[str, tuple], folder: Path) -> Path:
    """The factors (tensor name -> (A, B), ΔW = B·A) as a peft LoRA adapter folder on ``base``
    (lora_alpha = r, so peft's scale is 1), atomically."""
    from mergekit_mergeability.files import atomic_folder
    from mergekit_mergeability.sources.adapter import CONFIG, WEIGHTS

    ranks = {a.shape[0] for a, _ in factors.values()}
    if len(ranks) != 1:
        raise ValueError(f"one rank per adapter, got {sorted(ranks)}")
    (rank,) = ranks
    tensors = {}
    for name, (a, b) in factors.items():
        module = name[: -len(".weight")]
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.detach().contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.detach().contiguous()
    targets = sorted({name.split(".")[-2] for name in factors})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": rank,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
    }
    layers = [re.search(r"\.layers\.(\d+)\.", name) for name in factors]
    if all(layers):  # so that peft builds LoRA on these layers only, and warns of no missing keys
        config |= {"layers_to_transform": sorted({int(m[1]) for m in layers}), "layers_pattern": "layers"}
    with atomic_folder(folder) as partial:
        partial.mkdir(parents=True)
        (partial / CONFIG).write_text(json.dumps(config, indent=2))
        save_file(tensors, partial / WEIGHTS, metadata={"format": "pt"})
    return folder


def compact(base: Path, folder: Path) -> bool:
    """Rewrite mergekit's output ``folder`` in this layout when it differs from ``base`` only in
    editable matrices (as every merge of the demo's experts does): those get their own shard,
    every other shard becomes a link to the base's. Returns whether it did; otherwise the
    folder stays as mergekit wrote it. Config and tokenizer files are mergekit's own."""
    merged, original = _tensors(folder), _tensors(base)
    changed = {n: t for n, t in merged.items() if n not in original or not torch.equal(t, original[n])}
    if merged.keys() != original.keys() or any(shard_of(n) == REST for n in changed):
        return False
    for file in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        file.unlink()
    for file in ({shard_of(n) for n in original} - {shard_of(n) for n in changed}) | {"model.safetensors.index.json"}:
        _link(base / file, folder / file)
    for name, tensor in changed.items():
        save_file({name: tensor.contiguous()}, folder / shard_of(name), metadata={"format": "pt"})
    return True


def _tensors(folder: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: tensor for file in sorted(folder.glob("*.safetensors")) for name, tensor in load_file(file).items()}


def _write_shards(state: Dict[str, torch.Tensor], folder: Path) -> None:
    shards: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        shards.setdefault(shard_of(name), {})[name] = tensor
    for file, tensors in shards.items():
        save_file(tensors, folder / file, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": {n: shard_of(n) for n in sorted(state)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed: copy
        shutil.copy2(source, target)
