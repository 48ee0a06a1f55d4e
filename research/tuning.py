"""The merge users should write, checked on a family nothing was chosen on (pre-registered in
``research/pools/prereg/tuning.txt`` before this file was written).

    python research/run.py tuning regression [--markdown]   # the chooser on `configs`' archived reads (menu only)
    python research/run.py tuning measure [--archive]       # the fresh family: train, precheck, read the truth
    python research/run.py tuning report [--markdown]       # its tables (a fresh clone reads the archive)
    python research/run.py tuning plan-check [--models 1]   # issue 53: plan on its ten experts, scored unseen
    python research/run.py tuning plan-check --fresh --random 20   # issue 53's fresh pool, ten other tasks
    python research/run.py tuning plan-check --fresh plan54 --random 20   # the second (prereg/plan_guard.txt)
    python research/run.py tuning plan-check --family tuning3 --random 20   # tuning3's experts as a pool (prereg/plan_tuning3.txt)
    python research/run.py tuning measure --family tuning2 --archive # the second fresh family (prereg/tuning2.txt)
    python research/run.py tuning report --family tuning2            # every rule read off its archive
    python research/run.py tuning items --family tuning2             # every rule on 4, 8, 12 of the 16 items
    python research/run.py tuning measure --family tuning3 --archive # the third (prereg/tuning3.txt)
    python research/run.py tuning cutoffs --family tuning3           # where a CKA cut-off would preempt the menu
    python research/run.py tuning patch --family tuning2 --archive   # the layer patch as a candidate (prereg/patch.txt)
    python research/run.py tuning lengths --family tuning --report --draws 4   # every rule on probes of 8 to 32 items (prereg/probe_length.txt)

The `tuning` family: ten task-level experts of SmolLM2-135M-Instruct on tasks the `configs` family
does not use, LoRA rank 4 on the attention projections of layers 15-29, trained on 16 items with the
options listed. Each task has 16 probe items (all the precheck sees) and 48 unseen ones. 24 seeded
draws of 2, 3 and 5 experts, each written as task_arithmetic (weight 1) and as ties (density 0.5,
weight 1). The truth of a candidate: each member's mean p(gold) on its 48 unseen items in that
candidate's merge built in memory exactly as mergekit writes it (the rehearsal's own merge). The
precheck's choice with its default ``--tune-budget`` and with 0 (the menu alone) is read from the
same rehearsal.
The `tuning2` family (``FAMILIES``): ten other tasks, LoRA rank 8 on the MLP of layers 12-26, 32
unseen items a task, 20 draws; it keeps every candidate's read of every probe item and every
candidate's truth, so the stepped choice, the cross-fitted one and the ceilings are all read off its
archive. ``measure --part I/K`` measures the draws numbered I modulo K (K processes side by side, each
its own ``--out``); ``merge --from`` joins their records.
The `tuning3` family: ten other tasks, LoRA rank 8 on v, o, up and down of layers 4-19, 32 unseen
items, 20 draws; every item's read kept, but the truth of the menu and of each rule's pick only.
Everything is cached under ``--cache-dir`` and ``--out``; a rerun goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from configs import show, without_probes, write_rows as task_rows  # noqa: E402
from mergekit_mergeability.files import default_cache_dir  # noqa: E402
from mergekit_mergeability.decide.verdict import MENU as MENU_METHODS  # noqa: E402
from mergekit_mergeability.demo.steps import Demo, Settings  # noqa: E402
from mergekit_mergeability.files import write_atomic  # noqa: E402

TASKS = ("add_11", "add_50", "sub_2", "sub_10", "half", "previous", "tens", "add", "times", "smaller")
TRAIN, PROBE, SCORED = 16, 16, 48
METHODS = {"task_arithmetic": {"weight": 1.0}, "ties": {"weight": 1.0, "density": 0.5}}
ROWS = HERE / "pools" / "tuning_tasks.jsonl"
ARCHIVE = HERE / "pools" / "measured" / "tuning.json"
ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
SETTINGS = Settings(
    facts=str(ROWS),
    pool="tuning",
    fact_layers=tuple(range(15, 30)),
    fact_modules=ATTENTION,
    fact_rank=4,
    fact_adapters=True,
    fact_format="options",
)


@dataclass(frozen=True)
class Family:
    """A small-config family: its tasks and their items, how its experts are trained, its seeded
    draws of experts (size -> how many), and whether every rehearsed candidate's truth and every
    probe item's read are kept (so that any rule is read off the archive)."""

    name: str
    tasks: tuple
    settings: Settings
    scored: int
    draws: dict
    seed: int
    every: bool  # every candidate's truth, or only the menu's and each rule's pick's
    primary: str = "cross-fitted"  # the pre-registered rule its bars are read on

    @property
    def rows(self) -> Path:
        return Path(self.settings.facts)

    @property
    def archive(self) -> Path:
        return ARCHIVE.with_name(f"{self.name}.json")


def fresh(name: str, tasks: str, seed: int, every: bool, primary: str, **recipe) -> Family:
    """A fresh family as `tuning2` and `tuning3` are built: ``tasks`` (space-separated), their rows
    in pools/<name>_tasks.jsonl, its LoRA ``recipe`` (Settings' fact_* fields), 32 unseen items a task,
    20 draws (7 of 2 experts, 7 of 3, 6 of 5) seeded by ``seed``."""
    settings = replace(SETTINGS, facts=str(HERE / "pools" / f"{name}_tasks.jsonl"), pool=name, **recipe)
    return Family(name, tuple(tasks.split()), settings, 32, {2: 7, 3: 7, 5: 6}, seed, every, primary)


FAMILIES = {
    "tuning": Family("tuning", TASKS, SETTINGS, SCORED, {2: 8, 3: 8, 5: 8}, 50, every=False),
    # research/pools/prereg/tuning2.txt: new tasks, LoRA r8 on the MLP of layers 12-26, every candidate's truth
    "tuning2": fresh(
        "tuning2",
        "add_9 add_40 add_100 sub_4 sub_15 triple double_plus_one from_hundred mod_3 hundreds",
        51,
        every=True,
        primary="stepped",
        fact_layers=tuple(range(12, 27)),
        fact_modules=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
        fact_rank=8,
    ),
    # research/pools/prereg/tuning3.txt: new tasks, LoRA r8 on v, o, up, down of layers 4-19; the truth of
    # the menu and every rule's pick only
    "tuning3": fresh(
        "tuning3",
        "add_6 add_30 add_75 sub_8 sub_30 quadruple double_minus_one from_150 mod_5 digits_reversed",
        52,
        every=False,
        primary="lower bound",
        fact_layers=tuple(range(4, 20)),
        fact_modules=("self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"),
        fact_rank=8,
    ),
}
MENU = tuple(MENU_METHODS)  # the menu's candidates, by name
BOUND = 1.0  # the lower-bound choice's z (research/pools/prereg/tuning3.txt)


@dataclass(frozen=True)
class FreshPool:
    """A fresh pool for plan-check (issue 53): ten task experts, their rows, the unseen items a task
    that are its truth, and how they are trained."""

    tasks: tuple
    scored: int
    settings: Settings

    @property
    def rows(self) -> Path:
        return Path(self.settings.facts)


def fresh_pool(name: str, tasks: str, scored: int, **recipe) -> FreshPool:
    return FreshPool(
        tuple(tasks.split()),
        scored,
        replace(SETTINGS, facts=str(HERE / "pools" / f"{name}_tasks.jsonl"), pool=name, **recipe),
    )


FRESH = {
    # research/pools/prereg/plan_chooser.txt: trained as `tuning`, on tasks neither it nor `configs` uses
    "plan53": fresh_pool(
        "plan53", "add_3 add_20 sub_25 first_letter last_letter second_letter length backwards capitals vowels", 16
    ),
    # research/pools/prereg/plan_guard.txt: new tasks, LoRA r16 on q, k and gate of layers 6-24
    "plan54": fresh_pool(
        "plan54",
        "add_5 add_15 add_60 sub_3 sub_12 five_times from_200 mod_4 double_plus_three half_plus_one",
        32,
        fact_layers=tuple(range(6, 25)),
        fact_modules=("self_attn.q_proj", "self_attn.k_proj", "mlp.gate_proj"),
        fact_rank=16,
    ),
}
console = Console(width=120)


def write_rows(family: Family = FAMILIES["tuning"]) -> Path:
    """Each task's 16 trained and 16 probed items (``items``) and its unseen ones (``scored``)."""
    return task_rows(family.tasks, family.name, TRAIN, family.rows, family.scored)


def written_configs(family: Family):
    """(label, task names, method), the sizes interleaved so that a run cut short covers each."""
    rng = random.Random(family.seed)
    draws = {
        size: [sorted(rng.sample(family.tasks, size)) for _ in range(count)] for size, count in family.draws.items()
    }
    for n in range(max(family.draws.values())):
        for size, made in draws.items():
            for method in METHODS if n < len(made) else ():
                yield f"n{size}_{n}", made[n], method


def config(demo: Demo, experts, members, method: str, probes) -> dict:
    return {
        "merge_method": method,
        "base_model": str(demo.base()),
        "models": [
            {
                "model": f"{demo.base()}+{experts[f'task_{m}']['folder']}",
                "probe": str(probes[m]),
                "parameters": dict(METHODS[method]),
            }
            for m in members
        ],
        "dtype": "float32",
    }


def unseen_probes(demo: Demo, family: Family) -> dict:
    """Each task's unseen items as a probe file, lines as its probe's."""
    rows = {r["id"]: r for r in map(json.loads, family.rows.read_text().splitlines())}
    found = {}
    for task in family.tasks:
        fact = {"id": f"task_{task}", "items": rows[f"task_{task}"]["scored"], "train": 0}
        lines = "".join(json.dumps(line) + "\n" for line in demo.probe_lines(fact))
        found[task] = write_atomic(demo.out / "unseen" / f"{task}.jsonl", lines)
    return found


def trained_probes(demo: Demo, family: Family) -> dict:
    """Each task's 16 training items as a probe file: what a user who has the fine-tuning data has."""
    from mergekit_mergeability.demo.training import fact_lines

    found = {}
    for r in map(json.loads, family.rows.read_text().splitlines()):
        lines = "".join(json.dumps(line) + "\n" for line in fact_lines(r, family.settings.fact_format, trained=True))
        found[r["id"].removeprefix("task_")] = write_atomic(demo.out / "trained" / f"{r['id']}.jsonl", lines)
    return found


def rehearse(document: dict):
    """The precheck's measurements of ``document`` (what decides the merge to write), with the
    representation passes and the signature skipped: they do not enter the choice."""
    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.settings import PrecheckSettings

    settings = PrecheckSettings(
        device="cpu", dtype="float32", quiet=True, skip=("representations", "selectivity", "fluency", "dilution")
    )
    return measuring.measure(api._spec(document, pools=True), {}, settings)


def asked_inputs(document: dict, asked: dict, members, limit: int):
    """(spec, the precheck's inputs) of ``document`` with each member's probe ``asked`` (task -> probe
    file), ``limit`` items, loaded in float32 on the CPU."""
    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.diagnostics import DiagnosticInputs
    from mergekit_mergeability.settings import PrecheckSettings

    written = without_probes(document)
    for entry, task in zip(written["models"], members):
        entry["probe"] = str(asked[task])
    spec = api._spec(written, pools=True)
    base, models = measuring.load_inputs(spec, measuring.probe_specs(spec, {}), limit, "float32")
    return spec, DiagnosticInputs(base, models, PrecheckSettings(device="cpu", dtype="float32"))


class Truth:
    """A candidate's members' mean p(gold) on their unseen items (or other probes) in its merge, built in memory as
    the rehearsal builds it (``dilution.as_written`` on mergekit's plan, DARE drawn as the rehearsal
    draws it), cached by the merge."""

    def __init__(self, out: Path, name: str = "truth.json", limit: int = SCORED, each: bool = False):
        self.path, self.limit, self.each = out / name, limit, each
        self.cache = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def __call__(self, document: dict, merges: dict, unseen: dict, members) -> dict:
        """``merges``: name -> config; returns name -> task -> mean p(gold) on its unseen items (with
        ``each``, every item's p(gold))."""
        from functools import partial

        from mergekit_mergeability.decide.tuning import _merge_key
        from mergekit_mergeability.diagnostics.knowledge import scores
        from mergekit_mergeability.rehearsal.shared_layers import shared_below
        from mergekit_mergeability.merge_config import absolute
        from mergekit_mergeability.rehearsal.planned import plan
        from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
        from mergekit_mergeability.sources import load_causal_lm

        keys = {name: _merge_key(config) for name, config in merges.items()}
        left = {name: merges[name] for name, key in keys.items() if key not in self.cache}
        if left:
            spec, inputs = asked_inputs(document, unseen, members, self.limit)
            base, models = inputs.base, inputs.models
            touched = set().union(*inputs.touched.values())
            sources = {m.name: m.path for m in (base, *models)}
            module, tokenizer = load_causal_lm(base.path, "cpu", "float32")
            candidates = [
                as_planned(name, plan(absolute(config, sources), spec.source)) for name, config in left.items()
            ]
            jobs = [
                Job(name, partial(scores, module, tokenizer, list(m.probes), None)) for name in left for m in models
            ]
            with shared_below(module, touched):  # the untouched layers run once for every merge
                reads = iter(walk(module, candidates, jobs, list(sources.values()), touched))
            for name in left:
                read = {m.name: next(reads) for m in models}
                each = {f"task_{t}": [s.p_gold for s in read[m.name]] for t, m in zip(members, models)}
                self.cache[keys[name]] = {
                    t: [round(v, 6) for v in values] if self.each else sum(values) / len(values)
                    for t, values in each.items()
                }
            write_atomic(self.path, json.dumps(self.cache, indent=1))
        return {name: self.cache[key] for name, key in keys.items()}


def task_of(document: dict, members) -> dict:
    """Each model of ``document`` as written -> its task's name in the records (task_<member>)."""
    return {m["model"]: f"task_{t}" for m, t in zip(document["models"], members)}


def rehearsed(document: dict, members, label: str):
    """The precheck's rehearsal of ``document``: (each model's knowledge, each candidate's reads of its
    probe items, each candidate's advice, what the archive keeps: each candidate's line and every
    item's read by task, so that any rule can be read off it)."""
    from mergekit_mergeability import menu
    from mergekit_mergeability.decide.tuning import candidates
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.records import KnowledgeStats

    measured = rehearse(document)
    if "menu" not in measured.results:
        raise SystemExit(f"{label}: the menu was not rehearsed ({measured.errors()})")
    known = measured.results["knowledge"].per_model
    knowledge = {m: KnowledgeStats.of(known.get(m)).scored_mean_p_gold for m in known}
    reads = menu.scored(measured.results["menu"])
    offered = candidates(document, knowledge)
    tasks = task_of(document, members)
    archived = {
        "lines": {c: offered[c].line for c in reads if c != AS_WRITTEN},
        "reads": {
            c: {tasks[m]: [round(v, 6) for v in items] for m, items in by_model.items()}
            for c, by_model in reads.items()
        },
    }
    return knowledge, reads, offered, archived


def measure(args) -> None:
    from mergekit_mergeability.decide.tuning import methods
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, choose_method

    family = FAMILIES[args.family]
    if not family.rows.is_file():
        write_rows(family)
    demo = Demo(family.settings, args.cache_dir, args.out, console, quiet=False)
    started = time.perf_counter()
    experts = demo.fact_experts()
    console.print(f"{len(experts)} experts ({time.perf_counter() - started:.0f} s)")
    probes = {t: experts[f"task_{t}"]["probe"] for t in family.tasks}
    unseen, trained = unseen_probes(demo, family), trained_probes(demo, family)
    truth, on_trained = Truth(args.out, limit=family.scored), Truth(args.out, "trained.json")
    saved = args.out / f"{family.name}.json"
    records = json.loads(saved.read_text()) if saved.is_file() else []
    done = {(r["config"], r["method"]) for r in records}
    part, parts = args.part
    for label, members, method in written_configs(family):
        if (label, method) in done or int(label.split("_")[1]) % parts != part:
            continue
        if args.only and f"{label}_{method}" not in args.only:
            continue
        begun = time.perf_counter()
        document = config(demo, experts, members, method, probes)
        demo.write_config(f"{label}_{method}", document)  # what a user would run, and benchmarks/tuning.py
        knowledge, reads, offered, archived = rehearsed(document, members, f"{label} {method}")
        kinds = methods(document, knowledge)
        tuned = choose_method(reads, knowledge, kinds)
        untuned = choose_method({c: v for c, v in reads.items() if c in (AS_WRITTEN, *MENU)}, knowledge, kinds)
        tasks = task_of(document, members)
        needed = reads if family.every else (AS_WRITTEN, *(c for c in MENU if c in reads), *rules(archived).values())
        merges = {c: document if c == AS_WRITTEN else offered[c].advice.config for c in dict.fromkeys(needed)}
        measured_truth = truth(document, merges, unseen, members)
        # the merge as written asked its members' training items: a probe from the fine-tuning data
        from_training = on_trained(document, {AS_WRITTEN: document}, trained, members)[AS_WRITTEN]
        records.append(
            {
                "config": label,
                "method": method,
                "members": [f"task_{m}" for m in members],
                "rehearsed": list(reads),
                "tuned": {"chosen": tuned.chosen, "best": tuned.best, "gain": tuned.gain, "kept": tuned.kept},
                "untuned": {"chosen": untuned.chosen, "best": untuned.best, "gain": untuned.gain},
                "measured": measured_truth,
                "probe_read": {tasks[m]: v for m, v in tuned.per_model[AS_WRITTEN].items()},
                "trained_read": from_training,
                "seconds": round(time.perf_counter() - begun, 1),
            }
        )
        records[-1] |= archived
        write_atomic(saved, json.dumps(records, indent=1))
        chose = rules(archived)
        console.print(
            f"{label}_{method}: {family.primary} {chose[family.primary]},"
            f" budget 0 {chose[family.primary + ', budget 0']} ({records[-1]['seconds']:.0f} s)"
        )
        if args.archive:
            write_atomic(family.archive, saved.read_text())
    report(args, records)


def kept(record, candidate: str) -> float:
    truth = record["measured"][candidate]
    return sum(truth[t] for t in record["members"]) / len(record["members"])


def report(args, records=None) -> None:
    """The bars of issue 50 on the written configs measured so far: for a family that kept every
    item's read, the stepped choice's (tuning2.txt) and every rule beside it; else the cross-fitted
    choice the run recorded (tuning.txt)."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.maths.stats import mean_interval

    family = FAMILIES[args.family]
    if records is None:
        saved = args.out / f"{family.name}.json"
        records = json.loads((saved if saved.is_file() else family.archive).read_text())
    picked = [picks(r) for r in records] if all("reads" in r for r in records) else None
    if picked:
        rule = f"the {family.primary} choice"
        choices = [(p[family.primary], p[f"{family.primary}, budget 0"]) for p in picked]
    else:
        rule, choices = "the cross-fitted choice", [(r["tuned"]["chosen"], r["untuned"]["chosen"]) for r in records]
    table = Table(
        title=f"the `{family.name}` family, {rule}: {len(records)} written configs,"
        f" truth on {family.scored} unseen items a member"
    )
    for column in ("quantity", "mean", "95% interval", "worst", "bar"):
        table.add_column(column)

    def menu_best(r):
        return max(kept(r, c) for c in (AS_WRITTEN, *MENU) if c in r["measured"])

    rows = [
        ("(a) tuned − best of the menu", [kept(r, t) - menu_best(r) for r, (t, _) in zip(records, choices)], "≥ +0.01, low > −0.005"),
        ("(b) untuned − best of the menu", [kept(r, u) - menu_best(r) for r, (_, u) in zip(records, choices)], "≥ −0.01"),
        ("(c) tuned − as written", [kept(r, t) - kept(r, AS_WRITTEN) for r, (t, _) in zip(records, choices)], "worst ≥ −0.02"),
        ("untuned − as written", [kept(r, u) - kept(r, AS_WRITTEN) for r, (_, u) in zip(records, choices)], ""),
    ]  # fmt: skip
    for name, values, bar in rows:
        mean, (low, high) = mean_interval(values)
        table.add_row(name, f"{mean:+.3f}", f"[{low:+.3f}, {high:+.3f}]", f"{min(values):+.3f}", bar)
    show(table, args.markdown)
    if picked:
        by_rule(records, picked, args.markdown)
    probes_from(records, args.markdown, family.scored)
    moved = sum(t != AS_WRITTEN for t, _ in choices)
    console.print(f"tuned: off the config as written on {moved} of {len(records)}")


def rules(record) -> dict:
    """Each rule's pick on a record that kept every item's read (tuning2.txt, tuning3.txt): rule ->
    candidate."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, choose_method

    reads = record["reads"]
    parents = {
        c: AS_WRITTEN if line.startswith("as written") else "mean" if line.startswith("mean") else line
        for c, line in record["lines"].items()
        if c not in MENU
    }
    untuned = {c: v for c, v in reads.items() if c in (AS_WRITTEN, *MENU)}
    tuned_x, untuned_x = choose_method(reads), choose_method(untuned)
    return {
        "lower bound": choose_method(reads, bound=BOUND).chosen,
        "lower bound, budget 0": choose_method(untuned, bound=BOUND).chosen,
        "stepped": choose_method(reads, parents=parents).chosen,
        "stepped, budget 0": choose_method(untuned, parents=parents).chosen,
        "cross-fitted": tuned_x.chosen,
        "cross-fitted, budget 0": untuned_x.chosen,
        "ungated": tuned_x.best,
        "ungated, budget 0": untuned_x.best,
        # plan's guard (prereg/plan_guard.txt), read here after the fact: not pre-registered for the precheck
        "interval-guarded": choose_method(reads, sure=True).chosen,
        "interval-guarded, budget 0": choose_method(untuned, sure=True).chosen,
    }


def picks(record) -> dict:
    """Every rule's pick and the ceilings (the best truth of the menu, and of every candidate where
    each was measured): rule -> candidate."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN

    ceilings = {
        "ceiling: best of the menu": max(
            (c for c in record["reads"] if c in (AS_WRITTEN, *MENU)), key=lambda c: kept(record, c)
        )
    }
    if set(record["reads"]) <= set(record["measured"]):
        ceilings["ceiling: best of every candidate"] = max(record["reads"], key=lambda c: kept(record, c))
    return rules(record) | ceilings


def by_rule(records, picked, markdown: bool) -> None:
    """Every rule read off the archive, against the best of the menu and the config as written (truth
    on the unseen items, each config's mean over members; 95% intervals over configs)."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.maths.stats import mean_interval

    chosen = picked
    table = Table(title=f"every rule on {len(records)} written configs: truth on unseen items, kept − reference")
    for column in ("rule", "− best of the menu", "95% interval", "worst", "− as written", "95% interval ", "worst "):
        table.add_column(column)
    for rule in (r for r in chosen[0] if all(r in c for c in chosen)):
        cells = []
        for reference in ("ceiling: best of the menu", AS_WRITTEN):
            values = [kept(r, c[rule]) - kept(r, c.get(reference, reference)) for r, c in zip(records, chosen)]
            mean, (low, high) = mean_interval(values)
            cells += [f"{mean:+.3f}", f"[{low:+.3f}, {high:+.3f}]", f"{min(values):+.3f}"]
        table.add_row(rule, *cells)
    show(table, markdown)


def probes_from(records, markdown: bool, scored: int = SCORED) -> None:
    """The merge as written, each member's own score predicted from a probe of its 16 held-out items
    and from its 16 training items, against its mean p(gold) on its ``scored`` unseen items."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.maths.stats import correlate, mean_interval

    rows = [
        (r["probe_read"][t], r["trained_read"][t], r["measured"][AS_WRITTEN][t])
        for r in records
        if "trained_read" in r
        for t in r["members"]
    ]
    if len(rows) < 3:
        return
    table = Table(title=f"probes for the merge as written: {len(rows)} members, truth on {scored} unseen items")
    for column in ("probe of 16 items", "Spearman", "95% interval", "permutation p", "MAE", "MAE 95%"):
        table.add_column(column)
    truth = [y for *_, y in rows]
    for name, column in (("held out of training", 0), ("from the training items", 1)):
        read = [row[column] for row in rows]
        c = correlate(read, truth)
        mae, (low, high) = mean_interval([abs(a - b) for a, b in zip(read, truth)])
        table.add_row(
            name,
            f"{c.spearman:+.2f}",
            f"[{c.interval[0]:+.2f}, {c.interval[1]:+.2f}]",
            f"{c.p_permutation:.4f}",
            f"{mae:.3f}",
            f"[{low:.3f}, {high:.3f}]",
        )
    show(table, markdown)


def regression(args) -> None:
    """Budget 0 on `configs`' archived per-item reads: the probe's 16 items choose, the 48 unseen judge."""
    import numpy as np

    from configs import ARCHIVE as CONFIGS, ARCHIVE_ITEMS
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, choose_method
    from mergekit_mergeability.maths.stats import mean_interval

    read = json.loads(ARCHIVE_ITEMS.read_text())
    given = {"cross-fitted": {}, "stepped": {"parents": {}}, "lower bound": {"bound": BOUND}}  # the menu has no knobs
    over, gap = ({rule: [] for rule in given} for _ in range(2))
    for r in json.loads(CONFIGS.read_text()):
        at = {c: read.get(f"{r['config']}_{r['method']} {c}") for c in r["measured"]}
        if len(at) <= 1 or None in at.values():
            continue
        order = [AS_WRITTEN, *(c for c in MENU if c in at)]
        truth = {c: np.mean([np.mean(at[c][t][PROBE:]) for t in r["members"]]) for c in order}
        for rule, options in given.items():
            probes = {c: {t: at[c][t][:PROBE] for t in r["members"]} for c in order}
            chosen = choose_method(probes, **options).chosen
            over[rule].append(truth[chosen] - truth[AS_WRITTEN])
            gap[rule].append(max(truth.values()) - truth[chosen])
    count = len(over["stepped"])
    table = Table(title=f"`configs` (regression, budget 0): {count} configs, truth on 48 unseen items")
    for column in ("rule", "quantity", "mean", "95% interval", "worst"):
        table.add_column(column)
    for rule in given:
        for name, values, worst in (
            ("chosen − as written", over[rule], min(over[rule])),
            ("best of the menu − chosen", gap[rule], max(gap[rule])),
        ):
            mean, (low, high) = mean_interval(values)
            table.add_row(rule, name, f"{mean:+.3f}", f"[{low:+.3f}, {high:+.3f}]", f"{worst:+.3f}")
    show(table, args.markdown)


def items(args, draws: int = 6) -> None:
    """Each rule on fewer probe items: n of each member's 16, drawn without replacement (``draws``
    draws a config, seeded), on a family that kept every candidate's read and truth (tuning2); truth
    as in ``report``. Says how the choice gains with the items it is given, not how it would with
    more than 16."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN

    records = json.loads(FAMILIES[args.family].archive.read_text())
    shown = ("lower bound", "cross-fitted", "ungated", "lower bound, budget 0", "cross-fitted, budget 0")
    table = Table(
        title=f"the `{args.family}` family on fewer probe items: kept − best of the menu (worst − as written)"
    )
    for column in ("items a probe", *shown):
        table.add_column(column)
    rng = random.Random(0)
    for n in (4, 8, 12, PROBE):
        over, under = ({rule: [] for rule in shown} for _ in range(2))
        for _ in range(draws if n < PROBE else 1):
            for r in records:
                keep = {m: sorted(rng.sample(range(PROBE), n)) for m in r["members"]}
                reads = {c: {m: [v[i] for i in keep[m]] for m, v in by.items()} for c, by in r["reads"].items()}
                chose = picks(r | {"reads": reads})
                for rule in shown:
                    over[rule].append(kept(r, chose[rule]) - kept(r, chose["ceiling: best of the menu"]))
                    under[rule].append(kept(r, chose[rule]) - kept(r, AS_WRITTEN))
        table.add_row(str(n), *(f"{statistics.fmean(over[u]):+.3f} ({min(under[u]):+.3f})" for u in shown))
    show(table, args.markdown)


LENGTHS = (8, 16, 24, 32)  # items a probe (research/pools/prereg/probe_length.txt)
SHOWN = ("lower bound", "cross-fitted", "stepped", "ungated", "lower bound, budget 0", "cross-fitted, budget 0")


def lengths(args) -> None:
    """research/pools/prereg/probe_length.txt: the rehearsal of every written config of ``--family``
    and every rehearsed candidate's read of every unseen item (``--part`` as ``measure``'s), then each
    rule on n of 32 items that may be probed (the 16 probe items and the first 16 unseen), judged on
    the last 32 unseen items. ``--report`` reads what is measured (``--out`` and ``--from``, else the
    archive; ``--archive`` keeps it there)."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN

    family = FAMILIES[args.family]
    saved = args.out / "lengths.json"
    archive = ARCHIVE.parent / "lengths" / f"{family.name}.json"
    if args.report:
        found = [saved, *(folder / "lengths.json" for folder in args.parts_from)]
        found = [path for path in found if path.is_file()] or [archive]  # a fresh clone reads the archive
        records = [r for path in found for r in json.loads(path.read_text())]
        records = [r for r in records if args.draws is None or int(r["config"].split("_")[1]) < args.draws]
        if args.archive:
            write_atomic(archive, json.dumps(records))
    else:
        records = json.loads(saved.read_text()) if saved.is_file() else []
        demo = Demo(family.settings, args.cache_dir, args.out, console, quiet=False)
        experts = demo.fact_experts()
        probes = {t: experts[f"task_{t}"]["probe"] for t in family.tasks}
        unseen, truth = unseen_probes(demo, family), Truth(args.out, "items.json", family.scored, each=True)
        done = {(r["config"], r["method"]) for r in records}
        part, parts = args.part
        for label, members, method in written_configs(family):
            if (label, method) in done or int(label.split("_")[1]) % parts != part:
                continue
            begun = time.perf_counter()
            document = config(demo, experts, members, method, probes)
            _, reads, offered, archived = rehearsed(document, members, f"{label} {method}")
            merges = {c: document if c == AS_WRITTEN else offered[c].advice.config for c in reads}
            records.append(
                {"config": label, "method": method, "members": [f"task_{m}" for m in members]}
                | archived
                | {"unseen": truth(document, merges, unseen, members)}
                | {"seconds": round(time.perf_counter() - begun, 1)}
            )
            write_atomic(saved, json.dumps(records, indent=1))
            console.print(f"{label}_{method}: {len(reads)} candidates ({records[-1]['seconds']:.0f} s)")
    lengths_report(records, args.markdown)


def lengths_report(records, markdown: bool, draws: int = 6) -> None:
    """Each rule's pick on n of each member's 32 probe-able items (``draws`` seeded draws; all 32 once;
    "16 probe" the precheck's own 16), its truth on the last 32 unseen items: the mean over configs
    and draws of (pick − best of the menu) and, in brackets, the worst (pick − as written); then the
    intervals over configs (draws averaged within a config) at 16 and 32 items."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN
    from mergekit_mergeability.maths.stats import mean_interval

    if not records:
        return
    rng, judged = random.Random(0), []
    for r in records:
        held = {c: {m: items[PROBE:] for m, items in by.items()} for c, by in r["unseen"].items()}
        pool = {c: {m: r["reads"][c][m] + items[:PROBE] for m, items in by.items()} for c, by in r["unseen"].items()}
        judged.append(
            (r | {"measured": {c: {m: statistics.fmean(v) for m, v in by.items()} for c, by in held.items()}}, pool)
        )
    counts = {"16 probe": None, **{str(n): n for n in LENGTHS}}  # column -> items drawn (None: its own 16)
    over, under = {}, {}  # (rule, n) -> per config: its draws' differences
    for name, n in counts.items():
        for r, pool in judged:
            count = 1 if n in (None, 2 * PROBE) else draws
            chosen = []
            for _ in range(count):
                keep = {m: range(PROBE) if n is None else sorted(rng.sample(range(2 * PROBE), n)) for m in r["members"]}
                reads = {c: {m: [v[i] for i in keep[m]] for m, v in by.items()} for c, by in pool.items()}
                chosen.append(picks(r | {"reads": reads}))
            for rule in (*SHOWN, "ceiling: best of every candidate"):
                menu = [kept(r, c[rule]) - kept(r, c["ceiling: best of the menu"]) for c in chosen]
                written = [kept(r, c[rule]) - kept(r, AS_WRITTEN) for c in chosen]
                over.setdefault((rule, name), []).append(statistics.fmean(menu))
                under.setdefault((rule, name), []).append(min(written))
    table = Table(
        title=f"{len(records)} written configs, pick's truth on 32 unseen items − the best of the menu's"
        " (worst − as written), by items a probe"
    )
    for column in ("rule", *counts):
        table.add_column(column)
    for rule in (*SHOWN, "ceiling: best of every candidate"):
        table.add_row(rule, *(f"{statistics.fmean(over[rule, n]):+.3f} ({min(under[rule, n]):+.3f})" for n in counts))
    show(table, markdown)
    table = Table(title="the same, − the best of the menu, 95% intervals over configs")
    for column in ("rule", "16 items", "32 items"):
        table.add_column(column)
    for rule in SHOWN:
        cells = []
        for n in ("16", "32"):
            mean, (low, high) = mean_interval(over[rule, n])
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        table.add_row(rule, *cells)
    show(table, markdown)
    console.print(ceiling_bias(judged))


def ceiling_bias(judged, draws: int = 20) -> str:
    """Read after the table, not pre-registered: how much a ceiling gains from being read on the items
    it was chosen on. The 32 truth items split in halves (``draws`` seeded splits, each way round):
    the best candidate on one half, read on the other, against the best read on that other half."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN

    rng, found = random.Random(0), {"the menu": [], "every candidate": []}
    for r, _ in judged:
        truth = r["unseen"]

        def kept_on(c, items):
            return statistics.fmean(statistics.fmean(truth[c][m][PROBE + i] for i in items) for m in r["members"])

        for _ in range(draws):
            order = rng.sample(range(2 * PROBE), 2 * PROBE)
            for chosen_on, read_on in ((order[:PROBE], order[PROBE:]), (order[PROBE:], order[:PROBE])):
                for name, among in (
                    ("the menu", [c for c in truth if c in (AS_WRITTEN, *MENU)]),
                    ("every candidate", list(truth)),
                ):
                    pick = max(among, key=lambda c: kept_on(c, chosen_on))
                    found[name].append(max(kept_on(c, read_on) for c in among) - kept_on(pick, read_on))
    return "selection bias of a ceiling read on the items it is chosen on, 16 truth items (÷√2 for 32): " + ", ".join(
        f"{name} {statistics.fmean(v):+.4f}" for name, v in found.items()
    )


def plan_check(args) -> None:
    """issue 53 on ``--family``'s ten experts as one pool, planned and scored on their unseen items
    as ``configs plan-check`` does for the `configs` family's (its docstring says how)."""
    from configs import plan_check as check_family

    if args.fresh:
        pool = FRESH[args.fresh]
        write = lambda: task_rows(pool.tasks, args.fresh, TRAIN, pool.rows, pool.scored)  # noqa: E731
        check_family(args, pool.settings, pool.tasks, pool.rows, write)
    else:
        family = FAMILIES[args.family]
        check_family(args, family.settings, family.tasks, family.rows, lambda: write_rows(family))


def merge(args) -> None:
    """The records of ``--from`` folders (measure --part) into ``--out``'s, in the family's order, and
    the archive with ``--archive``."""
    family = FAMILIES[args.family]
    saved = args.out / f"{family.name}.json"
    found = {}
    for folder in (args.out, *args.parts_from):
        path = folder / f"{family.name}.json"
        for record in json.loads(path.read_text()) if path.is_file() else []:
            found.setdefault((record["config"], record["method"]), record)
    records = [found[label, method] for label, _, method in written_configs(family) if (label, method) in found]
    write_atomic(saved, json.dumps(records, indent=1))
    if args.archive:
        write_atomic(family.archive, saved.read_text())
    console.print(f"{len(records)} of {len(list(written_configs(family)))} written configs in {saved}")


def cutoffs(args) -> None:
    """Where the precheck as users run it (representations on) finds a CKA cut-off on a family's
    draws, and whether a layer patch there changes any weight: one that does makes the verdict
    layer_selective before the rehearsed menu is read (the families were measured without the
    representations). One run per draw: neither the cut-off nor the updates depend on the method."""
    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.decide.verdict import patch_changes
    from mergekit_mergeability.settings import PrecheckSettings

    family = FAMILIES[args.family]
    demo = Demo(family.settings, args.cache_dir, args.out, console, quiet=True)
    experts = demo.fact_experts()
    probes = {t: experts[f"task_{t}"]["probe"] for t in family.tasks}
    skip = ("knowledge", "fluency", "dilution", "selectivity", "menu")
    settings = PrecheckSettings(device="cpu", dtype="float32", quiet=True, skip=skip)
    saved = args.out / "cutoffs.json"
    found = json.loads(saved.read_text()) if saved.is_file() else {}
    for label, members, method in written_configs(family):
        if method != "task_arithmetic" or label in found:
            continue
        measured = measuring.measure(
            api._spec(config(demo, experts, members, method, probes), pools=True), {}, settings
        )
        cut = measuring.decision(measured, settings).cutoff
        changes = cut is not None and patch_changes(measuring.experts(measured), cut)
        found[label] = {"members": members, "cutoff": cut, "changes": changes}
        write_atomic(saved, json.dumps(found, indent=1))
        console.print(f"{label}: cut-off {cut}, the patch changes weights: {found[label]['changes']}")
    cut = [f for f in found.values() if f["cutoff"] is not None]
    changing = [f for f in cut if f["changes"]]
    console.print(
        f"{family.name}: {len(found)} draws; a CKA cut-off on {len(cut)} (blocks"
        f" {sorted({f['cutoff'] for f in cut})}); a patch that changes weights, so layer_selective before the"
        f" menu, on {len(changing)}"
    )


def patch_reads(document: dict, cutoff: int, asked: dict, members, limit: int) -> dict:
    """Each member's items of ``asked`` (task -> probe file) read on its own layer patch at ``cutoff``,
    as the precheck's menu builds and reads it (``menu.patches``), float32: member task -> one read
    per item."""
    from functools import partial

    from mergekit_mergeability import menu
    from mergekit_mergeability.diagnostics.knowledge import as_read
    from mergekit_mergeability.rehearsal.shared_layers import shared_below
    from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
    from mergekit_mergeability.sources import load_causal_lm

    spec, inputs = asked_inputs(document, asked, members, limit)
    touched = set().union(*inputs.touched.values())
    paths = [m.path for m in (inputs.base, *inputs.models)]
    planned = menu.patches(spec, inputs, cutoff)
    module, tokenizer = load_causal_lm(inputs.base.path, "cpu", "float32")
    candidates = [as_planned(m.name, planned[m.name]) for m in inputs.models]
    jobs = [Job(m.name, partial(as_read, module, tokenizer, list(m.probes))) for m in inputs.models]
    with shared_below(module, touched):
        reads = walk(module, candidates, jobs, paths, touched)
    return {f"task_{task}": read for task, read in zip(members, reads)}


def patch(args) -> None:
    """research/pools/prereg/patch.txt: on each written config of a family whose draw has a CKA cut-off
    some update reaches (cutoffs archive), the layer patch rehearsed as one more candidate: its reads
    (each member's probe on its own patch) beside the family's archived reads of every other
    candidate, the shipped chooser over all, and the patch's truth (each member's unseen items on
    its own patch). Cached in --out/patch.json."""
    family = FAMILIES[args.family]
    cut = json.loads((HERE / "pools" / "measured" / "cutoffs" / f"{family.name}.json").read_text())
    demo = Demo(family.settings, args.cache_dir, args.out, console, quiet=True)
    experts = demo.fact_experts()
    probes = {t: experts[f"task_{t}"]["probe"] for t in family.tasks}
    unseen = unseen_probes(demo, family)
    saved = args.out / "patch.json"
    found = json.loads(saved.read_text()) if saved.is_file() else {}
    for record in json.loads(family.archive.read_text()):
        label, method = record["config"], record["method"]
        draw, key = cut[label], f"{label}_{method}"
        if not draw["changes"] or key in found:
            continue
        begun = time.perf_counter()
        members = [t.removeprefix("task_") for t in record["members"]]
        document = config(demo, experts, members, method, probes)
        reads = patch_reads(document, draw["cutoff"], probes, members, None)
        truth = patch_reads(document, draw["cutoff"], unseen, members, family.scored)
        found[key] = {
            "cutoff": draw["cutoff"],
            "reads": {t: [round(v, 6) for v in r] for t, r in reads.items()},
            "truth": {t: sum(r) / len(r) for t, r in truth.items()},
            "seconds": round(time.perf_counter() - begun, 1),
        }
        write_atomic(saved, json.dumps(found, indent=1))
        console.print(f"{key}: cut-off {draw['cutoff']} ({found[key]['seconds']:.0f} s)")
    if args.archive:
        write_atomic(HERE / "pools" / "measured" / "patch" / f"{family.name}.json", saved.read_text())
    patch_report(family, found, args.markdown)


def patch_report(family: "Family", found: dict, markdown: bool) -> None:
    """The prereg's comparisons on the unseen items: the new recommendation, the patch always (the old
    order) and the menu's choice without the patch, each against the config as written; the ceiling."""
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, PATCH, choose_method
    from mergekit_mergeability.maths.stats import mean_interval

    records = {f"{r['config']}_{r['method']}": r for r in json.loads(family.archive.read_text())}
    for key, patched in found.items():  # every rule read off the reads: the archive's and the patch's
        reads = records[key]["reads"]
        patched["chosen_without"] = choose_method(reads).chosen
        assert patched["chosen_without"] == records[key]["tuned"]["chosen"], key  # the archive's own choice
        patched["registered"] = choose_method({**reads, PATCH: patched["reads"]}).chosen
        patched["chosen"] = choose_method({**reads, PATCH: patched["reads"]}, baseline=PATCH).chosen

    def truth(key: str, candidate: str) -> float:
        record, members = records[key], records[key]["members"]
        table = found[key]["truth"] if candidate == PATCH else record["measured"][candidate]
        return statistics.fmean(table[t] for t in members)

    keys = sorted(found)
    ways = {
        "the config as written": lambda k: truth(k, AS_WRITTEN),
        "the layer patch always (before)": lambda k: truth(k, PATCH),
        "the menu's choice, no patch": lambda k: truth(k, found[k]["chosen_without"]),
        "the patch among the candidates (registered)": lambda k: truth(k, found[k]["registered"]),
        "the patch as the baseline (amendment 1, ships)": lambda k: truth(k, found[k]["chosen"]),
        "ceiling: best on unseen items": lambda k: max(truth(k, c) for c in [*records[k]["measured"], PATCH]),
    }
    kept = {name: [way(k) for k in keys] for name, way in ways.items()}
    table = Table(title=f"{family.name}: {len(keys)} written configs with a cut-off some update reaches")
    for column in ("", "mean kept (unseen)", "− as written", "95% (over configs)", "worst − as written"):
        table.add_column(column)
    for name, values in kept.items():
        gain = [v - w for v, w in zip(values, kept["the config as written"])]
        mean, (low, high) = mean_interval(gain)
        row = f"{statistics.fmean(values):.3f}", f"{mean:+.3f}", f"{low:+.3f} to {high:+.3f}", f"{min(gain):+.3f}"
        table.add_row(name, *row)
    show(table, markdown)
    for rule in ("the patch among the candidates (registered)", "the patch as the baseline (amendment 1, ships)"):
        for name in ("the layer patch always (before)", "the menu's choice, no patch"):
            mean, (low, high) = mean_interval([a - b for a, b in zip(kept[rule], kept[name])])
            console.print(f"{rule} − {name}: {mean:+.3f} (95% {low:+.3f} to {high:+.3f})")
    for rule in ("registered", "chosen"):
        picked = sum(found[k][rule] == PATCH for k in keys)
        console.print(f"{rule}: the patch chosen on {picked} of {len(keys)} configs")
    show(table, markdown)


COMMANDS = {
    "measure": measure,
    "merge": merge,
    "report": report,
    "regression": regression,
    "items": items,
    "plan-check": plan_check,
    "cutoffs": cutoffs,
    "patch": patch,
    "lengths": lengths,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "demo")
    parser.add_argument(
        "--family", choices=FAMILIES, default="tuning", help="measure, report, plan-check: which small-config family"
    )
    parser.add_argument("--out", type=Path, default=None, help="default: pools-out/<family> (or <fresh pool>)")
    parser.add_argument("--archive", action="store_true", help="measure: keep the records in research/pools/measured")
    parser.add_argument(
        "--part",
        type=lambda text: tuple(map(int, text.split("/"))),
        default=(0, 1),
        help="measure: I/K, only the draws whose number is I modulo K (K processes side by side, each its --out;"
        " then `merge`)",
    )
    parser.add_argument("--only", nargs="+", default=[], help="measure: these written configs alone (n2_6_ties ...)")
    parser.add_argument(
        "--from", dest="parts_from", type=Path, nargs="+", default=[], help="merge, lengths --report: the parts' --out"
    )
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--report", action="store_true", help="lengths: read what --out and --from hold, measure nothing"
    )
    parser.add_argument("--draws", type=int, default=None, help="lengths --report: the first N draws of each size")
    parser.add_argument("--models", type=int, nargs="+", default=[1], help="plan-check: K, the merged models planned")
    parser.add_argument(
        "--random", type=int, default=0, help="plan-check: random subsets of the rehearsed plan's size and method"
    )
    parser.add_argument(
        "--fresh",
        nargs="?",
        const="plan53",
        choices=FRESH,
        help="plan-check: a fresh pool of issue 53 (plan53: pools/prereg/plan_chooser.txt; plan54: plan_guard.txt)",
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = Path("pools-out") / (args.fresh or args.family)
    args.out.mkdir(parents=True, exist_ok=True)
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()
