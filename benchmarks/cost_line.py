"""The cost line against the run it announces, phase by phase.

``--dry-run``'s estimate (no weights read: config.json, headers, the probes' tokens and a pace
timed once on one block of the base's shape, cached) is printed beside each diagnostic's measured
time in a whole precheck of the same config, run in the same process right after. Issue 52's
target: within ±30% of the measured time, at 135M and at a 1.1B shape, on a quiet machine.

The config: the `tuning` family's first three-expert draw (three SmolLM2-135M LoRA experts, 16-item
probes; ``python research/run.py tuning measure`` writes it), or ``--config`` yours (for a 1.1B
shape: ``benchmarks/scale.py --work DIR`` writes one). ``--fresh-pace`` times the pace again
instead of reading the cached one.

    python benchmarks/cost_line.py [--config CONFIG.yml] [--tune-budget N] [--fresh-pace]
"""

import argparse
import tempfile
import time
from pathlib import Path

from mergekit_mergeability import api, menu, plugins
from mergekit_mergeability.cost import duration
from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.settings import PrecheckSettings

DEFAULT = Path("pools-out/tuning/configs/n3_0_task_arithmetic.yml")


class Timed:
    """A diagnostic whose runs are timed into ``spent``."""

    def __init__(self, diagnostic, spent: dict):
        self._diagnostic, self._spent = diagnostic, spent

    def __getattr__(self, name):
        return getattr(self._diagnostic, name)

    def run(self, inputs):
        started = time.perf_counter()
        try:
            return self._diagnostic.run(inputs)
        finally:
            self._spent[self._diagnostic.name] = time.perf_counter() - started


def measured(config: Path, settings: PrecheckSettings):
    """Seconds per phase (each diagnostic's run, the menu's rehearsal) and in all, of one precheck."""
    spent = {}
    listed, rehearse = plugins.plugin_diagnostics, menu.rehearse

    def timed_list(*args, **kwargs):
        return [(plugin, Timed(d, spent)) for plugin, d in listed(*args, **kwargs)]

    def timed_menu(*args):
        started = time.perf_counter()
        try:
            return rehearse(*args)
        finally:
            spent["menu"] = time.perf_counter() - started

    plugins.plugin_diagnostics, menu.rehearse = timed_list, timed_menu
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as out:
            api.precheck(config, settings=settings, out=out)
    finally:
        plugins.plugin_diagnostics, menu.rehearse = listed, rehearse
    return spent, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--tune-budget", type=int, default=None)
    parser.add_argument("--fresh-pace", action="store_true")
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config (python research/run.py tuning measure writes it)")
    if args.fresh_pace:
        (default_cache_dir() / "pace.json").unlink(missing_ok=True)
    settings = PrecheckSettings(device="cpu", quiet=True, tune_budget=args.tune_budget)
    started = time.perf_counter()
    cost = api.precheck_cost(args.config, settings=settings)
    print(f"dry run: {time.perf_counter() - started:.1f} s; {cost.line()}")
    spent, whole = measured(args.config, settings)
    print(f"{'phase':16s} {'passes':>7s} {'estimated':>10s} {'measured':>9s} {'measured/estimated':>19s}")
    for name, estimate in cost.phases.items():
        if cost.passes[name] and name in spent:
            print(
                f"{name:16s} {cost.passes[name]:7,} {estimate:9.1f}s {spent[name]:8.1f}s {spent[name] / estimate:18.2f}x"
            )
    counted = sum(spent.get(name, 0.0) for name, n in cost.passes.items() if n)
    print(
        f"{'passes in all':16s} {cost.total:7,} {cost.estimate:9.1f}s {counted:8.1f}s {counted / cost.estimate:18.2f}x"
    )
    print(
        f"whole precheck {duration(whole)} ({whole:.0f} s) against the line's {duration(cost.estimate)} "
        f"({cost.estimate:.0f} s): {whole / cost.estimate:.2f}x (target: within ±30% on a quiet machine)"
    )


if __name__ == "__main__":
    main()
