"""The whole precheck of a config of three experts against the forward passes it cannot avoid.

Issue 40's target: at most 1.3x, with the machine quiet. The config: three LoRA experts of the
real SmolLM2-135M written as task_arithmetic, each with its 16-item probe (the small-config
family's ``n3_0`` draw: ``python research/run.py configs write`` trains them once and writes it), or
``--config`` any config of yours.

The floor: every forward pass the precheck counts before it runs (its cost line,
``api.precheck_cost``), run bare on the loaded base, in batches of the precheck's batch size:
probe lines (each prompt with its gold answer, the config's own probes in turn) or windows of the
shipped text, as the cost line counts them. Not in the floor, so in the ratio: loading the models,
building the rehearsed merges in memory, the weight statistics, tokenising, padding, reporting.

    python benchmarks/whole_precheck.py [--config CONFIG.yml] [--repeats 2] [--work DIR]
"""

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mergekit_mergeability import api, merge_config, tasks
from mergekit_mergeability.cost import WINDOW
from mergekit_mergeability.diagnostics.fluency import TEXT, windows
from mergekit_mergeability.resources import shipped
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.sources import load_causal_lm, resolve

DEFAULT = Path("pools-out/configs/configs/n3_0_task_arithmetic.yml")


def floor(config: Path, counted: dict, units: dict, settings: PrecheckSettings) -> float:
    """Seconds for ``counted`` bare forward passes on the config's base model, batched."""
    spec = merge_config.read(config)
    module, tokenizer = load_causal_lm(resolve(spec.base_model), settings.device, "float32")
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    lines = [
        i.prompt + i.gold
        for m in spec.models
        if m in spec.probes
        for i in tasks.load(spec.probes[m], settings.limit, spec.folder)
    ]
    text = windows(tokenizer, shipped(TEXT).read_text())
    started = time.perf_counter()
    with torch.no_grad():
        for name, count in counted.items():
            if units[name] == WINDOW:
                for start in range(0, count, settings.batch_size):
                    module(input_ids=text[start % len(text) : start % len(text) + settings.batch_size])
                continue
            cycle = itertools.islice(itertools.cycle(lines), count)
            while batch := list(itertools.islice(cycle, settings.batch_size)):
                module(**tokenizer(batch, return_tensors="pt", padding=True))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="where the prechecks write (default: a temp folder)")
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config; train the family once: python research/run.py configs write")
    settings = PrecheckSettings(device="cpu", dtype="float32", quiet=True)
    cost = api.precheck_cost(args.config, settings=settings)
    print(cost.line())
    wholes, floors = [], []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        for n in range(args.repeats):  # alternating, so that a busy spell hits both
            floors.append(floor(args.config, cost.passes, cost.units, settings))
            started = time.perf_counter()
            api.precheck(args.config, settings=settings, out=work / f"run{n}")
            wholes.append(time.perf_counter() - started)
            print(f"run {n}: whole precheck {wholes[-1]:.1f} s, its {cost.total:,} passes bare {floors[-1]:.1f} s")
    whole, bare = statistics.median(wholes), statistics.median(floors)
    print(f"whole / floor: {whole / bare:.2f}x (median of {args.repeats}; target <= 1.3x)")


if __name__ == "__main__":
    main()
