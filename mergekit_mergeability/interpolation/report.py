"""A sweep's outputs: ``sweep.json`` (schema: ``schema.json`` beside this file), ``sweep.png``,
``chosen.yml`` (the sweet spot as a config for the stock ``mergekit-yaml``), ``report.html``
and the terminal tables."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.summary import number

SCHEMA = Path(__file__).with_name("schema.json")
STAGE_COLOURS = {1: "#90caf9", 2: "#ffcc80", 3: "#a5d6a7"}
STAGE_NAMES = {1: "A-like", 2: "transition", 3: "B-like"}


def labels(report: Dict[str, Any]) -> Dict[str, str]:
    """Role -> the model's short name for titles (the full path is in sweep.json)."""
    from mergekit_mergeability.names import short_names

    models = report["models"]
    short = short_names(m["name"] for m in models.values())
    return {role: short[m["name"]] for role, m in models.items()}


def chosen_config(report: Dict[str, Any], sweep) -> Optional[Dict[str, Any]]:
    """The sweet spot's λ-model as a mergekit ``linear`` config; None where mergekit cannot
    build it (task vectors are not models it reads; no sweet spot). With --layers/--modules,
    each interpolated tensor gets its own weight through mergekit's substring ``filter:``,
    written as the full tensor name and checked to match no other tensor."""
    from mergekit_mergeability.interpolation.models import weights

    lam = report["sweet_spot"]["lambda"]
    if lam is None or sweep.ends.vectors:
        return None
    chosen = weights(lam)
    restricted = len(sweep.interpolated) < report["tensors"]["differing"]
    if restricted:
        others = [n for n in sweep.ends.names_of() if n not in set(sweep.interpolated)]
        if any(name in other for other in others for name in sweep.interpolated):
            return None

    def weight(role: str):
        if not restricted:
            return chosen[role]
        return [
            *({"filter": name, "value": chosen[role]} for name in sweep.interpolated),
            {"value": 1.0 if role == "a" else 0.0},
        ]

    models = [{"model": report["models"][role]["path"], "parameters": {"weight": weight(role)}} for role in ("a", "b")]
    return {"merge_method": "linear", "models": models, "dtype": report["settings"]["dtype"] or "float32"}


def write(report: Dict[str, Any], sweep, out: Path) -> List[Path]:
    import yaml

    out = Path(out)
    config = chosen_config(report, sweep)
    report["chosen_config"] = "chosen.yml" if config else None
    image = plot(report)
    written = [
        write_atomic(out / "sweep.json", json.dumps(report, indent=2) + "\n"),
        write_atomic(out / "sweep.png", image),
    ]
    if config:
        spot = report["sweet_spot"]
        header = f"# λ = {spot['lambda']:g}: {spot['reason']} (mergekit-mergeability sweep)\n# mergekit-yaml chosen.yml ./merged\n"
        written.append(write_atomic(out / "chosen.yml", header + yaml.safe_dump(config, sort_keys=False)))
    written.append(
        write_atomic(out / "report.html", render(report, image, config and yaml.safe_dump(config, sort_keys=False)))
    )
    return written


def _boundaries(rows: List[Dict[str, Any]]):
    """(stage, from λ, to λ) spans for shading: each boundary halfway between neighbouring points."""
    spans = []
    for i, row in enumerate(rows):
        low = rows[0]["lambda"] if i == 0 else (rows[i - 1]["lambda"] + row["lambda"]) / 2
        high = rows[-1]["lambda"] if i == len(rows) - 1 else (row["lambda"] + rows[i + 1]["lambda"]) / 2
        if spans and spans[-1][0] == row["stage"]:
            spans[-1][2] = high
        else:
            spans.append([row["stage"], low, high])
    return [s for s in spans if s[0] is not None]


def plot(report: Dict[str, Any]) -> bytes:
    from mergekit_mergeability.plots import png

    rows = report["points"]
    lambdas = [r["lambda"] for r in rows]

    def draw(fig, ax):
        for stage, low, high in _boundaries(rows):
            ax.axvspan(
                low, high, color=STAGE_COLOURS[stage], alpha=0.35, lw=0, label=f"stage {stage} ({STAGE_NAMES[stage]})"
            )
        ax.plot(lambdas, [r["accuracy"] for r in rows], "o-", color="#1b5e20", label=f"accuracy ({report['metric']})")
        ax.plot(
            lambdas,
            [r["marker_rate"] for r in rows],
            "s--",
            color="#b71c1c",
            label=f"marker rate ({report['settings']['marker']})",
        )
        refined = [r for r in rows if r["refined"]]
        ax.plot(
            [r["lambda"] for r in refined],
            [r["marker_rate"] for r in refined],
            "s",
            mfc="white",
            color="#b71c1c",
            ls="none",
            label="refined λ",
        )
        spot = report["sweet_spot"]["lambda"]
        if spot is not None:
            ax.axvline(spot, color="black", ls=":", label=f"sweet spot λ = {spot:g}")
        ax.set_xlabel("λ  (θ = λ·B + (1 − λ)·A)")
        ax.set_ylabel("accuracy, marker rate")
        ax.set_ylim(-0.03, 1.03)
        tokens = ax.twinx()
        tokens.plot(lambdas, [r["tokens"] for r in rows], "^-", color="#0d47a1", label="tokens per answer")
        tokens.set_ylabel("tokens per answer")
        tokens.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
        more, more_labels = tokens.get_legend_handles_labels()
        ax.legend(handles + more, labels + more_labels, fontsize="small", loc="center left", bbox_to_anchor=(1.1, 0.5))

    names = labels(report)
    return png(draw, f"{names['a']} → {names['b']} on {report['lm_eval_task']}", width=10, height=4.5)


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
    return lines


def print_sweep(report: Dict[str, Any], out: Optional[Path] = None) -> None:
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
                _span(s["from"], s["to"]),
                _range(s["accuracy_range"]),
                _range(s["tokens_range"], 1),
                _range(s["marker_rate_range"]),
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


def _span(low: float, high: float) -> str:
    return f"{low:g}" if low == high else f"{low:g}–{high:g}"


def _range(values, digits: int = 2) -> str:
    low, high = values
    return (
        number(low, digits)
        if round(low, digits) == round(high, digits)
        else f"{number(low, digits)}–{number(high, digits)}"
    )


def render(report: Dict[str, Any], figure: bytes, config_text: Optional[str]) -> str:
    """``report.html``: one self-contained page (``figure`` embedded), in the precheck report's style."""
    from mergekit_mergeability.output.html import SORT_SCRIPT

    esc = html.escape
    settings, models, names = report["settings"], report["models"], labels(report)
    image = base64.b64encode(figure).decode("ascii")
    k = settings["samples"]
    heads = [
        "λ",
        "stage",
        f"Mean@{k}",
        *([f"Pass@{k}", f"Vote@{k}"] if k > 1 else []),
        "tokens",
        "marker rate",
        "accuracy per token",
        "refined",
    ]
    body = ""
    for r in report["points"]:
        cells = [
            r["lambda"],
            r["stage"],
            r["accuracy"],
            *([(r["pass_at"] or {}).get(str(k)), r["vote"]] if k > 1 else []),
            r["tokens"],
            r["marker_rate"],
            r["accuracy_per_token"],
        ]
        body += (
            "<tr>"
            + "".join(
                f'<td class="num" data-value="{"" if v is None else v}">{"–" if v is None else f"{v:.4g}"}</td>'
                for v in cells
            )
            + f"<td>{'yes' if r['refined'] else ''}</td></tr>"
        )
    stage_rows = "".join(
        f"<tr><td>{s['stage']} {STAGE_NAMES[s['stage']]}</td><td>{_span(s['from'], s['to'])}</td><td>{_range(s['accuracy_range'])}</td>"
        f"<td>{_range(s['tokens_range'], 1)}</td><td>{_range(s['marker_rate_range'])}</td></tr>"
        for s in report["stages"]["table"]
    )
    chosen = (
        f"<pre>{esc(config_text)}</pre>"
        if config_text
        else "<p>No <code>chosen.yml</code>: "
        + (
            "no sweet spot."
            if report["sweet_spot"]["lambda"] is None
            else "mergekit builds models from models, not from task vectors (<code>--save-chosen</code> writes the model)."
        )
        + "</p>"
    )
    restricted = (
        ", ".join(f"{k} {v}" for k, v in (("layers", settings["layers"]), ("modules", settings["modules"])) if v)
        or "every tensor"
    )
    sampled = f" at temperature {settings['temperature']:g}" if k > 1 else " (greedy)"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mergeability sweep: {esc(names["a"])} → {esc(names["b"])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1220px;margin:1.5em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}
th{{background:#f3f3f3;cursor:pointer;white-space:nowrap}}td.num{{text-align:right;font-variant-numeric:tabular-nums}}
img{{max-width:100%}}code{{word-break:break-all}}pre{{background:#f7f7f7;padding:.6em;overflow:auto;max-height:20em}}</style></head><body>
<h1>Interpolation sweep</h1>
<p>θ(λ) = λ·B + (1 − λ)·A with A <code title="{esc(models["a"]["path"])}">{esc(names["a"])}</code> and B
<code title="{esc(models["b"]["path"])}">{esc(names["b"])}</code>{' (task vectors of <code title="' + esc(models["base"]["path"]) + '">' + esc(names["base"]) + "</code>)" if report["task_vectors"] else ""},
built in memory with mergekit's <code>linear</code> on {report["tensors"]["interpolated"]} of the {report["tensors"]["differing"]} tensors where they differ ({esc(restricted)}).
Task <code>{esc(report["task"])}</code> (lm-eval <code>{esc(report["lm_eval_task"])}</code>, {esc(str(report["metric"]))}),
{k} answer{"s" if k > 1 else ""} per problem{sampled}; marker <code>{esc(settings["marker"])}</code>.</p>
<ul>{"".join(f"<li>{esc(line)}</li>" for line in sentences(report))}</ul>
<h2>Stages</h2>
<table><thead><tr><th>stage</th><th>λ</th><th>accuracy</th><th>tokens per answer</th><th>marker rate</th></tr></thead><tbody>{stage_rows or '<tr><td colspan="5">no transition</td></tr>'}</tbody></table>
<h2>Curves</h2><img alt="accuracy, tokens and marker rate against λ" src="data:image/png;base64,{image}">
<h2>Every λ</h2><p><small>Click a column to sort.</small></p>
<table class="sortable"><thead><tr>{"".join(f"<th>{esc(h)}</th>" for h in heads)}</tr></thead><tbody>{body}</tbody></table>
<h2>The chosen model</h2>{chosen}
<p><small>{esc(report["tool"]["name"])} {esc(report["tool"]["version"])}, schema {esc(report["schema_version"])}</small></p>
<script>{SORT_SCRIPT}</script>
</body></html>
"""
