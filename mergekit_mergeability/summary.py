"""Terminal summaries (rich tables) of the JSON reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional


def _number(value: Optional[float], digits: int = 2) -> str:
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
            _number(k.get("accuracy")),
            _number(k.get("mean_gap")),
            _number(w.get("update_norm"), 3),
            _number(model["predicted_mergeability"]),
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
