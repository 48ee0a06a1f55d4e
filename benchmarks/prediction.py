"""How well the precheck predicts mergeability, and which merge keeps most: the numbers behind
the README's "How the prediction was fitted", from the pools ``benchmarks/pools.py`` measures.

    python benchmarks/prediction.py fewshot              # K shots: base p(gold) vs S on the fit pool
    python benchmarks/prediction.py calibrate [--install] # fit on the fit pool; --install ships it
    python benchmarks/prediction.py validate heldout     # precheck (shipped calibration) vs S
    python benchmarks/prediction.py methods fit          # own-task S by thirds of base knowledge

The held-out pool is only ever read by ``validate`` and ``methods``: nothing here fits on it
or chooses a default from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

OUT = Path("pools-out")
PACKAGED = Path(__file__).resolve().parents[1] / "mergekit_mergeability" / "precheck" / "calibration.json"
console = Console()


def _mean_s(pool: str, label: str = "mean") -> dict:
    report = json.loads((OUT / pool / "mergeability" / label / "mergeability.json").read_text())
    return {m["path"]: m["mergeability"] for m in report["models"]}


def fewshot(args) -> None:
    from mergekit_mergeability.maths.stats import correlate
    from mergekit_mergeability.precheck.calibration import features

    measured = _mean_s("fit")
    table = Table("shots", "Spearman: base p(gold) vs S", "95% interval", "permutation p", "accuracy vs S", title=f"Few-shot knowledge on the fit pool ({len(measured)} experts, mean merging)")
    for folder in sorted((OUT / "fit").glob("precheck_k*"), key=lambda p: int(p.name[len("precheck_k"):])):
        found = features(json.loads((folder / "precheck.json").read_text())["models"])
        common = [m for m in found if m in measured]
        p_gold = correlate([found[m]["p_gold"] for m in common], [measured[m] for m in common])
        accuracy = correlate([found[m]["accuracy"] for m in common], [measured[m] for m in common])
        low, high = p_gold.interval
        table.add_row(folder.name[len("precheck_k"):], f"{p_gold.spearman:+.2f}", f"{low:+.2f} – {high:+.2f}", f"{p_gold.p_permutation:.3f}", f"{accuracy.spearman:+.2f}")
    console.print(table)


def _run(*command: str) -> None:
    started = time.perf_counter()
    console.print(f"$ {' '.join(command)}")
    subprocess.run(command, check=True)
    console.print(f"[dim]({time.perf_counter() - started:.0f} s)[/dim]")


def calibrate(args) -> None:
    pairs = [str(OUT / "fit" / "precheck" / "precheck.json"), str(OUT / "fit" / "mergeability" / "mean" / "mergeability.json")]
    target = OUT / "calibration.json"
    _run(sys.executable, "-m", "mergekit_mergeability", "calibrate", *pairs, "--out", str(target), "--permutations", str(args.permutations))
    if args.install:
        shutil.copyfile(target, PACKAGED)
        console.print(f"installed as {PACKAGED}")


def validate(args) -> None:
    """Precheck the pool afresh with the shipped calibration, then validate against S."""
    precheck = OUT / args.pool / "validate" / "precheck"
    shutil.rmtree(precheck, ignore_errors=True)
    _run(sys.executable, "-m", "mergekit_mergeability", "precheck", str(OUT / args.pool / "configs" / "pool.yml"), "--out", str(precheck), "--skip", "representations", "--quiet")
    _run(sys.executable, "-m", "mergekit_mergeability", "validate", str(precheck / "precheck.json"), str(OUT / args.pool / "mergeability" / "mean" / "mergeability.json"), "--out", str(precheck.parent))


def methods(args) -> None:
    """Mean own-task S by thirds of the base's p(gold), for every method measured on the pool."""
    from mergekit_mergeability.demo.run import knowledge_groups

    thirds = knowledge_groups(json.loads((OUT / args.pool / "precheck" / "precheck.json").read_text()))
    groups = {"weakest-known third": thirds["weakly known"], "middle": thirds["partly known"], "strongest-known third": thirds["well known"]}
    groups["all"] = [m for members in groups.values() for m in members]
    table = Table("merge", *(f"{g} ({len(m)})" for g, m in groups.items()), title=f"Own-fact accuracy after merging ({args.pool} pool, 8 partners × 5 trials)")
    table.columns[0].no_wrap = True
    labels = sorted(f.name for f in (OUT / args.pool / "mergeability").iterdir() if (f / "mergeability.json").is_file())
    means = {}
    for label in ["mean", *(l for l in labels if l != "mean")]:
        s = _mean_s(args.pool, label)
        means[label] = {g: statistics.fmean(s[m] for m in members) for g, members in groups.items()}
        change = lambda g: "" if label == "mean" else f" ({means[label][g] - means['mean'][g]:+.3f})"  # noqa: E731
        table.add_row(label, *(f"{v:.3f}{change(g)}" for g, v in means[label].items()))
    console.print(table)


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fewshot").set_defaults(run=fewshot)
    fit = commands.add_parser("calibrate")
    fit.add_argument("--install", action="store_true", help="copy the fit into the package as its default calibration")
    fit.add_argument("--permutations", type=int, default=500)
    fit.set_defaults(run=calibrate)
    for name, run in (("validate", validate), ("methods", methods)):
        command = commands.add_parser(name)
        command.add_argument("pool", choices=["fit", "heldout"])
        command.set_defaults(run=run)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
