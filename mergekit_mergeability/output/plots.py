"""Matplotlib figures rendered off-screen to PNG bytes (no display needed)."""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, List

from mergekit_mergeability.output.terminal import STAGE_NAMES, labels


def png(draw: Callable, title: str, width: float = 8, height: float = 4) -> bytes:
    """``draw(fig, ax)`` on a fresh figure; returns the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    try:
        draw(fig, ax)
        ax.set_title(title)
        if fig.get_layout_engine() is None:  # a draw may set its own (constrained, for a legend outside)
            fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buffer.getvalue()


STAGE_COLOURS = {1: "#90caf9", 2: "#ffcc80", 3: "#a5d6a7"}  # a sweep's stages


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


def sweep_plot(report: Dict[str, Any]) -> bytes:
    """``sweep.png``: accuracy, marker rate and tokens per answer against λ, the stages shaded."""
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
