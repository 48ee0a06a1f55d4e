"""Multiple-choice tasks read without lm-eval's run (``task_scores.score_all``) against lm-eval's own run
of each (``harness.score``), on one model in one process: seconds, their ratio, and whether every
result is the same.

The tasks: the `tuning` family's ten probes of SmolLM2-135M-Instruct, 16 items each, as the lm-eval
tasks ``evaluate``, ``mergeability`` and ``plan``'s rehearsal score them (``python research/run.py
tuning measure`` writes them), or ``--probes`` your own JSONL files; the model: its base.

    python benchmarks/plain_scores.py [--probes P.jsonl ...] [--limit 16] [--repeats 2]
"""

import argparse
import statistics
import time
from pathlib import Path

from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.diagnostics.task_scores import score_all
from mergekit_mergeability.tasks import harness, lmeval

SMOLLM2 = default_cache_dir() / "demo" / "smollm2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--probes", type=Path, nargs="*", default=sorted((SMOLLM2 / "probes" / "tuning").glob("*.jsonl"))
    )
    parser.add_argument("--base", type=Path, default=SMOLLM2 / "base")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not args.probes or not args.base.is_dir():
        raise SystemExit(f"{args.base}: no base or probes (python research/run.py tuning measure writes them)")
    model, tokenizer = load_causal_lm(args.base, "cpu", "float32")
    tasks = [lmeval.resolve(str(p)) for p in args.probes]
    for task in tasks:  # each task built once first, as a run builds it before scoring
        task.check()
        lmeval.plain(task, args.limit)
    own, plain = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        expected = [harness.score(model, tokenizer, t, args.limit) for t in tasks]
        own.append(time.perf_counter() - started)
        started = time.perf_counter()
        read = score_all(model, tokenizer, tasks, args.limit)
        plain.append(time.perf_counter() - started)
    same = sum(a == b for a, b in zip(read, expected))
    items = sum(r["samples"] for r in read)
    print(f"{len(tasks)} tasks, {items} items, on {args.base.name}; median of {args.repeats} runs")
    print(f"  lm-eval's run of each  {statistics.median(own):6.1f} s")
    print(f"  read together          {statistics.median(plain):6.1f} s")
    print(f"  speed-up               {statistics.median(own) / statistics.median(plain):6.2f}x")
    print(f"  results the same, field by field: {same} of {len(tasks)}")


if __name__ == "__main__":
    main()
