"""Mergeability (Will it Merge?, arXiv 2601.06672): a model's own-task score after it is
merged with M partners drawn at random from a pool, averaged over N draws.

    S_i = mean_n score_i(merge({i} ∪ P_n)),   P_n ⊂ pool \\ {i}, |P_n| = M

Draws are seeded per (seed, model's position in the pool, trial), so a rerun, a
resumed run, or a run on another machine draws the same partners. Each finished
trial is appended to ``trials.jsonl`` and scores are cached by content, so an
interrupted run picks up where it stopped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths.stats import mean_interval


def partners(pool: List[str], model: str, count: int, trial: int, seed: int) -> List[str]:
    others = [m for m in pool if m != model]
    if count > len(others):
        raise UserError(f"--partners {count}: the pool has only {len(others)} other models for each one")
    # keyed by position in the pool, not by path: the same draws wherever the models live
    rng = random.Random(f"{seed}:{pool.index(model)}:{trial}")
    return rng.sample(others, count)


def summarise(scores: List[float], seed: int = 0, resamples: int = 2000) -> Dict[str, Any]:
    """Mean with a percentile bootstrap 95% interval over trials."""
    values = np.asarray(scores, dtype=float)
    mean, interval = mean_interval(values, seed, resamples)
    return {
        "mergeability": mean,
        "interval": list(interval),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
    }


class TrialLog:
    """``trials.jsonl``: one line per finished trial; read back to resume."""

    def __init__(self, path: Path, settings: Mapping[str, Any], own: Mapping[str, Any] = {}):
        """A finished trial is reused only under the same ``settings`` (every trial's) and
        ``own[model]`` (that model's trials only: how its own task is scored)."""
        self.path = Path(path)
        self.settings, self.own = dict(settings), own
        self.done: Dict[tuple, dict] = {}
        text = self.path.read_text(encoding="utf-8", errors="replace") if self.path.is_file() else ""
        self._torn = bool(text) and not text.endswith("\n")  # killed mid-write: the next row starts a fresh line
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a torn line: its trial simply runs again
                continue
            if isinstance(row, dict) and row.get("settings") == self.key(row.get("model")):
                self.done[row["model"], row["trial"]] = row

    def key(self, model: str) -> str:
        return json.dumps({**self.settings, "own": self.own.get(model)}, sort_keys=True, default=str)

    def get(self, model: str, trial: int) -> Optional[dict]:
        return self.done.get((model, trial))

    def add(self, row: dict) -> dict:
        row = {**row, "settings": self.key(row["model"])}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:  # one whole line per write
            handle.write("\n" * self._torn + json.dumps(row) + "\n")
        self._torn = False
        self.done[row["model"], row["trial"]] = row
        return row
