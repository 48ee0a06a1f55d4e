"""What tuning costs: the precheck with the knob grid at its default budget against the same
precheck with the menu alone (``--tune-budget 0``), in counted forward passes and in seconds.

Issue 50's targets: the default budget costs at most 3x the precheck's passes without tuning, and
the whole precheck with tuning takes at most 10 minutes on 2 quiet cores for three SmolLM2-135M
experts with 16-item probes. The config: the `tuning` family's first three-expert draw written as
task_arithmetic (``python research/run.py tuning measure`` trains the experts and writes it), or
``--config`` any config of yours. Both runs skip the representation passes, as the research does
not; say ``--all`` to run every diagnostic.

    python benchmarks/tuning.py [--config CONFIG.yml] [--all]
"""

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from mergekit_mergeability import api
from mergekit_mergeability.settings import PrecheckSettings

DEFAULT = Path("pools-out/tuning/configs/n3_0_task_arithmetic.yml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument(
        "--all", action="store_true", help="every diagnostic (default: no representations, selectivity)"
    )
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config (python research/run.py tuning measure writes it)")
    skip = () if args.all else ("representations", "selectivity")
    settings = PrecheckSettings(device="cpu", dtype="float32", quiet=True, skip=skip)
    counted, seconds = {}, {}
    for label, budget in (("menu alone", 0), ("default budget", None)):
        run = replace(settings, tune_budget=budget)
        counted[label] = api.precheck_cost(args.config, settings=run).total
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            result = api.precheck(args.config, settings=run, out=out)
        seconds[label] = time.perf_counter() - started
        chosen = result.to_json()["recommendation"]["method_choice"]
        print(
            f"{label:15s} {counted[label]:7,} passes counted  {seconds[label]:6.0f} s  "
            f"{len(chosen['kept']) if chosen else 0} merges rehearsed, chose {chosen and chosen['chosen']}"
        )
    print(
        f"with tuning / without: {counted['default budget'] / counted['menu alone']:.2f}x the passes "
        f"(target <= 3x), {seconds['default budget'] / seconds['menu alone']:.2f}x the time; "
        f"the precheck with tuning {seconds['default budget'] / 60:.1f} min (target <= 10 min on 2 quiet cores)"
    )


if __name__ == "__main__":
    main()
