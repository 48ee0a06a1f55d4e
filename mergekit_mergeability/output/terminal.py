"""Terminal summaries (rich tables) of every command's result: a result object
(``mergekit_mergeability.results``) or the document it is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from mergekit_mergeability.names import short_names, shorten
from mergekit_mergeability.records import FluencyStats

if TYPE_CHECKING:
    from mergekit_mergeability.results import Report

Printable = Union["Report", Dict[str, Any]]  # a result object, or its JSON document


def number(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def p_value(p: float) -> str:
    """A permutation p-value as papers print it: never 0.000, which no finite test gives."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def print_precheck(report: Printable, out: Optional[Path] = None, verbose: bool = False) -> None:
    """One line per model (its reasons cut to the width: whole in the report, or with ``verbose``
    below the table), then the findings and the verdict."""
    report = _document(report)
    from rich.console import Console
    from rich.table import Column

    console = Console()
    why = Column("why", no_wrap=True, overflow="ellipsis", ratio=1)
    experts = [m for m in report["models"] if m["role"] == "expert"]
    from mergekit_mergeability.decide.verdict import unprobed as without_probe

    unprobed = [m for m in experts if without_probe(m)]
    # without a probe there is no prediction: what was measured instead, under its own name
    kept = [FluencyStats.of(m.get("fluency")).signature_kept for m in experts]
    shift = unprobed and any(k is not None for k in kept)
    probed = len(unprobed) < len(experts)  # the base's knowledge is asked of probes: no columns without any
    columns = [
        "model",
        *(["base\np(gold)", "base\nacc"] if probed else []),
        "predicted",
        *(["shift kept"] if shift else []),
    ]
    table = wrapping_table("Mergeability precheck", *columns, expand=True)
    table.columns.append(why)
    briefs = [brief(m) for m in experts]
    for model, signature, said in zip(experts, kept, briefs):
        p_gold, accuracy = known(model, report)
        flag = "*" if model.get("out_of_domain") else ""
        table.add_row(
            model["name"],
            *([number(p_gold), number(accuracy)] if probed else []),
            number(model["predicted_mergeability"]) + flag,
            *([number(signature)] if shift else []),
            said,
        )
    console.print(table)
    if any(said != "; ".join(m["reasons"]) for m, said in zip(experts, briefs)):
        console.print(
            "[dim]rehearsed a–b: predicted by the merge built in memory, 95% over its probe's items"
            + ("" if verbose else " (--verbose: every reason in full)")
            + "[/dim]"
        )
    if unprobed:
        console.print(no_prediction(unprobed, experts, Path(report["config"]).is_dir()))
        merge = next((FluencyStats.of(m.get("fluency")) for m in unprobed if m.get("fluency")), None)
        if merge is not None and merge.merged_perplexity is not None:
            console.print(
                f"  the merge as written: perplexity {merge.merged_perplexity:.3g} on a shipped general text "
                f"(the base's {merge.base_perplexity:.3g}); shift kept: the share of each model's own shift there it keeps"
            )
    for model in experts if verbose else ():
        console.print(f"{model['name']}: " + "; ".join(model["reasons"]))
    if any(m.get("out_of_domain") for m in report["models"]):
        console.print(
            "[dim]* outside what the calibration was fitted on (the warning below says how): a rough guide[/dim]"
        )
    _print_legend(console, report["models"])
    names = {m["path"]: m["name"] for m in report["models"]}
    for finding in report["findings"]:
        if finding["severity"] != "info":
            console.print(f"[yellow]{finding['severity']}[/yellow] {shorten(finding['message'], names)}")
    rec = report["recommendation"]
    cutoff = f", cut-off {rec['cutoff']}" if rec["cutoff"] is not None else ""
    console.print(
        f"[bold]verdict: {rec['verdict']}[/bold] (method {rec['method']}{cutoff}): "
        + shorten("; ".join(rec["reasons"]), names)
    )
    main, *per_expert = rec["models"] or [None]
    if main is not None:
        console.print(f"  {main['file']} keeps {main['keeps']}; drops {main['drops']}")
        for note in main["notes"]:
            console.print(f"  [dim]{note}[/dim]")
    if per_expert:
        files = ", ".join(Path(a["file"]).name for a in per_expert)
        console.print(
            f"  recommended/ gives back each model kept apart: {files}"
            if rec["verdict"] == "leave_out"
            else f"  recommended/ holds one such model per expert: {files}"
        )
    for reason in report["stop"]:
        console.print(f"[red]stop:[/red] {shorten(reason, names)}")
    if out is not None:
        files = ["precheck.json", "report.html"] + (["recommended.yml"] if rec["models"] else [])
        console.print(f"wrote {', '.join(f'{out}/{f}' for f in files)}")


def brief(model: Dict[str, Any]) -> str:
    """A model's reasons in the precheck table's narrow "why" column: a prediction that is the
    rehearsal says so with its interval, the number itself being in the "predicted" column
    (``--verbose`` prints each reason whole)."""
    from mergekit_mergeability.decide.calibration import REHEARSED

    reasons, interval = list(model["reasons"]), model.get("predicted_interval")
    if reasons and reasons[0].startswith(REHEARSED) and interval:
        reasons[0] = f"rehearsed {interval[0]:.2f}–{interval[1]:.2f}"
    return "; ".join(reasons)


def no_prediction(unprobed, experts, pool: bool = False) -> str:
    """The line under the table where some model has no probe: how to get its prediction (``pool``:
    the models are a --pool folder's members)."""
    if len(unprobed) == len(experts):
        said = "No prediction: no model has a probe"
    else:
        names = ", ".join(m["name"] for m in unprobed[:3]) + (" and more" if len(unprobed) > 3 else "")
        said = f"No prediction for {names}: no probe"
    if pool:
        member = unprobed[0]["name"]
        return f"{said}; for one, --probes DIR with DIR/{member}.jsonl (or .yaml, .yml), or --probe {member}=SPEC"
    return (
        f"{said}; for one, give each model a probe: next to its model: in the config "
        "(a JSONL file, an lm-eval task or its fine-tuning data), or --probe MODEL=SPEC"
    )


def known(model: Dict[str, Any], report: Dict[str, Any]):
    """The base's p(gold) and accuracy on a model's probes, asked the way the calibration reads
    knowledge (as the task scores it, or the paper's lettered few-shot prompt)."""
    from mergekit_mergeability.records import KnowledgeStats

    k = KnowledgeStats.of(model["knowledge"])
    as_task = (report.get("calibration") or {}).get("knowledge_feature", "p_gold").startswith(("scored_", "task_"))
    return (k.scored_mean_p_gold, k.scored_accuracy) if as_task else (k.mean_p_gold, k.accuracy)


def legend(models) -> Dict[str, list]:
    """Where the short names live: {folder: [names]} for every name that is not its path (an
    adapter written BASE+ADAPTER lives where its adapter does, and says on which base)."""
    groups: Dict[str, list] = {}
    for m in models:
        if m["name"] != m["path"]:
            base, _, path = m["path"].rpartition("+") if "+" in m["path"] else ("", "", m["path"])
            folder = path[: -len(m["name"])].rstrip("/") if path.endswith(m["name"]) else path
            groups.setdefault(folder + (f" (on {base})" if base else ""), []).append(m["name"])
    return groups


def _print_legend(console, models) -> None:
    for folder, names in legend(models).items():
        console.print(f"[dim]in {folder}: {', '.join(names)}[/dim]")


def wrapping_table(title: str, *columns: str, **options):
    """A rich table whose cells wrap rather than end in "…": a cut name cannot tell two rows apart."""
    from rich.table import Column, Table

    return Table(*(Column(c, overflow="fold") for c in columns), title=title, **options)


def print_evaluation(report: Printable, out: Optional[Path] = None) -> None:
    report = _document(report)
    from rich.console import Console

    columns = ("task", "metric, n", "base", "expert", "merged", "kept", "gain")
    table = wrapping_table("What the merge kept", *columns)
    for column in table.columns[1:]:
        column.no_wrap = True
    table.caption = (
        "n: items scored; kept (retention): merged / expert; gain: (merged − base) / (expert − base);"
        " –: no ratio (the expert scores 0, or not above the base)"
    )
    tasks = short_names(row["task"] for row in report["tasks"])
    for row in report["tasks"]:
        samples = report.get("scores", {}).get("merged", {}).get(row["task"], {}).get("samples")
        table.add_row(
            tasks[row["task"]],
            row["metric"] + ("" if samples is None else f", {samples}"),
            *(number(row[k]) for k in ("base", "expert", "merged", "retention", "normalised_gain")),
        )
    Console().print(table)
    if out is not None:
        Console().print(f"wrote {out}/evaluation.json, {out}/evaluation.png")


def print_mergeability(report: Printable, out: Optional[Path] = None) -> None:
    report = _document(report)
    from rich.console import Console

    title = f"Mergeability: {report['method']}, {report['partners']} partners × {report['trials']} trials"
    table = wrapping_table(title, "model", "task", "base", "alone", "merged (S)", "95% interval", "gain kept")
    names = short_names(row["path"] for row in report["models"])
    tasks = short_names(row["task"] for row in report["models"])
    for row in report["models"]:
        low, high = row["interval"]
        table.add_row(
            names[row["path"]],
            tasks[row["task"]],
            number(row["base_score"]),
            number(row["expert_score"]),
            number(row["mergeability"]),
            f"{low:.2f}–{high:.2f}",
            number(row["normalised"]),
        )
    console = Console()
    console.print(table)
    _print_legend(console, [{"name": names[p], "path": p} for p in names])
    if out is not None:
        console.print(f"wrote {out}/mergeability.json")


def print_validation(report: Printable) -> None:
    report = _document(report)
    from rich.console import Console

    table = wrapping_table(
        f"Predicting {report['target']} over {report['models']} models ({report['method']})",
        "predictor",
        "Spearman",
        "95% bootstrap interval",
        "permutation p",
    )
    for row in report["correlations"]:
        low, high = row["interval"]
        table.add_row(
            row["predictor"], f"{row['spearman']:+.2f}", f"{low:+.2f} – {high:+.2f}", p_value(row["p_permutation"])
        )
    console = Console()
    console.print(table)
    versus = report.get("versus_best_single")
    if versus:
        low, high = versus["interval"]
        verdict = "beats" if versus["beats"] else "does not clearly beat"
        console.print(
            f"The prediction {verdict} its best single input ({versus['best_single']}): Spearman difference {versus['difference']:+.2f}, 95% interval {low:+.2f} – {high:+.2f} (n = {versus['n']})"
            + (f"; here the prediction is {', '.join(versus['same_as'])}" if versus.get("same_as") else "")
        )


def print_calibration(report: Printable) -> None:
    report = _document(report)
    from rich.console import Console

    console = Console()
    weights = wrapping_table(
        f"Calibration on {report['models']} models, {len(report['pools'])} pool(s) ({', '.join(report['method'])})",
        "feature",
        "direction",
        "weight",
        "alone (Spearman)",
    )
    for feature in report["model"]["features"]:
        alone = report["single_features"].get(feature["name"])
        weights.add_row(
            feature["name"], "+" if feature["direction"] > 0 else "−", f"{feature['weight']:.3f}", number(alone)
        )
    console.print(weights)
    held = wrapping_table(
        "Out of sample", "held out", "Spearman", "permutation p", "null 95th pct.", "best single feature"
    )
    for how, r in report["out_of_sample"].items():
        held.add_row(
            how.replace("_", " "),
            f"{r['spearman']:+.2f}",
            p_value(r["p_permutation"]),
            f"{r['null_95th_percentile']:+.2f}",
            f"{r['best_single_feature']} ({r['best_single_spearman']:+.2f})",
        )
    console.print(held)


# the sweep's: the same words in the terminal and on its page (``html.sweep_page``)
STAGE_NAMES = {1: "A-like", 2: "transition", 3: "B-like"}


def labels(report: Dict[str, Any]) -> Dict[str, str]:
    """Role -> the model's short name for titles (the full path is in sweep.json)."""
    from mergekit_mergeability.names import short_names

    models = report["models"]
    short = short_names(m["name"] for m in models.values())
    return {role: short[m["name"]] for role, m in models.items()}


def an_end(report: Dict[str, Any]) -> Optional[str]:
    """ "a" or "b" where the sweet spot is that model itself (λ 0 or 1, every differing tensor
    interpolated): there is no merge to write; else None."""
    lam, tensors = report["sweet_spot"]["lambda"], report["tensors"]
    if lam not in (0, 1) or tensors["interpolated"] < tensors["differing"] or report.get("task_vectors"):
        return None
    return "b" if lam == 1 else "a"


def sentences(report: Dict[str, Any]) -> List[str]:
    """What the sweep found, in a few lines (the terminal and the HTML page say the same)."""
    st, ref, spot = report["stages"], report["refinement"], report["sweet_spot"]
    lines = []
    if st["found"]:
        low, high = st["transition"]
        lines.append(
            f"Transition: the {st['leading'].replace('_', ' ')} changes most between λ = {low:g} and {high:g} "
            f"(λ ≈ {(low + high) / 2:g} ± {ref['transition_half_width']:g}); stage 2 from λ = {st['stage2_from']:g}, stage 3 from λ = {st['stage3_from']:g}."
        )
    else:
        lines.append(
            "No transition: neither the marker rate nor accuracy moves by 0.2 or more between the ends of the sweep."
        )
    added = f"added λ = {', '.join(f'{lam:g}' for lam in ref['added'])}" if ref["added"] else "added no λ"
    if not st["found"]:
        lines.append("Refinement: nothing to locate without a transition.")
    elif ref["located"]:
        saved = f"{ref['saved']} fewer than" if ref["saved"] > 0 else "no fewer than"
        lines.append(
            f"Refinement {added}: {ref['evaluated']} evaluations locate the transition to ± {ref['resolution']:g}, {saved} the {ref['uniform_grid']} of a uniform grid."
        )
    else:
        lines.append(
            f"Refinement {added}, then stopped at --refine {report['settings']['refine']}: the transition is located to ± {ref['transition_half_width']:g} only."
        )
    if spot["lambda"] is None:
        lines.append(f"Sweet spot: none ({spot['reason']}).")
    else:
        lines.append(
            f"Sweet spot: λ = {spot['lambda']:g}, accuracy {spot['accuracy']:.2f} at {spot['tokens']:.1f} tokens per answer ({spot['reason']})."
        )
    end = an_end(report)
    if end:
        lines.append(
            f"That is {end.upper()} itself ({Path(report['models'][end]['path']).name}): no model between the two does better"
            " here, so use it as it is; there is no merge to write."
        )
    return lines


def print_sweep(report: Printable, out: Optional[Path] = None) -> None:
    report = _document(report)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=min(Console().width, 80))
    rows, settings = report["points"], report["settings"]
    sampled = settings["samples"] > 1
    k = settings["samples"]
    columns = [
        "λ",
        "stage",
        f"Mean@{k}",
        *([f"Pass@{k}", f"Vote@{k}"] if sampled else []),
        "tokens",
        "marker",
        "acc/tok",
    ]
    names = labels(report)
    title = f"{names['a']} → {names['b']}: {report['lm_eval_task']}"
    table = Table(*columns, title=title, caption="* refined   ◀ sweet spot")
    spot = report["sweet_spot"]["lambda"]
    for r in rows:
        mark = ("*" if r["refined"] else "") + (" ◀" if r["lambda"] == spot else "")
        sampled_cells = [number((r["pass_at"] or {}).get(str(k))), number(r["vote"])] if sampled else []
        stage = "–" if r["stage"] is None else str(r["stage"])
        table.add_row(
            f"{r['lambda']:g}{mark}",
            stage,
            number(r["accuracy"]),
            *sampled_cells,
            f"{r['tokens']:.1f}",
            number(r["marker_rate"]),
            number(r["accuracy_per_token"], 3),
        )
    console.print(table)
    if report["stages"]["table"]:
        stages = Table("stage", "λ", "accuracy", "tokens", "marker rate", title="Stages")
        for s in report["stages"]["table"]:
            stages.add_row(
                f"{s['stage']} {STAGE_NAMES[s['stage']]}",
                lambda_span(s["from"], s["to"]),
                value_range(s["accuracy_range"]),
                value_range(s["tokens_range"], 1),
                value_range(s["marker_rate_range"]),
            )
        console.print(stages)
    for line in sentences(report):
        console.print(line)
    if out is not None:
        files = ["sweep.json", "sweep.png", *(["chosen.yml"] if report.get("chosen_config") else []), "report.html"]
        console.print(
            f"wrote {', '.join(f'{out}/{f}' for f in files)}"
            + (f"; the chosen model: {report['chosen_model']}" if report.get("chosen_model") else "")
        )


def lambda_span(low: float, high: float) -> str:
    return f"{low:g}" if low == high else f"{low:g}–{high:g}"


def value_range(values, digits: int = 2) -> str:
    low, high = values
    return (
        number(low, digits)
        if round(low, digits) == round(high, digits)
        else f"{number(low, digits)}–{number(high, digits)}"
    )


def _document(report: Printable) -> Dict[str, Any]:
    return report.to_json() if hasattr(report, "to_json") else report
