"""Terminal summaries (rich tables) of the JSON reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from mergekit_mergeability.names import short_names, shorten


def number(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def p_value(p: float) -> str:
    """A permutation p-value as papers print it: never 0.000, which no finite test gives."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def print_precheck(report: Dict[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console

    console = Console()
    table = wrapping_table("Mergeability precheck", "model", "p(gold)", "acc", "predicted", "why")
    for model in (m for m in report["models"] if m["role"] == "expert"):
        p_gold, accuracy = known(model, report)
        flag = "*" if model.get("out_of_domain") else ""
        table.add_row(
            model["name"],
            number(p_gold),
            number(accuracy),
            number(model["predicted_mergeability"]) + flag,
            "; ".join(model["reasons"]),
        )
    console.print(table)
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
        + shorten(" ".join(rec["reasons"]), names)
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


def known(model: Dict[str, Any], report: Dict[str, Any]):
    """The base's p(gold) and accuracy on a model's probes, asked the way the calibration reads
    knowledge (as the task scores it, or the paper's lettered few-shot prompt)."""
    from mergekit_mergeability.decide.features import _scored

    k = model["knowledge"] or {}
    as_task = (report.get("calibration") or {}).get("knowledge_feature", "p_gold").startswith(("scored_", "task_"))
    return (_scored(k, "mean_p_gold"), _scored(k, "accuracy")) if as_task else (k.get("mean_p_gold"), k.get("accuracy"))


def legend(models) -> Dict[str, list]:
    """Where the short names live: {folder: [names]} for every name that is not its path."""
    groups: Dict[str, list] = {}
    for m in models:
        if m["name"] != m["path"]:
            folder = m["path"][: -len(m["name"])].rstrip("/") if m["path"].endswith(m["name"]) else m["path"]
            groups.setdefault(folder, []).append(m["name"])
    return groups


def _print_legend(console, models) -> None:
    for folder, names in legend(models).items():
        console.print(f"[dim]in {folder}: {', '.join(names)}[/dim]")


def wrapping_table(title: str, *columns: str, **options):
    """A rich table whose cells wrap rather than end in "…": a cut name cannot tell two rows apart."""
    from rich.table import Column, Table

    return Table(*(Column(c, overflow="fold") for c in columns), title=title, **options)


def print_evaluation(report: Dict[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console

    table = wrapping_table(
        "What the merge kept", "task", "metric", "base", "expert", "merged", "retention", "normalised gain"
    )
    for row in report["tasks"]:
        table.add_row(
            row["task"],
            row["metric"],
            *(number(row[k]) for k in ("base", "expert", "merged", "retention", "normalised_gain")),
        )
    Console().print(table)
    if out is not None:
        Console().print(f"wrote {out}/evaluation.json, {out}/evaluation.png")


def print_mergeability(report: Dict[str, Any], out: Optional[Path] = None) -> None:
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


def print_validation(report: Dict[str, Any]) -> None:
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
        )


def print_calibration(report: Dict[str, Any]) -> None:
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
