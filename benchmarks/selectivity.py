"""Cost of the neuron-selectivity pass (LAPE counts) against the forward passes it rides on.

On SmolLM2-135M (the demo's base, from its cache; --model to point elsewhere), or the
~100M-parameter benchmark model when no SmolLM2 is cached:

1. The selectivity pass (hooks counting active MLP neurons per group over the answer
   span) vs a plain forward pass over the same padded batches. Target <= 1.2x. The pass
   asks for the last position's logits only (the counts need none); the plain pass
   without them too is shown, so the hooks' own cost is visible.
2. Peak anonymous memory (RssAnon, sampled) of the pass above the loaded model, at two
   probe counts, each in a fresh process, beside the plain forward pass's: it must not
   grow with the probe count more than the plain pass's does.

Each time is the median of --repeats runs, in one process, alternating.

    python benchmarks/selectivity.py [--repeats 3] [--model FOLDER] [--rows 64]
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.diagnostics.activations import encode, pad
from mergekit_mergeability.diagnostics.selectivity import activation_probabilities
from precheck import PeakMemory, alternate

CACHED = [default_cache_dir() / "demo" / "smollm2" / "base", Path("/tmp/democache/smollm2/base")]
TOPICS = ["the river", "a small boat", "the old library", "seven green apples", "the northern wind", "a quiet village"]


def rows(count: int):
    """Probe rows of two groups (English sentences, number lists), alternating; the same
    lengths however many (two-digit numbers), so memory compares like with like."""
    made, labels = [], []
    for i in range(count):
        n = 10 + i % 80
        if i % 2:
            made.append((f"Count on from {n}:", " " + ", ".join(str(n + k) for k in range(1, 9))))
        else:
            made.append(
                (
                    f"Describe {TOPICS[i % len(TOPICS)]} in one sentence:",
                    f" It was there on day {n}, as it always had been, and nobody asked why.",
                )
            )
        labels.append(i % 2)
    return made, labels


def model_folder(given, work: Path) -> Path:
    for folder in [given] if given else CACHED:
        if folder and (Path(folder) / "config.json").is_file():
            return Path(folder)
    from _models import build_models
    from mergekit_mergeability.tiny import train_tokenizer

    base = build_models(work, experts=0)["base"]
    train_tokenizer().save_pretrained(base)
    return base


@torch.inference_mode()
def plain_forward(model, tokenizer, probes, batch_size: int, **extra) -> None:
    encoded = [encode(tokenizer, p, c) for p, c in probes]
    for start in range(0, len(encoded), batch_size):
        ids, mask = pad(encoded[start : start + batch_size])
        model(input_ids=ids, attention_mask=mask, **extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="A model folder (default: the demo's cached SmolLM2).")
    parser.add_argument("--rows", type=int, default=64, help="Probe rows for the timing.")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--memory-of", type=int, help=argparse.SUPPRESS)  # internal: one measurement per process
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # internal: measure the plain pass
    args = parser.parse_args()
    folder = model_folder(args.model, Path(tempfile.mkdtemp(prefix="mm-bench-selectivity-")))
    model, tok = load_causal_lm(folder)

    if args.memory_of:
        probes, labels = rows(args.memory_of)
        with PeakMemory() as peak:
            if args.plain:
                plain_forward(model, tok, probes, args.batch_size)
            else:
                activation_probabilities(model, tok, probes, labels, 2, "answer", args.batch_size)
        print(peak.growth)
        return

    layers, width = model.config.num_hidden_layers, model.config.intermediate_size
    print(
        f"model {folder} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {layers} blocks x {width} MLP neurons), torch threads {torch.get_num_threads()}"
    )
    probes, labels = rows(args.rows)
    print(f"1. time ({args.rows} probe rows, 2 groups, batch {args.batch_size}, median of {args.repeats})")
    t = alternate(
        args.repeats,
        plain=lambda: plain_forward(model, tok, probes, args.batch_size),
        plain_no_logits=lambda: plain_forward(model, tok, probes, args.batch_size, logits_to_keep=1),
        selectivity=lambda: activation_probabilities(model, tok, probes, labels, 2, "answer", args.batch_size),
    )
    print(
        f"   plain forward {t['plain']:.2f} s, selectivity pass {t['selectivity']:.2f} s: {t['selectivity'] / t['plain']:.2f}x (target <= 1.2x)"
    )
    print(
        f"   vs a plain forward without logits {t['plain_no_logits']:.2f} s: {t['selectivity'] / t['plain_no_logits']:.2f}x (the hooks' own cost)"
    )
    print("2. peak memory above the loaded model (fresh process each)")
    for count in (args.rows, 4 * args.rows):
        growth = {}
        for name, extra in (("selectivity", []), ("plain", ["--plain"])):
            command = [
                sys.executable,
                __file__,
                "--memory-of",
                str(count),
                "--model",
                str(folder),
                "--batch-size",
                str(args.batch_size),
                *extra,
            ]
            # a fixed mmap threshold: freed batch tensors go back to the system at once instead of
            # staying in glibc's heap, so RssAnon follows what is alive
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
            )
            growth[name] = float(done.stdout.split()[-1])
        print(
            f"   {count} probe rows: selectivity pass {growth['selectivity']:.0f} MiB, plain forward {growth['plain']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
