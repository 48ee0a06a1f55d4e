"""The menu's forward passes, each speed-up measured against a baseline run in the same process.

The precheck of a config of three SmolLM2-135M LoRA experts spends most of its time rehearsing
merges: every candidate asks every member's probe. Seven speed-ups, each switched on in turn:
  - the prompt pass keeps the last position's logits only (``logits_to_keep=1``);
  - the options' common first tokens run with the prompt, and each option's last token is not run
    (what it predicts is not read; one-token options need no call at all);
  - the prompts of up to 16 items run together, left-padded, and so do their options
    (``activations.together``: at most ``CALL_TOKENS`` tokens a call);
  - the layers below the first one the updates touch run once for every candidate
    (``diagnostics.shared_layers``): the first candidate records, the others replay;
  - the masks of mergekit's magnitude pruning are computed once for each update and density and
    kept for the candidates that prune it again (``planned.shared_masks``);
  - options of one prompt that share their tokens before the last share one row of the options
    call (``activations.Asked.runs``: after " 36" and " 38"'s common space, both run "3");
  - an update is sorted once for its masks at every density the menu prunes at
    (``planned.sorted_together``, as ``menu.rehearse`` uses it), not once a density.
Each variant's scores must equal the baseline's (printed: the largest difference over every item of
every candidate). ``--bfloat16`` adds the shipped code run in bfloat16 on the CPU, kept only where
it is faster and its scores agree with float32's to 1e-3. The config: the `tuning` family's first three-expert draw as task_arithmetic
(LoRA on the attention of layers 15-29; ``python research/run.py tuning measure`` trains and writes
it), or ``--config`` yours. ``--tune-budget`` as the precheck's (default: the precheck's default,
ten of the knob grid's candidates beside the menu).

    python benchmarks/passes.py [--config CONFIG.yml] [--tune-budget N] [--repeats 1] [--bfloat16]
        [--variants NAME ...]   (the first is the baseline of the ratios; default every variant)
"""

import argparse
import contextlib
import functools
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import transformers

from mergekit_mergeability import api, menu
from mergekit_mergeability.rehearsal import planned
from mergekit_mergeability.diagnostics import activations
from mergekit_mergeability.rehearsal.shared_layers import Shared
from mergekit_mergeability.settings import PrecheckSettings

DEFAULT = Path("pools-out/tuning/configs/n3_0_task_arithmetic.yml")
VARIANTS = (
    "baseline",
    "+ last-position logits",
    "+ options trimmed",
    "+ prompts together",
    "+ shared lower layers",
    "+ shared masks",
    "+ shared option rows",
    "+ one sort, every density",
)
BFLOAT16 = "shipped, in bfloat16"


@contextlib.contextmanager
def variant(name: str):
    """The code as shipped, with the speed-ups after ``name`` in VARIANTS switched off."""
    keep = VARIANTS.index(name) if name in VARIANTS else len(VARIANTS)
    forward = transformers.LlamaForCausalLM.forward
    shared_below, split, options_pass, together = (
        menu.shared_below,
        activations.split,
        activations.options_pass,
        activations.together,
    )
    if keep < 1:

        @functools.wraps(forward)
        def every_logit(self, *args, logits_to_keep=0, **kwargs):
            return forward(self, *args, **kwargs)

        transformers.LlamaForCausalLM.forward = every_logit
    if keep < 2:
        activations.split = lambda options: ([], [list(o) for o in options])
        activations.options_pass = every_option_token
    if keep < 3:
        activations.together = lambda items, tokens=0: ([item] for item in items)
    if keep < 4:
        menu.shared_below = lambda module, names: contextlib.nullcontext(Shared())
    masks = planned.shared_masks
    planned._masks.clear()  # each run computes its own masks
    planned._kept[0] = 0
    if keep < 5:
        planned.shared_masks = contextlib.nullcontext
    runs = activations.Asked.runs
    if keep < 6:  # a row for every option, as before
        activations.Asked.runs = property(lambda asked: [tuple(o[:-1]) for o in asked.rest if len(o) > 1])
    sorted_together = menu.sorted_together
    if keep < 7:
        menu.sorted_together = lambda densities: contextlib.nullcontext()
    try:
        yield
    finally:
        transformers.LlamaForCausalLM.forward, menu.shared_below = forward, shared_below
        planned.shared_masks, activations.Asked.runs = masks, runs
        menu.sorted_together = sorted_together
        activations.split, activations.options_pass, activations.together = split, options_pass, together


def every_option_token(model, first, said, cache, mask, group):
    """The options' call before it was trimmed: every token of every option, on the cache of its one
    prompt (prompts then ran one at a time) repeated for each."""
    import torch

    (item,) = group
    options = item.rest
    cache.batch_repeat_interleave(len(options))
    ids, added = activations.pad([([], o) for o in options])
    attention = torch.cat([mask.expand(len(options), -1), added], dim=1)
    logits = model(input_ids=ids, attention_mask=attention, **{activations.cache_argument(model): cache}).logits
    following = torch.log_softmax(logits.float(), dim=-1)
    found = [
        first[0, o[0]] + following[r, : len(o) - 1].gather(1, torch.tensor(o[1:])[:, None]).sum()
        for r, o in enumerate(options)
    ]
    return [torch.stack(found)]


def timed_rehearsal(config: Path, settings: PrecheckSettings):
    """Seconds in ``menu.rehearse`` and its per-item reads, over one whole precheck."""
    rehearse, spent = menu.rehearse, {}

    def timing(*args):
        started = time.perf_counter()
        result = rehearse(*args)
        spent["seconds"], spent["items"] = time.perf_counter() - started, result.per_instance
        return result

    menu.rehearse = timing
    try:
        with tempfile.TemporaryDirectory() as out:
            api.precheck(config, settings=settings, out=out)
    finally:
        menu.rehearse = rehearse
    return spent["seconds"], spent["items"]


def largest_difference(a, b) -> float:
    return max(abs(x[c] - y[c]) for m in a for x, y in zip(a[m], b[m]) for c in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--tune-budget", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--bfloat16", action="store_true", help="also the shipped code in bfloat16")
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="the first: the baseline"
    )
    args = parser.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config (python research/run.py tuning measure writes it)")
    settings = PrecheckSettings(
        device="cpu", dtype="float32", quiet=True, skip=("representations", "selectivity"), tune_budget=args.tune_budget
    )
    names = (*args.variants, BFLOAT16) if args.bfloat16 else tuple(args.variants)
    seconds, items = {v: [] for v in names}, {}
    for _ in range(args.repeats):
        for name in names:  # interleaved: a noisy spell of the machine falls on every variant alike
            dtype = "bfloat16" if name == BFLOAT16 else "float32"
            with variant(name):
                spent, items[name] = timed_rehearsal(args.config, replace(settings, dtype=dtype))
            seconds[name].append(spent)
    first = names[0]
    base = statistics.median(seconds[first])
    for name in names:
        median = statistics.median(seconds[name])
        print(
            f"{name:24s} {median:7.1f} s  {base / median:4.2f}x {first}'s speed  "
            f"largest score difference {largest_difference(items[first], items[name]):.1e}"
        )
    print(f"target: the speed-ups together >= 1.5x ({args.repeats} run(s) each, medians)")


if __name__ == "__main__":
    main()
