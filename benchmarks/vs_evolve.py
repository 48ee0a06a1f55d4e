"""The precheck's recommendation against mergekit-evolve, the search users have today: the same
config, its knobs as evolve's genome, the same probes as evolve's fitness, and both judged on
held-out items neither saw.

(1) The precheck as a user runs it (``api.precheck``, every phase, its defaults, the default
``--tune-budget``) on the config with every member's probe an lm-eval task (as
``vs_merge_then_evaluate.py`` writes them); its ``recommended.yml``.
(2) ``mergekit-evolve`` (mergekit's own, run by ``_evolve.py`` with the shims it lists so that it runs
on a CPU-only machine): the genome is the config's own knobs (its merge method, each model's weight
and, where the method has one, density; one layer group), the fitness the same probes as lm-eval
tasks (acc, summed over members, asked without a chat template, as the precheck asks them), its
defaults otherwise: 100 evaluations (``--max-fevals``), CMA-ES from sigma 1/6, seed 0, each candidate
merged to disk and scored with lm-eval in bfloat16. Its best config (``best_config.yaml``).
Then the config as written, the precheck's recommendation and evolve's best are each merged with
mergekit in float32, and each member's held-out items read on the merge (mean p(gold), the reader
of the precheck's own probes). ``--precheck-dtype bfloat16`` has the precheck read its rehearsal in
the dtype evolve merges and scores in (by default it reads in the config's, float32 in the
`tuning3` configs). Printed: each one's held-out keep, each side's seconds, their ratio.

    python benchmarks/vs_evolve.py [--config CONFIG.yml --held-out A.jsonl B.jsonl ...] [--work DIR] [--max-fevals 100]
        [--precheck-dtype bfloat16]

The default config is the `tuning3` family's first three-expert draw written as task_arithmetic
(``python research/run.py tuning measure --family tuning3`` writes it and the held-out items);
``--held-out`` gives each member's held-out probe in the config's order. Run it with the machine
quiet: both sides are timed.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import yaml
from rich.console import Console
from rich.table import Table

from _models import workdir
from vs_merge_then_evaluate import asked_as_tasks, merge, written

FAMILY = Path("pools-out/tuning3")
DEFAULT = FAMILY.with_name("tuning3-0") / "configs" / "n3_0_task_arithmetic.yml"
DEFAULT_HELD_OUT = [FAMILY / "unseen" / f"{task}.jsonl" for task in ("add_6", "double_minus_one", "mod_5")]
console = Console(width=120)


def genome(config: Path, names: Dict[str, str]) -> dict:
    """mergekit-evolve's configuration for ``config``: its models, base and method as the genome,
    every member's probe task as the fitness."""
    document = yaml.safe_load(config.read_text())
    return {
        "genome": {
            "models": [entry["model"] for entry in document["models"]],
            "merge_method": document["merge_method"],
            "base_model": document["base_model"],
            "layer_granularity": 0,
        },
        "tasks": [{"name": task, "metric": "acc,none"} for task in names.values()],
        "apply_chat_template": False,
        "fewshot_as_multiturn": False,
    }


def evolve(config: Path, names: Dict[str, str], include: List[Path], fevals: int, work: Path):
    """(evolve's best config, its seconds); its output in ``work/evolve.log``."""
    (work / "genome.yml").write_text(yaml.safe_dump(genome(config, names), sort_keys=False))
    command = [sys.executable, str(Path(__file__).with_name("_evolve.py")), str(work / "genome.yml")]
    command += ["--storage-path", str(work / "evolve"), "--no-merge-cuda", "--max-fevals", str(fevals)]
    command += ["--no-save-final-model", *(f"--task-search-path={p}" for p in include)]
    cores = str(os.cpu_count())  # its one evaluator gets every core, as the precheck does (Ray would give it 1 thread)
    threads = {"EVOLVE_CPUS": cores, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", cores)}
    started = time.perf_counter()
    with open(work / "evolve.log", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ | threads, cwd=work)
    seconds = time.perf_counter() - started
    best = work / "evolve" / "best_config.yaml"
    if done.returncode or not best.is_file():
        raise SystemExit(f"mergekit-evolve failed (exit {done.returncode}): see {work / 'evolve.log'}")
    return yaml.safe_load(best.read_text()), seconds


def held_out(document: dict, probes: List[list], name: str, work: Path) -> List[float]:
    """Each member's mean p(gold) on its held-out items (``probes``: each member's instances), in
    ``document``'s merge written by mergekit in float32."""
    from mergekit_mergeability.diagnostics.knowledge import scores
    from mergekit_mergeability.sources import load_causal_lm

    folder = work / "held_out" / name
    merge(yaml.safe_dump({**document, "dtype": "float32"}, sort_keys=False), folder, work / "lora-merged")
    model, tokenizer = load_causal_lm(folder, "cpu", "float32")
    read = [scores(model, tokenizer, instances, None) for instances in probes]
    return [sum(s.p_gold for s in member) / len(member) for member in read]


def precheck(config: Path, dtype: str, out: Path):
    """The precheck with its defaults but ``dtype``: (recommended.yml as a mergekit config, its seconds)."""
    from mergekit_mergeability import api, merge_config
    from mergekit_mergeability.settings import PrecheckSettings

    started = time.perf_counter()
    api.precheck(config, settings=PrecheckSettings(device="cpu", dtype=dtype, quiet=True), out=out)
    seconds = time.perf_counter() - started
    if json.loads((out / "precheck.json").read_text())["recommendation"]["verdict"] == "layer_selective":
        raise SystemExit(
            f"{config}: the precheck wrote one model per expert (layer_selective); this compares one merge"
        )
    recommended = merge_config.read(out / "recommended.yml")
    return yaml.safe_load(written(recommended.document, recommended)), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT, help=f"the mergekit config (default {DEFAULT})")
    parser.add_argument(
        "--held-out", type=Path, nargs="+", default=DEFAULT_HELD_OUT, help="each member's held-out probe, in order"
    )
    parser.add_argument("--work", type=Path, default=None, help="keep everything here (default: a temporary folder)")
    parser.add_argument("--max-fevals", type=int, default=100, help="mergekit-evolve's budget (its default: 100)")
    parser.add_argument(
        "--precheck-dtype",
        default="auto",
        choices=["auto", "bfloat16"],
        help="what the precheck reads its rehearsal in: auto, its default (the config's dtype:), "
        "or bfloat16, what evolve merges and scores in",
    )
    args = parser.parse_args()
    from mergekit_mergeability import merge_config, tasks
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.gate import ENVIRONMENT

    os.environ.pop(ENVIRONMENT, None)  # the opt-in gate would precheck every merge evolve writes
    if importlib.util.find_spec("cma") is None or importlib.util.find_spec("ray") is None:
        raise SystemExit("mergekit-evolve needs ray and cma: pip install '.[evolve]' in the checkout")
    for path in (args.config, *args.held_out):
        if not path.is_file():
            raise SystemExit(f"{path}: no such file (python research/run.py tuning measure --family tuning3 writes it)")
    try:  # read before the half hour of work, so a broken file stops it at once
        probes = [tasks.load(str(path)) for path in args.held_out]
    except UserError as error:
        raise SystemExit(str(error)) from None
    with workdir(args.work, "vs-evolve-") as work:
        work = work.resolve()
        config, names, include = asked_as_tasks(args.config, work)
        if len(args.held_out) != len(names):
            raise SystemExit(f"--held-out: {len(names)} members, {len(args.held_out)} files")
        console.print(f"{args.config}: {len(names)} members; (1) the precheck ...")
        recommended, precheck_seconds = precheck(config, args.precheck_dtype, work / "precheck")
        console.print(f"(1) {precheck_seconds:.1f} s; (2) mergekit-evolve, {args.max_fevals} evaluations ...")
        best, evolve_seconds = evolve(config, names, include, args.max_fevals, work)
        console.print(f"(2) {evolve_seconds:.1f} s; the three merges read on the held-out items ...")
        spec = merge_config.read(config)
        merges = {"as written": yaml.safe_load(written(spec.document, spec)), "precheck": recommended, "evolve": best}
        kept = {name: held_out(document, probes, name.replace(" ", "_"), work) for name, document in merges.items()}
        result = {
            "config": str(args.config),
            "held_out": {name: dict(zip(names.values(), values)) for name, values in kept.items()},
            "seconds": {"precheck": precheck_seconds, "evolve": evolve_seconds},
            "precheck_dtype": args.precheck_dtype,
            "merges": merges,
        }
        (work / "comparison.json").write_text(json.dumps(result, indent=1))
        table = Table(title=f"{args.config.name}: held-out mean p(gold), each member's items")
        for column in ("merge", *names.values(), "mean", "seconds"):
            table.add_column(column, justify="left" if column == "merge" else "right")
        spent = {"precheck": precheck_seconds, "evolve": evolve_seconds}
        for name, values in kept.items():
            seconds = f"{spent[name]:.0f}" if name in spent else ""
            table.add_row(name, *(f"{v:.3f}" for v in values), f"{sum(values) / len(values):.3f}", seconds)
        console.print(table)
        console.print(f"time ratio (evolve / precheck): {evolve_seconds / precheck_seconds:.1f}x")


if __name__ == "__main__":
    main()
