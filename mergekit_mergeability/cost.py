"""What the precheck's heavy passes will cost, said before they run (and all ``--dry-run`` does).

Each diagnostic that runs the model says how many forward passes it will make (``passes(inputs,
tokenizer)``: probe sequences, or windows of the shipped text where its ``unit`` says so); a
third party's diagnostic without ``passes`` is left out of the sum, and the line says so. One batch
of each kind (the precheck's batch size) is timed on the base here, on the precheck's device, so
the time is this machine's: rough, as the models' loads and the probes' own lengths are not in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

LINE, WINDOW = "line", "window"


@dataclass(frozen=True)
class Cost:
    passes: Dict[str, int]  # diagnostic -> forward passes
    units: Dict[str, str]  # diagnostic -> LINE or WINDOW
    seconds: Dict[str, float] = field(default_factory=dict)  # unit -> one pass, timed here in a batch
    uncounted: List[str] = field(default_factory=list)  # diagnostics that do not say their passes
    device: str = "cpu"
    notes: List[str] = field(default_factory=list)  # what a count is made of, where it is not plain

    @property
    def total(self) -> int:
        return sum(self.passes.values())

    @property
    def estimate(self) -> Optional[float]:
        """Seconds for every counted pass, at the timed pace (None: nothing timed)."""
        if not self.seconds:
            return None
        return sum(n * self.seconds.get(self.units[name], 0.0) for name, n in self.passes.items())

    def line(self) -> str:
        counted = ", ".join(f"{name} {n:,}" for name, n in self.passes.items() if n)
        said = f"precheck: about {self.total:,} forward passes" + (f" ({counted})" if counted else "")
        if self.estimate is not None and self.total:
            said += f"; roughly {duration(self.estimate)} on {self.device} at the pace of one timed batch"
        if self.uncounted:
            said += f"; not counted: {', '.join(self.uncounted)}"
        return "; ".join([said, *self.notes])


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate(inputs, diagnostics, menu_passes: int = 0, notes: List[str] = []) -> Cost:
    """The cost of ``diagnostics`` (those that will run) and the menu's rehearsal on ``inputs``."""
    tokenizer, module = None, None
    if inputs.base is not None:
        from mergekit_mergeability.sources import load_causal_lm

        settings = inputs.settings
        module, tokenizer = load_causal_lm(inputs.base.path, settings.device, inputs.base.load_dtype(settings))
    passes, units, uncounted = {}, {}, []
    for diagnostic in diagnostics:
        counter = getattr(diagnostic, "passes", None)
        if counter is None:
            uncounted.append(diagnostic.name)
            continue
        units[diagnostic.name] = getattr(diagnostic, "unit", LINE)
        passes[diagnostic.name] = (
            counter(inputs, tokenizer) if tokenizer is not None or units[diagnostic.name] == LINE else 0
        )
    if menu_passes:
        passes["menu"], units["menu"] = menu_passes, LINE
    seconds = _timed(module, tokenizer, inputs, set(u for d, u in units.items() if passes[d])) if module else {}
    device = str(module.device) if module is not None else inputs.settings.device
    return Cost(passes, units, seconds, uncounted, device, list(notes))


def _timed(module, tokenizer, inputs, kinds) -> Dict[str, float]:
    """Seconds per forward pass of each kind on the base, from one batch of the precheck's batch size
    (the faster of two runs): the first probe line (prompt and gold), a window of the shipped text."""
    import torch

    from mergekit_mergeability.diagnostics.fluency import TEXT, windows
    from mergekit_mergeability.resources import shipped

    first = next((i for m in inputs.models for i in (m.probes or ())), None)
    ids = {}
    if LINE in kinds and first is not None:
        ids[LINE] = tokenizer(first.prompt + first.gold, return_tensors="pt")["input_ids"]
    if WINDOW in kinds:
        ids[WINDOW] = windows(tokenizer, shipped(TEXT).read_text())[:1]
    seconds, batch = {}, max(1, inputs.settings.batch_size)
    with torch.no_grad():
        for kind, tokens in ids.items():
            runs = []
            for _ in range(2):
                started = time.perf_counter()
                module(input_ids=tokens.repeat(batch, 1).to(module.device))
                runs.append(time.perf_counter() - started)
            seconds[kind] = min(runs) / batch
    return seconds
