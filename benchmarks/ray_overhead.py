"""What --ray costs on one small machine: the same pool single-process vs as tasks on a local Ray cluster.

The pool: a ~100M-parameter Llama-style base and --experts fine-tunes (base + seeded noise), 64
probe rows. Two passes of the precheck, each run in this process and then inside
``distributed.cluster`` on a local cluster of this machine's CPUs (``ray.init(num_cpus=N)``,
started once, before any timing, and warmed by one run of both passes; both printed apart):

1. the weight pass (task-vector statistics), one task per shard of tensors;
2. the representation pass (hidden states of every model, the base included), one task per model.

Each time is the median of --repeats runs, alternating. On 2 cores there is no speed-up to
expect; the ratio is Ray's overhead (target <= 1.3x). The numbers of both runs must be equal.

    python benchmarks/ray_overhead.py [--experts 3] [--layers 8] [--repeats 3] [--cpus 2] [--work DIR]
"""

import argparse
import os
import statistics
import time
from pathlib import Path

from _models import build_models, workdir
from mergekit_mergeability import distributed
from mergekit_mergeability.sources.architecture import tensor_position
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.representations import Representations
from mergekit_mergeability.diagnostics.weights import WeightStatistics
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tasks.probes import GENERATION, Instance
from mergekit_mergeability.tiny import train_tokenizer

ROWS = [
    Instance(
        f"Question {i}: what does fine-tune {i} know about merging?", (f" Answer {i}: quite a lot.",), 0, GENERATION
    )
    for i in range(64)
]


def inputs_of(paths: dict) -> DiagnosticInputs:
    experts = [n for n in paths if n != "base"]
    per_expert = len(ROWS) // len(experts)
    models = tuple(
        ModelInput(n, paths[n], tuple(ROWS[i * per_expert : (i + 1) * per_expert])) for i, n in enumerate(experts)
    )
    return DiagnosticInputs(ModelInput("base", paths["base"]), models, PrecheckSettings(quiet=True, device="cpu"))


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--experts", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    ray = distributed.require_ray()
    with workdir(args.work, "mm-bench-ray-") as work:
        paths = build_models(work, experts=args.experts, layers=args.layers)
        for folder in paths.values():
            train_tokenizer().save_pretrained(folder)
        inputs = inputs_of(paths)
        tensor_position("model.embed_tokens.weight")  # mergekit's architectures imported here (~3 s), not in a pass
        started, _ = timed(lambda: ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False))
        print(
            f"local Ray cluster of {args.cpus} CPUs started in {started:.1f} s (once per run; not in the times below)"
        )
        passes = {"weights": WeightStatistics(), "representations": Representations()}
        with distributed.cluster(None):  # the workers import torch, transformers and mergekit once per run
            warm, _ = timed(lambda: [diagnostic.run(inputs) for diagnostic in passes.values()])
        print(f"first run of both passes on Ray (workers importing, not in the times below): {warm:.1f} s")
        times = {(name, where): [] for name in passes for where in ("process", "ray")}
        for _ in range(args.repeats):
            for name, diagnostic in passes.items():
                seconds, here = timed(lambda: diagnostic.run(inputs))
                times[name, "process"].append(seconds)
                with distributed.cluster(None):
                    seconds, there = timed(lambda: diagnostic.run(inputs))
                times[name, "ray"].append(seconds)
                assert (here.per_model, here.per_pair, here.per_layer) == (
                    there.per_model,
                    there.per_pair,
                    there.per_layer,
                ), f"{name}: Ray's numbers differ"
        ray.shutdown()
    median = {key: statistics.median(values) for key, values in times.items()}
    print(
        f"{'pass':<16} {'one process':>12} {'local Ray':>10} {'ratio':>6}   (median of {args.repeats}; numbers equal)"
    )
    for name in passes:
        process, on_ray = median[name, "process"], median[name, "ray"]
        print(f"{name:<16} {process:>10.2f} s {on_ray:>8.2f} s {on_ray / process:>5.2f}x")
    process, on_ray = (sum(median[name, where] for name in passes) for where in ("process", "ray"))
    print(f"{'both':<16} {process:>10.2f} s {on_ray:>8.2f} s {on_ray / process:>5.2f}x   target <= 1.3x")


if __name__ == "__main__":
    main()
