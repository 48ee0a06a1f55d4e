"""The whole precheck at an earlier commit against this checkout's, on one config: on the same
machine, in turn, each run in a fresh process with the precheck's defaults (``api.precheck``,
device cpu); the median seconds of each side, their ratio, and whether every run's precheck.json
says the same (the largest difference of any number in it; paths and timings aside).

    python benchmarks/against_commit.py --config CONFIG.yml [--commit 05aeea4] [--repeats 2] [--work DIR]

The earlier commit is checked out beside this one (``git worktree``, in the work folder) and put
first on PYTHONPATH, so its package and built-in plugin are the ones imported; nothing is installed.
Run it with the machine quiet. A config whose probes are lm-eval tasks, as ``vs_evolve.py`` writes
them (``--work`` there keeps it as config.yml), is timed as that benchmark times the precheck.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from _models import workdir

REPO = Path(__file__).resolve().parent.parent
RUN = """
import sys, time
from pathlib import Path
from mergekit_mergeability import api
from mergekit_mergeability.settings import PrecheckSettings
started = time.perf_counter()
api.precheck(Path(sys.argv[1]), settings=PrecheckSettings(device="cpu", quiet=True), out=Path(sys.argv[2]))
print(time.perf_counter() - started)
"""
AMBIENT = ("created", "timings", "options", "path")  # keys that say where or when, not what was found
console = Console(width=100)


def timed(config: Path, out: Path, tree: Path) -> float:
    """Seconds of one precheck by the package in ``tree``, in a fresh process."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", RUN, str(config), str(out)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the precheck by {tree} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def differences(a, b, where: str = "") -> list:
    """(where, how far apart) for every number or value that differs between two reports."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = [(f"{where}/{k}", "only one") for k in set(a) ^ set(b)]
        return found + [d for k in set(a) & set(b) - set(AMBIENT) for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        gap = abs(a - b) if a == a and b == b else (0.0 if a != a and b != b else float("inf"))  # NaN equals NaN
        return [(where, gap)] if gap else []
    return [] if a == b else [(where, "differs")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="the mergekit config the precheck reads")
    parser.add_argument("--commit", default="HEAD~1", help="the earlier commit (default HEAD~1)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, in turn (default 2)")
    parser.add_argument("--work", type=Path, default=None, help="keep the checkout and the reports here")
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config")
    with workdir(args.work, "against-commit-") as work:
        earlier = work.resolve() / "earlier"
        if not earlier.exists():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(earlier), args.commit], check=True
            )
        sides = {args.commit: earlier, "this checkout": REPO}
        seconds = {side: [] for side in sides}
        reports = []
        for run in range(args.repeats):
            for side, tree in sides.items() if run % 2 == 0 else reversed(sides.items()):
                out = work / f"{'earlier' if tree == earlier else 'this'}-{run}"
                seconds[side].append(timed(args.config.resolve(), out, tree))
                reports.append(json.loads((out / "precheck.json").read_text()))
                console.print(f"run {run}, {side}: {seconds[side][-1]:.1f} s")
        found = [d for report in reports[1:] for d in differences(reports[0], report)]
        worst = max((gap for _, gap in found), key=lambda g: float("inf") if isinstance(g, str) else g, default=0)
        medians = {side: statistics.median(s) for side, s in seconds.items()}
        for side, median in medians.items():
            console.print(f"{side}: median {median:.1f} s of {len(seconds[side])}")
        console.print(f"ratio (earlier / this checkout): {medians[args.commit] / medians['this checkout']:.2f}x")
        console.print(f"reports: largest difference {worst}" + (f" (first at {found[0][0]})" if found else ""))
        if args.work is None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(earlier)], check=True)


if __name__ == "__main__":
    main()
