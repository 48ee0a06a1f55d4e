"""What planning a hundred LoRA adapters with rehearsal costs, against the 10 minutes the plan may take.

The pool: the `tuning` family's ten trained experts of SmolLM2-135M-Instruct (LoRA rank 4 on the
attention of layers 15-29; ``python research/run.py tuning measure`` trains them), each copied into
``--adapters / 10`` variants whose factors carry seeded noise (the first copy is the trained
adapter itself), each with its task's 16-item probe. Nothing is scored for quality here: the copies
share tasks, so the plan's choice says nothing; its cost is what a pool of that many adapters of
that shape costs. ``mergekit-mergeability plan --pool ADAPTERS --base BASE --probes PROBES`` runs in
a fresh process at the default ``--budget-evals``, as a user runs it; the report splits its time
into the precheck of the pool (weights and the base on every probe), the search and the
rehearsal (plan.json's ``checked``).

    python benchmarks/plan_adapters.py [--adapters 100] [--work DIR] [--limit N]
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from _models import workdir

from mergekit_mergeability.files import default_cache_dir

SMOLLM2 = default_cache_dir() / "demo" / "smollm2"  # where the research's demo cache keeps them
BASE, TRAINED, PROBES = SMOLLM2 / "base", SMOLLM2 / "experts" / "tuning", SMOLLM2 / "probes" / "tuning"
TARGET_SECONDS = 600


def pool(work: Path, count: int) -> tuple:
    """``count`` adapters and their probes under ``work`` (kept between runs), and the base."""
    if not TRAINED.is_dir():
        raise SystemExit(f"{TRAINED}: no trained experts (python research/run.py tuning measure trains them)")
    trained = sorted(TRAINED.iterdir())
    adapters, probes = work / "adapters", work / "probes"
    probes.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        source = trained[i % len(trained)]
        task = source.name.removeprefix("fact_")
        name = f"a{i:03d}_{task}"
        folder = adapters / name
        if not folder.is_dir():
            partial = adapters / f".{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
            if i >= len(trained):  # a variant: the trained factors with seeded noise
                generator = torch.Generator().manual_seed(i)
                factors = load_file(source / "adapter_model.safetensors")
                noisy = {k: v + 0.3 * v.std() * torch.randn(v.shape, generator=generator) for k, v in factors.items()}
                save_file(noisy, partial / "adapter_model.safetensors", metadata={"format": "pt"})
            partial.rename(folder)
        shutil.copyfile(PROBES / f"{task}.jsonl", probes / f"{name}.jsonl")
    return BASE, adapters, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", type=int, default=100)
    parser.add_argument("--work", type=Path, help="keep the adapters here (default: a temporary folder)")
    parser.add_argument("--limit", type=int, help="items per probe (default: the precheck's)")
    parser.add_argument("--budget-evals", type=int, help="default: plan's")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="what plan loads the models in"
    )
    args = parser.parse_args()
    with workdir(args.work, "plan-adapters-") as work:
        base, adapters, probes = pool(work, args.adapters)
        out = work / "plan"
        shutil.rmtree(out, ignore_errors=True)
        command = [str(Path(sys.executable).parent / "mergekit-mergeability"), "plan", "--pool", str(adapters)]
        command += ["--base", str(base), "--probes", str(probes), "--out", str(out), "--device", "cpu"]
        command += ["--dtype", args.dtype, "--no-cache"]
        command += ["--limit", str(args.limit)] * (args.limit is not None)
        command += ["--budget-evals", str(args.budget_evals)] * (args.budget_evals is not None)
        log = work / "plan.log"
        started = time.perf_counter()
        with log.open("w") as written:
            done = subprocess.run(command, stdout=written, stderr=subprocess.STDOUT, text=True)
        seconds = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(log.read_text()[-3000:])
        plan = json.loads((out / "plan.json").read_text())
    checked = plan.get("checked") or {}
    rehearsal = checked.get("seconds", 0.0)
    planned = [len(m["members"]) for m in plan["models"]]
    print(
        f"plan on {args.adapters} LoRA adapters of SmolLM2-135M-Instruct in {args.dtype}, rehearsal budget {checked.get('budget')}:"
    )
    measured = len(checked.get("candidates", []))
    print(
        f"  whole plan {seconds:6.0f} s: precheck and search {seconds - rehearsal:4.0f} s, rehearsal {rehearsal:4.0f} s"
    )
    print(f"  rehearsal: {measured} merged models measured, {checked.get('spent')} of them from the budget")
    print(f"  planned model sizes: {planned}; its log: {log}" if args.work else f"  planned model sizes: {planned}")
    print(f"  against the target of {TARGET_SECONDS} s: {seconds / TARGET_SECONDS:.2f}x of it")


if __name__ == "__main__":
    main()
