"""The menu's rehearsal streamed block by block (``rehearsal.stream.walk``) against the same
candidates each built whole and asked in turn (the rehearsal before it streamed), in one process.

Three full fine-tunes of a Llama shape (every tensor changed: the base plus seeded noise), ``--blocks``
blocks deep, stored in bfloat16 and read in float32 as the precheck reads them on a CPU; each with a
probe of ``--items`` multiple-choice items whose options run several tokens (a prompt pass and an
options pass); the menu's candidates as the precheck plans them (the config as written, the mean
merge, TIES, DARE-TIES, knowledge_weighted, then the knob grid). Prints each side's seconds building
merges and in all, the bytes each read from the models' files, the ratios, and the largest
difference between the two sides' reads (float32). Both sides' files sit in the page cache after
their first read here; where a model's files are larger than memory (7B and up), each byte read is
a byte from disk.

    python benchmarks/rehearsal.py [--shape 1.1B] [--blocks 4] [--items 16] [--candidates 15] [--work DIR]
"""

import argparse
import json
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import transformers
import yaml

from _models import workdir
from sizes import SHAPES

from mergekit_mergeability import tasks
from mergekit_mergeability.decide.tuning import PRUNED_AT, candidates
from mergekit_mergeability.diagnostics.knowledge import as_read
from mergekit_mergeability.rehearsal import planned
from mergekit_mergeability.rehearsal.shared_layers import shared_below
from mergekit_mergeability.rehearsal.stream import Job, as_planned, walk
from mergekit_mergeability.sources import load_causal_lm, patched, tensors
from mergekit_mergeability.tiny import CORPUS, train_tokenizer

OPTIONS = ["the cat sat on it", "a dog ran far away", "on the mat", "over the lazy dog"]


def build(root: Path, shape: dict, blocks: int, items: int) -> Path:
    """Base, three full fine-tunes and their probes under ``root``; the config (task_arithmetic)."""
    if (root / "config.yml").is_file():
        return root / "config.yml"
    tokenizer = train_tokenizer()
    config = transformers.LlamaConfig(**{**shape, "num_hidden_layers": blocks})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    models = []
    for name in ("base", "expert0", "expert1", "expert2"):
        if name != "base":
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p), alpha=0.01)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        models.append(str(root / name))
    document = {"merge_method": "task_arithmetic", "base_model": models[0], "models": []}
    for i, path in enumerate(models[1:]):
        probe = root / f"probe{i}.jsonl"
        lines = [
            {"question": f"{CORPUS[k % len(CORPUS)]} Item {k} of {i}?", "choices": OPTIONS, "label": (k + i) % 4}
            for k in range(items)
        ]
        probe.write_text("".join(json.dumps(line) + "\n" for line in lines))
        document["models"].append({"model": path, "parameters": {"weight": 1 / 3}, "probe": str(probe)})
    (root / "config.yml").write_text(yaml.safe_dump(document, sort_keys=False))
    return root / "config.yml"


@contextmanager
def counted(read: list):
    """The bytes of every tensor read from the models' files while in it, added to ``read[0]``."""
    from mergekit_mergeability.sources.folder import TensorReader

    own = TensorReader.__getitem__

    def getitem(self, name):
        tensor = own(self, name)
        read[0] += tensor.numel() * tensor.element_size()
        return tensor

    TensorReader.__getitem__ = getitem
    try:
        yield
    finally:
        TensorReader.__getitem__ = own


@contextmanager
def building(seconds: list):
    """``planned.merged`` timed while in it: the seconds spent merging tensors, added to ``seconds[0]``."""
    merged = planned.merged

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return merged(*args, **kwargs)
        finally:
            seconds[0] += time.perf_counter() - started

    planned.merged = timed
    try:
        yield
    finally:
        planned.merged = merged


def whole(module, tokenizer, plans, paths, names, probes):
    """Each candidate built whole, every touched tensor, then each probe asked on it: the rehearsal before."""
    readers = {p: tensors(p) for p in paths}
    read = lambda model, name: readers[model][name] if name in readers[model].index else None  # noqa: E731
    found = []
    for plan in plans.values():
        with torch.no_grad(), patched(module, {n: planned.merged(plan[n], read) for n in names}):
            found += [as_read(module, tokenizer, probe) for probe in probes]
    return found


def streamed(module, tokenizer, plans, paths, names, probes):
    jobs = [Job(name, partial(as_read, module, tokenizer, probe)) for name in plans for probe in probes]
    return walk(module, [as_planned(n, p) for n, p in plans.items()], jobs, paths, names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1.1B", choices=sorted(SHAPES))
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--candidates", type=int, default=15, help="the config as written and this many more, at most")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    with workdir(args.work, "rehearsal-") as root:
        config = build(root, SHAPES[args.shape], args.blocks, args.items)
        document = yaml.safe_load(config.read_text())
        paths = [document["base_model"], *(m["model"] for m in document["models"])]
        probes = [tasks.load(m["probe"]) for m in document["models"]]
        knowledge = {m["model"]: 0.5 for m in document["models"]}
        menu = {n: c.advice.config for n, c in candidates(document, knowledge).items()}
        configs = {"as written": document, **dict(list(menu.items())[: args.candidates])}
        plans = {n: planned.plan(c, config) for n, c in configs.items()}
        module, tokenizer = load_causal_lm(paths[0], "cpu", "float32")
        names = {n for n, _ in module.named_parameters()}
        print(
            f"{args.shape} shape, {args.blocks} blocks, 3 full fine-tunes, {len(plans)} candidates, {args.items} items"
        )
        timings, reads, read = {}, {}, {}
        for side, rehearse in (("built whole", whole), ("streamed", streamed)):
            seconds, read[side] = [0.0], [0]
            planned._masks.clear()  # each side sorts its own updates
            planned._kept[0] = 0
            started = time.perf_counter()
            with (
                counted(read[side]),
                building(seconds),
                shared_below(module, names),
                planned.sorted_together(PRUNED_AT),
            ):
                reads[side] = rehearse(module, tokenizer, plans, paths, names, probes)
            timings[side] = (seconds[0], time.perf_counter() - started)
            print(
                f"  {side:>11s}: building {timings[side][0]:7.1f} s, in all {timings[side][1]:7.1f} s,"
                f" {read[side][0] / 2**30:6.2f} GiB read"
            )
        (b0, t0), (b1, t1) = timings["built whole"], timings["streamed"]
        gap = max(abs(x - y) for a, b in zip(reads["built whole"], reads["streamed"]) for x, y in zip(a, b))
        fewer = read["built whole"][0] / read["streamed"][0]
        print(
            f"  streamed: building {b0 / b1:.2f}x faster, in all {t0 / t1:.2f}x, {fewer:.1f}x fewer bytes read;"
            f" largest difference of a read {gap:.1e}"
        )


if __name__ == "__main__":
    main()
