"""Wall time and peak memory of our merge methods vs mergekit's built-in counterparts.

Three ~100M-parameter Llama-style models (base + two experts) are written once;
each merge runs in its own process through the stock mergekit-yaml (so peak RSS
is the merge's own), alternating methods over --repeats rounds; the script prints
medians and the ratios ours / built-in. Targets: time <= 1.10x, peak memory <= 1.05x.

    python benchmarks/merge_methods.py [--repeats 3] [--work DIR]
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from _models import build_models, workdir

PAIRS = {  # ours -> (built-in counterpart, our parameters, its parameters)
    "knowledge_weighted": ("task_arithmetic", {"temperature": 1e9}, {}),
    "knowledge_weighted+ties": ("ties", {"ties": True, "temperature": 1e9}, {}),
    "layer_selective": ("task_arithmetic", {"cutoff": 8}, {}),
}


PER_MODEL = {
    "task_arithmetic": {"weight": 0.5, "density": 0.5},
    "ties": {"weight": 0.5, "density": 0.5},
    "knowledge_weighted": {"knowledge": 0.5, "density": 0.5},
    "layer_selective": {"weight": 0.5},
}


def merge_config(method: str, parameters: dict, paths: dict) -> dict:
    name = method.split("+")[0]
    per_model = PER_MODEL[name]
    return {
        "merge_method": name,
        "base_model": str(paths["base"]),
        "dtype": "float32",
        "models": [{"model": str(paths[e]), "parameters": per_model} for e in ("expert0", "expert1")],
        "parameters": parameters,
    }


def run_once(config: dict, work: Path) -> tuple:
    path = work / "config.yml"
    path.write_text(yaml.safe_dump(config))
    out = work / "out"
    start = time.perf_counter()
    code = (
        "import resource, sys; from mergekit.scripts.run_yaml import main\n"
        "try: main()\nexcept SystemExit: pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path, out, "--no-write-model-card", "--no-copy-tokenizer", "--quiet"],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - start
    subprocess.run(["rm", "-rf", out], check=True)
    return seconds, int(done.stdout.strip().splitlines()[-1]) / 1024  # MiB


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    with workdir(args.work, "mm-bench-") as work:
        paths = build_models(work / "models")
        results = {}
        for _ in range(args.repeats):
            for ours, (builtin, our_params, their_params) in PAIRS.items():
                for label, method, params in (
                    (ours, ours, our_params),
                    (f"{builtin} (for {ours})", builtin, their_params),
                ):
                    results.setdefault(label, []).append(run_once(merge_config(method, params, paths), work))
    print(f"\n{'method':34} {'time s':>8} {'peak MiB':>9}   ratios vs built-in (time, memory)")
    for ours, (builtin, _, _) in PAIRS.items():
        mine, theirs = results[ours], results[f"{builtin} (for {ours})"]
        t, m = (statistics.median(x[i] for x in mine) for i in (0, 1))
        bt, bm = (statistics.median(x[i] for x in theirs) for i in (0, 1))
        print(f"{ours:34} {t:8.1f} {m:9.0f}   {t / bt:.2f}x, {m / bm:.2f}x")
        print(f"{builtin:34} {bt:8.1f} {bm:9.0f}")


if __name__ == "__main__":
    main()
