"""Matplotlib figures rendered off-screen to PNG bytes (no display needed)."""

from __future__ import annotations

import io
from typing import Callable


def png(draw: Callable, title: str, width: float = 8, height: float = 4) -> bytes:
    """``draw(fig, ax)`` on a fresh figure; returns the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    try:
        draw(fig, ax)
        ax.set_title(title)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buffer.getvalue()
