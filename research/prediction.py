"""How well the precheck predicts mergeability, and which merge keeps most: the numbers behind
the README's "How the prediction was fitted", from the pools ``research/pools.py`` measures.

    python research/prediction.py fewshot              # K shots: base p(gold) vs S on the fit pool
    python research/prediction.py calibrate [--install] # fit on fit, options, heldout, lora; --install ships it
    python research/prediction.py validate heldout     # precheck (shipped calibration) vs S
    python research/prediction.py methods fit          # own-task S by thirds of base knowledge
    python research/prediction.py families             # leave one family out: the README's headline
    python research/prediction.py check deep           # the shipped calibration on a family it never saw
    python research/prediction.py aims [FAMILY ...]    # knowledge_weighted's three aims, per family
    python research/prediction.py reliability [FAMILY ...] # how much of S is noise (split halves)
    python research/prediction.py across fit lora      # two families of the same facts, fact by fact
    python research/prediction.py derived pools-plan/lora  # no probes: the signature vs weights alone
    python research/prediction.py lm-eval pools-plan/lora  # its probes as lm-eval tasks vs as JSONL
    python research/prediction.py own-text pools-plan/lora # no probes: probes from each expert's own text
    python research/prediction.py refresh lora         # one diagnostic run again into a family's precheck.json

``families`` fits on every family but the one it predicts (the checks, ``attention``, ``deep``, ``wide`` and ``middle``,
only when named); ``calibrate`` fits the shipped calibration on the four it was fitted on. No default (``--fewshot``, knowledge_weighted's) was
chosen on any family but ``fit``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.table import Table

OUT = Path("pools-out")
PACKAGED = Path(__file__).resolve().parents[1] / "mergekit_mergeability" / "decide" / "calibration.json"
console = Console()


def _families(specs):
    """(family, its folder under pools-out) for each FAMILY or FAMILY=FOLDER (a family measured
    into another folder, e.g. a first look with --count)."""
    for spec in specs:
        family, _, folder = spec.partition("=")
        yield family, folder or family


def _measured(pool: str, label: str = "mean") -> dict:
    """A measured method's per-expert entries (mergeability, base_score, trials) by expert path."""
    return _measured_at(OUT / pool, label)


def _measured_at(folder: Path, label: str = "mean") -> dict:
    report = json.loads((folder / "mergeability" / label / "mergeability.json").read_text())
    return {m["path"]: m for m in report["models"]}


def _mean_s(pool: str, label: str = "mean") -> dict:
    return {path: m["mergeability"] for path, m in _measured(pool, label).items()}


def fewshot(args) -> None:
    from mergekit_mergeability.maths.stats import correlate
    from mergekit_mergeability.decide.features import features

    measured = _mean_s("fit")
    table = Table(
        "shots",
        "Spearman: base p(gold) vs S",
        "95% interval",
        "permutation p",
        "accuracy vs S",
        title=f"Few-shot knowledge on the fit pool ({len(measured)} experts, mean merging)",
    )
    for folder in sorted((OUT / "fit").glob("precheck_k*"), key=lambda p: int(p.name[len("precheck_k") :])):
        found = features(json.loads((folder / "precheck.json").read_text())["models"])
        common = [m for m in found if m in measured]
        p_gold = correlate([found[m]["p_gold"] for m in common], [measured[m] for m in common])
        accuracy = correlate([found[m]["accuracy"] for m in common], [measured[m] for m in common])
        low, high = p_gold.interval
        table.add_row(
            folder.name[len("precheck_k") :],
            f"{p_gold.spearman:+.2f}",
            f"{low:+.2f} – {high:+.2f}",
            f"{p_gold.p_permutation:.3f}",
            f"{accuracy.spearman:+.2f}",
        )
    console.print(table)


def _run(*command: str) -> None:
    started = time.perf_counter()
    console.print(f"$ {' '.join(command)}")
    subprocess.run(command, check=True)
    console.print(f"[dim]({time.perf_counter() - started:.0f} s)[/dim]")


def calibrate(args) -> None:
    """Fit the calibration on the families the shipped one is fitted on (or those named); --install ships it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pools import SHIPPED

    pairs = []
    for family in args.families or SHIPPED:
        precheck, measured = (
            OUT / family / "precheck" / "precheck.json",
            OUT / family / "mergeability" / "mean" / "mergeability.json",
        )
        if precheck.is_file() and measured.is_file():
            pairs += [str(precheck), str(measured)]
    target = args.output or OUT / "calibration.json"
    if args.also:  # features the package measures but does not fit: fitted here, to test them
        from mergekit_mergeability.decide.calibration import calibrate as fit, write

        found = fit(
            list(zip(pairs[::2], pairs[1::2])), permutations=args.permutations, within=args.within, also=args.also
        )
        write(found, target, pairs)
        weights = {f["name"]: round(f["weight"], 3) for f in found["model"]["features"]}
        console.print(f"wrote {target}: weights {weights}")
        return
    _run(
        sys.executable,
        "-m",
        "mergekit_mergeability",
        "calibrate",
        *pairs,
        "--out",
        str(target),
        "--permutations",
        str(args.permutations),
        "--within-pools" if args.within else "--pooled",
    )
    if args.install:
        from mergekit_mergeability.api import install

        console.print(f"installed as {install(target, kind='precheck')}")


def validate(args) -> None:
    """Precheck the pool afresh with the shipped calibration, then validate against S."""
    precheck = OUT / args.pool / "validate" / "precheck"
    shutil.rmtree(precheck, ignore_errors=True)
    _run(
        sys.executable,
        "-m",
        "mergekit_mergeability",
        "precheck",
        str(OUT / args.pool / "configs" / "pool.yml"),
        "--out",
        str(precheck),
        "--skip",
        "representations",
        "--quiet",
    )
    _run(
        sys.executable,
        "-m",
        "mergekit_mergeability",
        "validate",
        str(precheck / "precheck.json"),
        str(OUT / args.pool / "mergeability" / "mean" / "mergeability.json"),
        "--out",
        str(precheck.parent),
    )


def methods(args) -> None:
    """Mean own-task S by thirds of the base's p(gold), for every method measured on the pool."""
    from mergekit_mergeability.demo.steps import knowledge_groups

    thirds = knowledge_groups(json.loads((OUT / args.pool / "precheck" / "precheck.json").read_text()))
    groups = {
        "weakest-known third": thirds["weakly known"],
        "middle": thirds["partly known"],
        "strongest-known third": thirds["well known"],
    }
    groups["all"] = [m for members in groups.values() for m in members]
    table = Table(
        "merge",
        *(f"{g} ({len(m)})" for g, m in groups.items()),
        title=f"Own-fact accuracy after merging ({args.pool} pool, 8 partners × 5 trials)",
    )
    table.columns[0].no_wrap = True
    labels = sorted(f.name for f in (OUT / args.pool / "mergeability").iterdir() if (f / "mergeability.json").is_file())
    means = {}
    for label in ["mean", *(l for l in labels if l != "mean")]:
        s = _mean_s(args.pool, label)
        means[label] = {g: statistics.fmean(s[m] for m in members) for g, members in groups.items()}
        change = lambda g: "" if label == "mean" else f" ({means[label][g] - means['mean'][g]:+.3f})"  # noqa: E731
        table.add_row(label, *(f"{v:.3f}{change(g)}" for g, v in means[label].items()))
    console.print(table)


def families(args) -> None:
    """Leave one family out: fit the calibration (the shipped procedure, nothing chosen per
    family) on every other family, predict the held-out one, and compare with each single
    input there; then the pooled number and a permutation null of the whole procedure."""
    import numpy as np

    from mergekit_mergeability.maths import fitting
    from mergekit_mergeability.decide.calibration import REHEARSAL, measured_pool
    from mergekit_mergeability.decide.features import fitted_with

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pools import FAMILIES, FITTED

    chosen = fitted_with(args.also)
    names, directions = list(chosen), list(chosen.values())
    extra = [n for n in RIVALS if n not in names] if args.rehearsal else []  # columns read, not fitted
    pools, described = {}, {}
    for family, folder in _families(args.families or FITTED):
        described[family] = FAMILIES.get(family, family)
        precheck, measured = (
            OUT / folder / "precheck" / "precheck.json",
            OUT / folder / "mergeability" / "mean" / "mergeability.json",
        )
        if precheck.is_file() and measured.is_file():
            pools[family] = measured_pool(precheck, measured, names=[*names, *extra, REHEARSAL])[1:3]
        else:
            console.print(
                f"[yellow]{family}: not measured yet ({measured}); run `python research/pools.py {family} --precheck`[/yellow]"
            )
    if len(pools) < 2:
        raise SystemExit("need at least two measured families")
    rows, report = [], {"families": {}, "features": names}
    x_all = np.vstack([x for x, _ in pools.values()])
    y_all = np.concatenate([y for _, y in pools.values()])
    groups = [f for f, (_, y) in pools.items() for _ in y]
    fitted = x_all[:, : len(names)]
    predicted_all = fitting.held_out_predictions(fitted, y_all, groups, names, directions, True, args.within)
    if args.rehearsal:  # nothing of it is fitted: where measured it is the prediction, as in the precheck
        rehearsed = x_all[:, -1]
        predicted_all = np.where(np.isnan(rehearsed), predicted_all, rehearsed)
    rivals = [*names, *extra]  # the single inputs it is compared with (not the one it reads)
    for family, (x, y) in pools.items():
        inside = np.array(groups) == family
        scored = _scored(predicted_all[inside], x[:, : len(rivals)], y, args.permutations, rivals)
        report["families"][family] = scored
        scored["description"] = described[family]
        rows.append((family, scored))
    pooled = fitting.within_pools(predicted_all, y_all, groups)
    if args.rehearsal:  # nothing fitted: the null shuffles S within each family against the prediction
        null = _shuffled(predicted_all, y_all, groups, args.null)
    else:
        null = fitting.permutation_null(fitted, y_all, groups, names, directions, args.null, 0, True, args.within)
    report["pooled"] = {
        "spearman": pooled,
        "n": len(y_all),
        "p_permutation": fitting.p_value(pooled, null),
        "null_95th_percentile": float(np.percentile(null, 95)),
        "permutations": args.null,
    }
    console.print(_table(rows, "Leave one family out: Spearman with measured S (mean merge, 8 partners × 5 trials)"))
    console.print(
        f"pooled (within-family Spearman, size-weighted): {pooled:+.2f}, n = {len(y_all)}, permutation p {_p(report['pooled']['p_permutation'])} ({args.null} {'shuffles of S within each family' if args.rehearsal else 'refits on shuffled targets'}; 95th percentile {report['pooled']['null_95th_percentile']:+.2f})"
    )
    for family in pools:
        console.print(f"[dim]{family}: {described[family]}[/dim]")
    out = OUT / "families.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out}")


# The single inputs the rehearsal is compared with, beside the calibrated ones (research/pools/prereg/rehearsal2.txt)
RIVALS = ("partnered_p_gold", "partnered_accuracy")


def _shuffled(predicted, y, groups, permutations: int, seed: int = 0):
    """The pooled within-family Spearman of a fixed prediction against S shuffled within each family."""
    import numpy as np

    from mergekit_mergeability.maths import fitting

    shuffles = fitting.shuffled_within(y, groups, permutations, seed)
    return np.array([fitting.within_pools(predicted, shuffled, groups) for shuffled in shuffles])


def _scored(predicted, x, y, permutations: int, names=None) -> dict:
    """A prediction of one family against measured S: its Spearman (bootstrap 95% interval,
    permutation p), the best single input there other than one it equals (of ``names``, x's columns: by default the
    calibrated features), and the paired bootstrap interval of the difference."""
    import numpy as np

    from mergekit_mergeability.decide.features import CALIBRATED, FEATURES
    from mergekit_mergeability.maths import fitting
    from mergekit_mergeability.maths.stats import correlate, difference

    names = list(names or CALIBRATED)
    directions = [FEATURES[n] for n in names]
    predicted = np.clip(predicted, 0, 1)
    result = correlate(predicted, y, permutations=permutations, seed=0)
    singles = fitting.single_features(x, y, ["pool"] * len(y), names, directions)
    columns = {n: d * x[:, i] for i, (n, d) in enumerate(zip(names, directions))}
    # a rival is another input: one the prediction merely equals (a rehearsal read as is) cannot lose to it
    same = {n for n, c in columns.items() if np.allclose(c, predicted, equal_nan=True)}
    best = fitting.best({n: v for n, v in singles.items() if n not in same})
    column = columns[best]
    known = ~np.isnan(column)
    gap, (low, high) = difference(predicted[known], column[known], y[known])
    return {
        "n": len(y),
        "spearman": result.spearman,
        "interval": result.interval,
        "p_permutation": result.p_permutation,
        "best_single_feature": best,
        "best_single_spearman": singles[best],
        "difference": gap,
        "difference_interval": [low, high],
        "single_features": singles,
    }


def _table(rows, title: str) -> Table:
    table = Table("family", "n", "predicted", "95%", "p", "best single input", "difference [95%]", title=title)
    for column in table.columns:  # at 80 columns a long name wraps instead of being cut
        column.overflow = "fold"
    for family, r in rows:
        table.add_row(
            family,
            str(r["n"]),
            f"{r['spearman']:+.2f}",
            f"{r['interval'][0]:+.2f} – {r['interval'][1]:+.2f}",
            _p(r["p_permutation"]),
            f"{r['best_single_feature']} {r['best_single_spearman']:+.2f}",
            f"{r['difference']:+.2f} [{r['difference_interval'][0]:+.2f}, {r['difference_interval'][1]:+.2f}]",
        )
    return table


HOLD = "mergekit_mergeability.diagnostics.dilution as d; d.SUM_SHARE = d.SUM_BUDGET = float('inf')"


def refresh(args) -> None:
    """Run one diagnostic again over a measured family (its experts cached: ``pools.py FAMILY
    --methods ""`` retrains them) and write its per-model fields into the family's precheck.json,
    so a new signal joins the archived reports without measuring anything else; the fields the
    report already had must come back within --tolerance."""
    from mergekit_mergeability.files import write_atomic

    every = ("knowledge", "weights", "dilution", "representations", "selectivity", "compatibility")
    scratch = OUT / args.family / f"refresh_{args.diagnostic}"
    if not (args.reuse and (scratch / "precheck.json").is_file()):
        shutil.rmtree(scratch, ignore_errors=True)
        skips = [flag for name in every if name != args.diagnostic for flag in ("--skip", name)]
        config = OUT / args.family / "configs" / "pool.yml"
        cli = ["-m", "mergekit_mergeability"]
        # --hold-sum: the same numbers (tests/test_dilution.py), without the N² reads a user's memory bound forces
        if args.hold_sum:
            cli = ["-c", f"import {HOLD}; from mergekit_mergeability.cli import main; main()"]
        _run(sys.executable, *cli, "precheck", str(config), "--out", str(scratch), *skips, "--quiet")
    fresh = {m["path"]: m.get(args.diagnostic) for m in json.loads((scratch / "precheck.json").read_text())["models"]}
    target = OUT / args.family / "precheck" / "precheck.json"
    report = json.loads(target.read_text())
    worst = 0.0
    for model in report["models"]:
        new = fresh.get(model["path"])
        if not new:
            continue
        old = model.get(args.diagnostic) or {}
        for key, value in old.items():
            if isinstance(value, (int, float)) and isinstance(new.get(key), (int, float)):
                worst = max(worst, abs(value - new[key]))
        model[args.diagnostic] = {**old, **new}
    if worst > args.tolerance:
        raise SystemExit(
            f"{args.family}: {args.diagnostic} differs from the archived report by {worst:.2g}; not written"
        )
    write_atomic(target, json.dumps(report, indent=2) + "\n")
    console.print(f"{target}: {args.diagnostic} rewritten (fields it had: within {worst:.2g})")


def check(args) -> None:
    """The shipped calibration (or ``--calibration``) on a family it was not fitted on, as a user's
    precheck would predict it: each expert's features in that family's precheck.json, the weights as
    shipped; against measured S, with its best single input there."""
    import numpy as np

    from mergekit_mergeability.decide.calibration import Calibration, measured_pool
    from mergekit_mergeability.decide.features import CALIBRATED, features
    from mergekit_mergeability.files import read_report

    calibration = Calibration.load(args.calibration)
    fitted = calibration.document.get("provenance", {}).get("command", "")
    if f"{OUT.name}/{args.family}/" in fitted:
        raise SystemExit(
            f"{args.family}: {calibration.path} was fitted on it (its provenance names {OUT.name}/{args.family}/);"
            " check a family it has not seen"
        )
    reports = (
        OUT / args.family / "precheck" / "precheck.json",
        OUT / args.family / "mergeability" / "mean" / "mergeability.json",
    )
    # every input fitted (and, beside a rehearsal, its rivals), for the best single one; not the one it reads
    names = list(dict.fromkeys([*CALIBRATED, *calibration.model.names, *(RIVALS if calibration.reads_first else ())]))
    models, x, y, _ = measured_pool(*reports, names=names)
    table = features(read_report(reports[0], "precheck", ("path", "role"))["models"])
    predicted = np.array([calibration.predict(table[m])[0] for m in models], dtype=float)
    scored = _scored(predicted, x, y, args.permutations, names)
    on = re.findall(rf"{OUT.name}/([^/\s]+)/precheck", fitted)
    scored["calibration"] = {"path": str(calibration.path), "fitted_on": on, "command": fitted}
    rows = [(args.family, scored)]
    if calibration.reads_first:  # the fitted model alone, as it predicts where the rehearsal was not measured
        alone = np.array([calibration.fitted(table[m])[0] for m in models], dtype=float)
        scored["fitted_alone"] = _scored(alone, x, y, args.permutations, names)
        rows.append((f"{args.family} (knowledge and weights alone)", scored["fitted_alone"]))
    title = f"{args.family}: the calibration fitted on {', '.join(on) or 'its own pools'}, against measured S"
    console.print(_table(rows, title))
    out = OUT / f"check_{args.family}.json"
    out.write_text(json.dumps(scored, indent=2) + "\n")
    console.print(f"wrote {out}")


def derived(args) -> None:
    """Amendment 7 of ``pools/prereg/users_configs.txt``: a pool's config with every probe removed,
    prechecked as shipped (each expert predicted by its derived signature) and with ``fluency``
    skipped (weights alone); each against the pool's measured S (the mean merge's trials)."""
    _against_s(args.folder, _without_probes(args.folder), "no probes", args.permutations)


def _without_probes(folder: Path) -> dict:
    """Amendment 7's two arms: the pool's config with every probe removed, prechecked as shipped
    (``signature``) and with ``fluency`` skipped (``weights alone``)."""
    import yaml
    from configs import without_probes  # research/configs.py: a config with every probe removed

    from mergekit_mergeability.files import write_atomic

    document = without_probes(yaml.safe_load((folder / "configs" / "pool.yml").read_text()))
    config = write_atomic(folder / "configs" / "pool_no_probes.yml", yaml.safe_dump(document, sort_keys=False))
    return {
        "signature": _prechecked(config, folder / "derived" / "signature"),
        "weights alone": _prechecked(config, folder / "derived" / "weights_alone", skip=("fluency",)),
    }


def lm_eval_probes(args) -> None:
    """Amendment 8 of ``pools/prereg/users_configs.txt``: a pool prechecked with its JSONL probes
    and with each probe written as an lm-eval task (the same items, as the precheck scores them);
    each against the pool's measured S, and lm-eval's acc beside the JSONL run's accuracy."""
    import yaml
    from configs import routes_agree, task_yaml  # research/configs.py: lm-eval tasks, and the two routes compared

    from mergekit_mergeability.files import write_atomic
    from mergekit_mergeability.tasks.probes import scored_lines

    folder = args.folder
    document = yaml.safe_load((folder / "configs" / "pool.yml").read_text())
    tasks = folder / "lmeval" / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    as_tasks = {
        **document,
        "models": [
            {**m, "probe": str(task_yaml(tasks, f"pool_{Path(m['probe']).stem}", scored_lines(Path(m["probe"]))))}
            for m in document["models"]
        ],
    }
    config = write_atomic(folder / "configs" / "pool_lmeval.yml", yaml.safe_dump(as_tasks, sort_keys=False))
    arms = {
        "JSONL probes": _prechecked(folder / "configs" / "pool.yml", folder / "lmeval" / "jsonl"),
        "lm-eval probes": _prechecked(config, folder / "lmeval" / "lmeval"),
    }
    _against_s(folder, arms, "probes as JSONL and as lm-eval tasks", args.permutations)
    jsonl = arms["JSONL probes"]
    routes_agree(
        [
            abs(m["dilution"]["partnered_task_score"] - jsonl[path]["dilution"]["partnered_accuracy"])
            for path, m in arms["lm-eval probes"].items()
            if m["role"] != "base"
        ],
        "experts",
    )


def own_text(args) -> None:
    """Amendment 10 of ``pools/prereg/users_configs.txt`` (rule 5): each expert's probe derived from
    its own greedy text where the base would say another word (``own_items``), written as an lm-eval
    task, the pool prechecked with them; against S beside amendment 7's two arms."""
    import yaml
    from configs import task_yaml  # research/configs.py: instances as an lm-eval task YAML

    from mergekit_mergeability.files import write_atomic
    from mergekit_mergeability.progress import task
    from mergekit_mergeability.resources import shipped
    from mergekit_mergeability.sources import load_causal_lm, resolve

    folder = args.folder
    document = yaml.safe_load((folder / "configs" / "pool.yml").read_text())
    questions = [json.loads(line)["question"] for line in shipped("fewshot/general.jsonl").read_text().splitlines()]
    prompts = [*shipped("text/openings.txt").read_text().splitlines(), *(f"{q}\nAnswer:" for q in questions)]
    tasks = folder / "own_text" / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    base, tokenizer = load_causal_lm(document["base_model"])
    models = []
    with task("own text: each expert's derived probe", len(document["models"])) as advance:
        for m in document["models"]:
            path = tasks / f"own_{Path(m['model']).name}.yaml"
            if not path.is_file():
                expert, _ = load_causal_lm(resolve(m["model"]))
                items = own_items(expert, base, tokenizer, prompts)
                first = f": {items[0].prompt[-40:]!r} {items[0].continuations}" if items else ""
                console.print(f"{Path(m['model']).name}: {len(items)} items{first}")
                if items:
                    task_yaml(tasks, path.stem, items, delimiter="")
            models.append({**m, "probe": str(path)} if path.is_file() else {k: v for k, v in m.items() if k != "probe"})
            advance(1)
    config = write_atomic(folder / "configs" / "pool_own_text.yml", yaml.safe_dump({**document, "models": models}))
    before = _without_probes(folder)
    arms = {
        "own text (rule 5)": _prechecked(config, folder / "own_text" / "precheck"),
        "weights alone": before["weights alone"],
        "signature (rule 4)": before["signature"],
    }
    _against_s(folder, arms, "probes derived from each expert's own text", args.permutations)


def own_items(expert, base, tokenizer, prompts, new_tokens: int = 16, count: int = 16):
    """Rule 5's items: from each prompt the expert writes ``new_tokens`` greedily; wherever the base,
    on the same text so far, would write another token and both tokens begin a word, the text so far
    with choices (the expert's token, the base's) and gold the expert's; the ``count`` with the
    largest margin of the expert's log-prob between the two."""
    import torch

    from mergekit_mergeability.tasks.probes import Instance

    def word(token: int) -> Optional[str]:
        text = tokenizer.decode([token])
        return text if text.startswith(" ") and text.strip() else None

    found = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            written = expert.generate(
                ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
            mine = expert(written).logits[0].float().log_softmax(-1)
            theirs = base(written).logits[0].float()
            for t in range(ids.shape[1], written.shape[1]):
                x, b = int(written[0, t]), int(theirs[t - 1].argmax())
                gold, other = (word(x), word(b)) if x != b else (None, None)
                if gold and other:
                    context = tokenizer.decode(written[0, :t])
                    found.append((float(mine[t - 1, x] - mine[t - 1, b]), context, gold, other))
    found.sort(key=lambda f: -f[0])
    return [Instance(prompt=context, continuations=(x, b), label=0) for _, context, x, b in found[:count]]


def _prechecked(config: Path, out: Path, skip=()) -> dict:
    """The precheck of ``config`` into ``out`` as the pools run it (read back where it ran): its
    models by path."""
    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    if not (out / "precheck.json").is_file():
        settings = PrecheckSettings(device="cpu", dtype="float32", skip=(*skip, "representations", "selectivity"))
        api.precheck(config, settings=settings, out=out)
    return {m["path"]: m for m in json.loads((out / "precheck.json").read_text())["models"]}


def _against_s(folder: Path, arms: dict, what: str, permutations: int) -> None:
    """Each arm's predicted_mergeability (prechecked models by path) against the pool's measured S:
    Spearman, interval, permutation p; the first two arms' paired difference."""
    import numpy as np

    from mergekit_mergeability.maths.stats import correlate, difference

    s = {path: m["mergeability"] for path, m in _measured_at(folder).items()}
    experts = sorted(s)
    y = np.array([s[m] for m in experts])
    x = {
        arm: np.array([models[m].get("predicted_mergeability") for m in experts], dtype=float)
        for arm, models in arms.items()
    }
    table = Table(title=f"{folder}: {what}, predicted vs measured S (n = {len(experts)})")
    for column in ("prediction", "Spearman", "95% interval", "permutation p", "distinct"):
        table.add_column(column)
    for arm, values in x.items():
        r = correlate(values, y, permutations=permutations)
        table.add_row(
            arm, f"{r.spearman:+.2f}", f"[{r.interval[0]:+.2f}, {r.interval[1]:+.2f}]", _p(r.p_permutation),
            str(len(set(values))),
        )  # fmt: skip
    console.print(table)
    a, b = list(x)[:2]
    gap, (low, high) = difference(x[a], x[b], y)
    console.print(f"{a} − {b}: {gap:+.2f} [{low:+.2f}, {high:+.2f}] (paired bootstrap over experts)")


# knowledge_weighted's aims (issue 19): lift the weakest-known third, spare the strongest, keep as much as TIES
AIMS = {"weakest third − mean": 0.15, "strongest third − mean": -0.03, "all − TIES": 0.0}


def _aims_of(folder: str, kw: str):
    """knowledge_weighted (label ``kw``) against mean merging and TIES on one measured family:
    per aim (mean paired difference, its bootstrap 95% interval, whether it holds), and where the
    best-known third's loss comes from (``_best_known``); None until every method is measured."""
    from mergekit_mergeability.demo.steps import knowledge_groups
    from mergekit_mergeability.maths.stats import mean_interval

    root = OUT / folder
    labels = {"mean": "mean", "ties": "ties_d0.5", "kw": kw}
    if not all((root / "mergeability" / label / "mergeability.json").is_file() for label in labels.values()):
        return None
    s = {key: _mean_s(folder, label) for key, label in labels.items()}
    thirds = knowledge_groups(json.loads((root / "precheck" / "precheck.json").read_text()))
    groups = {
        "weakest third − mean": (thirds["weakly known"], "mean"),
        "strongest third − mean": (thirds["well known"], "mean"),
        "all − TIES": (sorted(s["kw"]), "ties"),
    }
    found = {}
    for aim, (members, against) in groups.items():
        gain, interval = mean_interval([s["kw"][m] - s[against][m] for m in members])
        found[aim] = (gain, interval, gain >= AIMS[aim])
    base = {path: m["base_score"] for path, m in _measured(folder).items()}
    return found, _best_known(thirds["well known"], base, s, kw)


def _best_known(best, base, s, kw: str) -> str:
    """Where the best-known third's loss comes from: how many of them the base already answered
    (base score 1: the expert's own update is not needed) and how many of those keep less under
    ``kw`` and under TIES than under the mean merge, with the same partner draws."""
    answered = [e for e in best if base[e] == 1.0]
    lost = {key: sum(s[key][e] < s["mean"][e] for e in answered) for key in ("kw", "ties")}
    return (
        f"best-known third: the base already answers {len(answered)} of {len(best)}; of those, "
        f"{lost['kw']} keep less under {kw} and {lost['ties']} under TIES than under the mean merge"
    )


def reliability_of(scores, splits: int = 500, seed: int = 0):
    """(split-half Spearman, reliability of S) for ``scores`` (experts × trials): the Spearman
    between the means of two random halves of the trials, averaged over ``splits`` splits, and
    stepped up to all the trials (Spearman–Brown)."""
    import numpy as np

    from mergekit_mergeability.maths.stats import spearman

    scores = np.asarray(scores, dtype=float)
    rng = np.random.default_rng(seed)
    half = scores.shape[1] // 2
    orders = [rng.permutation(scores.shape[1]) for _ in range(splits)]
    r = float(np.mean([spearman(scores[:, o[:half]].mean(1), scores[:, o[half : 2 * half]].mean(1)) for o in orders]))
    factor = scores.shape[1] / half
    return r, factor * r / (1 + (factor - 1) * r)


def reliability(args) -> None:
    """How reproducible each family's S is (``reliability_of``): the ceiling no prediction of S can pass."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pools import FAMILIES

    for family, folder in _families(args.families or FAMILIES):
        if not (OUT / folder / "mergeability" / "mean" / "mergeability.json").is_file():
            console.print(f"[yellow]{family}: not measured[/yellow]")
            continue
        scores = [[t["score"] for t in m["trials"]] for m in _measured(folder).values()]
        r, whole = reliability_of(scores)
        console.print(
            f"{family}: {len(scores)} experts × {len(scores[0])} trials; split-half {r:+.3f}, reliability of S {whole:+.3f}"
        )


def across(args) -> None:
    """Two families that teach the same facts (``lora`` teaches ``fit``'s), fact by fact: whether
    the facts keep their order of S, and whether each family's features rank the other's S."""
    from mergekit_mergeability.maths.stats import spearman

    def by_fact(folder: str):
        report = json.loads((OUT / folder / "precheck" / "precheck.json").read_text())
        features = {Path(m["path"]).name: m["features"] for m in report["models"] if m["role"] == "expert"}
        return features, {Path(path).name: s for path, s in _mean_s(folder).items()}

    (fa, sa), (fb, sb) = by_fact(args.a), by_fact(args.b)
    facts = sorted(set(sa) & set(sb))
    console.print(
        f"{len(facts)} facts in both; S of {args.a} against S of {args.b}: {spearman([sa[f] for f in facts], [sb[f] for f in facts]):+.2f}"
    )
    table = Table("feature", f"{args.a} vs {args.b}", f"{args.a}'s → S of {args.b}", f"{args.b}'s → S of {args.b}")
    for name in ("scored_p_gold", "scored_gap", "relative_norm", "relative_top_sv"):
        x, y = [fa[f][name] for f in facts], [fb[f][name] for f in facts]
        target = [sb[f] for f in facts]
        table.add_row(name, *(f"{v:+.2f}" for v in (spearman(x, y), spearman(x, target), spearman(y, target))))
    console.print(table)


def aims(args) -> None:
    """knowledge_weighted's candidate defaults (``--kw``: labels pools.py measured) against mean
    merging and TIES on each family, with the same partner draws: the mean paired difference per
    group of experts (thirds by the base's knowledge), a bootstrap 95% interval over experts, and
    which aims hold. With several candidates, each family's default is chosen on the other
    families alone (most families with every aim met, then most aims met), and scored on it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pools import FAMILIES

    candidates = args.kw.split(",")
    measured = {}
    for family, folder in _families(args.families or FAMILIES):
        found = {kw: _aims_of(folder, kw) for kw in candidates}
        missing = [kw for kw, f in found.items() if f is None]
        if missing:
            console.print(f"[yellow]{family}: not measured yet: {', '.join(missing)} (or mean, ties_d0.5)[/yellow]")
            continue
        for _, line in found.values():
            console.print(f"{family}: {line}")
        measured[family] = {kw: aims for kw, (aims, _) in found.items()}
    table = Table(
        "family",
        "default",
        *(f"{aim} (aim ≥ {bound:+.2f})" for aim, bound in AIMS.items()),
        "aims met",
        title="knowledge_weighted against mean merging and TIES (8 partners × 5 trials, same draws)",
    )

    def met(found) -> int:
        return sum(held for _, _, held in found.values())

    for family, found in measured.items():
        for kw in candidates:
            cells = [
                f"{gain:+.3f} [{low:+.3f}, {high:+.3f}] {'✓' if held else '✗'}"
                for gain, (low, high), held in found[kw].values()
            ]
            table.add_row(family, kw, *cells, f"{met(found[kw])}/{len(AIMS)}")
        table.add_section()
    console.print(table)
    for kw in candidates:
        on = [f for f, found in measured.items() if met(found[kw]) == len(AIMS)]
        console.print(f"{kw}: every aim met on {len(on)} of {len(measured)} families ({', '.join(on) or 'none'})")
    if len(candidates) > 1 and len(measured) > 1:
        chosen_met = 0
        for family in measured:
            others = [f for f in measured if f != family]
            chosen = max(
                candidates,
                key=lambda kw: (
                    sum(met(measured[f][kw]) == len(AIMS) for f in others),
                    sum(met(measured[f][kw]) for f in others),
                ),
            )
            held = met(measured[family][chosen])
            chosen_met += held == len(AIMS)
            console.print(f"{family} held out: chosen on the others {chosen}; there {held}/{len(AIMS)} aims")
        console.print(
            f"default chosen leaving each family out: every aim met on {chosen_met} of {len(measured)} families"
            " (issue 19 asks for three of four)"
        )


def gate(args) -> None:
    """What the precheck's choice between knowledge_weighted and TIES reads (each family's whole
    pool config rehearsed both ways: every expert's probe on both merges, read as scored), beside
    the same two methods measured on paper 1's 9-model trials (same partner draws); the two are
    different merges (the config holds 64 or more), so the second is context, not a check."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pools import FAMILIES

    from mergekit_mergeability.decide import _against_ties
    from mergekit_mergeability.maths.merging import DEFAULT_TEMPERATURE

    table = Table(
        "family", "experts", "rehearsed: kw", "TIES", "chooses", "9-model trials: kw", "TIES", "leads",
        title="kw (knowledge_weighted) against TIES: the whole config rehearsed, and paper 1's trials",
    )  # fmt: skip
    for family, folder in _families(args.families or FAMILIES):
        report = OUT / folder / "precheck" / "precheck.json"
        if not report.is_file():
            continue
        experts = [m for m in json.loads(report.read_text())["models"] if m["role"] == "expert"]
        rehearsed, by = _against_ties(experts, None)
        if rehearsed is None:
            console.print(f"[yellow]{family}: not rehearsed yet: research/prediction.py refresh {family}[/yellow]")
            continue
        trials = ["–", "–", "–"]
        labels = (f"kw_t{DEFAULT_TEMPERATURE:g}", "ties_d0.5")  # the default's trials
        if all((OUT / folder / "mergeability" / label / "mergeability.json").is_file() for label in labels):
            kw, ties = (sum(s.values()) / len(s) for s in (_mean_s(folder, label) for label in labels))
            trials = [f"{kw:.3f}", f"{ties:.3f}", "kw" if kw > ties else "TIES"]
        chosen = "kw" if rehearsed[0] > rehearsed[1] else "TIES"
        table.add_row(family, str(len(experts)), f"{rehearsed[0]:.3f}", f"{rehearsed[1]:.3f}", chosen, *trials)
    console.print(table)


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fewshot").set_defaults(run=fewshot)
    fit = commands.add_parser("calibrate")
    fit.add_argument(
        "families",
        nargs="*",
        help="the families to fit on (default: those the shipped one is fitted on: fit, options, heldout, lora)",
    )
    fit.add_argument("--install", action="store_true", help="copy the fit into the package as its default calibration")
    fit.add_argument("--permutations", type=int, default=500)
    fit.add_argument("--within", action="store_true", help="fit the weights within families (pool fixed effects)")
    fit.add_argument("--output", type=Path, help="where to write it (default: pools-out/calibration.json)")
    fit.add_argument("--also", action="append", default=[], help="fit this measured, unfitted feature too (repeatable)")
    fit.set_defaults(run=calibrate)
    held = commands.add_parser("families")
    held.add_argument(
        "families",
        nargs="*",
        help="the families to use, FAMILY or FAMILY=FOLDER under pools-out (default: every one but the checks, attention, deep, wide and middle)",
    )
    held.add_argument("--permutations", type=int, default=10_000, help="per held-out family")
    held.add_argument("--null", type=int, default=200, help="refits on shuffled targets for the pooled number")
    held.add_argument("--within", action="store_true", help="fit the weights within families (pool fixed effects)")
    held.add_argument(
        "--also", action="append", default=[], help="fit this measured, unfitted feature too (repeatable)"
    )
    held.add_argument(
        "--rehearsal",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the prediction reads the partnered accuracy first where measured (nothing of it fitted)",
    )
    held.set_defaults(run=families)
    held = commands.add_parser("aims")
    held.add_argument(
        "families",
        nargs="*",
        help="FAMILY or FAMILY=FOLDER under pools-out (default: every one measured)",
    )
    held.add_argument(
        "--kw",
        default="kw_t0.3",
        help="knowledge_weighted labels pools.py measured, comma-separated (kw:T → kw_tT, kw-noties:T → kw_noties_tT)",
    )
    held.set_defaults(run=aims)
    noise = commands.add_parser("reliability", help="how reproducible each family's S is (split halves)")
    noise.add_argument("families", nargs="*", help="FAMILY or FAMILY=FOLDER under pools-out (default: every one)")
    noise.set_defaults(run=reliability)
    both = commands.add_parser("across", help="two families of the same facts, fact by fact")
    both.add_argument("a", help="a measured pool (e.g. fit)")
    both.add_argument("b", help="one teaching the same facts (e.g. lora)")
    both.set_defaults(run=across)
    again = commands.add_parser("refresh", help="run one diagnostic again and write it into a family's precheck.json")
    again.add_argument("family", help="a pool measured under pools-out, its experts cached")
    again.add_argument("--diagnostic", default="dilution")
    again.add_argument("--tolerance", type=float, default=1e-3, help="largest change allowed in the fields it had")
    again.add_argument(
        "--hold-sum",
        action="store_true",
        help="hold the partners' summed update in memory whatever its size (a benchmark machine, not a user's bound)",
    )
    again.add_argument(
        "--reuse",
        action="store_true",
        help="write the fields of a finished earlier run (its folder) instead of rerunning",
    )
    again.set_defaults(run=refresh)
    gated = commands.add_parser(
        "gate",
        help="knowledge_weighted against TIES: the rehearsal of each family's whole config, and its 9-model trials",
    )
    gated.add_argument("families", nargs="*", help="FAMILY or FAMILY=FOLDER under pools-out (default: every one)")
    gated.set_defaults(run=gate)
    for name, run, text in (
        ("derived", derived, "no probes: the derived signature against weights alone, on a pool"),
        ("lm-eval", lm_eval_probes, "a pool's probes as lm-eval tasks against the same probes as JSONL"),
        ("own-text", own_text, "no probes: probes derived from each expert's own text (rule 5), on a pool"),
    ):
        pooled = commands.add_parser(name, help=text)
        pooled.add_argument("folder", type=Path, help="a measured pool's folder (configs/pool.yml, mergeability/mean)")
        pooled.add_argument("--permutations", type=int, default=10_000)
        pooled.set_defaults(run=run)
    checked = commands.add_parser("check", help="the shipped calibration on a family it was not fitted on")
    checked.add_argument("family", help="a pool measured under pools-out (e.g. attention)")
    checked.add_argument("--calibration", type=Path, help="a calibration file (default: the shipped one)")
    checked.add_argument("--permutations", type=int, default=10_000)
    checked.set_defaults(run=check)
    for name, run in (("validate", validate), ("methods", methods)):
        command = commands.add_parser(name)
        command.add_argument(
            "pool", help="a pool measured under pools-out (fit, heldout, options, lora, tasks, attention)"
        )
        command.set_defaults(run=run)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
