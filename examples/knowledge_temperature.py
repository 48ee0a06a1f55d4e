"""Re-measure knowledge_weighted's temperature on the demo's pool of single-fact experts.

Runs the mergeability protocol (the demo's partners and trials) with task_arithmetic
(the mean) and with knowledge_weighted at several temperatures, and prints the mean
own-fact accuracy after merging for the weakly-, partly- and well-known thirds.
Reuses the demo's cache: run `mergekit-mergeability demo` first (or pass --quick).

    python examples/knowledge_temperature.py [--quick] [--temperatures 0.03,0.1,0.3,1,10]
"""

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mergekit_mergeability.demo.run import FULL, QUICK, Demo, group_means, knowledge_groups
from mergekit_mergeability.cli import default_cache_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--temperatures", default="0.03,0.1,0.3,1,10")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "demo")
    parser.add_argument("--out", type=Path, default=Path("mergeability-demo"))
    args = parser.parse_args()
    console = Console()
    demo = Demo(QUICK if args.quick else FULL, args.cache_dir, args.out, console)
    configs = demo.configs(demo.fact_experts(), demo.translation_experts())
    saved = demo.out / "precheck" / "facts" / "precheck.json"
    precheck = json.loads(saved.read_text()) if saved.is_file() else demo.precheck("facts", configs["facts"])
    knowledge = {m["path"]: m["knowledge"]["accuracy"] for m in precheck["models"] if m["role"] == "expert"}
    reports = {"mean": demo.measure(configs["facts"], "task_arithmetic", {"weight": round(1 / (demo.s.partners + 1), 6)}, knowledge)}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        reports[f"τ = {temperature:g}"] = demo.measure(
            configs["facts"], "knowledge_weighted", {"temperature": temperature}, knowledge, label=f"knowledge_weighted_t{temperature:g}"
        )
    groups = knowledge_groups(precheck)
    table = Table("task_arithmetic (mean) or knowledge_weighted at τ", *(f"{g} ({len(p)})" for g, p in groups.items()), "all", title=f"Own-fact accuracy after merging ({demo.s.partners} partners × {demo.s.trials} trials)")
    for label, means in group_means(reports, groups).items():
        table.add_row(label, *(f"{means[g]:.2f}" for g in groups), f"{means['all']:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
