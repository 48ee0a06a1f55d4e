"""``report.html``: one self-contained page (plots embedded as PNG) from ``precheck.json``."""

from __future__ import annotations

import base64
import html
from typing import Any, Dict, List, Optional

from mergekit_mergeability.summary import number

MAX_LINES = 8  # pairs drawn one line each; more are drawn as a band
VERDICT_COLOURS = {"merge_as_configured": "#2e7d32", "knowledge_weighted": "#ef6c00", "layer_selective": "#1565c0", "do_not_merge": "#c62828"}


def render(report: Dict[str, Any]) -> str:
    rec = report["recommendation"]
    figures = [f for f in (_cka_plot(report), _knowledge_plot(report), _conflict_plot(report)) if f]
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in _model_row(m)) + "</tr>" for m in report["models"]
    )
    findings = "".join(f"<li><b>{html.escape(f['severity'])}</b> {html.escape(f['message'])}</li>" for f in report["findings"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mergeability precheck: {html.escape(report['config'])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
.verdict{{color:white;background:{VERDICT_COLOURS.get(rec['verdict'], '#555')};padding:.3em .8em;border-radius:4px}}
img{{max-width:100%}}</style></head><body>
<h1>Mergeability precheck</h1>
<p>Config <code>{html.escape(report['config'])}</code>, method <code>{html.escape(report['merge_method'])}</code>,
base <code>{html.escape(str(report['base_model']))}</code>.</p>
<h2>Verdict: <span class="verdict">{html.escape(rec['verdict'])}</span></h2>
<ul>{''.join(f'<li>{html.escape(r)}</li>' for r in rec['reasons'])}</ul>
<p>Recommended method <code>{html.escape(str(rec['method']))}</code>, cut-off {html.escape(str(rec['cutoff']))};
ready-to-run config: <code>recommended.yml</code>.</p>
<h2>Models</h2>
<table><tr><th>model</th><th>probe</th><th>base accuracy</th><th>mean gap</th><th>update norm</th><th>predicted mergeability</th><th>why</th></tr>{rows}</table>
{''.join(figures)}
<h2>Findings</h2><ul>{findings or '<li>none</li>'}</ul>
<p><small>{html.escape(report['tool']['name'])} {html.escape(report['tool']['version'])}, schema {html.escape(report['schema_version'])}</small></p>
</body></html>
"""


def _model_row(model: Dict[str, Any]) -> List[str]:
    k, w = model["knowledge"] or {}, model["weights"] or {}
    return [
        model["path"] + (" (base)" if model["role"] == "base" else ""),
        model["probe"] or "–",
        number(k.get("accuracy"), 3),
        number(k.get("mean_gap"), 3),
        number(w.get("update_norm"), 3),
        number(model["predicted_mergeability"], 3),
        "; ".join(model["reasons"]),
    ]


def _figure(draw, title: str, width: float = 8, height: float = 4) -> str:
    from mergekit_mergeability.plots import png

    encoded = base64.b64encode(png(draw, title, width, height)).decode("ascii")
    return f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{encoded}">'


def _cka_plot(report) -> Optional[str]:
    pairs = [p for p in report["pairs"] if p.get("cka")]
    if not pairs:
        return None
    layers = report["layers"]

    def draw(fig, ax):
        import numpy as np

        curves = {f"{_short(p['a'])} vs {_short(p['b'])}": [np.nan if v is None else v for v in p["cka"]] for p in pairs}
        if len(curves) <= MAX_LINES:
            for label, values in curves.items():
                ax.plot(range(len(values)), values, marker=".", label=label)
        else:  # a large pool: the spread over pairs, not a line each
            stacked = np.array(list(curves.values()))
            x = range(stacked.shape[1])
            ax.fill_between(x, np.nanmin(stacked, 0), np.nanmax(stacked, 0), alpha=0.3, label=f"min–max over {len(curves)} pairs")
            ax.plot(x, np.nanmedian(stacked, 0), marker=".", label="median pair")
        ax.axhline(layers["cka_threshold"], color="grey", linestyle="--", label="threshold")
        if layers["cutoff"] is not None:
            ax.axvline(layers["cutoff"] + 0.5, color="red", linestyle=":", label=f"cut-off {layers['cutoff']}")
        ax.set_xlabel("layer (0 = embeddings, i = output of block i−1)")
        ax.set_ylabel("linear CKA (answer span)")
        lowest = min([layers["cka_threshold"], *(v for p in pairs for v in p["cka"] if v is not None)])
        ax.set_ylim(max(lowest - 0.05, -0.05), 1.01)
        ax.legend(fontsize="small")

    return _figure(draw, "Representation similarity per layer")


def _knowledge_plot(report) -> Optional[str]:
    experts = [m for m in report["models"] if m["role"] == "expert"]
    if not any(m["knowledge"] or m["predicted_mergeability"] is not None for m in experts):
        return None

    def draw(fig, ax):
        x = range(len(experts))
        accuracy = [(m["knowledge"] or {}).get("accuracy") or 0 for m in experts]
        predicted = [m["predicted_mergeability"] or 0 for m in experts]
        ax.bar([i - 0.2 for i in x], accuracy, width=0.4, label="base accuracy on probes")
        ax.bar([i + 0.2 for i in x], predicted, width=0.4, label="predicted mergeability")
        ax.set_xticks(list(x), [_short(m["path"]) for m in experts], rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.legend(fontsize="small")

    return _figure(draw, "Base-model knowledge and predicted mergeability")


def _conflict_plot(report) -> Optional[str]:
    pairs = [p for p in report["pairs"] if p.get("sign_conflict") is not None]
    if not pairs:
        return None
    names = list(dict.fromkeys([p["a"] for p in pairs] + [p["b"] for p in pairs]))

    def draw(fig, ax):
        import numpy as np

        grid = np.full((len(names), len(names)), np.nan)
        for p in pairs:
            i, j = names.index(p["a"]), names.index(p["b"])
            grid[i, j] = grid[j, i] = p["sign_conflict"]
        image = ax.imshow(grid, vmin=0, vmax=0.6, cmap="Reds")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize="small")
        ax.set_xticks(range(len(names)), [_short(n) for n in names], rotation=30, ha="right")
        ax.set_yticks(range(len(names)), [_short(n) for n in names])
        fig.colorbar(image, ax=ax, label="sign-conflict rate (0.5 = unrelated)")

    return _figure(draw, "Task-vector sign conflicts between models", width=6, height=5)


def _short(path: str) -> str:
    return path.rstrip("/").split("/")[-1]
