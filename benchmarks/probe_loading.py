"""What an lm-eval task probe costs against a JSONL probe of the same items, as the precheck loads them.

A config of --experts tiny models, every one probed with the same task: once as a JSONL file of
--items multiple-choice lines, once as an lm-eval task YAML over the same lines (a ``json``
dataset). Each side loads every model's probe through ``measure.load_inputs``, as a fresh
precheck run does (the package's memo of built tasks cleared before each run; lm-eval's and
datasets' disk caches warmed once, untimed, as any second run finds them). The instances of the
two sides must be the same questions and options. Prints the median of --repeats runs, alternating.

``--precheck``: the whole precheck instead, every model probed with its own task (its own folder,
``--shots`` few-shot examples from the task's own lines) against JSONL lines of the same items
declared ``"format": "options", "shots": K``, as issue 21 measured a 23-model pool.

    python benchmarks/probe_loading.py [--experts 4] [--items 64] [--repeats 3] [--work DIR]
    python benchmarks/probe_loading.py --precheck --experts 23 --items 4 --shots 3

Measured on 2 busy CPU cores (4 models, 64 items, medians): before the memo, every model built the
task again and lm-eval compiled its Jinja templates once per document: 281 ms against JSONL's
6.5 ms (43x). Each distinct task built once, its templates compiled once: 13 ms against 3.0 ms (4.4x).

Whole prechecks (2026-12-01, 2 cores shared with a pool build, one run each after a warm-up pair):
23 models, each its own 4-item task, 0-shot (the same cloze prompts on both sides): lm-eval 72.5 s
against JSONL 71.1 s (1.02x). 3-shot: 44.0 s against 141.9 s (0.31x), but there the two sides ask
different prompts (the JSONL lines as options, listed and lettered; the task cloze with three shots).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import yaml

from _models import workdir
from mergekit_mergeability import api, merge_config
from mergekit_mergeability.measuring import load_inputs
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tasks import lmeval
from mergekit_mergeability.tiny import make_family


def write_probes(root: Path, items: int, name: str = "facts", shots: int = 0):
    """A JSONL probe and an lm-eval task over the same lines; with ``shots``, both few-shot
    (the JSONL lines as ``options``, the task with ``num_fewshot``)."""
    rows = [
        {"question": f"Fact {name} {i}: which word comes first?", "choices": ["alpha", "beta", "gamma"], "label": i % 3}
        for i in range(items)
    ]
    lines = [{**r, "format": "options", "shots": shots} if shots else r for r in rows]
    jsonl = root / f"{name}.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in lines))
    task = root / "tasks" / name / f"{name}.yaml"
    task.parent.mkdir(parents=True, exist_ok=True)
    (task.parent / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fewshot = {"fewshot_split": "test", "num_fewshot": shots} if shots else {}
    task.write_text(
        yaml.safe_dump(
            {
                "task": f"probe_loading_{name}",
                "dataset_path": "json",
                "dataset_kwargs": {"data_files": {"test": str(task.parent / "docs.jsonl")}},
                "test_split": "test",
                **fewshot,
                "output_type": "multiple_choice",
                "doc_to_text": "{{question}}\nAnswer:",
                "doc_to_choice": "{{choices}}",
                "doc_to_target": "{{label}}",
                "metric_list": [{"metric": "acc"}],
            },
            sort_keys=False,
        )
    )
    return jsonl, task


def spec_for(family: dict, probes_of) -> merge_config.MergeSpec:
    """The merge of ``family``'s experts, each probed with ``probes_of(expert)``."""
    models = [
        {"model": str(path), "probe": str(probes_of(name)), "parameters": {"weight": 1.0}}
        for name, path in family.items()
        if name != "base"
    ]
    return merge_config.from_document(
        {"merge_method": "task_arithmetic", "base_model": str(family["base"]), "models": models}, Path.cwd()
    )


def load(spec: merge_config.MergeSpec, limit: int):
    getattr(lmeval, "_built", {}).clear()  # a fresh precheck: nothing built yet in this process
    started = time.perf_counter()
    _, models = load_inputs(spec, spec.probes, limit)
    return time.perf_counter() - started, models


def whole_precheck(spec: merge_config.MergeSpec, out: Path, limit: int) -> float:
    getattr(lmeval, "_built", {}).clear()
    started = time.perf_counter()
    api.precheck(spec, settings=PrecheckSettings(device="cpu", quiet=True, limit=limit), out=out)
    return time.perf_counter() - started


def report(times: dict, what: str) -> None:
    median = {side: statistics.median(t) for side, t in times.items()}
    print(what)
    for side, seconds in median.items():
        print(
            f"  {side:8} probes: {seconds * 1000:8.1f} ms  (runs: {', '.join(f'{t * 1000:.1f}' for t in times[side])})"
        )
    print(f"ratio lm-eval / jsonl: {median['lm-eval'] / median['jsonl']:.1f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--precheck", action="store_true", help="time whole prechecks, one task per model")
    parser.add_argument("--shots", type=int, default=3, help="with --precheck: few-shot examples per question")
    args = parser.parse_args()
    with workdir(args.work, "probe-loading-") as root:
        family = make_family(root / "models", "llama", experts=args.experts)
        if args.precheck:
            own = {name: write_probes(root, args.items, name, args.shots) for name in family if name != "base"}
            specs = {"jsonl": spec_for(family, lambda n: own[n][0]), "lm-eval": spec_for(family, lambda n: own[n][1])}
            times = {side: [] for side in specs}
            for repeat in range(args.repeats + 1):  # the first pair warms the caches, untimed
                for side, spec in specs.items():
                    seconds = whole_precheck(spec, root / f"out-{side}", args.items)
                    if repeat:
                        times[side].append(seconds)
            report(
                times,
                f"whole precheck: {args.experts} models, each with its own {args.items}-item probe, {args.shots}-shot",
            )
            return
        jsonl, task = write_probes(root, args.items)
        specs = {"jsonl": spec_for(family, lambda _: jsonl), "lm-eval": spec_for(family, lambda _: task)}
        _, jsonl_models = load(specs["jsonl"], args.items)  # warm-up: lm-eval's task index, the datasets cache
        _, task_models = load(specs["lm-eval"], args.items)
        asked = lambda models: [[(i.prompt, i.continuations, i.label) for i in m.probes] for m in models]  # noqa: E731
        assert asked(jsonl_models) == asked(task_models), "the two probes must be the same items"
        times = {side: [] for side in specs}
        for _ in range(args.repeats):
            for side, spec in specs.items():
                times[side].append(load(spec, args.items)[0])
        report(times, f"{args.experts} models, each probed with the same {args.items} items")


if __name__ == "__main__":
    main()
