"""The numbers behind `mergekit-mergeability plan`: its conditional calibration, its speed, and
whether a plan keeps what it predicts.

    python research/plan.py fit [PRECHECK_JSON MERGEABILITY_DIR ...] [--install]
        Refit the conditional prediction on measured pools (default: every
        pools-out/*/precheck/precheck.json with each pools-out/*/mergeability/<label>/
        beside it) and print its out-of-sample Spearman per merge rule and size;
        --install writes it into the package (mergekit_mergeability/planner/conditional.json),
        --output PATH elsewhere (a candidate for ``methods --calibration PATH``).
    python research/plan.py speed [--adapters 100] [--models 1]
        Plan on N LoRA adapters of a SmolLM2-shaped model (factors only, random; never
        materialised): the weight pass alone against the plan's own work after it,
        time and peak memory, each in a fresh process.
    python research/plan.py methods pools-out/fit [--measured ties_d0.5=0.799 ...]
        Each merge rule's prediction for a measured pool's own trials (every expert with the
        partners its mean-merge trials drew, merged with each method instead): the mean over
        experts and by thirds of the base's knowledge, next to what was measured where a
        pools-out/<pool>/mergeability/<label>/ holds that method's trials (or --measured
        LABEL=VALUE gives the overall number). The check of the fallback predictions until
        each method's own trials are fitted.
    python research/plan.py check POOL.yml --precheck PRECHECK_JSON [--models 1] [--random 20] [--budget-evals 4]
        The issue's done-when on a measured pool: the planned merge (with --budget-evals, the
        one plan's rehearsal chooses) measured in memory
        (every expert scored on its own task inside its planned model, as `mergeability`
        scores a trial) against merging everything with task_arithmetic and with TIES, and
        against --random subsets of the planned size with the planned method; bootstrap
        intervals over experts. Heavy on a real model: minutes per merge on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Column, Table

HERE = Path(__file__).resolve().parent
OUT = Path("pools-out")
SHIPPED_FAMILIES = ("fit", "options")  # the shipped conditional fit's (planner/conditional.json)
console = Console()


def _pairs(arguments, out: Path, families):
    if arguments:
        if len(arguments) % 2:
            raise SystemExit("fit takes pairs: PRECHECK_JSON MERGEABILITY_DIR ...")
        return [(Path(a), Path(b)) for a, b in zip(arguments[::2], arguments[1::2])]
    found = []
    for precheck in sorted(out / family / "precheck" / "precheck.json" for family in families):
        if not precheck.is_file():
            raise SystemExit(f"{precheck}: not measured (research/pools.py {precheck.parents[1].name} measures it)")
        for folder in sorted((precheck.parents[1] / "mergeability").glob("*")):
            if (folder / "trials.jsonl").is_file() or (folder / "mergeability.json").is_file():
                found.append((precheck, folder))
    if not found:
        raise SystemExit(f"no measured pools under {out}/ (research/pools.py measures them)")
    return found


def fit(args) -> None:
    from mergekit_mergeability.planner import conditional_fit

    pairs = _pairs(args.measured, args.out, args.families.split(","))
    started = time.perf_counter()
    rows = conditional_fit.measured_rows(pairs)
    document = conditional_fit.fit(rows, permutations=args.permutations)
    seconds = time.perf_counter() - started
    table = Table(
        "rule",
        "size |S|",
        "held out",
        "experts",
        "trials",
        "Spearman per expert [95%]",
        "per trial",
        "within expert",
        "expert features only",
        "all features",
        title=f"Conditional prediction out of sample ({len(pairs)} measured pools, {seconds:.0f} s)",
    )
    for rule, held in document["out_of_sample"].items():
        for how, judged in held.items():
            for size, cell in judged["by_size"].items():
                low, high = cell["interval"] or (float("nan"), float("nan"))
                variants = cell["variants"]
                table.add_row(
                    rule,
                    size,
                    how.replace("leave_one_", "").replace("_out", "").replace("pool", "family"),
                    str(cell["experts"]),
                    str(cell["trials"]),
                    f"{cell['spearman']:+.2f} [{low:+.2f}, {high:+.2f}]",
                    f"{cell['spearman_trials']:+.2f}",
                    "—" if cell["within_expert_pearson"] is None else f"{cell['within_expert_pearson']:+.2f}",
                    f"{variants['expert_features_only']:+.2f}",
                    f"{variants['all_features']:+.2f}",
                )
            if "permutation" in judged:
                null = judged["permutation"]
                console.print(
                    f"{rule}: permutation p = {null['p']:.3f} ({null['permutations']} refits on shuffled experts; "
                    f"their 95th percentile {null['null_95th_percentile']:+.2f})"
                )
    console.print(table)
    for rule, entry in document["rules"].items():
        weights = ", ".join(f"{f['name']} {f['weight']:.3f}" for f in entry["model"]["features"] if f["weight"] > 0)
        console.print(f"{rule}: sizes {entry['sizes']}, {entry['trials']} trials; weights: {weights}")
    if args.install or args.output:
        command = "python research/plan.py fit " + " ".join(f"{a} {b}" for a, b in pairs)
        command += " --install" if args.install else f" --output {args.output}"
        import tempfile

        target = args.output or Path(tempfile.mkdtemp(prefix="conditional-")) / "conditional.json"
        written = conditional_fit.write(document, target, command)
        if args.install:
            from mergekit_mergeability.api import install

            written = install(written, kind="plan")
        console.print(f"wrote {written}")


def _adapters(root: Path, count: int, layers: int, rank: int) -> tuple:
    """A SmolLM2-shaped base (its widths, ``layers`` decoder blocks, random) and ``count``
    random LoRA adapters on q_proj and v_proj of every block, written as peft folders."""
    import transformers

    from mergekit_mergeability.tiny import make_adapter, train_tokenizer

    base = root / "base"
    if not base.is_dir():
        tok = train_tokenizer()
        config = transformers.LlamaConfig(
            vocab_size=len(tok),
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=layers,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(base, safe_serialization=True)
        tok.save_pretrained(base)
    targets = [f"model.layers.{i}.self_attn.{m}.weight" for i in range(layers) for m in ("q_proj", "v_proj")]
    folders = []
    for i in range(count):
        folder = root / "adapters" / f"a{i:03d}"
        if not folder.is_dir():
            make_adapter(base, folder, targets, rank=rank, alpha=2 * rank, seed=i)
        folders.append(folder)
    return base, folders


def _measure(base: Path, folders, models: int) -> dict:
    """In this process: the weight pass, then the plan's own work on its numbers."""
    from precheck import PeakMemory

    from mergekit_mergeability.sources.architecture import tensor_position
    from mergekit_mergeability.sources import resolve
    from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
    from mergekit_mergeability.diagnostics.weights import WeightStatistics
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.planner import deciding, conditional_fit

    tensor_position("model.embed_tokens.weight")  # mergekit's architectures import (~3 s): not the pass
    inputs = DiagnosticInputs(
        ModelInput(str(base), base),
        tuple(ModelInput(str(f), resolve(str(f))) for f in folders),
        PrecheckSettings(quiet=True),
    )
    with PeakMemory() as weights_peak:
        started = time.perf_counter()
        result = WeightStatistics().run(inputs)
        weight_seconds = time.perf_counter() - started
    report = _report(result, [str(f) for f in folders], str(base))
    calibration = conditional_fit.load()
    with PeakMemory() as plan_peak:
        started = time.perf_counter()
        merges, _ = deciding.candidate_merges(report, None)
        decided = deciding.decide(report, calibration, merges, models)
        plan_seconds = time.perf_counter() - started
    return {
        "adapters": len(folders),
        "weight_seconds": weight_seconds,
        "weight_memory": weights_peak.growth,
        "plan_seconds": plan_seconds,
        "plan_memory": plan_peak.growth,
        "evaluations": decided.search.evaluations,
        "objective": decided.search.objective,
        "planned": [len(s.members) for s in decided.search.slots],
    }


def _report(result, experts, base: str) -> dict:
    """A precheck report's shape from the weight pass alone (no probes: no knowledge)."""
    from mergekit_mergeability.records import WeightStats

    models = [{"path": base, "role": "base", "knowledge": None, "weights": None}]
    for name in experts:
        weights = WeightStats.measured(result.per_model[name], result.per_layer[name]).json()
        models.append({"path": name, "role": "expert", "knowledge": None, "weights": weights})
    pairs = [{"a": a, "b": b, **values} for (a, b), values in result.per_pair.items()]
    return {"models": models, "pairs": pairs, "layers": {"cutoff": None}}


def transfer(args) -> None:
    """Does fitting on more families predict a family never fitted on better? Each family beyond
    the shipped fit's (fit, options), its trials of each rule predicted by a fit on the shipped
    families and by a fit on every other family given; Spearman over its experts (their mean
    score against their mean prediction), the paired difference with a bootstrap interval."""
    from mergekit_mergeability.maths import fitting
    from mergekit_mergeability.maths.stats import spearman
    from mergekit_mergeability.planner import conditional, conditional_fit

    rows = conditional_fit.measured_rows(_pairs([], args.out, args.families.split(",")))
    family = np.array([pool.split("/")[0] for pool in rows.pool])
    rng = np.random.default_rng(args.seed)
    table = Table("rule", "family", "experts", "fit on fit, options", "fit on every other family", "difference [95%]")
    for rule in sorted(set(rows.rule)):
        at = np.array([r == rule for r in rows.rule])
        names = conditional_fit.features_for(rows.size[at].tolist())
        x = rows.x[at][:, [list(conditional.FEATURES).index(n) for n in names]]
        y, kin, experts = rows.y[at], family[at], np.array(rows.expert)[at]
        directions = [conditional.FEATURES[n] for n in names]
        shipped = np.isin(kin, SHIPPED_FAMILIES)
        for held_family in sorted(set(kin) - set(SHIPPED_FAMILIES)):
            held = kin == held_family
            if not shipped.any() or held.all():
                continue
            fits = [fitting.fit(x[train], y[train], names, directions) for train in (shipped, ~held)]
            order = list(dict.fromkeys(experts[held].tolist()))
            mean = lambda v: np.array([v[experts[held] == e].mean() for e in order])  # noqa: E731
            truth, (a, b) = mean(y[held]), [mean(f.predict(x[held])) for f in fits]
            picks = [rng.integers(0, len(order), len(order)) for _ in range(1000)]
            boot = [spearman(b[i], truth[i]) - spearman(a[i], truth[i]) for i in picks if np.std(truth[i]) > 0]
            low, high = np.nanpercentile(boot, [2.5, 97.5])
            table.add_row(
                rule,
                held_family,
                str(len(order)),
                f"{spearman(a, truth):+.2f}",
                f"{spearman(b, truth):+.2f}",
                f"{spearman(b, truth) - spearman(a, truth):+.2f} [{low:+.2f}, {high:+.2f}]",
            )
    console.print(table)


def speed(args) -> None:
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="plan-speed-"))
    base, folders = _adapters(work, args.adapters, args.layers, args.rank)
    rows = []
    for count in sorted({min(20, args.adapters), args.adapters}):
        done = subprocess.run(
            [sys.executable, __file__, "_measure", str(base), str(args.models), *map(str, folders[:count])],
            capture_output=True,
            text=True,
            cwd=HERE,
        )
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        rows.append(json.loads(done.stdout.splitlines()[-1]))
    table = Table(
        "adapters",
        "weight pass",
        "its peak memory",
        "plan (search + predictions)",
        "its peak memory",
        "candidates scored",
        "planned sizes",
        title=f"plan on LoRA adapters (r{args.rank}, q/v of {args.layers} SmolLM2-wide blocks), K = {args.models}, fresh process each",
    )
    for row in rows:
        table.add_row(
            str(row["adapters"]),
            f"{row['weight_seconds']:.1f} s",
            f"{row['weight_memory']:.0f} MiB",
            f"{row['plan_seconds']:.1f} s",
            f"{row['plan_memory']:.0f} MiB",
            str(row["evaluations"]),
            str(row["planned"]),
        )
    console.print(table)
    console.print(f"adapters under {work}")


def check(args) -> None:
    """Measure the plan, merge-everything and random subsets in memory (see the module docstring)."""
    from mergekit_mergeability.files import default_cache_dir
    from mergekit_mergeability.settings import RunSettings
    from mergekit_mergeability.sources.cache import Cache
    from mergekit_mergeability.planner import conditional, deciding, conditional_fit, planning
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.maths.stats import ratio_interval
    from mergekit_mergeability.api import probe_items

    spec = merge_config.read(args.pool)
    report = planning.read_precheck(args.precheck, spec)
    calibration = conditional_fit.load(args.calibration)
    experts, bases = planning.expert_scores(args.measured)
    merges, _ = deciding.candidate_merges(report, args.methods.split(",") if args.methods else None)
    decided = deciding.decide(
        report, calibration, merges, args.models, names=spec.models, expert_scores=experts, base_scores=bases
    )
    pool = decided.pool
    cache = Cache(default_cache_dir() / "scores")
    settings = RunSettings(device="cpu", quiet=args.quiet)
    measure = planning.Measurer(spec, settings, cache, pool, probe_items(spec, settings))
    rng = np.random.default_rng(args.seed)

    def kept(assignment) -> np.ndarray:
        """Measured own-task score per expert: inside its model, or the base's when left out."""
        scores = measure.base_scores().copy()
        for members, merge in assignment:
            for i, score in zip(members, measure.scores(members, merge)):
                scores[i] = score
        return scores

    if args.budget_evals:  # as `plan` rehearses its finalists; the merges it builds are measured once
        checked = planning.verify(decided, measure, args.budget_evals, report)
        if checked["chosen"] is not None:
            planning.choose(decided, checked["chosen"]["assignment"])
        for c in checked["candidates"]:
            mark = " ◀ chosen" if c is checked["chosen"] else ""
            console.print(f"rehearsed {c['label']}: {c['measured']:.2f} (predicted {c['predicted']:.2f}){mark}")
        choice, n = checked["choice"], len(pool)
        console.print(
            f"chooser: best {choice.best}, baseline {choice.baseline}, picks on the halves {choice.picked},"
            f" cross-fitted gain {choice.gain * n:+.2f} tasks [{choice.gain_interval[0] * n:+.2f},"
            f" {choice.gain_interval[1] * n:+.2f}]: {choice.chosen} chosen"
        )
    everyone = tuple(range(len(pool)))
    arms = {"planned": [(p.members, p.merge) for p in decided.planned if p.members]}
    console.print("planned: " + "; ".join(f"{merge.label()} on {len(members)}" for members, merge in arms["planned"]))
    arms["everything, task_arithmetic"] = [(everyone, conditional.Merge(conditional.TASK_ARITHMETIC))]
    arms["everything, ties"] = [(everyone, conditional.Merge(conditional.TIES, density=0.5))]
    sizes = [len(m) for m, _ in arms["planned"]]
    for r in range(args.random):
        picked = rng.permutation(len(pool))
        start, random_arm = 0, []
        for (members, merge), size in zip(arms["planned"], sizes):
            random_arm.append((tuple(sorted(picked[start : start + size].tolist())), merge))
            start += size
        arms[f"random #{r + 1}"] = random_arm
    measured = {}
    for label, assignment in arms.items():
        began = time.perf_counter()
        measured[label] = kept(assignment)
        predicted = decided.objective_of(assignment)
        console.print(
            f"{label}: measured {measured[label].sum():.2f} of {len(pool)} tasks (predicted {predicted:.2f}); {time.perf_counter() - began:.0f} s"
        )
    planned = measured["planned"]
    best_everything = max(("everything, task_arithmetic", "everything, ties"), key=lambda k: measured[k].sum())
    alone = np.array([measure.trials.ends(name)[1] for name in pool.names])
    console.print(
        f"each alone (the ceiling): {alone.sum():.2f} of {len(pool)}; the base {kept([]).sum():.2f};"
        f" {best_everything} keeps {measured[best_everything].sum() / alone.sum():.0%} of what the experts keep alone"
    )
    randoms = [k for k in measured if k.startswith("random")]
    best_random = max(randoms, key=lambda k: measured[k].sum()) if randoms else None
    table = Table(
        "against", "tasks kept", "planned − it [95% over experts]", "planned / it [95%]", title=f"K = {args.models}"
    )
    for label in (best_everything, best_random):
        if label is None:
            continue
        low, high = _paired_interval(planned, measured[label], args.seed)
        ratio, (below, above) = ratio_interval(planned, measured[label], args.seed)
        table.add_row(
            label,
            f"{measured[label].sum():.2f}",
            f"{planned.sum() - measured[label].sum():+.2f} [{low:+.2f}, {high:+.2f}]",
            f"{ratio:.2f}× [{below:.2f}, {above:.2f}]",
        )
    console.print(table)
    if randoms:
        totals = np.array([measured[k].sum() for k in randoms])
        ninetieth = np.percentile(totals, 90)
        console.print(
            f"random subsets: 90th percentile {ninetieth:.2f} of {len(randoms)} (median {np.median(totals):.2f});"
            f" planned {planned.sum():.2f} {'above' if planned.sum() > ninetieth else 'not above'} it"
        )
    if args.out:
        from mergekit_mergeability.files import write_atomic

        arms = {**measured, "each alone": alone}
        write_atomic(
            Path(args.out), json.dumps({label: values.tolist() for label, values in arms.items()}, indent=2) + "\n"
        )


METHODS = {  # label as research/pools.py writes it -> the merge it ran (knowledge from the precheck)
    "ties_d0.5": ("ties", {"density": 0.5}),
    "ties_d0.2": ("ties", {"density": 0.2}),
    # pools.py's kw:T runs the method's defaults but τ: ties at density 0.5 (kw-ties:T:0.5 is the same merge)
    "kw_t0.1": ("knowledge_weighted", {"temperature": 0.1, "ties": True, "density": 0.5}),
    "kw_t0.3": ("knowledge_weighted", {"temperature": 0.3, "ties": True, "density": 0.5}),
    "kw_t1": ("knowledge_weighted", {"temperature": 1.0, "ties": True, "density": 0.5}),
    "kw_ties_t0.1_d0.5": ("knowledge_weighted", {"temperature": 0.1, "ties": True, "density": 0.5}),
    "kw_ties_t0.3_d0.5": ("knowledge_weighted", {"temperature": 0.3, "ties": True, "density": 0.5}),
    "kw_ties_t0.3_d0.2": ("knowledge_weighted", {"temperature": 0.3, "ties": True, "density": 0.2}),
    "kw_kd_t0.3_d0.5": ("knowledge_weighted", {"temperature": 0.3, "ties": True, "density": 0.5, "by_knowledge": True}),
    "kw_noties_t0.1": ("knowledge_weighted", {"temperature": 0.1, "ties": False}),
    "kw_noties_t0.3": ("knowledge_weighted", {"temperature": 0.3, "ties": False}),
    "kw_noties_t1": ("knowledge_weighted", {"temperature": 1.0, "ties": False}),
}


def methods(args) -> None:
    from mergekit_mergeability.planner import conditional, conditional_fit

    folder = Path(args.pool)
    report = json.loads((folder / "precheck" / "precheck.json").read_text())
    mean = json.loads((folder / "mergeability" / "mean" / "mergeability.json").read_text())
    calibration = conditional_fit.load(args.calibration)
    pool = conditional.from_report(report)
    index = {name: i for i, name in enumerate(pool.names)}
    order = np.argsort(pool.knowledge, kind="stable")
    thirds = np.array_split(order, 3)
    given = dict(item.split("=") for item in args.measured or ())
    table = Table(
        Column("merge", overflow="fold"),
        Column("rule read", overflow="fold"),
        "all",
        "weakest third",
        "middle",
        "strongest",
        title=f"{folder.name}: predicted (measured) own-task scores for the mean-merge trials' partner draws, "
        "merged with each method",
    )
    for label, (method, knobs) in {"mean": ("task_arithmetic", {}), **METHODS}.items():
        per = np.full(len(pool), np.nan)
        for model in mean["models"]:
            i = index[model["path"]]
            values = []
            for trial in model["trials"]:
                members = [i] + [index[p] for p in trial["partners"]]
                merge = (
                    conditional.Merge(method, **knobs)
                    if method != "task_arithmetic"
                    else conditional.Merge(
                        method, weights=tuple((pool.names[j], mean["parameters"]["weight"]) for j in members)
                    )
                )
                prediction = calibration.predict(pool, members, merge, domain=False)
                values.append(prediction.values[0])
            per[i] = np.mean(values)
        rule = calibration.model_for(conditional.Merge(method, **knobs).rule)
        measured = ["", "", "", ""]
        path = folder / "mergeability" / label / "mergeability.json"
        if path.is_file():
            found = {index[m["path"]]: m["mergeability"] for m in json.loads(path.read_text())["models"]}
            values = np.array([found.get(i, np.nan) for i in range(len(pool))])
            measured = [f" ({np.nanmean(values):.3f})"] + [f" ({np.nanmean(values[t]):.3f})" for t in thirds]
        elif label in given:
            measured[0] = f" ({given[label]})"
        predicted = [np.nanmean(per)] + [np.nanmean(per[t]) for t in thirds]
        table.add_row(
            label,
            f"{rule[0].rule}{' (fallback)' if rule[1] else ''}",
            *(f"{value:.3f}{shown}" for value, shown in zip(predicted, measured)),
        )
    console.print(table)


def _paired_interval(a: np.ndarray, b: np.ndarray, seed: int, resamples: int = 2000):
    rng = np.random.default_rng(seed)
    differences = a - b
    totals = [differences[rng.integers(0, len(a), len(a))].sum() for _ in range(resamples)]
    return float(np.percentile(totals, 2.5)), float(np.percentile(totals, 97.5))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":  # a fresh process of `speed`
        base, models, folders = Path(sys.argv[2]), int(sys.argv[3]), [Path(f) for f in sys.argv[4:]]
        print(json.dumps(_measure(base, folders, models)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fitting = commands.add_parser("fit")
    fitting.add_argument("measured", nargs="*")
    fitting.add_argument("--out", type=Path, default=OUT, help="where measured pools are found (default pools-out)")
    fitting.add_argument(
        "--families",
        default="fit,options",
        help="the families under --out to fit on (default: the shipped fit's, fit,options; heldout and lora stay clean)",
    )
    fitting.add_argument("--permutations", type=int, default=200)
    written = fitting.add_mutually_exclusive_group()
    written.add_argument("--install", action="store_true", help="write it into the package: plan's default")
    written.add_argument("--output", type=Path, help="write it here (for methods --calibration) instead")
    timing = commands.add_parser("speed")
    timing.add_argument("--adapters", type=int, default=100)
    timing.add_argument("--layers", type=int, default=8)
    timing.add_argument("--rank", type=int, default=16)
    timing.add_argument("--models", type=int, default=1)
    timing.add_argument("--work", type=Path)
    moving = commands.add_parser("transfer")
    moving.add_argument("--out", type=Path, default=OUT, help="where measured pools are found (default pools-out)")
    moving.add_argument("--families", default="fit,options,tasks,attention,deep,down,low,middle,vq,wide")
    moving.add_argument("--seed", type=int, default=0)
    comparing = commands.add_parser("methods")
    comparing.add_argument("pool", type=Path, help="a measured pool's folder (pools-out/<pool>)")
    comparing.add_argument("--calibration", type=Path)
    comparing.add_argument("--measured", nargs="*", metavar="LABEL=VALUE", help="overall measured numbers to show")
    checking = commands.add_parser("check")
    checking.add_argument("pool", type=Path)
    checking.add_argument("--precheck", type=Path, required=True)
    checking.add_argument("--calibration", type=Path)
    checking.add_argument("--measured", type=Path, help="the pool's mergeability.json: measured expert and base scores")
    checking.add_argument("--methods")
    checking.add_argument("--models", type=int, default=1)
    checking.add_argument("--random", type=int, default=20)
    checking.add_argument(
        "--budget-evals",
        type=int,
        default=0,
        help="rehearse the finalists first, as plan does (0: the prediction alone)",
    )
    checking.add_argument("--seed", type=int, default=0)
    checking.add_argument("--out", type=Path, help="also write every arm's per-expert scores here (JSON)")
    checking.add_argument("--quiet", "-q", action="store_true")
    args = parser.parse_args()
    {"fit": fit, "speed": speed, "methods": methods, "check": check, "transfer": transfer}[args.command](args)


if __name__ == "__main__":
    main()
