"""What a merge kept of a fine-tune's own-task score.

    retention        = merged / expert
    normalised gain  = (merged − base) / (expert − base)      1: all the fine-tune's gain kept, 0: none
Both are None where the denominator vanishes (|denominator| < ``eps``): an expert
no better than the base has no gain to keep, and a ratio there is noise.
"""

from __future__ import annotations

from typing import Optional

EPS = 1e-6


def retention(merged: float, expert: float, eps: float = EPS) -> Optional[float]:
    return merged / expert if abs(expert) >= eps else None


def normalised_gain(merged: float, expert: float, base: float, eps: float = EPS) -> Optional[float]:
    gain = expert - base
    return (merged - base) / gain if abs(gain) >= eps else None
