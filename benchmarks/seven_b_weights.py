"""The weight-only precheck at a 7B shape on this machine: its peak memory against one model's size.

Issue 52's bound: with three LoRA experts of a Llama-2-7B shape (hidden 4096, MLP 11008, 32 layers,
vocabulary 32000, bfloat16: 12.6 GiB a model), the checks that need no rehearsal (compatibility,
update statistics and cancel-out from the weights, layer-wise CKA on ``--limit`` probe lines) run
within 1.3x one model's memory. The base is ``tiny.shaped``: its header lists every tensor and its
data is a sparse run of zeros, so nothing is downloaded or written, yet every byte a pass reads is
read (as zeros: the memory and the time are a real model's, the scores are not). The adapters are
rank-8 LoRA on every layer's q and v projections (``tiny.make_adapter``, seeded).

The precheck runs in a fresh process with the rehearsing diagnostics skipped (knowledge, dilution,
fluency, selectivity, the menu); its peak anonymous memory (RssAnon sampled every 5 ms, file-backed
pages excluded, as ``benchmarks/scale.py`` reads it) is printed against one model's bytes, with
each phase's start, peak and end, and beside it the peak resident size (VmHWM: the weights' pages
mapped from the page cache included).

    python benchmarks/seven_b_weights.py [--limit 4] [--work DIR]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import transformers
import yaml

SEVEN = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000)
SKIPPED = ("knowledge", "dilution", "fluency", "selectivity", "menu")


def build(work: Path, limit: int) -> Path:
    """The base, three adapters, a probe of ``limit`` lines and the config naming them; its path."""
    from mergekit_mergeability.tiny import make_adapter, shaped

    base = shaped(work / "base", transformers.LlamaConfig(**SEVEN, architectures=["LlamaForCausalLM"]), "bfloat16")
    layers = range(SEVEN["num_hidden_layers"])
    touched = [f"model.layers.{i}.self_attn.{p}.weight" for i in layers for p in ("q_proj", "v_proj")]
    adapters = [make_adapter(base, work / f"expert{i}", touched, rank=8, seed=i, base_name=str(base)) for i in range(3)]
    probe = work / "probe.jsonl"
    lines = [
        {"question": f"Fact {i}: which comes first?", "choices": ["alpha", "beta", "gamma"], "label": i % 3}
        for i in range(limit)
    ]
    probe.write_text("".join(json.dumps(line) + "\n" for line in lines))
    models = [{"model": f"{base}+{a}", "probe": str(probe), "parameters": {"weight": 1.0}} for a in adapters]
    config = work / "seven.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    return config


def measured(config: Path, limit: int) -> None:
    """In this (fresh) process: the precheck under ``PeakMemory``, printed as JSON."""
    sys.path.insert(0, str(Path(__file__).parent))
    from precheck import PeakMemory
    from scale import phased

    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    settings = PrecheckSettings(device="cpu", quiet=True, limit=limit, skip=SKIPPED)
    started = time.perf_counter()
    with PeakMemory() as peak, tempfile.TemporaryDirectory() as out:
        phased(peak)
        api.precheck(config, settings=settings, out=out)
    status = Path("/proc/self/status").read_text()
    resident = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "growth": peak.growth,
                "phases": peak.phases,
                "resident": resident,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: the fresh process
    args = parser.parse_args()
    if args.measure:
        return measured(args.measure, args.limit)
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        config = build(work, args.limit)
        one = sum(f.stat().st_size for f in (work / "base").glob("*.safetensors")) / 2**30
        done = subprocess.run(
            [sys.executable, __file__, "--measure", str(config), "--limit", str(args.limit)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        found = json.loads(done.stdout.splitlines()[-1])
        growth = found["growth"] / 1024
        print(
            f"7B shape, 3 LoRA experts, weight-only precheck ({', '.join(SKIPPED)} skipped), {args.limit} probe lines:"
            f" {found['seconds']:.0f} s; peak anonymous memory {growth:.2f} GiB = {growth / one:.2f}x one model"
            f" ({one:.1f} GiB; target <= 1.3x); peak resident {found['resident'] / 1024:.2f} GiB = {found['resident'] / 1024 / one:.2f}x,"
            " the memory-mapped weights' pages included"
        )
        print("   by phase, GiB above the start (start, peak, end):")
        for label, depth, *mib in found["phases"]:
            print(f"   {'  ' * depth + label:<20}" + "".join(f"{m / 1024:7.2f}" for m in mib))


if __name__ == "__main__":
    main()
