"""Cost of the precheck's two heavy passes against the work they cannot avoid.

1. Weight pass (task-vector statistics, base + 3 experts, ~100M parameters each)
   vs just reading the same safetensors bytes (file reads). Target <= 1.5x. Also
   vs touching the already-mapped blocks once, a floor no real reader reaches.
   Peak anonymous memory (RssAnon, sampled) above the idle process, for models of
   8 and 16 layers: it must stay at a few tensors and not grow with the model.
2. Activation pass (hidden states at every layer, pooled over spans; the last
   position's logits alone, as the representations run it) vs plain forward passes
   (every position's logits) over the same padded batches. Target <= 1.3x.

Each measurement is the median of --repeats runs, in one process, alternating.

    python benchmarks/precheck.py [--repeats 3] [--work DIR]
"""

import argparse
import contextlib
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from _models import build_models, workdir
from mergekit_mergeability.sources import TensorReader, load_causal_lm
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.activations import encode, hidden_means, pad
from mergekit_mergeability.diagnostics.weights import WeightStatistics
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tiny import train_tokenizer

PROMPTS = [
    (f"Question {i}: what does the fine-tune number {i} know about merging models?", f" Answer {i}: quite a lot.")
    for i in range(64)
]


def rss_anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakMemory:
    """Samples RssAnon every 5 ms while the block runs (file-backed mmap pages excluded).
    ``phase(label)`` also records where a part of the block starts, peaks and ends (``phases``:
    label, depth, then MiB above the block's start; a phase may hold others)."""

    def __enter__(self):
        self.start = rss_anon_mib()
        self.peak = self.start
        self.phases = []  # [label, depth, start, peak, end], in the order they start
        self._open = []  # [peak] of each phase now running
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while self._running:
            now = rss_anon_mib()
            self.peak = max(self.peak, now)
            for running in list(self._open):
                running[0] = max(running[0], now)
            time.sleep(0.005)

    @contextlib.contextmanager
    def phase(self, label: str):
        begun = rss_anon_mib()
        running = [begun]
        entry = [label, len(self._open), begun - self.start]
        self.phases.append(entry)
        self._open.append(running)
        try:
            yield
        finally:
            self._open.pop()  # phases nest, so the last opened ends first
            end = rss_anon_mib()
            entry += [max(running[0], end) - self.start, end - self.start]

    def __exit__(self, *exc):
        self._running = False
        self._thread.join()
        self.growth = self.peak - self.start


def read_files(paths: dict) -> None:
    """The I/O floor: read each model's safetensors bytes into memory, file by file."""
    for folder in paths.values():
        for file in sorted(folder.glob("*.safetensors")):
            file.read_bytes()


def read_only(paths: dict) -> None:
    """The floor: read every block of every model once, as the weight pass does."""
    readers = [TensorReader(p) for p in paths.values()]
    for name in readers[0].index:
        for start, stop in readers[0].blocks(name):
            for reader in readers:
                reader.rows(name, start, stop).float().sum()


def weight_pass(paths: dict) -> None:
    inputs = DiagnosticInputs(
        ModelInput("base", paths["base"]),
        tuple(ModelInput(n, p) for n, p in paths.items() if n != "base"),
        PrecheckSettings(quiet=True),
    )
    WeightStatistics().run(inputs)


@torch.inference_mode()
def plain_forward(model, tokenizer, batch_size: int = 16) -> None:
    encoded = [encode(tokenizer, p, c) for p, c in PROMPTS]
    for start in range(0, len(encoded), batch_size):
        ids, mask = pad(encoded[start : start + batch_size])
        model(input_ids=ids, attention_mask=mask)


def activation_pass(model, tokenizer) -> None:
    for _ in hidden_means(model, tokenizer, PROMPTS, batch_size=16):
        pass


def timed(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def alternate(repeats: int, **runs) -> dict:
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--memory-of", type=Path, help=argparse.SUPPRESS)  # internal: one measurement per process
    args = parser.parse_args()
    if args.memory_of:
        paths = {p.name: p for p in sorted(args.memory_of.iterdir()) if p.is_dir() and any(p.glob("*.safetensors"))}
        with PeakMemory() as peak:
            weight_pass(paths)
        print(peak.growth)
        return
    with workdir(args.work, "mm-bench-precheck-") as work:
        benchmark(work, args.repeats)


def benchmark(work: Path, repeats: int) -> None:
    print("1. weight pass")
    # the fixed cost of a pass (torch's own buffers, file handles): tiny models, ~40K parameters
    from mergekit_mergeability.tiny import make_family

    make_family(work / "tiny", "llama", experts=3)
    done = subprocess.run(
        [sys.executable, __file__, "--memory-of", str(work / "tiny")], capture_output=True, text=True, check=True
    )
    print(f"   tiny models: peak memory growth {float(done.stdout.split()[-1]):.0f} MiB (the fixed cost)")
    for layers in (8, 16):
        paths = build_models(work / f"models{layers}", experts=3, layers=layers)
        size = sum(p.stat().st_size for p in paths["base"].glob("*.safetensors")) / 2**20
        largest = max(math.prod(i.shape) for i in TensorReader(paths["base"]).index.values()) * 4 / 2**20
        # a fresh process: the allocator keeps what earlier runs freed
        done = subprocess.run(
            [sys.executable, __file__, "--memory-of", str(work / f"models{layers}")],
            capture_output=True,
            text=True,
            check=True,
        )
        growth = float(done.stdout.split()[-1])
        print(
            f"   {layers} layers: model {size:.0f} MiB, largest tensor {largest:.0f} MiB, peak memory growth {growth:.0f} MiB = {growth / size:.2f}x one model"
        )
        if layers == 8:
            t = alternate(
                repeats,
                files=lambda: read_files(paths),
                mapped=lambda: read_only(paths),
                weights=lambda: weight_pass(paths),
            )
            print(f"   weight statistics {t['weights']:.2f} s")
            print(
                f"   vs reading the safetensors files' bytes {t['files']:.2f} s: {t['weights'] / t['files']:.2f}x (target <= 1.5x)"
            )
            print(
                f"   vs touching every memory-mapped block once {t['mapped']:.2f} s: {t['weights'] / t['mapped']:.2f}x (the memory-bandwidth floor)"
            )

    print("2. activation pass (64 probe rows, batch 16)")
    train_tokenizer().save_pretrained(work / "models8" / "base")  # an offline tokenizer beside the weights
    model, tok = load_causal_lm(work / "models8" / "base")
    t = alternate(repeats, plain=lambda: plain_forward(model, tok), activations=lambda: activation_pass(model, tok))
    print(
        f"   plain forward {t['plain']:.2f} s, activation pass {t['activations']:.2f} s: {t['activations'] / t['plain']:.2f}x (target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
