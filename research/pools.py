"""Measured pools of single-fact experts of SmolLM2-135M-Instruct, in families that differ
in how the experts were trained and scored: the ground truth the precheck's prediction is
fitted on and checked on, leaving one family out at a time (``research/prediction.py
families``).

    python research/pools.py fit                      # cloze, one up_proj (layer 15): 86 facts
    python research/pools.py heldout                  # cloze, one up_proj (layer 10): 83 other facts
    python research/pools.py options                  # options listed, 3-shot, one up_proj (layer 15): 64 facts
    python research/pools.py lora                     # cloze, LoRA r8 on attention and MLP, layers 10-19: 64 facts
    python research/pools.py tasks                    # task-level: 65 tasks, 8 held-out items each; LoRA r8 on the MLP
    python research/pools.py attention                # options, 3-shot, LoRA r4 on attention, layers 2-8: 64 facts
    python research/pools.py deep                     # cloze, LoRA r8 on the MLP of layers 20-29: 64 facts
    python research/pools.py wide                     # options, 0-shot, LoRA r4 on every module of all 30 layers: 64 facts
    python research/pools.py middle                   # cloze, LoRA r16 on every module of layers 12-17: 64 facts
    python research/pools.py low                      # cloze, LoRA r8 on the MLP of layers 0-9: 64 facts
    python research/pools.py down                     # options, 3-shot, LoRA r32 on down_proj of layers 4-15: 64 facts
    python research/pools.py vq                       # options, 1-shot, LoRA r8 on q, v, up of layers 8-19: 64 facts
    python research/pools.py fit --methods mean,ties,kw:0.1,kw-ties:0.1:0.5

Each expert is trained until the gold choice has p ≥ 0.9 on both phrasings of its fact,
in the format its probe is scored in (``FAMILIES`` says how each family differs). Facts
are in ``research/pools/``: ``options`` uses the held-out pool's facts, ``lora`` the fit
pool's (the family differs in what is updated, not in what is taught). A ``tasks`` expert is
trained on its task's first items (p ≥ 0.9 on each, or 150 steps) and probed on the rest,
which it never saw (``make_tasks.py`` writes them). Per pool this writes, under ``--out/<pool>/``: the pool config,
``precheck/precheck.json`` (knowledge, weight and interference features) and
``mergeability/<method>/mergeability.json`` (8 partners × 5 trials, paper 1's protocol; ``--partners N``
measures merges of another size into ``<method>_pN``, for the conditional prediction of ``plan``).
Methods: ``mean`` (task_arithmetic, weights 1/9), ``ties`` (density 0.5), ``kw:T``
(knowledge_weighted, temperature T; then any of its parameters, ``kw:0.3:scale=0.6``), ``kw-ties:T:D`` (with ties: true, density D),
``kw-noties:T`` (ties: false: the paper's weighted mean), ``kw-kd:T:D`` (ties, density D raised
by knowledge: ``density_by_knowledge: true``).
Everything is cached (experts, scores, finished trials): a rerun only re-reads.
Needs the demo's base model: ``bash examples/demo.sh`` (or any demo run) first.

The measured reports are archived in ``research/pools/measured/<pool>.tar.gz`` (every
``precheck.json`` and each method's ``mergeability.json``; ``--pack`` writes it after a
measurement). ``--unpack`` restores them under ``--out`` without measuring anything, which is
all ``research/prediction.py`` reads: its tables rerun in minutes on a fresh clone.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import json
import tarfile
import time
from pathlib import Path

from rich.console import Console

from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.demo.steps import Demo, Settings, knowledge_of
from mergekit_mergeability.files import write_atomic

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "pools" / "measured"  # the measured reports, one archive per pool (--pack, --unpack)
FIT, HELDOUT = str(HERE / "pools" / "fit_facts.jsonl"), str(HERE / "pools" / "heldout_facts.jsonl")
PLAN = str(HERE / "pools" / "plan_facts.jsonl")  # facts of their own, for plan's check pools
TASKS = str(HERE / "pools" / "tasks.jsonl")  # task-level rows: research/pools/make_tasks.py writes them
ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
ATTENTION_AND_MLP = ("self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")
EVERY_MODULE = (*ATTENTION, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
POOLS = {
    "fit": Settings(facts=FIT, pool="fit", fact_layer=15, trials=5),
    "heldout": Settings(facts=HELDOUT, pool="heldout", fact_layer=10, trials=5),
    "options": Settings(
        facts=HELDOUT, fact_count=64, pool="options", fact_layer=15, fact_format="options", fact_shots=3, trials=5
    ),
    "lora": Settings(
        facts=FIT,
        fact_count=64,
        pool="lora",
        fact_layers=tuple(range(10, 20)),
        fact_modules=ATTENTION_AND_MLP,
        fact_rank=8,
        fact_adapters=True,
        trials=5,
    ),
    "tasks": Settings(
        facts=TASKS,
        pool="tasks",
        fact_layers=tuple(range(9, 21)),
        fact_modules=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
        fact_rank=8,
        fact_adapters=True,
        trials=5,
    ),
    # Measured 2026-12-02 after the shipped calibration (four families) was fitted, to check it on a family
    # nothing was fitted or chosen on: options listed, LoRA on attention alone, in the lower layers.
    "attention": Settings(
        facts=HELDOUT,
        fact_count=64,
        pool="attention",
        fact_layers=tuple(range(2, 9)),
        fact_modules=ATTENTION,
        fact_rank=4,
        fact_adapters=True,
        fact_format="options",
        fact_shots=3,
        trials=5,
    ),
    # Defined 2026-12-02 before it was measured, to check the dilution signal on a family no one had seen
    # (docs/prediction.md): cloze facts, LoRA on the MLP of the upper layers, where no fitted family updates.
    "deep": Settings(
        facts=HELDOUT,
        fact_count=64,
        pool="deep",
        fact_layers=tuple(range(20, 30)),
        fact_modules=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
        fact_rank=8,
        fact_adapters=True,
        trials=5,
    ),
    # Defined 2026-12-02 before it was trained, to check the dilution margin on a family no one had seen
    # (docs/prediction.md): options listed with no solved examples, every module of every layer.
    "wide": Settings(
        facts=FIT,
        fact_count=64,
        pool="wide",
        fact_layers=tuple(range(30)),
        fact_modules=EVERY_MODULE,
        fact_rank=4,
        fact_adapters=True,
        fact_format="options",
        trials=5,
    ),
    # Defined 2026-12-02 before it was trained, to decide the calibration fitted within families
    # (docs/prediction.md): cloze facts, rank-16 LoRA on every module of six middle layers.
    "middle": Settings(
        facts=HELDOUT,
        fact_count=64,
        pool="middle",
        fact_layers=tuple(range(12, 18)),
        fact_modules=EVERY_MODULE,
        fact_rank=16,
        fact_adapters=True,
        trials=5,
    ),
    # Defined 2026-12-02 before it was trained, to decide the partnered dilution (docs/prediction.md):
    # cloze facts, LoRA on the MLP of the lowest layers, where no fitted family updates.
    "low": Settings(
        facts=FIT,
        fact_count=64,
        pool="low",
        fact_layers=tuple(range(10)),
        fact_modules=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
        fact_rank=8,
        fact_adapters=True,
        trials=5,
    ),
    # Defined 2026-12-02 before it was trained, to decide the rehearsal prediction (docs/prediction.md):
    # options listed, 3-shot, a rank-32 LoRA on the MLP's down projection alone, in the lower-middle layers.
    "down": Settings(
        facts=FIT,
        fact_count=64,
        pool="down",
        fact_layers=tuple(range(4, 16)),
        fact_modules=("mlp.down_proj",),
        fact_rank=32,
        fact_adapters=True,
        fact_format="options",
        fact_shots=3,
        trials=5,
    ),
    # Defined 2026-12-03 before it was trained, to decide the scored rehearsal (docs/prediction.md):
    # options listed after one solved example, LoRA on q, v and up projections of twelve middle layers.
    "vq": Settings(
        facts=HELDOUT,
        fact_count=64,
        pool="vq",
        fact_layers=tuple(range(8, 20)),
        fact_modules=("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj"),
        fact_rank=8,
        fact_adapters=True,
        fact_format="options",
        fact_shots=1,
        trials=5,
    ),
    # A check pool for plan, never fitted on: facts no measured family has, options listed (merging
    # everything loses most in that format), at the heldout family's depth.
    "options10": Settings(facts=PLAN, pool="options10", fact_layer=10, fact_format="options", fact_shots=3, trials=5),
}
# What each family is, in the words the README's tables use; pools of one family differ only in their facts.
FAMILIES = {
    "fit": "cloze, 0-shot; rank-16 update of one mlp.up_proj (layer 15)",
    "heldout": "cloze, 0-shot; rank-16 update of one mlp.up_proj (layer 10)",
    "options": "options listed and lettered, 3-shot; rank-16 update of one mlp.up_proj (layer 15)",
    "lora": "cloze, 0-shot; peft LoRA r8 on q, v, o, up and down projections of layers 10-19",
    "tasks": "task-level: trained on 12 items of a rule or mapping, scored on 8 held out; cloze, 0-shot; "
    "peft LoRA r8 on the MLP (gate, up, down) of layers 9-20",
    "attention": "options listed and lettered, 3-shot; peft LoRA r4 on q, k, v and o projections of layers 2-8",
    "deep": "cloze, 0-shot; peft LoRA r8 on the MLP (gate, up, down) of layers 20-29",
    "wide": "options listed and lettered, 0-shot; peft LoRA r4 on every projection (q, k, v, o, gate, up, down) of all 30 layers",
    "middle": "cloze, 0-shot; peft LoRA r16 on every projection (q, k, v, o, gate, up, down) of layers 12-17",
    "low": "cloze, 0-shot; peft LoRA r8 on the MLP (gate, up, down) of layers 0-9",
    "down": "options listed and lettered, 3-shot; peft LoRA r32 on mlp.down_proj of layers 4-15",
    "vq": "options listed and lettered, 1-shot; peft LoRA r8 on q, v and up projections of layers 8-19",
}


# Families defined after the calibration and every default were fixed, to check them: calibrate and
# families leave them out unless named (prediction.py check FAMILY predicts one).
CHECKS = ("attention", "deep", "wide", "middle", "low", "down", "vq")
FITTED = tuple(f for f in FAMILIES if f not in CHECKS)  # leave-one-family-out runs over these
SHIPPED = ("fit", "options", "heldout", "lora")  # the shipped calibration is fitted on these (tasks came after)


def method(spec: str, partners: int):
    """(label, mergekit method, parameters) for a method spec of the command line."""
    name, *values = spec.split(":")
    if name == "mean":
        return "mean", "task_arithmetic", {"weight": round(1 / (partners + 1), 6)}
    if name == "ties":
        density = float(values[0]) if values else 0.5
        return f"ties_d{density:g}", "ties", {"weight": 1.0, "density": density}
    if name == "kw":  # kw:T, then any of the method's parameters as key=value (kw:0.3:scale=0.6)
        extra = dict(value.split("=", 1) for value in values[1:])
        parsed = {k: v.lower() == "true" if v.lower() in ("true", "false") else float(v) for k, v in extra.items()}
        label = f"kw_t{float(values[0]):g}" + "".join(f"_{k}{v}" for k, v in extra.items())
        return label, "knowledge_weighted", {"temperature": float(values[0]), **parsed}
    if name == "kw-ties":
        temperature, density = float(values[0]), float(values[1])
        return (
            f"kw_ties_t{temperature:g}_d{density:g}",
            "knowledge_weighted",
            {"temperature": temperature, "ties": True, "density": density},
        )
    if name == "kw-noties":
        temperature = float(values[0])
        return f"kw_noties_t{temperature:g}", "knowledge_weighted", {"temperature": temperature, "ties": False}
    if name == "kw-kd":
        temperature, density = float(values[0]), float(values[1])
        return (
            f"kw_kd_t{temperature:g}_d{density:g}",
            "knowledge_weighted",
            {"temperature": temperature, "ties": True, "density": density, "density_by_knowledge": True},
        )
    raise SystemExit(
        f"--methods: unknown method {spec!r}; use mean, ties[:D], kw:T, kw-ties:T:D, kw-noties:T or kw-kd:T:D"
    )


def precheck(demo: Demo, config: Path, fewshot: int) -> dict:
    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    out = demo.out / "precheck" if fewshot is None else demo.out / f"precheck_k{fewshot}"
    saved = out / "precheck.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    settings = PrecheckSettings(
        device="cpu", dtype="float32", quiet=demo.quiet, skip=("representations", "selectivity")
    )
    if fewshot is not None:  # only the knowledge differs between these
        settings = dataclasses.replace(
            settings, fewshot=fewshot, skip=("representations", "selectivity", "weights", "dilution")
        )
    return api.precheck(config, settings=settings, out=out).to_json()


def pack(folder: Path, pool: str) -> Path:
    """Archive a measured pool's reports (``--pack``): byte for byte the same archive for the same reports."""
    reports = sorted([*folder.glob("precheck*/precheck.json"), *folder.glob("mergeability/*/mergeability.json")])
    if not reports:
        raise SystemExit(f"--pack: nothing measured under {folder}; run: python research/pools.py {pool}")
    data = io.BytesIO()
    with gzip.GzipFile(fileobj=data, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for report in reports:
            content = report.read_bytes()
            entry = tarfile.TarInfo(str(report.relative_to(folder)))
            entry.size = len(content)
            tar.addfile(entry, io.BytesIO(content))
    return write_atomic(MEASURED / f"{pool}.tar.gz", data.getvalue())


def unpack(folder: Path, pool: str) -> list:
    """Restore a pool's archived reports under ``folder`` (``--unpack``); returns what it wrote."""
    archive = MEASURED / f"{pool}.tar.gz"
    if not archive.is_file():
        raise SystemExit(f"--unpack: {archive} is not there; measure it: python research/pools.py {pool} --pack")
    written = []
    with tarfile.open(archive, "r:gz") as tar:
        for entry in tar.getmembers():
            if not entry.isfile() or entry.name.startswith(("/", "..")):
                continue
            written.append(write_atomic(folder / entry.name, tar.extractfile(entry).read()))
    return written


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("pool", choices=sorted(POOLS))
    parser.add_argument(
        "--methods",
        default="mean,ties",
        help="comma-separated: mean, ties[:D], kw:T[:key=value...], kw-ties:T:D, kw-noties:T, kw-kd:T:D",
    )
    parser.add_argument(
        "--precheck", action="store_true", help="run the precheck (the features) even when no method needs it"
    )
    parser.add_argument(
        "--fewshot", type=int, action="append", help="also run the precheck with this many shots (repeatable)"
    )
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "demo")
    parser.add_argument("--out", type=Path, default=Path("pools-out"))
    parser.add_argument("--count", type=int, help="only the first N facts (a first look: measure into its own --out)")
    parser.add_argument(
        "--partners", type=int, help="merge each expert with this many random partners (default 8; labels get _pN)"
    )
    parser.add_argument("--quiet", "-q", action="store_true")
    archive = parser.add_mutually_exclusive_group()
    archive.add_argument(
        "--pack", action="store_true", help="after measuring, archive the reports (research/pools/measured)"
    )
    archive.add_argument(
        "--unpack", action="store_true", help="only restore the archived reports under --out; measure nothing"
    )
    args = parser.parse_args()
    console = Console()
    if args.unpack:
        written = unpack(args.out / args.pool, args.pool)
        console.print(f"{args.pool}: {len(written)} reports restored under {args.out / args.pool}")
        return
    settings = POOLS[args.pool] if args.count is None else dataclasses.replace(POOLS[args.pool], fact_count=args.count)
    if args.partners is not None:
        settings = dataclasses.replace(settings, partners=args.partners)
    suffix = "" if settings.partners == POOLS[args.pool].partners else f"_p{settings.partners}"
    demo = Demo(settings, args.cache_dir, args.out / args.pool, console, args.quiet)
    started = time.perf_counter()
    facts = demo.fact_experts()
    config = demo.fact_config(facts, name="pool")
    console.print(f"{len(facts)} experts ({time.perf_counter() - started:.0f} s); pool config {config}")
    for k in args.fewshot or ():
        precheck(demo, config, k)
    methods = [method(spec.strip(), settings.partners) for spec in args.methods.split(",") if spec.strip()]
    methods = [(label + suffix, name, parameters) for label, name, parameters in methods]
    knowledge = {}
    if args.precheck or any(name == "knowledge_weighted" for _, name, _ in methods):
        report = precheck(demo, config, None)
        knowledge = knowledge_of(report)  # the knowledge the precheck would recommend with
    for label, name, parameters in methods:
        begun = time.perf_counter()
        measured = demo.measure(config, name, parameters, knowledge, label=label)
        mean = sum(m["mergeability"] for m in measured["models"]) / len(measured["models"])
        console.print(
            f"{label}: mean mergeability {mean:.3f} over {len(measured['models'])} experts ({time.perf_counter() - begun:.0f} s)"
        )
    console.print(f"done in {time.perf_counter() - started:.0f} s; outputs under {demo.out}")
    if args.pack:
        console.print(f"archived: {pack(demo.out, args.pool)}")


if __name__ == "__main__":
    main()
