"""What the precheck's heavy passes will cost, said before they run (and all ``--dry-run`` does),
with no weight read and no model loaded: at 7B that is the 14-28 GB the passes will then read.

Each diagnostic that runs the model says how many forward passes it will make (``passes(inputs,
tokenizer)``: probe sequences, or windows of the shipped text where its ``unit`` says so); a
third party's diagnostic without ``passes`` is left out of the sum, and the line says so. The time
comes from the probes' own token counts and a ``Pace``: seconds per token through one decoder
block and through the head, timed once on a one-block model of the base's shape (config.json, with
random weights) on the precheck's device and dtype, and kept in the user's cache for the next run.
A counted probe line is one of an item's options: the item's prompt runs once for all of them
(``activations.shared_prompt_logprobs``); a row is a prompt and its answer whole.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

LINE, WINDOW, ROW = "line", "window", "row"
TIMED_TOKENS = 64  # per row of the timed batch
TIMED_VOCABULARY = 8192  # the head is timed this wide and scaled to the model's vocabulary


@dataclass(frozen=True)
class Cost:
    passes: Dict[str, int]  # diagnostic -> forward passes
    units: Dict[str, str]  # diagnostic -> LINE, ROW or WINDOW
    # unit -> one pass's seconds at this device's pace: (in the decoder blocks, outside them)
    seconds: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    uncounted: List[str] = field(default_factory=list)  # diagnostics that do not say their passes
    device: str = "cpu"
    notes: List[str] = field(default_factory=list)  # what a count is made of, where it is not plain
    # diagnostic -> the share of a pass's blocks it runs (the menu shares the untouched layers)
    shares: Dict[str, float] = field(default_factory=dict)
    elsewhere: Dict[str, "Cost"] = field(default_factory=dict)  # another device here (a GPU) -> its cost

    @property
    def total(self) -> int:
        return sum(self.passes.values())

    @property
    def phases(self) -> Dict[str, float]:
        """Seconds for each diagnostic's counted passes, at the timed pace (empty: nothing timed)."""
        if not self.seconds:
            return {}
        phases = {}
        for name, n in self.passes.items():
            blocks, outside = self.seconds.get(self.units[name], (0.0, 0.0))
            phases[name] = n * (blocks * self.shares.get(name, 1.0) + outside)
        return phases

    @property
    def estimate(self) -> Optional[float]:
        """Seconds for every counted pass, at the timed pace (None: nothing timed)."""
        return sum(self.phases.values()) if self.seconds else None

    def line(self) -> str:
        counted = ", ".join(f"{name} {n:,}" for name, n in self.passes.items() if n)
        said = f"precheck: about {self.total:,} forward passes" + (f" ({counted})" if counted else "")
        if self.estimate is not None and self.total:
            said += f"; roughly {duration(self.estimate)} on {self.device}"
            said += "".join(f" (on {d}: {duration(c.estimate)})" for d, c in self.elsewhere.items() if c.estimate)
        if self.uncounted:
            said += f"; not counted: {', '.join(self.uncounted)}"
        return "; ".join([said, *self.notes])

    def by_phase(self) -> List[str]:
        """One line a phase: its passes and roughly how long, on this device and any other here."""
        return [
            f"  {name}: {n:,} passes, about {duration(seconds)}"
            + "".join(f", {duration(c.phases[name])} on {d}" for d, c in self.elsewhere.items() if name in c.phases)
            for (name, seconds), n in zip(self.phases.items(), self.passes.values())
            if n
        ]


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate(inputs, diagnostics, menu_passes: int = 0, notes: List[str] = [], menu_share: float = 1.0) -> Cost:
    """The cost of ``diagnostics`` (those that will run) and the menu's rehearsal on ``inputs``
    (``menu_share``: the share of the blocks its passes run), from headers, config.json and the
    probes' tokens."""
    tokenizer = _tokenizer(inputs.base.path) if inputs.base is not None else None
    passes, units, uncounted = {}, {}, []
    for diagnostic in diagnostics:
        counter = getattr(diagnostic, "passes", None)
        if counter is None:
            uncounted.append(diagnostic.name)
            continue
        units[diagnostic.name] = getattr(diagnostic, "unit", LINE)
        passes[diagnostic.name] = (
            counter(inputs, tokenizer) if tokenizer is not None or units[diagnostic.name] != WINDOW else 0
        )
    if menu_passes:
        passes["menu"], units["menu"] = menu_passes, LINE
    device = _device(inputs.settings.device)
    shares = {"menu": menu_share} if menu_passes else {}

    def on(device: str) -> Dict[str, Tuple[float, float]]:
        if tokenizer is None or not any(passes.values()):
            return {}
        config = _source(inputs.base.path).config_json()[1]
        at = pace(config, device, inputs.base.load_dtype(inputs.settings), inputs.settings.batch_size)
        return {unit: at.seconds(*tokens) for unit, tokens in _tokens(inputs, tokenizer).items()}

    elsewhere = {}
    if device == "cpu" and _gpu():
        elsewhere["cuda"] = Cost(passes, units, on("cuda"), uncounted, "cuda", shares=shares)
    return Cost(passes, units, on(device), uncounted, device, list(notes), shares, elsewhere)


@dataclass(frozen=True)
class Pace:
    """Seconds per token through one decoder block and through the head (the embedding, the final
    norm and the logits), and what a forward call costs beyond its tokens, outside the blocks and
    in each, for a model of ``layers`` blocks."""

    block: float
    head: float
    call: float
    block_call: float
    layers: int

    def seconds(self, block_tokens: float, head_tokens: float, calls: float) -> Tuple[float, float]:
        """One counted pass (its tokens through the blocks, those whose logits are read, its share
        of a call): its seconds in the blocks and outside them."""
        blocks = self.layers * (block_tokens * self.block + calls * self.block_call)
        return blocks, head_tokens * self.head + calls * self.call


def pace(config: dict, device: str, dtype: str, batch: int) -> Pace:
    """This device's ``Pace`` for a model shaped as ``config`` (config.json's dict): timed once on
    one block with random weights, then kept in the user's cache per device, dtype and shape."""
    from mergekit_mergeability.files import default_cache_dir, write_atomic

    shape = {k: config.get(k) for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads")}
    key = f"{device}/{dtype}/batch {batch}/" + "/".join(f"{v}" for v in shape.values())
    kept = default_cache_dir() / "pace.json"
    known = _read(kept)
    if not isinstance(known.get(key), dict) or set(known[key]) != set(Pace.__dataclass_fields__):
        known[key] = asdict(_timed(config, device, dtype, batch))
        write_atomic(kept, json.dumps(known, indent=1))
    return Pace(**{**known[key], "layers": int(config.get("num_hidden_layers") or 1)})


def _timed(config: dict, device: str, dtype: str, batch: int) -> Pace:
    """A one-block model of the shape, timed with its block and without (the faster of two runs),
    on ``batch`` rows of TIMED_TOKENS and on one row of one token (a call's own cost)."""
    import torch
    import transformers

    vocabulary = int(config.get("vocab_size") or TIMED_VOCABULARY)
    shaped = {**config, "num_hidden_layers": 1, "vocab_size": min(vocabulary, TIMED_VOCABULARY)}
    if isinstance(shaped.get("layer_types"), list):  # one entry per block
        shaped["layer_types"] = shaped["layer_types"][:1]
    shaped = {k: v for k, v in shaped.items() if k not in ("architectures", "dtype", "torch_dtype")}
    made = transformers.AutoConfig.for_model(**shaped)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(made, dtype=getattr(torch, dtype)).eval()
    blocks = model.get_decoder().layers

    def fastest(rows: int, tokens: int) -> float:
        ids = torch.randint(0, made.vocab_size, (rows, tokens), device=device)
        runs = []
        with torch.inference_mode():
            for _ in range(3):  # the first warms up
                started = time.perf_counter()
                model(input_ids=ids)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - started)
        return min(runs[1:])

    tokens = batch * TIMED_TOKENS
    whole, whole_call = fastest(batch, TIMED_TOKENS), fastest(1, 1)
    model.get_decoder().layers = torch.nn.ModuleList()
    outer, outer_call = fastest(batch, TIMED_TOKENS), fastest(1, 1)
    model.get_decoder().layers = blocks
    return Pace(
        block=max(whole - outer - (whole_call - outer_call), 0.0) / tokens,
        head=max(outer - outer_call, 0.0) / tokens * vocabulary / made.vocab_size,
        call=outer_call,
        block_call=max(whole_call - outer_call, 0.0),
        layers=1,
    )


def _tokens(inputs, tokenizer) -> Dict[str, Tuple[float, float, float]]:
    """Per unit, one counted pass's (tokens through the blocks, tokens whose logits are read, calls):
    a probe line shares its item's prompt with the item's other options (two calls an item); a row
    is a prompt and its answer; a window is the shipped text's."""
    from mergekit_mergeability.diagnostics.fluency import WINDOW as WINDOW_TOKENS

    batch = max(1, inputs.settings.batch_size)
    items = [i for m in inputs.models for i in (m.probes or ())]
    found = {WINDOW: (WINDOW_TOKENS, WINDOW_TOKENS, 1 / batch)}
    if items:
        count = lambda text, **kw: len(tokenizer(text, **kw)["input_ids"])  # noqa: E731
        prompts = [count(i.prompt) for i in items]
        options = [[count(c, add_special_tokens=False) for c in (*i.continuations, *i.letters)] for i in items]
        lines = sum(len(o) for o in options)
        found[LINE] = (
            (sum(prompts) + sum(map(sum, options))) / lines,
            (len(items) + sum(map(sum, options))) / lines,
            2 * len(items) / lines,
        )
        rows = sum(p + o[i.label] for p, o, i in zip(prompts, options, items)) / len(items)
        found[ROW] = (rows, rows, 1 / batch)
    return found


def _tokenizer(source):
    """The base's tokenizer alone (no weights); None where it has none to load."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError):
        return None


def _source(path):
    from mergekit_mergeability.sources import source_of

    return source_of(path)


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _device(requested: str) -> str:
    from mergekit_mergeability.sources import auto_device

    return str(auto_device(requested))


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
