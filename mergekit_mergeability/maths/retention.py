"""What a merge kept of a fine-tune's own-task score.

    retention        = merged / expert
    normalised gain  = (merged − base) / (expert − base)      1: all the fine-tune's gain kept, 0: none
Retention is None where the expert scores 0; the normalised gain where the expert is not above
the base by ``eps``: it has no gain to keep, and a ratio there is noise, or, below the base, reads
a merge that falls with the expert as a gain kept (base 0.12, expert 0, merged 0: 1.0).
"""

from __future__ import annotations

from typing import Optional

EPS = 1e-6


def retention(merged: float, expert: float, eps: float = EPS) -> Optional[float]:
    return merged / expert if abs(expert) >= eps else None


def normalised_gain(merged: float, expert: float, base: float, eps: float = EPS) -> Optional[float]:
    gain = expert - base
    return (merged - base) / gain if gain >= eps else None
