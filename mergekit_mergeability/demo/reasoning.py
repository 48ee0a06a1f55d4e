"""The demo's interpolation sweep (paper 2, arXiv 2510.10977) on a real model.

A is SmolLM2-135M-Instruct itself, which answers a two-digit addition directly (and
mostly wrongly). B is a "thinking" variant trained on CPU to answer with a short
reasoning trace closed by ``</think>``::

    Question: What is 47 + 38?
    Answer: <think>7+8=15, 4+3+1=8</think> 85

B is a low-rank update of the upper layers' ``mlp.up_proj`` (``experts.train_low_rank``),
trained on additions outside the held-out problems the sweep scores (the shipped task
``demo_arithmetic``, data in ``configs/demo/arithmetic.jsonl``); prompts come from
that task, so training and scoring ask alike.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, List, Tuple

TASK = "demo_arithmetic"
BATCH = 16  # problems per training step
LAMBDAS = "0:1:0.1"


def trace(a: int, b: int) -> str:
    """The thinking answer: units, then tens with the carry, then the sum after the marker."""
    units, tens = a % 10 + b % 10, a // 10 + b // 10 + (a % 10 + b % 10) // 10
    carry = "+1" if units >= 10 else ""
    return f" <think>{a % 10}+{b % 10}={units}, {a // 10}+{b // 10}{carry}={tens}</think> {a + b}"


def training_pairs(task, count: int, seed: int) -> List[Tuple[str, str]]:
    """(prompt, thinking answer) for ``count`` two-digit additions the task does not hold."""
    held_out = {(doc["a"], doc["b"]) for doc in task.test_docs()}
    problems = [(a, b) for a in range(10, 100) for b in range(10, 100) if (a, b) not in held_out]
    random.Random(seed).shuffle(problems)
    return [(task.doc_to_text({"a": a, "b": b}), trace(a, b) + "\n") for a, b in problems[:count]]


def thinking_model(demo) -> Path:
    """B, trained once into the demo's cache (a folder sharing the base's unchanged shards)."""
    from mergekit_mergeability.demo.checkpoints import save_expert
    from mergekit_mergeability.demo.training import train_low_rank, updated
    from mergekit_mergeability.progress import task
    from mergekit_mergeability.tasks.lmeval import resolve
    from mergekit_mergeability.interpolation.answers import GenerationTask

    folder = demo.cache / "sweep" / "thinking"
    if not folder.is_dir():
        model, tokenizer = demo.model()
        steps = demo.s.thinking_steps
        pairs = training_pairs(GenerationTask(resolve(TASK), 1, 1.0).task, steps * BATCH, seed=0)
        with task("thinking model: training steps (once)", steps, demo.quiet) as advance:
            factors = train_low_rank(
                model,
                tokenizer,
                demo.s.thinking_layers,
                pairs,
                lambda: False,
                rank=demo.s.thinking_rank,
                min_steps=steps,
                max_steps=steps,
                batch_size=BATCH,
                advance=advance,
            )
        changed = updated(model, factors)
        save_expert(demo.base(), changed, folder)
    return folder


def sweep(demo) -> Dict[str, Any]:
    """Step 6: sweep λ from the instruct model (0) to the thinking model (1) on held-out problems."""
    from dataclasses import replace

    from mergekit_mergeability.settings import SweepSettings
    from mergekit_mergeability.sources.cache import Cache
    from mergekit_mergeability.interpolation import outputs, sweeping
    from mergekit_mergeability.output.terminal import print_sweep

    demo.console.rule("6. interpolation sweep: the instruct model (base) → thinking (paper 2)")
    thinking = thinking_model(demo)
    # what demo.run_settings() runs with, at the sweep's limit
    run_settings = replace(demo.run_settings(), limit=demo.s.sweep_limit)
    settings = SweepSettings(**vars(run_settings), lambdas=sweeping.grid(LAMBDAS))
    report, done = sweeping.run(
        str(demo.base()), str(thinking), None, TASK, settings, Cache(demo.cache / "sweep" / "scores")
    )
    outputs.write(report, done, demo.out / "sweep")
    print_sweep(report, demo.out / "sweep")
    return report
