"""The HTML pages, each one self-contained file (plots embedded as PNG, a few lines of script to
sort a table) in one style (``PAGE_STYLE``): the precheck's ``report.html`` (``render``, from
precheck.json; models by short name, the full path on hover) and the sweep's (``sweep_page``)."""

from __future__ import annotations

import base64
import html
import math
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from mergekit_mergeability.decide.features import rehearsal
from mergekit_mergeability.names import shorten
from mergekit_mergeability.records import DilutionStats, KnowledgeStats, PairLayers, PairWeights, WeightStats
from mergekit_mergeability.output.terminal import (
    an_end,
    STAGE_NAMES,
    known,
    labels,
    lambda_span,
    legend,
    number,
    sentences,
    value_range,
)

PAGE_STYLE = "body{font-family:system-ui,sans-serif;max-width:1220px;margin:1.5em auto;padding:0 1em;color:#222}"
MAX_LINES = 8  # pairs drawn one line each; more are drawn as a band
ANNOTATED = 12  # heatmaps print their values up to this many models
VERDICT_COLOURS = {
    "merge_as_configured": "#2e7d32",
    "knowledge_weighted": "#ef6c00",
    "layer_selective": "#1565c0",
    "leave_out": "#8d6e63",
    "sign_election": "#6a1b9a",
    "method_by_rehearsal": "#1565c0",
    "do_not_merge": "#c62828",
}
COLUMNS = {  # header: what it means (the header's tooltip)
    "model": "the folder name; the full path on hover",
    "probe": "its probe set",
    "p(gold)": "the base's probability of the gold option, asked as the calibration reads knowledge (mean over the probe)",
    "accuracy": "the base's accuracy on the probe, likewise",
    "lettered": "p(gold) asked as Will it Merge? asks it: few-shot, options lettered",
    "at 1/9": "p(gold) on its own probe, as the task scores it, with a ninth of its update: the share a mean merge of 9 gives it",
    "rehearsal": "its own probe, as its task is scored (p(gold) where the options are listed, accuracy where cloze, the task's own metric, such as chrF, where it is an lm-eval task), on a rehearsal of the merge: a ninth of its update and the rest split among the config's other models (paper 1's expected partner; under 9 models, the merge as configured): the prediction, where measured",
    "‖τ‖": "update norm",
    "σ_max": "top singular value of the update",
    "cos(rest)": "cosine between this update and the sum of the others",
    "kept": "what the configured merge keeps of this update along its direction: 1 untouched, >1 reinforced, 0 cancelled",
    "predicted": "predicted mergeability: own-task score after merging (a pool: a mean merge with 8 random partners; a config of 2 to 8 models: the merge as written)",
    "why": "the two features that moved the prediction most",
}
SORT_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach((th, column) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const up = th.dataset.order !== 'up';
  th.parentNode.querySelectorAll('th').forEach(h => delete h.dataset.order);
  th.dataset.order = up ? 'up' : 'down';
  const key = row => { const text = row.cells[column].dataset.value ?? row.cells[column].textContent;
                       const n = parseFloat(text); return isNaN(n) ? text : n; };
  [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1); }).forEach(row => body.appendChild(row));
}));
"""


def render(report: Dict[str, Any]) -> str:
    rec = report["recommendation"]
    esc = html.escape
    names = {m["path"]: m["name"] for m in report["models"]}
    plots = (
        _cka_plot(report, names),
        _specific_plot(report),
        _overlap_plot(report, names),
        _knowledge_plot(report),
        _cosine_plot(report, names),
    )
    figures = [f for f in plots if f]
    layers = report["layers"]
    decided = (
        f"<p><small>Layer cut-off set by: {esc(layers['decided_by'])} (--cutoff-signal {esc(layers['cutoff_signal'])}).</small></p>"
        if layers.get("decided_by")
        else ""
    )
    rows = "".join(_model_row(m, report) for m in report["models"] if m["role"] == "expert")
    findings = "".join(
        f"<li class='{esc(f['severity'])}'><b>{esc(f['severity'])}</b> {esc(shorten(f['message'], names))}</li>"
        for f in report["findings"]
    )
    places = "".join(
        f"<li><code>{esc(folder)}</code>: {esc(', '.join(members))}</li>"
        for folder, members in legend(report["models"]).items()
    )
    advice = "".join(
        f"<li><code>{esc(a['file'])}</code>{' (for ' + esc(names.get(a['expert'], a['expert'])) + ')' if a['expert'] else ''}: "
        f"<b>keeps</b> {esc(a['keeps'])}; <b>drops</b> {esc(a['drops'])}"
        + "".join(f"<br><small>{esc(n)}</small>" for n in a["notes"])
        + "</li>"
        for a in rec["models"]
    )
    if not advice:
        advice = "<li>No recommended config: the verdict is <b>do_not_merge</b>, for the reasons above.</li>"
    calibration = report.get("calibration") or {}
    stop = "".join(f"<li>{esc(r)}</li>" for r in report["stop"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mergeability precheck: {esc(report["config"])}</title>
<style>{PAGE_STYLE}
table{{border-collapse:collapse;font-size:13px;width:100%}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}}
th{{background:#f3f3f3;cursor:pointer;white-space:nowrap}}th[data-order=up]::after{{content:" ▲"}}th[data-order=down]::after{{content:" ▼"}}
td.num{{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}}td.name{{white-space:nowrap;max-width:13em;overflow:hidden;text-overflow:ellipsis}}td.why{{min-width:15em}}span.ood{{color:#a60;font-size:small}}li.info{{color:#777}}li.error b{{color:#b00}}li.warning b{{color:#a60}}
.verdict{{color:white;background:{VERDICT_COLOURS.get(rec["verdict"], "#555")};padding:.2em .7em;border-radius:4px}}
img{{max-width:100%}}code{{overflow-wrap:anywhere}}small{{color:#555}}</style></head><body>
<h1>Mergeability precheck</h1>
<p>{"Pool folder" if Path(report["config"]).is_dir() else "Config"} <code>{esc(report["config"])}</code>, method <code>{esc(report["merge_method"])}</code>,
base <code>{esc(str(report["base_model"]))}</code>.</p>
<h2>Verdict: <span class="verdict">{esc(rec["verdict"])}</span></h2>
<ul>{"".join(f"<li>{esc(r)}</li>" for r in rec["reasons"])}</ul>
{decided}
{f"<p><b>Stop:</b></p><ul>{stop}</ul>" if stop else ""}
<h2>Recommended models</h2>
<ul>{advice}</ul>
{_menu_table(rec.get("method_choice"), names, report["models"], rec.get("search") or [])}
{_landscape_plot(rec) or ""}
<h2>Models</h2>
<p><small>Click a column to sort. Predicted mergeability: the expected own-task score after merging (a pool: with 8 random partners; a config of 2 to 8 models: in the merge as written),
{"the rehearsal where it was measured, else " if calibration.get("reads_first") else ""}{_calibration_name(calibration.get("path"))}'s fit on knowledge and weights ({esc(str(calibration.get("fitted_on_models")))} measured experts;
leave-one-out Spearman {number(calibration.get("leave_one_out_spearman"))}); capped by the share of its update the merge keeps.</small></p>
<table class="sortable"><thead><tr>{"".join(f'<th title="{esc(t)}">{esc(c)}</th>' for c, t in COLUMNS.items())}</tr></thead><tbody>{rows}</tbody></table>
<ul><small>{places}</small></ul>
{"".join(figures)}
<h2>Findings</h2><ul>{findings or "<li>none</li>"}</ul>
<p><small>{esc(report["tool"]["name"])} {esc(report["tool"]["version"])}, schema {esc(report["schema_version"])}</small></p>
<script>{SORT_SCRIPT}</script>
</body></html>
"""


def _calibration_name(path: Optional[str]) -> str:
    """The shipped calibration by that name (its path is inside whichever install wrote the report),
    any other by its path."""
    from pathlib import Path

    from mergekit_mergeability.decide.calibration import DEFAULT

    if path and Path(path).parts[-3:] == DEFAULT.parts[-3:]:
        return "the shipped calibration"
    return f"the calibration <code>{html.escape(str(path))}</code>"


def _menu_table(
    choice: Optional[Dict[str, Any]],
    names: Dict[str, str],
    described: List[Dict[str, Any]] = (),
    search: List[Dict[str, Any]] = (),
) -> str:
    """The config as written, the menu and the knob grid, each rehearsed: what each model kept on
    its own probe, on each half of it and on all of it, item by item; where a model's task is scored
    by its own metric (the Models table's rehearsal column), the two reads of the config as written
    side by side."""
    if not choice:
        return ""
    esc = html.escape
    models = list(choice["per_model"]["as_written"])
    order = sorted(choice["kept"], key=lambda c: -choice["kept"][c])
    head = "".join(f"<th>{esc(names.get(m, m))}</th>" for m in models)

    def cell(value: float) -> str:
        return f"<td class='num'>{value:.3f}</td>"

    lambdas = {  # a method that normalises its weights, rehearsed at the update size the config gives
        c["name"]: c["lambda"]
        for c in search
        if c.get("method") != "task_arithmetic" and c.get("lambda") not in (None, 1, 1.0)
    }

    def label(c: str) -> str:
        return c.replace("_", " ") + (f" (λ {lambdas[c]:g})" if c in lambdas else "")

    rows = "".join(
        f"<tr><td>{'<b>' if c == choice['chosen'] else ''}{esc(label(c))}{'</b>' if c == choice['chosen'] else ''}</td>"
        + cell(choice["kept"][c])
        + "".join(cell(half) for half in choice["halves"][c])
        + "".join(cell(choice["per_model"][c][m]) for m in models)
        + "</tr>"
        for c in order
    )
    low, high = choice["gain_interval"]
    picks = " and ".join(f"half {h}: {esc(p.replace('_', ' '))}" for h, p in zip("AB", choice["picked"]))
    patched = choice.get("baseline") == "layer patch"  # else the config as written (older reports: no key)
    baseline = "the layer patch" if patched else "the config as written"
    written = choice.get("baseline", "as_written")
    stays = choice["chosen"] == written
    note = (
        f"Each half of every probe picked {baseline} itself, so it stays; chosen in bold."
        if set(choice["picked"]) == {written}
        else f"Each half of every probe picked a merge ({picks}); read on the other half, the picks keep "
        f"{choice['gain']:+.3f} over {baseline} (95% {low:+.3f} to {high:+.3f}), so "
        + (f"{baseline} stays" if stays else "the best over all items is recommended")
        + "; chosen in bold."
    )
    if patched:
        note += " The layer patch: each model's probe on its own patched model (one model per expert)."
    if lambdas:
        note += (
            " A merge marked λ keeps the update size the config as written gives (its weights' sum):"
            " mergekit's default for it is λ 1, which was not rehearsed."
        )
    if choice.get("items_to_separate"):
        note += (
            f" The probes cannot tell {esc(choice['best'].replace('_', ' '))} from {esc(choice['runner_up'].replace('_', ' '))}:"
            f" about {choice['items_to_separate']} items per probe would."
        )
    return (
        "<h2>The merge to write, by rehearsal</h2><p><small>Each merge built in memory as its config would be written, "
        "every model's own probe asked on it, read item by item: p(gold) where the options are listed, "
        "accuracy where cloze, and where the answer is generated, the reference's p(gold) per token "
        "(chrF and BLEU score a whole corpus, not an item). "
        + note
        + _two_reads(choice, names, described)
        + "</small></p>"
        f"<table class='sortable'><thead><tr><th>merge</th><th>mean kept</th><th>half A</th><th>half B</th>{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


def _two_reads(choice: Dict[str, Any], names: Dict[str, str], models: List[Dict[str, Any]]) -> str:
    """Where the Models table reads a model's rehearsal with its task's own metric, a sentence that
    sets it beside this table's item-by-item read of the same merge, so that the two numbers for
    the config as written are not taken for a disagreement."""
    written = choice["per_model"]["as_written"]
    read = [(m, DilutionStats.of(m.get("dilution")), rehearsal(m)) for m in models if m["path"] in written]
    both = [
        (names.get(m["path"], m["path"]), d.task_metric, task, written[m["path"]])
        for m, d, task in read
        if d.rehearsed == "written" and d.task_metric and task is not None
    ]
    if not both:
        return ""
    return (
        " The Models table reads the config as written with each task's own metric: "
        + "; ".join(
            f"{html.escape(name)} {metric} {task:.2f} there, {item:.3f} here" for name, metric, task, item in both
        )
        + "."
    )


def _landscape_plot(rec: Dict[str, Any]) -> Optional[str]:
    """What the rehearsed merges keep against their update scale (left) and their density (right),
    one line per method, one expert's update doubled as crosses, the config as written dashed, the
    layer patch dotted where it was rehearsed, and the recommended merge starred."""
    search, choice = rec.get("search"), rec.get("method_choice")
    if not search or len(search) < 3:
        return None
    menu_density = next((c["density"] for c in search if c["name"] == "ties"), None)
    scales: Dict[str, List[Tuple[float, float]]] = {}
    densities: Dict[str, List[Tuple[float, float]]] = {}
    boosted = [c["kept"] for c in search if c.get("line", "").startswith("mean, ")]
    for c in search:
        if c.get("scale") is None or c["line"].startswith("mean, "):
            continue
        if c["density"] in (None, menu_density):
            scales.setdefault(c["line"], []).append((c["scale"], c["kept"]))
        if c["density"] is not None and c["scale"] == 1.0:
            densities.setdefault(c["method"], []).append((c["density"], c["kept"]))
    patch = next((c for c in search if c.get("method") == "layer_selective"), None)
    chosen = next(c for c in search if c["name"] == choice["chosen"])
    on_density = chosen["density"] not in (None, menu_density)

    colours: Dict[str, str] = {}

    def draw(fig, ax):
        ax.set_subplotspec(fig.add_gridspec(1, 2)[0])
        right = fig.add_subplot(1, 2, 2, sharey=ax)
        for panel, curves, label in (
            (ax, scales, "update scale (1: as the menu writes it)"),
            (right, densities, "density"),
        ):
            for name, points in curves.items():  # a method's line has one colour in both panels
                points.sort()
                colour = colours.setdefault(name, f"C{len(colours)}")
                panel.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name, color=colour)
            panel.axhline(choice["kept"]["as_written"], color="grey", linestyle="--", label="the config as written")
            if patch is not None:  # one model per expert: no scale, no density
                named = f"layer patch at block {patch['cutoff']}, each expert its own model"
                panel.axhline(patch["kept"], color="black", linestyle=":", label=named)
            panel.set_xlabel(label)
        if boosted:
            ax.plot([1.0] * len(boosted), boosted, "x", color="grey", label="mean, one expert ×2")
        x = chosen["density"] if on_density else chosen.get("scale") or 1.0
        (right if on_density else ax).plot(  # hollow: the candidate's own point shows through it
            [x], [chosen["kept"]], "*", markersize=18, markerfacecolor="none", markeredgecolor="black",
            markeredgewidth=1.5, zorder=3, label="recommended",
        )  # fmt: skip
        ax.set_ylabel("mean kept on own probes")
        # one legend for both panels, below them: inside, it hid the star where it sat high
        shown = {label: handle for panel in (ax, right) for handle, label in zip(*panel.get_legend_handles_labels())}
        fig.set_layout_engine("constrained")
        fig.legend(shown.values(), shown.keys(), loc="outside lower center", ncol=4, fontsize="small")

    return _figure(draw, "What each rehearsed merge keeps", width=10, height=5)


def _model_row(model: Dict[str, Any], report: Dict[str, Any]) -> str:
    esc = html.escape
    k, w = KnowledgeStats.of(model["knowledge"]), WeightStats.of(model["weights"])
    p_gold, accuracy = known(model, report)
    probe = model["probe"] or "–"
    cells = [
        f'<td class="name" title="{esc(model["path"])}">{esc(model["name"])}</td>',
        f'<td class="name" title="{esc(probe)}">{esc(probe.rstrip("/").split("/")[-1])}</td>',
    ]
    for value, digits in (
        (p_gold, 2),
        (accuracy, 2),
        (k.mean_p_gold, 2),
        (DilutionStats.of(model.get("dilution")).diluted_mean_p_gold, 2),
        (rehearsal(model), 2),
        (w.update_norm, 3),
        (w.top_singular_value, 3),
        (w.pool_cosine, 2),
        (model.get("kept_share"), 2),
        (model["predicted_mergeability"], 2),
    ):
        cells.append(f'<td class="num" data-value="{"" if value is None else value}">{number(value, digits)}</td>')
    outside = model.get("out_of_domain") or []
    if outside:  # beside the prediction: outside what the calibration was fitted on
        cells[-1] = cells[-1].replace(
            "</td>", f' <span class="ood" title="{esc("; ".join(outside))}">outside domain</span></td>'
        )
    why = model["reasons"] + ([f"outside the calibration's domain: {', '.join(outside)}"] if outside else [])
    cells.append(f'<td class="why">{esc("; ".join(why))}</td>')
    return "<tr>" + "".join(cells) + "</tr>"


def _layer_axis(ax, label: str) -> None:
    """A layer or block axis: labelled, ticked at whole numbers only (a 4-layer model has no block 1.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _figure(draw, title: str, width: float = 8, height: float = 4) -> str:
    from mergekit_mergeability.output.plots import png

    encoded = base64.b64encode(png(draw, title, width, height)).decode("ascii")
    return f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{encoded}">'


def _cka_plot(report, names) -> Optional[str]:
    pairs = [p for p in map(PairLayers.of, report["pairs"]) if p.cka_unbiased]
    if not pairs:
        return None
    layers = report["layers"]

    def draw(fig, ax):
        _lines(ax, _pair_curves(report["pairs"], names, lambda p: p.cka_unbiased), "pairs")
        level = layers.get("cka_effective_threshold") or layers["cka_threshold"]
        drop = f" (shared level − {layers['cka_relative_drop']:g})" if level > layers["cka_threshold"] else ""
        ax.axhline(level, color="grey", linestyle="--", label=f"threshold {level:.2f}{drop}")
        if layers["cutoff"] is not None:
            ax.axvline(layers["cutoff"] + 0.5, color="red", linestyle=":", label=f"cut-off {layers['cutoff']}")
        _layer_axis(ax, "layer (0 = embeddings, i = output of block i−1)")
        ax.set_ylabel("unbiased CKA (answer span)")
        lowest = min([level, *(v for p in pairs for v in p.cka_unbiased if v is not None)])
        ax.set_ylim(max(lowest - 0.05, -0.05), 1.01)
        ax.legend(fontsize="small")

    return _figure(draw, "Representation similarity per layer")


def _pair_curves(pairs, names, metric: Callable[[PairLayers], Optional[List]]) -> Dict[str, List[float]]:
    """Per pair of precheck.json's ``pairs`` where ``metric`` (of its layers) was measured: its curve."""
    return {
        f"{names.get(p['a'], p['a'])} vs {names.get(p['b'], p['b'])}": [math.nan if v is None else v for v in values]
        for p in pairs
        for values in [metric(PairLayers.of(p))]
        if values
    }


def _lines(ax, curves: Dict[str, List[float]], what: str) -> None:
    """A line per curve; for many, their spread (min–max band and median), not a line each."""
    import numpy as np

    if len(curves) <= MAX_LINES:
        for label, values in curves.items():
            ax.plot(range(len(values)), values, marker=".", label=label)
        return
    stacked = np.array(list(curves.values()))
    x = range(stacked.shape[1])
    with warnings.catch_warnings():  # a layer no curve has a value for (nothing to compare there) stays a gap
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high, middle = np.nanmin(stacked, 0), np.nanmax(stacked, 0), np.nanmedian(stacked, 0)
    ax.fill_between(x, low, high, alpha=0.3, label=f"min–max over {len(curves)} {what}")
    ax.plot(x, middle, marker=".", label=f"median of the {what}")


def _specific_plot(report) -> Optional[str]:
    models = [m for m in report["models"] if any(any(counts) for counts in (m.get("specific_neurons") or {}).values())]
    if not models:  # no specific neuron anywhere: a finding says so, a flat line would not
        return None
    span = report["layers"]["selectivity"]["span"]

    def draw(fig, ax):
        curves = {
            f"{m['name']}, group {group}": counts for m in models for group, counts in m["specific_neurons"].items()
        }
        if len(curves) > MAX_LINES:  # many models: one line per model, its groups summed
            curves = {m["name"]: [sum(c) for c in zip(*m["specific_neurons"].values())] for m in models}
        _lines(ax, curves, "models")
        _layer_axis(ax, "decoder block")
        ax.set_ylabel(f"group-specific MLP neurons ({span} span)")
        ax.legend(fontsize="small")

    return _figure(draw, "Group-specific neurons per block (LAPE)")


def _overlap_plot(report, names) -> Optional[str]:
    pairs = [p for p in report["pairs"] if any(v is not None for v in PairLayers.of(p).specific_overlap or ())]
    if not pairs:
        return None
    selectivity = report["layers"]["selectivity"]

    def draw(fig, ax):
        _lines(ax, _pair_curves(pairs, names, lambda p: p.specific_overlap), "pairs")
        blocks = sorted({b for c in selectivity["collisions"] for b in c["blocks"]})
        for i, block in enumerate(blocks):
            ax.axvline(block, color="red", linestyle=":", label="experts' specific neurons collide" if i == 0 else None)
        if report["layers"]["cutoff_signal"] != "cka":
            ax.axhline(selectivity["overlap_threshold"], color="grey", linestyle="--", label="threshold")
            if selectivity["cutoff"] is not None:
                ax.axvline(
                    selectivity["cutoff"] - 0.5,
                    color="purple",
                    linestyle="-.",
                    label=f"overlap cut-off {selectivity['cutoff']}",
                )
        _layer_axis(ax, "decoder block")
        ax.set_ylabel("Jaccard overlap of specific neurons")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize="small")

    return _figure(draw, "Specific-neuron overlap per block")


def _knowledge_plot(report) -> Optional[str]:
    experts = [m for m in report["models"] if m["role"] == "expert"]
    if not any(m["knowledge"] or m["predicted_mergeability"] is not None for m in experts):
        return None
    experts.sort(key=lambda m: (m["predicted_mergeability"] is None, m["predicted_mergeability"] or 0))

    def draw(fig, ax):
        import numpy as np

        y = range(len(experts))
        p_gold = [known(m, report)[0] or 0 for m in experts]
        predicted = [m["predicted_mergeability"] or 0 for m in experts]
        ax.barh([i + 0.2 for i in y], p_gold, height=0.4, label="base p(gold) on its probes")
        # where the prediction is the rehearsal: the range its probe's items alone leave (95%)
        ranges = np.array([m.get("predicted_interval") or (v, v) for v, m in zip(predicted, experts)])
        ax.barh(
            [i - 0.2 for i in y], predicted, height=0.4, xerr=np.abs(ranges.T - predicted), capsize=3,
            label="predicted mergeability (± its probe's items)",
        )  # fmt: skip
        ax.set_yticks(list(y), [m["name"] for m in experts], fontsize=_fontsize(len(experts)))
        ax.set_xlim(0, 1)
        ax.axvline(0.5, color="grey", linestyle=":")
        ax.legend(
            fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2
        )  # below the axes: never over a bar

    return _figure(
        draw, "Base-model knowledge and predicted mergeability", width=8, height=max(3, 0.22 * len(experts) + 1.2)
    )


def _cosine_plot(report, names) -> Optional[str]:
    pairs = [p for p in report["pairs"] if PairWeights.of(p).cosine is not None]
    if not pairs:
        return None
    members = list(dict.fromkeys([p["a"] for p in pairs] + [p["b"] for p in pairs]))
    size = min(12, max(5, 0.2 * len(members) + 3))

    def draw(fig, ax):
        import numpy as np

        grid = np.full((len(members), len(members)), np.nan)
        for p in pairs:
            i, j = members.index(p["a"]), members.index(p["b"])
            grid[i, j] = grid[j, i] = PairWeights.of(p).cosine
        image = ax.imshow(grid, vmin=-1, vmax=1, cmap="RdBu")
        if len(members) <= ANNOTATED:
            for (i, j), value in np.ndenumerate(grid):
                if not np.isnan(value):
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize="small")
        labels = [names.get(n, n) for n in members]
        ax.set_xticks(range(len(members)), labels, rotation=90, fontsize=_fontsize(len(members)))
        ax.set_yticks(range(len(members)), labels, fontsize=_fontsize(len(members)))
        fig.colorbar(image, ax=ax, label="task-vector cosine (−1: they cancel)", shrink=0.8)

    return _figure(draw, "Interference: cosine between task vectors", width=size + 1.5, height=size)


def _fontsize(count: int) -> float:
    return 9 if count <= 20 else max(5, 9 - (count - 20) / 10)


def sweep_page(report: Dict[str, Any], figure: bytes, config_text: Optional[str]) -> str:
    """A sweep's ``report.html``: one self-contained page (``figure`` embedded), in the precheck report's style."""
    esc = html.escape
    settings, models, names = report["settings"], report["models"], labels(report)
    image = base64.b64encode(figure).decode("ascii")
    k = settings["samples"]
    heads = [
        "λ",
        "stage",
        f"accuracy (Mean@{k})",
        *([f"Pass@{k}", f"Vote@{k}"] if k > 1 else []),
        "tokens",
        "marker rate",
        "accuracy per token",
        "refined",
    ]
    body = ""
    shown = ["g", "d", ".3f", *([".3f", ".3f"] if k > 1 else []), ".1f", ".2f", ".4f"]  # each column's format
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
                f'<td class="num" data-value="{"" if v is None else v}">{"–" if v is None else format(v, f)}</td>'
                for v, f in zip(cells, shown)
            )
            + f"<td>{'yes' if r['refined'] else ''}</td></tr>"
        )
    stage_rows = "".join(
        f"<tr><td>{s['stage']} {STAGE_NAMES[s['stage']]}</td><td>{lambda_span(s['from'], s['to'])}</td><td>{value_range(s['accuracy_range'])}</td>"
        f"<td>{value_range(s['tokens_range'], 1)}</td><td>{value_range(s['marker_rate_range'])}</td></tr>"
        for s in report["stages"]["table"]
    )
    chosen = (
        f"<pre>{esc(config_text)}</pre>"
        if config_text
        else "<p>No <code>chosen.yml</code>: "
        + (
            "no sweet spot."
            if report["sweet_spot"]["lambda"] is None
            else "the sweet spot is one of the two models itself, with nothing to merge."
            if an_end(report)
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
<style>{PAGE_STYLE}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}
th{{background:#f3f3f3;cursor:pointer;white-space:nowrap}}td.num{{text-align:right;font-variant-numeric:tabular-nums}}
img{{max-width:100%}}code{{overflow-wrap:anywhere}}pre{{background:#f7f7f7;padding:.6em;overflow:auto;max-height:20em}}</style></head><body>
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
