"""What the precheck of three experts costs from 135M to 70B shapes, estimated here without a weight.

For each Llama shape (SmolLM2-135M's, TinyLlama-1.1B's, Llama-3.2-3B's, Llama-2-7B's, Llama-3-70B's), a base and
three fine-tunes are written as headers over sparse zeros (``tiny.shaped``: no disk, no tensor
read), given the probes of ``--config`` (default: the `tuning` family's first three-expert draw,
16 items each, and its base's tokenizer), and ``--dry-run``'s estimate is printed phase by phase:
the pace of one block of that shape timed on this device (cached), times the probes' tokens. With
``--tune-budget 0`` beside the default, the knob grid's share shows. A full rehearsal at 7B is not
run for hours: this is its estimate from a timed sample, and benchmarks/cost_line.py checks such
estimates against whole runs where they are affordable (135M, 1.1B). ``--dtype`` overrides the
config's ``dtype:``; ``--tokenizer`` reads the probes with a local tokenizer where the config's base
is a hub id (``examples/own-config/config.yml``: three 7B fine-tunes, 16 items each, bfloat16).

    python benchmarks/sizes.py [--config CONFIG.yml] [--sizes 135M,1.1B,3B,7B,70B] [--device cpu]
        [--dtype bfloat16] [--tokenizer FOLDER]
"""

import argparse
import tempfile
from pathlib import Path

import transformers
import yaml

from mergekit_mergeability import api
from mergekit_mergeability.cost import duration
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tiny import shaped

DEFAULT = Path("pools-out/tuning/configs/n3_0_task_arithmetic.yml")
SHAPES = {
    "135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "1.1B": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False),
    "3B": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}  # fmt: skip


def at_size(config: Path, shape: dict, root: Path, dtype=None, tokenizer_from=None) -> Path:
    """``config`` with its base and models replaced by models of ``shape`` (its probes kept), in
    ``dtype`` where given, with the tokenizer of ``tokenizer_from`` (default: the config's base)."""
    document = yaml.safe_load(config.read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_from or document["base_model"])
    document["dtype"] = dtype or document.get("dtype")
    made = transformers.LlamaConfig(**shape)
    document["base_model"] = str(shaped(root / "base", made, tokenizer=tokenizer))
    for i, entry in enumerate(document["models"]):
        entry["model"] = str(shaped(root / f"expert{i}", made, tokenizer=tokenizer))
        if "probe" in entry:
            entry["probe"] = str((config.parent / entry["probe"]).resolve())
    written = root / "config.yml"
    written.write_text(yaml.safe_dump(document, sort_keys=False))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--sizes", default=",".join(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="the models' dtype (default: the config's dtype:)")
    parser.add_argument("--tokenizer", type=Path, help="a local folder whose tokenizer reads the probes")
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config (python research/run.py tuning measure writes it)")
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as root:
            config = at_size(args.config, SHAPES[size], Path(root), args.dtype, args.tokenizer)
            costs = {
                budget: api.precheck_cost(config, settings=PrecheckSettings(device=args.device, tune_budget=budget))
                for budget in (0, None)
            }
        tuned, menu_alone = costs[None], costs[0]
        print(
            f"{size:>5s}: 3 experts, {tuned.total:,} passes: about {duration(tuned.estimate)} on {tuned.device} "
            f"({duration(menu_alone.estimate)} with --tune-budget 0)"
            + "".join(f"; on {d}: {duration(c.estimate)}" for d, c in tuned.elsewhere.items())
        )
        for line in tuned.by_phase():
            print(f"       {line.strip()}")


if __name__ == "__main__":
    main()
