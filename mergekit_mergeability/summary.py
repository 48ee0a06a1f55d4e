"""Terminal summaries (rich tables) of the JSON reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional


def number(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def print_precheck(report: Dict[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table("model", "base accuracy", "mean gap", "update norm", "predicted", "why", title="Mergeability precheck")
    for model in report["models"]:
        if model["role"] == "base":
            continue
        k, w = model["knowledge"] or {}, model["weights"] or {}
        table.add_row(
            model["path"],
            number(k.get("accuracy")),
            number(k.get("mean_gap")),
            number(w.get("update_norm"), 3),
            number(model["predicted_mergeability"]),
            "; ".join(model["reasons"]),
        )
    console.print(table)
    for finding in report["findings"]:
        if finding["severity"] != "info":
            console.print(f"[yellow]{finding['severity']}[/yellow] {finding['message']}")
    rec = report["recommendation"]
    cutoff = f", cut-off {rec['cutoff']}" if rec["cutoff"] is not None else ""
    console.print(f"[bold]verdict: {rec['verdict']}[/bold] (method {rec['method']}{cutoff}): " + " ".join(rec["reasons"]))
    for reason in report["stop"]:
        console.print(f"[red]stop:[/red] {reason}")
    if out is not None:
        console.print(f"wrote {out}/precheck.json, {out}/recommended.yml, {out}/report.html")


def _table(title: str, *columns: str):
    from rich.table import Table

    return Table(*columns, title=title)


def print_evaluation(report: Dict[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console

    table = _table("What the merge kept", "task", "metric", "base", "expert", "merged", "retention", "normalised gain")
    for row in report["tasks"]:
        table.add_row(row["task"], row["metric"], *(number(row[k]) for k in ("base", "expert", "merged", "retention", "normalised_gain")))
    Console().print(table)
    if out is not None:
        Console().print(f"wrote {out}/evaluation.json, {out}/evaluation.png")


def print_mergeability(report: Dict[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console

    title = f"Mergeability: {report['method']}, {report['partners']} partners × {report['trials']} trials"
    table = _table(title, "model", "task", "base", "alone", "merged (S)", "95% interval", "gain kept")
    for row in report["models"]:
        low, high = row["interval"]
        table.add_row(row["path"], row["task"], number(row["base_score"]), number(row["expert_score"]), number(row["mergeability"]), f"{low:.2f}–{high:.2f}", number(row["normalised"]))
    Console().print(table)
    if out is not None:
        Console().print(f"wrote {out}/mergeability.json")


def print_validation(report: Dict[str, Any]) -> None:
    from rich.console import Console

    table = _table(f"Predicting {report['target']} over {report['models']} models ({report['method']})", "predictor", "Spearman", "95% bootstrap interval", "permutation p")
    for row in report["correlations"]:
        low, high = row["interval"]
        table.add_row(row["predictor"], f"{row['spearman']:+.2f}", f"{low:+.2f} – {high:+.2f}", f"{row['p_permutation']:.3f}")
    Console().print(table)
