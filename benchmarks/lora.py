"""A pool of LoRA adapters on SmolLM2-135M: the precheck's weight pass adapter-native vs materialised.

Adapters of rank 16 on the projections --modules names (default q_proj and v_proj, peft's default
for Llama; ``all``: q, k, v, o, gate, up, down) of several layers, seeded random factors, written
as peft folders. The same adapters written as full model folders
(base + ΔW, ``sources.adapter.materialise``) are the materialised pool. For each pool size, in a fresh
process each: the weight pass's time and peak anonymous memory (RssAnon, sampled; file-backed
pages excluded) above the idle process, and the largest difference between the two passes'
numbers. Full folders (~540 MB each) go under --work and are deleted at the end.

    python benchmarks/lora.py [--adapters 50] [--full 5,10] [--layers 8] [--modules q_proj,v_proj|all] [--cache-dir DIR]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from precheck import PeakMemory

from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.weights import WeightStatistics
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.sources import resolve
from mergekit_mergeability.sources.adapter import materialise
from mergekit_mergeability.sources.architecture import tensor_position
from mergekit_mergeability.tiny import make_adapter

MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
PEFT_DEFAULT = "q_proj,v_proj"  # peft's target_modules for Llama when none are named


def measure(base: Path, members: list) -> dict:
    """One weight pass in this process: seconds, peak memory growth (MiB) and its numbers."""
    tensor_position("model.embed_tokens.weight")  # imports mergekit's architectures (~3 s, either way): not the pass
    inputs = DiagnosticInputs(
        ModelInput("base", base),
        tuple(ModelInput(f"#{i}", resolve(str(m))) for i, m in enumerate(members)),
        PrecheckSettings(quiet=True),
    )
    with PeakMemory() as peak:
        started = time.perf_counter()
        result = WeightStatistics().run(inputs)
        seconds = time.perf_counter() - started
    numbers = {f"{m}.{k}": v for m, values in result.per_model.items() for k, v in values.items()}
    numbers.update({f"{a}|{b}.{k}": v for (a, b), values in result.per_pair.items() for k, v in values.items()})
    return {"seconds": seconds, "memory": peak.growth, "numbers": numbers}


def in_fresh_process(base: Path, members: list) -> dict:
    # a fresh process each: the allocator keeps what earlier runs freed
    done = subprocess.run(
        [sys.executable, __file__, "--measure", str(base), *map(str, members)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def largest_difference(ours: dict, theirs: dict) -> float:
    """The largest relative difference, near 0 measured against 1e-3 (cosines of unrelated adapters).
    σ_max is left out: at rank 16 the materialised pass's 8-column sketch is only a lower bound."""
    return max(
        abs(ours[k] - theirs[k]) / max(abs(theirs[k]), 1e-3) for k in theirs if not k.endswith("top_singular_value")
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument(
        "--full", default="5,10", help="pool sizes also measured materialised (each full folder ~540 MB of disk)"
    )
    parser.add_argument("--layers", type=int, default=8, help="adapted layers (0, then evenly spread over the 30)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--modules", default=PEFT_DEFAULT, help="comma-separated projection names, or all")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir() / "demo",
        help="where the demo keeps SmolLM2 (smollm2/base)",
    )
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--measure", nargs="+", type=Path, help=argparse.SUPPRESS)  # internal: BASE MEMBER...
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1:])))
        return

    from mergekit_mergeability.demo.bases import smollm2

    base = smollm2(args.cache_dir / "smollm2" / "base")
    work = args.work or Path(tempfile.mkdtemp(prefix="mm-bench-lora-"))
    layers = sorted({round(i * 29 / max(args.layers - 1, 1)) for i in range(args.layers)})
    modules = [m for m in MODULES if args.modules == "all" or m.split(".")[-1] in args.modules.split(",")]
    targets = [f"model.layers.{layer}.{module}.weight" for layer in layers for module in modules]
    full_sizes = [int(n) for n in args.full.split(",") if n.strip()]
    sizes = sorted({*full_sizes, args.adapters})
    started = time.perf_counter()
    adapters = [
        make_adapter(
            base, work / "adapters" / f"a{i:02d}", targets, rank=args.rank, alpha=2 * args.rank, seed=i, scale=0.02
        )
        for i in range(args.adapters)
    ]
    size = sum(f.stat().st_size for f in adapters[0].iterdir()) / 2**20
    print(
        f"{args.adapters} adapters of SmolLM2-135M, rank {args.rank}, {len(targets)} matrices ({len(layers)} layers × {', '.join(m.split('.')[-1] for m in modules)}), {size:.1f} MiB each ({time.perf_counter() - started:.0f} s to write)"
    )
    try:
        full = []
        for n in full_sizes:
            while len(full) < n:
                full.append(materialise(resolve(str(adapters[len(full)])), work / "full" / f"a{len(full):02d}"))
        folder = sum(f.stat().st_size for f in full[0].iterdir()) / 2**20 if full else 0
        print(f"materialised: {len(full)} full folders of {folder:.0f} MiB each")
        print(
            f"{'pool':>5} {'adapter-native':>22} {'materialised':>22} {'time ratio':>11} {'largest difference':>19} (σ_max aside)"
        )
        for n in sizes:
            native = in_fresh_process(base, adapters[:n])
            row = f"{n:>5} {native['seconds']:>8.2f} s {native['memory']:>7.0f} MiB"
            if n in full_sizes:
                materialised = in_fresh_process(base, full[:n])
                ratio = materialised["seconds"] / native["seconds"]
                difference = largest_difference(native["numbers"], materialised["numbers"])
                row += f" {materialised['seconds']:>8.2f} s {materialised['memory']:>7.0f} MiB {ratio:>10.1f}× {difference:>19.1e}"
            print(row, flush=True)
    finally:
        shutil.rmtree(work / "full", ignore_errors=True)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
