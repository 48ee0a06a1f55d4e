"""What the precheck's heavy passes will cost, said before they run (and all ``--dry-run`` does),
with no weight read and no model loaded: at 7B that is the 14-28 GB the passes will then read.

Each diagnostic that runs the model says how many forward passes it will make (``passes(inputs,
tokenizer)``: probe sequences, or windows of the shipped text where its ``unit`` says so); a
third party's diagnostic without ``passes`` is left out of the sum, and the line says so. The time
comes from the probes' own token counts and a ``Pace``: seconds a forward call of n tokens takes in
a decoder block and outside the blocks, timed once on a few blocks of the base's shape
(config.json, random weights) on the precheck's device and dtype, and kept in the user's cache for
the next run. A counted probe line is one of an item's options: the item's prompt runs once for
all of them (``activations.shared_prompt_logprobs``); a row is a prompt and its answer whole.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

LINE, WINDOW, ROW = "line", "window", "row"
UNCACHED = 256 << 20  # bytes of blocks timed together, beyond any processor cache


@dataclass(frozen=True)
class Cost:
    passes: Dict[str, int]  # diagnostic -> forward passes
    units: Dict[str, str]  # diagnostic -> LINE, ROW or WINDOW
    # diagnostic -> one of its passes' seconds at this device's pace: (in the decoder blocks, outside them)
    seconds: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    uncounted: List[str] = field(default_factory=list)  # diagnostics that do not say their passes
    device: str = "cpu"
    notes: List[str] = field(default_factory=list)  # what a count is made of, where it is not plain
    # diagnostic -> the share of a pass's blocks it runs (the menu shares the untouched layers)
    shares: Dict[str, float] = field(default_factory=dict)
    elsewhere: Dict[str, "Cost"] = field(default_factory=dict)  # another device here (a GPU) -> its cost
    dtype: str = ""  # what the passes run in
    building: Dict[str, float] = field(default_factory=dict)  # diagnostic -> seconds building its merges in memory

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
            blocks, outside = self.seconds.get(name, (0.0, 0.0))
            phases[name] = n * (blocks * self.shares.get(name, 1.0) + outside) + self.building.get(name, 0.0)
        return phases

    @property
    def estimate(self) -> Optional[float]:
        """Seconds for every counted pass, at the timed pace (None: nothing timed)."""
        return sum(self.phases.values()) if self.seconds else None

    def line(self) -> str:
        """The count and roughly how long, then one indented line per note."""
        counted = ", ".join(f"{name} {n:,}" for name, n in self.passes.items() if n)
        said = f"precheck: about {self.total:,} forward passes" + (f" ({counted})" if counted else "")
        if self.estimate is not None and self.total:
            said += f"; roughly {duration(self.estimate)} on {self.device}" + (
                f" in {self.dtype}" if self.dtype else ""
            )
            said += "".join(f" (on {d}: {duration(c.estimate)})" for d, c in self.elsewhere.items() if c.estimate)
        if self.uncounted:
            said += f"; not counted: {', '.join(self.uncounted)}"
        return "\n".join([said, *(f"  {note}" for note in self.notes)])

    def by_phase(self) -> List[str]:
        """One line a phase: its passes and roughly how long, on this device and any other here."""
        phases = self.phases
        return [
            f"  {name}: {n:,} passes, about {duration(phases[name])}"
            + (f" (its merges built in {duration(self.building[name])})" if name in self.building else "")
            + "".join(f", {duration(c.phases[name])} on {d}" for d, c in self.elsewhere.items() if name in c.phases)
            for name, n in self.passes.items()
            if n and name in phases
        ]


def size(count: float) -> str:
    """Bytes as a person reads them (decimal units, as disks and the hub count them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate(inputs, diagnostics, menu_passes: int = 0, notes: Sequence[str] = (), menu_merges=None) -> Cost:
    """The cost of ``diagnostics`` (those that will run) and the menu's rehearsal on ``inputs``,
    from headers, config.json and the probes' tokens. The menu's passes, and those of a diagnostic
    that says ``shares_layers``, ask each probe under several merges: after the first, they run
    only the layers the updates touch (``shared_layers``). ``menu_merges``: the plans of the merges
    the menu builds (``menu.merges``), each timed on random inputs (``_building``)."""
    from mergekit_mergeability.sources import source_of

    notes = list(notes)  # a block that cannot be timed adds one
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
    dtype = inputs.base.load_dtype(inputs.settings) if inputs.base is not None else ""
    config = source_of(inputs.base.path).config_json()[1] if inputs.base is not None else {}
    shared = ["menu", *(d.name for d in diagnostics if getattr(d, "shares_layers", False))]
    shares = _shares(inputs, config, {name: passes[name] for name in shared if passes.get(name)})

    def on(device: str) -> Dict[str, Tuple[float, float]]:
        if tokenizer is None or not any(passes.values()):
            return {}
        try:
            at = pace(config, device, dtype)
        except Exception as error:  # a shape transformers cannot build bare: the count is still said
            notes.append(
                f"no time estimated: a block of {config.get('model_type')} could not be timed ({type(error).__name__})"
            )
            return {}
        return _seconds(inputs, diagnostics, passes, tokenizer, at)

    building = {"menu": _building(menu_merges, inputs, dtype)} if menu_merges and passes.get("menu") else {}
    if building and not inputs.read_weights:
        notes.append(
            "no weights read: every tensor of a whole model is counted as changed, so building its merges"
            " may take far less (an adapter counts its own tensors)"
        )
    elsewhere = {}
    if device == "cpu" and _gpu():  # the merges are built on the CPU either way
        elsewhere["cuda"] = Cost(passes, units, on("cuda"), uncounted, "cuda", shares=shares, building=building)
    return Cost(passes, units, on(device), uncounted, device, notes, shares, elsewhere, dtype, building)


def _building(plans, inputs, dtype: str) -> float:
    """Seconds to build each of ``plans``' merges (tensor name -> mergekit's plan) on the tensors the
    updates touch: the merges built in turn as the menu builds them (each update sorted once for
    every density pruned at, ``planned.sorted_together``), on random inputs for one touched tensor
    of middling size (its shape from the base's headers; its first TIMED_MERGE values' rows), the
    faster of two turns, scaled to the values of them all. Reading the models' tensors is not counted."""
    import torch

    from mergekit_mergeability.decide.tuning import PRUNED_AT
    from mergekit_mergeability.rehearsal.planned import merged, sorted_together
    from mergekit_mergeability.sources import TensorReader

    index = TensorReader(inputs.base.path).index
    size = lambda name: math.prod(index[name].shape)  # noqa: E731
    names = sorted(set().union(*inputs.touched.values()) & set(index), key=size)
    if not names:
        return 0.0
    middle = names[len(names) // 2]
    shape = list(index[middle].shape)
    shape[0] = min(shape[0], max(1, TIMED_MERGE // math.prod(shape[1:])))  # its first rows, at a 7B shape
    models = {str(model) for plan in plans.values() for model, _, _ in plan[middle].reads}

    def built() -> float:  # every merge in turn, as the menu builds them: each update sorted once for all
        drawn = {model: torch.randn(shape, dtype=getattr(torch, dtype or "float32")) for model in models}
        started = time.perf_counter()  # (fresh values each turn: no mask kept from the one before)
        with sorted_together(PRUNED_AT):
            for plan in plans.values():
                merged(plan[middle], lambda model, name: drawn[model])
        return time.perf_counter() - started

    return min(built(), built()) * sum(map(size, names)) / math.prod(shape)


TIMED = (1, 8, 16, 32, 64, 128, 512, 2048)  # tokens in one forward call, where the pace is timed
# the calls the passes make (``activations``): a probe's prompt, keeping its last position's logits and its
# keys and values; its options, one row each, on that cache; a whole sequence, every position's logits
PROMPT, OPTIONS, FULL = "prompt", "options", "full"
KINDS = (PROMPT, OPTIONS, FULL)
TIMED_MERGE = 1 << 22  # values of a touched tensor each merge is timed on (a 1.1B shape's whole middling one)
PACE_VERSION = "calls-4"  # in the cache's keys: a version that timed other calls keeps its own entries
TIMED_OPTIONS, TIMED_PROMPT = 4, 32  # an options call is timed as this many rows after a prompt this long


@dataclass(frozen=True)
class Pace:
    """Seconds one forward call of n tokens (TIMED, read between them by linear interpolation)
    takes in one decoder block and outside the blocks (embedding, final norm, logits, the call's
    own overhead), for each kind of call (KINDS), for a model of ``layers`` blocks."""

    block: Dict[str, List[float]]
    outside: Dict[str, List[float]]
    layers: int = 1

    def call(self, kind: str, tokens: float) -> Tuple[float, float]:
        """One call of ``tokens`` tokens: (seconds in all the blocks, seconds outside them)."""
        import numpy as np

        block, outside = (float(np.interp(tokens, TIMED, table[kind])) for table in (self.block, self.outside))
        return self.layers * block, outside


def pace(config: dict, device: str, dtype: str) -> Pace:
    """This device's ``Pace`` for a model shaped as ``config`` (config.json's dict): timed once on a
    few blocks with random weights (``_timed``), then kept in the user's cache per device, dtype and shape."""
    from mergekit_mergeability.files import default_cache_dir, write_atomic
    from mergekit_mergeability.progress import note

    shape = (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    key = f"{PACE_VERSION}/{device}/{dtype}/" + "/".join(f"{config.get(k)}" for k in shape)
    kept = default_cache_dir() / "pace.json"
    known = _read(kept)
    if not _usable(known.get(key)):
        note(f"timing a forward pass of this shape once ({device}, {dtype}), kept in {kept}")
        timed = _timed(config, device, dtype)
        known[key] = {"block": timed.block, "outside": timed.outside}
        write_atomic(kept, json.dumps(known, indent=1))
    return Pace(**known[key], layers=int(config.get("num_hidden_layers") or 1))


def _usable(kept) -> bool:
    """Whether a kept pace has every kind's table at every TIMED size (one kept by an older version may not)."""
    tables = [kept.get(part) for part in ("block", "outside")] if isinstance(kept, dict) else [None]
    return all(
        isinstance(t, dict) and set(t) == set(KINDS) and all(len(t[k]) == len(TIMED) for k in KINDS) for t in tables
    )


def _timed(config: dict, device: str, dtype: str) -> Pace:
    """A model of the shape with a few blocks (UNCACHED bytes of them, or all), each TIMED call
    run with its blocks and without (the fastest of a few runs). The embedding and the head are
    timed whole: at a few tokens, reading the head is much of a call."""
    import torch
    import transformers

    from mergekit_mergeability.diagnostics.activations import Asked, options_pass, prompt_pass

    def built(layers: int, on: str = device):
        shaped = {**config, "num_hidden_layers": layers}
        if isinstance(shaped.get("layer_types"), list):  # one entry per block
            shaped["layer_types"] = (shaped["layer_types"] * layers)[:layers]
        shaped = {k: v for k, v in shaped.items() if k not in ("architectures", "dtype", "torch_dtype")}
        made = transformers.AutoConfig.for_model(**shaped)
        with torch.device(on):
            return transformers.AutoModelForCausalLM.from_config(made, dtype=getattr(torch, dtype)).eval()

    # enough blocks that their weights do not fit in the processor's cache, as a whole model's do not:
    # one small block run again and again is read from the cache, and timed several times too fast
    one = sum(p.numel() * p.element_size() for p in built(1, "meta").get_decoder().layers.parameters())
    count = min(int(config.get("num_hidden_layers") or 1), max(1, -(-UNCACHED // one)))
    model = built(count)
    decoder = model.get_decoder()
    blocks = decoder.layers

    def ids(tokens: int) -> List[int]:
        return torch.randint(0, model.config.vocab_size, (tokens,)).tolist()

    def ready(kind: str, tokens: int):
        """One call of ``kind`` and ``tokens`` tokens, as the passes make it, ready to run (an options
        call's prompt already run)."""
        if kind == PROMPT:
            prompt = [Asked(ids(tokens), [], [])]
            return lambda: prompt_pass(model, prompt)
        if kind == OPTIONS:
            rows = min(TIMED_OPTIONS, tokens)
            # each option one token longer: its last token is not run
            item = [Asked(ids(TIMED_PROMPT), [], [ids(tokens // rows + 1) for _ in range(rows)])]
            prompted = prompt_pass(model, item)
            return lambda: options_pass(model, *prompted, item)
        rows = max(1, tokens // 256)
        batch = torch.tensor([ids(tokens // rows) for _ in range(rows)], device=device)
        return lambda: model(input_ids=batch)

    def fastest(tokens: int, kind: str) -> float:
        runs = []
        with torch.inference_mode():
            for _ in range(2 if tokens > 256 else 5):  # the first warms up
                call = ready(kind, tokens)
                started = time.perf_counter()
                call()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - started)
        return min(runs[1:])

    whole = {kind: [fastest(n, kind) for n in TIMED] for kind in KINDS}
    decoder.layers = torch.nn.ModuleList()
    outside = {kind: [fastest(n, kind) for n in TIMED] for kind in KINDS}
    decoder.layers = blocks
    block = {kind: [max(w - b, 0.0) / count for w, b in zip(whole[kind], outside[kind])] for kind in KINDS}
    return Pace(block, outside)


def _seconds(inputs, diagnostics, passes, tokenizer, at: Pace) -> Dict[str, Tuple[float, float]]:
    """Per diagnostic, one counted pass's seconds (in the blocks, outside them). A probe line is
    one option of an item whose prompt runs once for all its options (a PROMPT call of the prompt,
    an OPTIONS call of all its options), among the requests the diagnostic says it asks (``asked``) or
    else the models' probes, with the items lm-eval's own requests score whole besides (``whole``)
    spread over them; a row is a prompt and its answer whole, in batches, the logits of the last
    position alone (a PROMPT call: the passes read hidden states and activations); a window is the
    shipped text's."""
    from mergekit_mergeability.diagnostics.fluency import WINDOW as WINDOW_TOKENS

    batch = max(1, inputs.settings.batch_size)
    probed = [i for m in inputs.models for i in (m.probes or ())]
    count = lambda text, **kw: len(tokenizer(text, **kw)["input_ids"])  # noqa: E731
    asked = {d.name: d.asked(inputs) for d in diagnostics if hasattr(d, "asked")}
    whole = {d.name: d.whole(inputs) for d in diagnostics if hasattr(d, "whole")}
    found = {}
    for name, unit in ({d.name: getattr(d, "unit", LINE) for d in diagnostics} | {"menu": LINE}).items():
        items = asked.get(name) or probed
        if not passes.get(name):
            continue
        if unit == WINDOW:
            found[name] = at.call(FULL, WINDOW_TOKENS)
        elif unit == ROW and items:
            row = sum(count(i.prompt) + count(i.gold, add_special_tokens=False) for i in items) / len(items)
            found[name] = tuple(part / batch for part in at.call(PROMPT, batch * row))
        elif items:
            counted = sum(i.sequences for i in items)  # every option and letter, as its passes count them
            found[name] = tuple(part / counted for part in _asked(items, tokenizer, at))
            if whole.get(name):  # and once, lm-eval's own requests: each option whole with its prompt, in batches
                rows = [
                    count(i.prompt) + count(c, add_special_tokens=False) for i in whole[name] for c in i.continuations
                ]
                called = at.call(FULL, batch * sum(rows) / len(rows))
                found[name] = tuple(a + b * len(rows) / batch / passes[name] for a, b in zip(found[name], called))
    return found


def _asked(items, tokenizer, at: Pace) -> Tuple[float, float]:
    """The calls ``activations.choice_logprobs`` makes for ``items``: per group it runs together
    (``ITEMS_AT_ONCE`` at a time, then ``together``), one PROMPT call of the padded prompts, each with
    its options' common first tokens, and where an option has two tokens or more, one OPTIONS call of
    those options without their last token, padded to the longest."""
    from mergekit_mergeability.diagnostics import activations

    spent = []
    for start in range(0, len(items), activations.ITEMS_AT_ONCE):
        window = items[start : start + activations.ITEMS_AT_ONCE]
        asked = [activations.asked(tokenizer, i.prompt, (*i.continuations, *i.letters)) for i in window]
        for group in activations.together(asked):
            prompts, options = activations.calls(group)
            spent += [at.call(PROMPT, prompts)] + ([at.call(OPTIONS, options)] if options else [])
    return tuple(sum(part) for part in zip(*spent)) if spent else (0.0, 0.0)


def _shares(inputs, config: dict, passes: Dict[str, int]) -> Dict[str, float]:
    """Each diagnostic's share of a whole pass's blocks (``shared_layers.share``), where it passes
    each probe line ``passes / lines`` times."""
    from mergekit_mergeability.rehearsal.shared_layers import first_touched, share

    lines = sum(i.sequences for m in inputs.models for i in (m.probes or ()))
    if not passes or not lines:
        return {}
    layers = int(config.get("num_hidden_layers") or 1)
    first = first_touched(set().union(*inputs.touched.values()), layers, bool(config.get("tie_word_embeddings")))
    return {name: share(n / lines, first, layers) for name, n in passes.items()}


def _tokenizer(source):
    """The base's tokenizer alone (no weights); None where it has none to load."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError):
        return None


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
