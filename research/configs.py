"""Small configs as users write them: issue 40's ``configs`` family, the ground truth for the
precheck's rehearsal of the merge as written and for its method choice.

    python research/run.py configs measure [--no-menu-truth] [--archive]  # train, precheck, merge, score
    python research/run.py configs write                 # the 20 configs, nothing measured
    python research/run.py configs report [--markdown]   # the tables of docs/prediction.md (a fresh
                                                         # clone reads pools/measured/configs.json)
    python research/run.py configs lm-eval [--archive]   # the same family scored through lm-eval tasks
                                                         # (measure's merges reused, or built)
    python research/run.py configs menu [--archive]      # the menu's truth for the configs measure
                                                         # left without it (amendment 9)
    python research/run.py configs plan-check            # issue 41: plan on the ten experts, scored unseen
    python research/run.py configs ceiling [--archive]   # amendment 11: how far a 16-item probe lets an exact
                                                         # rehearsal reach (a fresh clone reads the archive)

Ten task-level experts of SmolLM2-135M-Instruct (a rule such as "add 7" or "the larger of two
numbers"; LoRA r8 on the MLP of layers 9-20, trained on 12 items with the options listed, no solved
examples). Each has a probe of the next 16 items, which is all the precheck sees, and 48
items after those that nobody sees until the merge is scored. Configs of 2, 3 and 5 experts (two,
two and one seeded draws), each written four ways as users write them: ``task_arithmetic``
(weight 1 each), ``ties`` and ``dare_ties`` (density 0.5, weight 1), ``della`` (density 0.5,
epsilon 0.1, lambda 1). Ground truth: each member's mean p(gold) on its 48 unseen items in the
merge mergekit writes (``run_merge``, as ``mergekit-yaml`` does; DARE and DELLA draw as mergekit
draws, not with the rehearsal's seed). The menu's candidates (``advice.menu``) are merged and scored
the same way, to check the method the precheck recommends against the best of them.

Nothing is fitted on this family; the rules it checks are pre-registered in
``research/pools/prereg/users_configs.txt``. Needs the demo's base model (run the demo first);
everything is cached (experts, merges, prechecks, scores) under ``--cache-dir`` and ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import track
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pools"))
import make_tasks  # noqa: E402  (research/pools/make_tasks.py: the task generators)

from mergekit_mergeability.files import default_cache_dir  # noqa: E402
from mergekit_mergeability.demo.steps import Demo, Settings  # noqa: E402
from mergekit_mergeability.files import write_atomic  # noqa: E402
from mergekit_mergeability.tasks.lmeval import write_task as task_yaml  # noqa: E402  (a probe as an lm-eval task)

TASKS = ("add_7", "sub_5", "double", "next", "last_digit", "first_digit", "digit_sum", "difference", "larger", "parity")
TRAIN, PROBE, SCORED = 12, 16, 48
SIZES = {2: 2, 3: 2, 5: 1}  # experts per config: how many seeded draws
METHODS = {
    "task_arithmetic": {"weight": 1.0},
    "ties": {"weight": 1.0, "density": 0.5},
    "dare_ties": {"weight": 1.0, "density": 0.5},
    "della": {"weight": 1.0, "density": 0.5, "epsilon": 0.1, "lambda": 1.0},
}
ROWS = HERE / "pools" / "configs_tasks.jsonl"
ARCHIVE = HERE / "pools" / "measured" / "configs.json"  # what `measure` wrote, kept (`measure --archive`)
ARCHIVE_LM_EVAL = ARCHIVE.with_name("configs_lmeval.json")  # what `lm-eval` wrote, kept
ARCHIVE_ITEMS = ARCHIVE.with_name("configs_items.json")  # what `ceiling` read, item by item, kept
SETTINGS = Settings(
    facts=str(ROWS),
    pool="configs",
    fact_layers=tuple(range(9, 21)),
    fact_modules=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    fact_rank=8,
    fact_adapters=True,
    fact_format="options",
)
console = Console(width=120)


def write_rows(
    names=TASKS, family: str = "configs", train: int = TRAIN, path: Path = ROWS, scored: int = SCORED
) -> Path:
    """A family's tasks: each task's items from make_tasks' generator (seeded by the family and its
    name), ``items`` the ``train`` trained and 16 probed, ``scored`` the ``scored`` (48) after them."""
    made = dict(make_tasks.TASKS + make_tasks.MORE_TASKS + make_tasks.THIRD_TASKS + make_tasks.FOURTH_TASKS)
    rows = []
    for name in names:
        items = made[name](random.Random(f"{family}/{name}"), train + PROBE + scored)
        assert len(items) == train + PROBE + scored and len({i["question"] for i in items}) == len(items), name
        rows.append(
            {"id": f"task_{name}", "items": items[: train + PROBE], "train": train, "scored": items[train + PROBE :]}
        )
    return write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def groups():
    """The seeded draws of experts: (label, task names)."""
    rng = random.Random(40)
    for size, draws in SIZES.items():
        for n in range(draws):
            yield f"n{size}_{n}", sorted(rng.sample(TASKS, size))


def to_measure(saved: Path):
    """The records ``saved`` holds (a rerun goes on where it stopped) and the (label, members,
    method) still to measure."""
    records = json.loads(saved.read_text()) if saved.is_file() else []
    done = {(r["config"], r["method"]) for r in records}
    left = [(label, members, m) for (label, members), m in itertools.product(list(groups()), METHODS)]
    return records, [(label, members, m) for label, members, m in left if (label, m) not in done]


def model(demo: Demo, experts, task: str) -> str:
    """An expert as users write a LoRA adapter in a mergekit config: ``base+adapter``."""
    return f"{demo.base()}+{experts[f'task_{task}']['folder']}"


def config(demo: Demo, experts, members, method: str) -> dict:
    parameters = METHODS[method]
    return {
        "merge_method": method,
        "base_model": str(demo.base()),
        "models": [
            {
                "model": model(demo, experts, m),
                "probe": str(experts[f"task_{m}"]["probe"]),
                "parameters": dict(parameters),
            }
            for m in members
        ],
        "dtype": "float32",
    }


def without_probes(document: dict) -> dict:
    return {**document, "models": [{k: v for k, v in m.items() if k != "probe"} for m in document["models"]]}


class Scorer:
    """Each task's 48 unseen items (``TASK``), or its 16 probe items (``TASK/probe``), as its probe
    is scored (the options listed), on a model folder: mean p(gold), or each item's with ``per_item``;
    cached by folder and task in ``out/name``."""

    def __init__(self, out: Path, name: str = "scores.json", per_item: bool = False, rows_file: Path = ROWS):
        from mergekit_mergeability.demo.training import fact_instances

        rows = {r["id"]: r for r in map(json.loads, rows_file.read_text().splitlines())}
        self.instances = {}
        for task, r in rows.items():
            self.instances[task] = fact_instances({"id": task, "items": r["scored"], "train": 0}, "options")
            self.instances[f"{task}/probe"] = fact_instances(r, "options")  # items[train:], the probe
        self.path, self.per_item = out / name, per_item
        self.cache = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def __call__(self, folder: Path, tasks) -> dict:
        from mergekit_mergeability.demo.training import gold_probability
        from mergekit_mergeability.sources import load_causal_lm, resolve

        key = str(folder)
        missing = [t for t in tasks if t not in self.cache.get(key, {})]
        if missing:
            model, tokenizer = load_causal_lm(resolve(key))  # an adapter folder: its base with it added
            for task in missing:
                p = gold_probability(model, tokenizer, self.instances[task])
                self.cache.setdefault(key, {})[task] = [round(v, 6) for v in p] if self.per_item else sum(p) / len(p)
            write_atomic(self.path, json.dumps(self.cache, indent=1))
        return {t: self.cache[key][t] for t in tasks}


def lm_eval_tasks(out: Path) -> dict:
    """Each task's probe (``TASK/probe``) and scored items (``TASK``) as lm-eval multiple-choice task
    YAMLs, the prompts and choices rendered as the JSONL probe renders them (amendment 6): path by key."""
    from mergekit_mergeability.demo.training import fact_instances

    folder = out / "lmeval"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for r in map(json.loads, ROWS.read_text().splitlines()):
        scored = {"id": r["id"], "items": r["scored"], "train": 0}
        for key, fact in ((f"{r['id']}/probe", r), (r["id"], scored)):
            name = f"configs_{key.replace('/', '_')}"
            written[key] = task_yaml(folder, name, fact_instances(fact, "options"))
    return written


def lm_eval(args) -> None:
    """Amendment 6: the 20 configs prechecked with lm-eval task probes, and each member's lm-eval acc
    on its 48 scored items in the merge ``measure`` wrote (the truth), beside the JSONL run."""
    from mergekit_mergeability.sources import load_causal_lm, resolve
    from mergekit_mergeability.tasks.harness import score
    from mergekit_mergeability.tasks.lmeval import resolve as task

    measured = args.out / "configs.json"
    jsonl = {
        (r["config"], r["method"]): r for r in json.loads((measured if measured.is_file() else ARCHIVE).read_text())
    }
    yamls = lm_eval_tasks(args.out)
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=False)
    experts = demo.fact_experts()
    truth_path = args.out / "scores_lmeval.json"
    truth = json.loads(truth_path.read_text()) if truth_path.is_file() else {}
    saved = args.out / "configs_lmeval.json"
    records, left = to_measure(saved)
    for label, members, method in left:
        begun = time.perf_counter()
        name = f"{label}_{method}"
        document = config(demo, experts, members, method)
        # measure's JSONL precheck and merge: read where it left them, built where it did not
        jsonl_run = precheck(demo.write_config(name, document), args.out / "precheck" / name, menu=False)
        merged = demo.merge(demo.write_config(f"{name}_merge", without_probes(document)))
        for entry, m in zip(document["models"], members):
            entry["probe"] = str(yamls[f"task_{m}/probe"])
        report = precheck(
            demo.write_config(f"{name}_lmeval", document), args.out / "precheck_lmeval" / name, menu=False
        )
        if str(merged) not in truth:
            module, tokenizer = load_causal_lm(resolve(str(merged)))
            truth[str(merged)] = {
                f"task_{m}": score(module, tokenizer, task(str(yamls[f"task_{m}"])))["score"] for m in members
            }
            write_atomic(truth_path, json.dumps(truth, indent=1))
        folders = {model(demo, experts, m): f"task_{m}" for m in members}
        rehearsed = {folders[m["path"]]: m for m in report["models"] if m["path"] in folders}
        before = {
            folders[m["path"]]: m["dilution"]["partnered_accuracy"] for m in jsonl_run["models"] if m["path"] in folders
        }
        records.append(
            {
                "config": label,
                "method": method,
                "members": [f"task_{m}" for m in members],
                "predicted": {t: m.get("predicted_mergeability") for t, m in rehearsed.items()},
                "task_score": {t: m["dilution"].get("partnered_task_score") for t, m in rehearsed.items()},
                "jsonl_accuracy": before,
                "measured": {t: truth[str(merged)][t] for t in rehearsed},
                "jsonl": {
                    "predicted": jsonl[label, method]["predicted"],
                    "measured": jsonl[label, method]["measured"]["as_written"],
                },
                "seconds": round(time.perf_counter() - begun, 1),
            }
        )
        write_atomic(saved, json.dumps(records, indent=1))
        console.print(f"{name}: lm-eval probes ({records[-1]['seconds']:.0f} s)")
    if args.archive:
        console.print(f"archived: {write_atomic(ARCHIVE_LM_EVAL, saved.read_text())}")
    lm_eval_report(records, args.markdown)


def lm_eval_report(records, markdown: bool) -> None:
    rows = [(r["method"], r["predicted"][t], r["measured"][t]) for r in records for t in r["members"]]
    show(
        agreement(
            "lm-eval task probes: predicted (acc on the rehearsed merge) vs measured acc, merge as written", rows
        ),
        markdown,
    )
    before = [
        (r["method"], r["jsonl"]["predicted"][t], r["jsonl"]["measured"][t]) for r in records for t in r["members"]
    ]
    show(agreement("the same rows with JSONL probes: rule 1 (p(gold))", before), markdown)
    routes_agree([abs(r["task_score"][t] - r["jsonl_accuracy"][t]) for r in records for t in r["members"]], "rows")


def routes_agree(differences, unit: str) -> None:
    """How far lm-eval's acc on the rehearsed merge is from the JSONL run's accuracy on the same items."""
    console.print(
        f"lm-eval's acc on the rehearsed merge vs the JSONL run's partnered accuracy, same items: max |difference| "
        f"{max(differences):.4f}, mean {sum(differences) / len(differences):.4f} over {len(differences)} {unit}"
    )


def precheck(config_path: Path, out: Path, menu: bool = True) -> dict:
    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    if (out / "precheck.json").is_file():
        return json.loads((out / "precheck.json").read_text())
    skip = ("representations", "selectivity") + (() if menu else ("menu",))
    settings = PrecheckSettings(device="cpu", dtype="float32", quiet=True, skip=skip)
    return api.precheck(config_path, settings=settings, out=out).to_json()


def write(args) -> None:
    """The 20 configs with their probes, written (the experts trained once), nothing measured:
    what ``benchmarks/whole_precheck.py`` times."""
    if not ROWS.is_file():
        write_rows()
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=False)
    experts = demo.fact_experts()
    for label, members in groups():
        for method in METHODS:
            console.print(f"wrote {demo.write_config(f'{label}_{method}', config(demo, experts, members, method))}")


def candidates(demo: Demo, name: str, document: dict, report: dict, score, tasks) -> dict:
    """Each of the menu's candidates for ``document`` (as its precheck ``report`` would write them)
    merged by mergekit and scored on its members' unseen items: scores by candidate."""
    from mergekit_mergeability.decide.advice import menu

    knowledge = {
        m["path"]: (m.get("knowledge") or {}).get("scored_mean_p_gold") for m in report["models"] if m["role"] != "base"
    }
    return {
        candidate: score(demo.merge(demo.write_config(f"{name}_{candidate}", without_probes(advice.config))), tasks)
        for candidate, advice in menu(document, knowledge).items()
    }


def measure(args) -> None:
    if not ROWS.is_file():
        write_rows()
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=False)
    started = time.perf_counter()
    experts = demo.fact_experts()
    console.print(f"{len(experts)} experts ({time.perf_counter() - started:.0f} s)")
    score = Scorer(args.out)
    score(demo.base(), [f"task_{t}" for t in TASKS])
    for task in TASKS:
        score(experts[f"task_{task}"]["folder"], [f"task_{task}"])
    saved = args.out / "configs.json"
    records, left = to_measure(saved)
    for label, members, method in left:
        begun = time.perf_counter()
        name = f"{label}_{method}"
        document = config(demo, experts, members, method)
        path = demo.write_config(name, document)
        report = precheck(path, args.out / "precheck" / name, args.menu_truth)  # no truth, no menu: unchecked
        tasks = [f"task_{m}" for m in members]
        folders = {model(demo, experts, m): f"task_{m}" for m in members}
        measured = {
            "as_written": score(demo.merge(demo.write_config(f"{name}_merge", without_probes(document))), tasks)
        }
        if args.menu_truth:
            measured.update(candidates(demo, name, document, report, score, tasks))
        records.append(
            {
                "config": label,
                "method": method,
                "members": tasks,
                "predicted": {
                    folders[m["path"]]: m.get("predicted_mergeability")
                    for m in report["models"]
                    if m["path"] in folders
                },
                "measured": measured,
                "verdict": report["recommendation"]["verdict"],
                "method_choice": report["recommendation"].get("method_choice"),
                "findings": [f for f in report.get("findings", []) if f.get("severity") == "error"],
                "fluency": {folders[m["path"]]: m.get("fluency") for m in report["models"] if m["path"] in folders},
                "seconds": round(time.perf_counter() - begun, 1),
            }
        )
        write_atomic(saved, json.dumps(records, indent=1))
        console.print(f"{name}: {records[-1]['verdict']} ({records[-1]['seconds']:.0f} s)")
    if args.archive:
        console.print(f"archived: {write_atomic(ARCHIVE, saved.read_text())}")


def menu_rest(args) -> None:
    """Amendment 9: the configs ``measure`` left without their menu's truth, prechecked again with
    the menu and each candidate merged and scored, written into their records."""
    saved = args.out / "configs.json"
    records = json.loads((saved if saved.is_file() else ARCHIVE).read_text())
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=False)
    experts = demo.fact_experts()
    score = Scorer(args.out)
    members = dict(groups())
    for r in (r for r in records if len(r["measured"]) == 1):
        begun = time.perf_counter()
        name = f"{r['config']}_{r['method']}"
        document = config(demo, experts, members[r["config"]], r["method"])
        report = precheck(demo.write_config(name, document), args.out / "precheck_menu" / name)
        r["measured"].update(candidates(demo, name, document, report, score, r["members"]))
        r.update(
            verdict=report["recommendation"]["verdict"], method_choice=report["recommendation"].get("method_choice")
        )
        write_atomic(saved, json.dumps(records, indent=1))
        console.print(f"{name}: {(r['method_choice'] or {}).get('chosen')} ({time.perf_counter() - begun:.0f} s)")
    if args.archive:
        console.print(f"archived: {write_atomic(ARCHIVE, saved.read_text())}")


def report(args) -> None:
    from mergekit_mergeability.maths.stats import mean_interval

    saved = args.out / "configs.json"
    if not saved.is_file():  # a fresh clone: the archived measurement
        console.print(f"{saved} not measured here: reading the archived {ARCHIVE}")
        saved = ARCHIVE
    records = json.loads(saved.read_text())
    console.print(f"configs family: {len(records)} configs, {sum(len(r['members']) for r in records)} rows")
    rows = [(r["method"], r["predicted"][t], r["measured"]["as_written"][t]) for r in records for t in r["members"]]
    show(agreement("rule 1: rehearsed (predicted) vs measured own-task p(gold), merge as written", rows), args.markdown)
    console.print(
        f"mean predicted {sum(r[1] for r in rows) / len(rows):.3f}, mean measured {sum(r[2] for r in rows) / len(rows):.3f}"
    )
    # rule 4 on the same merges: the no-probe prediction (signature kept on the shipped text)
    derived = [
        (r["method"], min(1.0, max(0.0, r["fluency"][t]["signature_kept"])), r["measured"]["as_written"][t])
        for r in records
        for t in r["members"]
        if (r["fluency"].get(t) or {}).get("signature_kept") is not None
    ]
    if len(derived) >= 3:
        show(agreement("rule 4: signature kept (no probe) vs measured own-task p(gold)", derived), args.markdown)
    # rule 3: the recommended candidate against the best of the menu and the config as written
    table = Table(title="rule 3: the recommended merge, measured on the 48 unseen items (mean over members)")
    for column in ("config", "recommended", "its score", "best of menu", "best", "as written", "gap to best"):
        table.add_column(column)
    gaps, losses = [], []
    for r in (r for r in records if len(r["measured"]) > 1):  # the menu's candidates measured too
        kept = {c: sum(v.values()) / len(v) for c, v in r["measured"].items()}
        chosen = (r["method_choice"] or {}).get("chosen", "as_written")
        best = max(kept, key=kept.get)
        gaps.append(kept[best] - kept[chosen])
        losses.append(kept["as_written"] - kept[chosen])
        table.add_row(
            f"{r['config']} {r['method']}", chosen, f"{kept[chosen]:.3f}", best, f"{kept[best]:.3f}",
            f"{kept['as_written']:.3f}", f"{gaps[-1]:.3f}",
        )  # fmt: skip
    show(table, args.markdown)
    gap, (low, high) = mean_interval(gaps) if gaps else (float("nan"), (float("nan"), float("nan")))
    console.print(
        f"recommended vs best of menu: mean gap {gap:.3f} [{low:.3f}, {high:.3f}] over {len(gaps)} configs "
        f"(bar ≤ 0.01); below the config as written by more than 0.02 on {sum(v > 0.02 for v in losses)} "
        f"(worst {max(losses, default=float('nan')):+.3f})"
    )
    refused = [f"{r['config']} {r['method']}" for r in records if r["verdict"] == "do_not_merge"]
    console.print(f"rule 2: do_not_merge on {len(refused)} of {len(records)} configs {refused or ''}")
    scored = args.out / "configs_lmeval.json"
    scored = scored if scored.is_file() else ARCHIVE_LM_EVAL
    if scored.is_file():  # amendment 6: the same family scored through lm-eval tasks
        lm_eval_report(json.loads(scored.read_text()), args.markdown)
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=True)
    if not (demo.cache / "experts" / SETTINGS.pool).is_dir():
        console.print("(the experts and merges are not in --cache-dir: the checks below need `configs measure` first)")
        return
    # how far a probe's 16 items are from the 48 scored ones, before any merge: each expert alone
    experts, probe = demo.fact_experts(), Scorer(args.out, "scores_probe.json")
    gaps = []
    for task in sorted({t for r in records for t in r["members"]}):
        folder = experts[task]["folder"]
        alone = probe(folder, [task, f"{task}/probe"])
        gaps.append(alone[f"{task}/probe"] - alone[task])
        console.print(
            f"{task}: alone on its probe {alone[f'{task}/probe']:.3f}, on the 48 scored items {alone[task]:.3f}"
        )
    gap, (low, high) = mean_interval(gaps)
    console.print(
        f"probe minus scored items, each expert alone: {gap:+.3f} [{low:+.3f}, {high:+.3f}] over {len(gaps)} experts"
    )
    # the rehearsal against the merge mergekit wrote, asked the same 16 probe items
    same = []
    for r in records:
        folder = demo.merge(args.out / "configs" / f"{r['config']}_{r['method']}_merge.yml")  # cached
        got = probe(folder, [f"{t}/probe" for t in r["members"]])
        same += [(r["method"], abs(r["predicted"][t] - got[f"{t}/probe"])) for t in r["members"]]
    for drawn in (False, True):
        gaps = [d for method, d in same if (method in ("dare_ties", "della")) == drawn]
        if gaps:
            console.print(
                f"rehearsal vs the written merge on the probe items, {'DARE/DELLA (drawn anew)' if drawn else 'task_arithmetic, ties'}: "
                f"max |difference| {max(gaps):.4f}, mean {sum(gaps) / len(gaps):.4f} over {len(gaps)} rows"
            )


def merged_items(args, records) -> dict:
    """Each measured merge, its members read item by item on all 64 of their task's items (the probe's
    16, then the 48 unseen): "CONFIG_METHOD CANDIDATE" -> task -> values. A merge not cached is
    merged again as `measure` merged it (DARE and DELLA draw anew); a menu candidate whose config
    `candidates` never wrote here is written as it writes them, its knowledge the base's p(gold) on
    each member's probe read the same way."""
    from mergekit_mergeability.decide.advice import menu

    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=True)
    experts, score, members = demo.fact_experts(), Scorer(args.out, "scores_items.json", per_item=True), dict(groups())
    probes = score(demo.base(), [f"task_{t}/probe" for t in TASKS])
    knowledge = {model(demo, experts, t): sum(p) / len(p) for t in TASKS for p in [probes[f"task_{t}/probe"]]}
    read = {}
    every = [(r, c) for r in records for c in r["measured"] if c == "as_written"]  # the merges as written first
    every += [(r, c) for r in records for c in r["measured"] if c != "as_written" and args.menu_truth]
    for r, candidate in every:
        name = f"{r['config']}_{r['method']}"
        document = config(demo, experts, members[r["config"]], r["method"])
        path = args.out / "configs" / f"{name}_{candidate}.yml"
        if candidate == "as_written":
            path = demo.write_config(f"{name}_merge", without_probes(document))
        elif not path.is_file():
            path = demo.write_config(path.stem, without_probes(menu(document, knowledge)[candidate].config))
        got = score(demo.merge(path), [f"{t}/probe" for t in r["members"]] + r["members"])
        read[f"{name} {candidate}"] = {t: got[f"{t}/probe"] + got[t] for t in r["members"]}
    console.print(f"read {len(read)} merges")
    return read


def ceiling(args) -> None:
    """Amendment 11: how far a 16-item probe lets an exact rehearsal (the written merge itself)
    reach on this family: 2,000 draws of each task's 16 probe items from its 64, the other 48 the truth."""
    import numpy as np

    from mergekit_mergeability.decide.verdict import AS_WRITTEN, choose_method
    from mergekit_mergeability.maths.stats import spearman

    records = json.loads((args.out / "configs.json" if (args.out / "configs.json").is_file() else ARCHIVE).read_text())
    demo = Demo(SETTINGS, args.cache_dir, args.out, console, quiet=True)
    if (demo.cache / "experts" / SETTINGS.pool).is_dir() or not ARCHIVE_ITEMS.is_file():
        read = merged_items(args, records)
        console.print(f"wrote {write_atomic(args.out / ARCHIVE_ITEMS.name, json.dumps(read))}")
        if args.archive:
            console.print(f"archived: {write_atomic(ARCHIVE_ITEMS, json.dumps(read))}")
    else:  # a fresh clone: the archived reading
        read = json.loads(ARCHIVE_ITEMS.read_text())
    read = {key: {t: np.asarray(v) for t, v in tasks.items()} for key, tasks in read.items()}
    written = [(r, f"{r['config']}_{r['method']} {AS_WRITTEN}") for r in records]
    checks = Table(title="checks: the merges read here against the archive, max |difference| (rows)")
    for column in (
        "merge",
        "48 unseen items' mean vs the archived truth",
        "16 probe items' mean vs the archived prediction",
    ):
        checks.add_column(column)
    offered = sorted({c for r in records for c in r["measured"]} - {AS_WRITTEN})
    for method, candidate in [(m, AS_WRITTEN) for m in METHODS] + [(None, c) for c in offered]:
        pairs = [
            (r, f"{r['config']}_{r['method']} {candidate}")
            for r in records
            if method in (None, r["method"]) and f"{r['config']}_{r['method']} {candidate}" in read
        ]
        truth = [abs(read[k][t][PROBE:].mean() - r["measured"][candidate][t]) for r, k in pairs for t in r["members"]]
        asked = [
            abs(read[k][t][:PROBE].mean() - r["predicted"][t])
            for r, k in pairs
            for t in r["members"]
            if r["predicted"].get(t) is not None
        ]
        checks.add_row(
            method or f"menu: {candidate}",
            f"{max(truth):.6f} ({len(truth)})" if truth else "not read",
            f"{max(asked):.6f}" if method and asked else "",
        )
    show(checks, args.markdown)
    tasks = sorted({t for r in records for t in r["members"]})
    menus = [
        r
        for r in records
        if len(r["measured"]) > 1 and all(f"{r['config']}_{r['method']} {c}" in read for c in r["measured"])
    ]

    def outcomes(order) -> dict:
        """The bars' quantities when each task's probe is ``order[task][:16]`` and its truth the rest."""
        probe = {t: order[t][:PROBE] for t in tasks}
        truth = {t: order[t][PROBE:] for t in tasks}
        rows = [
            (r["method"], read[k][t][probe[t]].mean(), read[k][t][truth[t]].mean())
            for r, k in written
            for t in r["members"]
        ]
        got = {}
        for method in (None, *METHODS):
            chosen = [row for row in rows if method in (None, row[0])]
            got[method or "all"] = spearman([c[1] for c in chosen], [c[2] for c in chosen])
        got["MAE"] = float(np.mean([abs(p - y) for _, p, y in rows]))
        gated, greedy = [], []
        for r in menus:
            at = {c: read[f"{r['config']}_{r['method']} {c}"] for c in r["measured"]}
            kept = {c: np.mean([v[t][truth[t]].mean() for t in r["members"]]) for c, v in at.items()}
            asked = {c: {t: v[t][probe[t]] for t in r["members"]} for c, v in at.items()}
            gated.append(max(kept.values()) - kept[choose_method(asked).chosen])
            greedy.append(
                max(kept.values()) - kept[max(asked, key=lambda c: np.mean([x.mean() for x in asked[c].values()]))]
            )
        got["menu gap (shipped rule)"], got["menu gap (highest probe mean)"] = np.mean(gated), np.mean(greedy)
        return got

    actual = outcomes({t: np.arange(PROBE + SCORED) for t in tasks})
    rng = np.random.default_rng(11)
    draws = [outcomes({t: rng.permutation(PROBE + SCORED) for t in tasks}) for _ in track(range(2_000), "draws")]
    bars = {"all": (">=", 0.85), "MAE": ("<=", 0.08), **{m: (">=", 0.75) for m in METHODS}}
    bars.update({"menu gap (shipped rule)": ("<=", 0.01), "menu gap (highest probe mean)": ("<=", 0.01)})
    meets = {q: [d[q] >= bar if sense == ">=" else d[q] <= bar for d in draws] for q, (sense, bar) in bars.items()}
    table = Table(
        title=f"ceiling: an exact rehearsal read on a 16-item probe ({len(draws)} draws; {len(written)} configs, {len(menus)} with the menu)"
    )
    for column in ("quantity", "bar", "actual split", "median", "95% of draws", "draws meeting the bar"):
        table.add_column(column)
    for q, (sense, bar) in bars.items():
        values = np.array([d[q] for d in draws])
        low, mid, high = np.percentile(values, [2.5, 50, 97.5])
        label = q if q.startswith(("MAE", "menu")) else f"Spearman, {q}"
        table.add_row(
            label,
            f"{sense} {bar}",
            f"{actual[q]:+.3f}",
            f"{mid:+.3f}",
            f"[{low:+.3f}, {high:+.3f}]",
            f"{np.mean(meets[q]):.1%}",
        )
    show(table, args.markdown)
    rule1 = [all(meets[q][i] for q in ("all", "MAE", *METHODS)) for i in range(len(draws))]
    console.print(f"draws meeting all three rule-1 bars at once: {np.mean(rule1):.1%}")


def show(table: Table, markdown: bool) -> None:
    """A table on the terminal, or as a markdown table (for docs/prediction.md)."""
    if not markdown:
        console.print(table)
        return
    headers = [str(c.header) for c in table.columns]
    print(f"\n**{table.title}**\n\n| " + " | ".join(headers) + " |\n|" + "---|" * len(headers))
    for row in zip(*(list(c.cells) for c in table.columns)):
        print("| " + " | ".join(map(str, row)) + " |")
    print()


def agreement(title: str, rows) -> Table:
    """Spearman (permutation p, bootstrap interval) and mean absolute error, over all rows and per method."""
    from mergekit_mergeability.maths.stats import correlate, mean_interval

    table = Table(title=title)
    for column in ("method", "n", "Spearman", "95% interval", "permutation p", "MAE", "MAE 95% interval"):
        table.add_column(column)
    for method in [None, *METHODS]:
        chosen = [r for r in rows if method in (None, r[0]) and r[1] is not None]
        if len(chosen) < 3:
            continue
        c = correlate([r[1] for r in chosen], [r[2] for r in chosen])
        mae, (low, high) = mean_interval([abs(r[1] - r[2]) for r in chosen])
        table.add_row(
            method or "all", str(c.n), f"{c.spearman:+.2f}", f"[{c.interval[0]:+.2f}, {c.interval[1]:+.2f}]",
            f"{c.p_permutation:.4f}", f"{mae:.3f}", f"[{low:.3f}, {high:.3f}]",
        )  # fmt: skip
    return table


def plan_check(args, settings: Settings = SETTINGS, names=TASKS, rows: Path = ROWS, write=write_rows) -> None:
    """issue 41 on items the plan never saw: the family's ten experts as one pool (task_arithmetic,
    weights 1/10, each with its 16-item probe), planned with ``mergekit-mergeability plan`` twice, by
    the rehearsal (``--budget-evals 4``, the default) and by the prediction alone (``0``); each plan's
    configs, and everything merged with TIES and with the mean merge, merged by mergekit and every
    expert scored on its 48 unseen items (left out: the base's score; alone: its own); ``--random
    N``: N random draws of the rehearsed plan's models, each of its size, merged as it is. Another family's
    experts with ``settings``, task ``names`` and their ``rows`` (``write`` writes them)."""
    import subprocess

    import numpy as np

    from mergekit_mergeability.maths.stats import mean_interval, ratio_interval

    if not rows.is_file():
        write()
    demo = Demo(settings, args.cache_dir, args.out, console, quiet=False)
    experts = demo.fact_experts()
    tasks = [f"task_{t}" for t in names]
    score = Scorer(args.out, rows_file=rows)
    base = score(demo.base(), tasks)
    own = {t: score(experts[t]["folder"], [t])[t] for t in tasks}
    task_of = {model(demo, experts, t[5:]): t for t in tasks}
    entry = lambda t, parameters: {"model": model(demo, experts, t[5:]), "parameters": parameters}  # noqa: E731
    pool = demo.write_config(
        "plan_pool",
        {
            "merge_method": "task_arithmetic",
            "base_model": str(demo.base()),
            "models": [{**entry(t, {"weight": 0.1}), "probe": str(experts[t]["probe"])} for t in tasks],
            "dtype": "float32",
        },
    )
    everything = {
        "everything, TIES": {
            "merge_method": "ties",
            "models": [entry(t, {"weight": 1.0, "density": 0.5}) for t in tasks],
        },
        "everything, the mean merge": {
            "merge_method": "task_arithmetic",
            "models": [entry(t, {"weight": 0.1}) for t in tasks],
        },
    }
    arms = {}
    for label, document in everything.items():
        path = demo.write_config(
            label.replace(", ", "_").replace(" ", "_"), {**document, "base_model": str(demo.base()), "dtype": "float32"}
        )
        arms[label] = [(tasks, path)]
    for k in args.models:
        for budget in (4, 0):
            out = args.out / "plan" / f"k{k}_budget{budget}"
            if not (out / "plan.json").is_file():
                command = [sys.executable, "-m", "mergekit_mergeability", "plan", str(pool), "--out", str(out)]
                subprocess.run([*command, "--models", str(k), "--budget-evals", str(budget)], check=True)
            planned = json.loads((out / "plan.json").read_text())["models"]
            arms[f"K = {k}, {'rehearsed' if budget else 'predicted'}"] = [
                ([task_of[m] for m in model_["members"]], out / model_["file"]) for model_ in planned
            ]
    rehearsed = arms.get(f"K = {args.models[0]}, rehearsed", [])
    draw = random.Random(41)
    # the rehearsed plan's models, each of its size and method, drawn anew
    written = [yaml.safe_load(Path(path).read_text()) for _, path in rehearsed]
    parameters = [as_planned(w, path, task_of) for w, (_, path) in zip(written, rehearsed)]
    whole = len(rehearsed) == 1 and len(rehearsed[0][0]) == len(tasks)  # every draw is the plan itself
    if whole and args.random:
        console.print(f"--random {args.random}: not drawn, the rehearsed plan merges every expert in one model")
    for r in range(args.random if rehearsed and not whole else 0):
        drawn = draw.sample(tasks, sum(len(members) for members, _ in rehearsed))
        arms[f"random #{r + 1}"] = []
        for i, (members, _) in enumerate(rehearsed):
            picked, drawn = sorted(drawn[: len(members)]), drawn[len(members) :]
            document = {**written[i], "models": [entry(t, parameters[i][t]) for t in picked]}
            name = f"plan_random_{r + 1}" + (f"_{i + 1}" if len(rehearsed) > 1 else "")
            arms[f"random #{r + 1}"].append((picked, demo.write_config(name, document)))
    kept = {}
    for label, models in arms.items():
        values = dict(base)
        for members, path in models:
            values.update({members[0]: own[members[0]]} if len(members) == 1 else score(demo.merge(path), members))
        kept[label] = np.array([values[t] for t in tasks])
        console.print(
            f"{label}: {kept[label].sum():.2f} of {len(tasks)} ({', '.join(f'{len(m)}' for m, _ in models)} experts per model)"
        )
    best = max(everything, key=lambda label: kept[label].sum())
    randoms = [kept.pop(label) for label in list(kept) if label.startswith("random")]
    if randoms:
        totals = [r.sum() for r in randoms]
        console.print(
            f"random subsets: 90th percentile {np.percentile(totals, 90):.2f} of {len(totals)} "
            f"(median {np.median(totals):.2f}); K = {args.models[0]}, rehearsed: {kept[f'K = {args.models[0]}, rehearsed'].sum():.2f}"
        )
    kept["each alone (the ceiling)"] = np.array([own[t] for t in tasks])
    kept["the base"] = np.array([base[t] for t in tasks])
    table = Table("plan", f"kept (of {len(tasks)}, unseen items)", f"− {best} [95%]", "÷ [95%]")
    for label in kept:
        _, (low, high) = mean_interval(kept[label] - kept[best])  # over experts, paired; × 10: in tasks
        low, high = low * len(tasks), high * len(tasks)
        ratio, (below, above) = ratio_interval(kept[label], kept[best])
        table.add_row(
            label,
            f"{kept[label].sum():.2f}",
            f"{kept[label].sum() - kept[best].sum():+.2f} [{low:+.2f}, {high:+.2f}]",
            f"{ratio:.2f}× [{below:.2f}, {above:.2f}]",
        )
    show(table, args.markdown)
    kept.update({f"random #{r + 1}": values for r, values in enumerate(randoms)})
    write_atomic(args.out / "plan_check.json", json.dumps({k: v.tolist() for k, v in kept.items()}, indent=1))


def as_planned(written, path: Path, task_of) -> dict:
    """Each task's per-model parameters in a merge written as ``written`` (a planned model's config
    at ``path``): planned merges weigh their members alike, but knowledge_weighted gives each its
    own ``knowledge``, as plan computes it from the precheck beside the plan (``mergekit_parameters``)."""
    from mergekit_mergeability.planner import conditional, conditional_fit, deciding

    shared = dict(written["models"][0].get("parameters", {}))
    report = json.loads((Path(path).parent.parent / "precheck.json").read_text())
    pool = conditional.from_report(report, knowledge_feature=deciding.knowledge_feature(conditional_fit.load(None)))
    known = {task_of[name]: float(k) for name, k in zip(pool.names, pool.knowledge)}
    return {
        t: {**shared, "knowledge": round(k, 6)} if "knowledge" in shared else dict(shared) for t, k in known.items()
    }


COMMANDS = {
    "measure": measure,
    "write": write,
    "report": report,
    "lm-eval": lm_eval,
    "menu": menu_rest,
    "plan-check": plan_check,
    "ceiling": ceiling,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("command", choices=("rows", *COMMANDS))
    parser.add_argument(
        "--models", type=int, nargs="+", default=[1, 2], help="plan-check: K, the merged models planned"
    )
    parser.add_argument(
        "--random", type=int, default=0, help="plan-check: random subsets of the rehearsed plan's size and method"
    )
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "demo")
    parser.add_argument("--out", type=Path, default=Path("pools-out") / "configs")
    parser.add_argument("--markdown", action="store_true", help="report: the tables as markdown")
    parser.add_argument(
        "--archive",
        action="store_true",
        help=f"measure, lm-eval, menu, ceiling: then keep what was read in the repository ({ARCHIVE.name}, …)",
    )
    parser.add_argument(
        "--no-menu-truth",
        dest="menu_truth",
        action="store_false",
        help="measure: do not rehearse the menu, nor merge and score its candidates (the method choice goes unchecked; half the time)",
    )
    args = parser.parse_args()
    if args.command == "rows":
        console.print(f"wrote {write_rows()}")
    else:
        COMMANDS[args.command](args)


if __name__ == "__main__":
    main()
