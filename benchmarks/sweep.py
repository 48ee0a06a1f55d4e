"""Time per λ point of `sweep` against one plain lm-eval run of the same model and task.

The demo's models: SmolLM2-135M-Instruct (A) and its thinking variant (B), from the demo
cache (built there if missing), on the demo's task (64 held-out two-digit additions,
greedy, up to 32 tokens each). The sweep evaluates --points λ with no score cache: each
point builds the λ-model in memory (mergekit's linear on the tensors A and B differ in),
patches it into the loaded module and scores every answer. The plain run is what a user
does today for one λ, on the same model written to a folder:

- `lm_eval run --model hf ...` in a fresh process (start-up, imports, model and task loading);
- `simple_evaluate(model="hf", ...)` in this process (model and task loading, no start-up).

Target: a sweep point ≤ 1.2× one plain run. Medians of --repeats, alternating.

    python benchmarks/sweep.py [--points 5] [--repeats 3]
"""

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from _models import workdir

from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.demo import reasoning
from mergekit_mergeability.demo.steps import FULL, Demo
from mergekit_mergeability.sources.cache import Cache
from mergekit_mergeability.tasks.lmeval import quiet_harness, shipped_tasks
from mergekit_mergeability.settings import SweepSettings
from mergekit_mergeability.interpolation.sweeping import Sweep, grid

SETTINGS = SweepSettings(device="cpu", quiet=True)


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def plain_cli(folder: Path) -> None:
    arguments = f"pretrained={folder},dtype=float32"
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "hf",
        "--model_args",
        arguments,
        "--tasks",
        reasoning.TASK,
    ]
    command += ["--include_path", str(shipped_tasks()), "--device", "cpu", "--batch_size", "16"]
    subprocess.run(command, check=True, capture_output=True)


def plain_in_process(folder: Path) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(shipped_tasks()), include_defaults=False)
    with quiet_harness():
        simple_evaluate(
            model="hf",
            model_args={"pretrained": str(folder), "dtype": "float32"},
            tasks=[reasoning.TASK],
            task_manager=manager,
            device="cpu",
            batch_size=16,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=5, help="λ points of the timed sweep, evenly over [0, 1]")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with workdir(None, "sweep-benchmark-") as work:
        demo = Demo(FULL, default_cache_dir() / "demo", work / "demo", Console(), quiet=True)
        a, b = str(demo.base()), str(reasoning.thinking_model(demo))
        lambdas = grid(f"0:1:{1 / (args.points - 1)}")

        setup = {}
        start = time.perf_counter()
        sweep = Sweep(a, b, None, reasoning.TASK, replace(SETTINGS, lambdas=lambdas, refine=0), Cache(None))
        setup["checks, task and tensor plan"] = time.perf_counter() - start
        setup["loading A once"] = timed(sweep.lm)
        middle = lambdas[len(lambdas) // 2]
        folder = sweep.save_model(middle, work / f"lambda_{middle:g}")  # the plain runs score this λ-model from disk

        per_point, cli, in_process = {lam: [] for lam in lambdas}, [], []
        for _ in range(args.repeats):
            for lam in lambdas:
                per_point[lam].append(timed(lambda: sweep.record(lam)))
            cli.append(timed(lambda: plain_cli(folder)))
            in_process.append(timed(lambda: plain_in_process(folder)))
    point = statistics.median([t for times in per_point.values() for t in times])
    same, fresh, warm = statistics.median(per_point[middle]), statistics.median(cli), statistics.median(in_process)
    print(f"A {a}\nB {b}\ntask {reasoning.TASK}: 64 problems, greedy; {len(sweep.interpolated)} tensors interpolated")
    for what, seconds in setup.items():
        print(f"sweep set-up, once: {what}: {seconds:.2f} s")
    print(
        "sweep, per λ point (median of repeats): "
        + ", ".join(f"λ = {lam:g} {statistics.median(t):.2f} s" for lam, t in per_point.items())
    )
    print(
        f"plain `lm_eval run` on the λ = {middle:g} folder: {fresh:.2f} s; the sweep's λ = {middle:g} point: {same / fresh:.2f}x, its median point: {point / fresh:.2f}x"
    )
    print(
        f"plain simple_evaluate in this process:   {warm:.2f} s; the sweep's λ = {middle:g} point: {same / warm:.2f}x, its median point: {point / warm:.2f}x"
    )
    total = sum(setup.values()) + sum(statistics.median(t) for t in per_point.values())
    print(
        f"a whole {len(lambdas)}-point sweep, set-up included: {total:.1f} s = {total / len(lambdas):.2f} s per point, {total / len(lambdas) / warm:.2f}x the in-process run"
    )


if __name__ == "__main__":
    main()
