"""The precheck at real size: base + 3 experts shaped like a 1.1B Llama (22 layers, hidden 2048,
MLP 5632, vocabulary 32000), stored in bf16 (or --dtype float32), against reading their files once.

1. Weight pass (task-vector statistics) vs reading every model's safetensors bytes once, from
   the page cache (both warmed first; the median of --repeats, alternating). Target <= 1.5x.
2. Peak anonymous memory (RssAnon, sampled; file-backed mmap pages excluded) of a whole precheck
   with probes (--dtype auto: the checkpoints' own bf16), in a fresh process, against one model's
   size on disk. Models are loaded one at a time, so the target is <= 1.3x one model.

    python benchmarks/scale.py [--layers 22] [--dtype bfloat16] [--repeats 3] [--threads N] [--work DIR] [--skip D]

--threads sets torch's intra-op threads (default: torch's own, one per core). On cores other
jobs share, one thread is faster: every parallel region waits for the thread that was preempted.

It writes the whole precheck's config as DIR/llama-*/precheck.yml (``cost_line.py --config`` reads it).
Experts are the base plus seeded noise on every matrix (a full fine-tune, the weight pass's
worst case). Building the four models writes ~8.8 GB (bf16) to --work; keep it to rerun.
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
import yaml
from safetensors.torch import save_file

from _models import workdir
from precheck import PeakMemory, read_files, weight_pass
from mergekit_mergeability.tiny import train_tokenizer

SHAPE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4)
LINES = 16  # probe lines per model


def tensor_shapes(config: transformers.LlamaConfig):
    h, m, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    yield "model.embed_tokens.weight", (v, h)
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        yield f"{layer}.input_layernorm.weight", (h,)
        yield f"{layer}.post_attention_layernorm.weight", (h,)
        for name, shape in (("q", (h, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, h))):
            yield f"{layer}.self_attn.{name}_proj.weight", shape
        for name, shape in (("gate", (m, h)), ("up", (m, h)), ("down", (h, m))):
            yield f"{layer}.mlp.{name}_proj.weight", shape
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def build(root: Path, layers: int, dtype: torch.dtype, experts: int = 3) -> dict:
    """base + experts as Hugging Face folders, one shard per decoder layer (memory: one layer)."""
    config = transformers.LlamaConfig(num_hidden_layers=layers, tie_word_embeddings=False, **SHAPE)
    config.torch_dtype = dtype
    names = ["base", *(f"expert{i}" for i in range(experts))]
    paths = {name: root / name for name in names}
    if all((p / "model.safetensors.index.json").is_file() for p in paths.values()):
        return paths
    tokenizer = train_tokenizer()
    groups = {}
    for name, shape in tensor_shapes(config):
        key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(key, []).append((name, shape))
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(p)
        tokenizer.save_pretrained(p)
    weight_map = {}
    for g, (key, members) in enumerate(groups.items()):
        generator = torch.Generator().manual_seed(g)
        base = {n: (torch.randn(s, generator=generator) * 0.02).to(dtype) for n, s in members}
        shard = f"model-{g + 1:05d}-of-{len(groups):05d}.safetensors"
        for i, name in enumerate(names):
            noise = torch.Generator().manual_seed(1000 * (i + 1) + g)
            tensors = {
                n: (t if name == "base" else (t.float() + torch.randn(t.shape, generator=noise) * 2e-4).to(dtype))
                for n, t in base.items()
            }
            save_file(tensors, str(paths[name] / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n, _ in members})
    for p in paths.values():
        (p / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return paths


def probes(root: Path) -> Path:
    lines = [
        {"question": f"Fact {i}: which of these comes first?", "choices": ["alpha", "beta", "gamma"], "label": i % 3}
        for i in range(LINES)
    ]
    path = root / "probe.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def document(paths: dict, probe: Path) -> dict:
    """The config of the whole precheck: the experts' task_arithmetic merge, each with the probe."""
    models = [
        {"model": str(p), "probe": str(probe), "parameters": {"weight": 1.0}} for n, p in paths.items() if n != "base"
    ]
    return {"merge_method": "task_arithmetic", "base_model": str(paths["base"]), "models": models}


def whole_precheck(paths: dict, probe: Path, out: Path, skip=()) -> None:
    from mergekit_mergeability import api, merge_config
    from mergekit_mergeability.settings import PrecheckSettings

    spec = merge_config.from_document(document(paths, probe), out.parent)
    api.precheck(spec, settings=PrecheckSettings(device="cpu", quiet=True, limit=LINES, skip=tuple(skip)), out=out)


def phased(peak: PeakMemory) -> None:
    """Record each part of the precheck as a phase of ``peak``: loading, planning, every
    diagnostic, the decision, the report; within the rehearsal, its loading and each merge it
    builds (held while its probes are asked), and each walk of the rehearsal."""
    from mergekit_mergeability import measuring, menu
    from mergekit_mergeability.diagnostics import dilution, fluency
    from mergekit_mergeability.output import precheck_report
    from mergekit_mergeability.plugins import plugin_diagnostics

    def wrap(owner, attribute: str, label=lambda args: "") -> None:
        inner = getattr(owner, attribute)

        def run(*args, **kwargs):
            with peak.phase(label(args) or attribute):
                return inner(*args, **kwargs)

        setattr(owner, attribute, run)

    def wrap_context(owner, attribute: str) -> None:
        inner = getattr(owner, attribute)

        @contextlib.contextmanager
        def run(*args, **kwargs):
            with peak.phase(attribute), inner(*args, **kwargs) as value:
                yield value

        setattr(owner, attribute, run)

    for owner, attribute in (
        (measuring, "load_inputs"),
        (measuring, "plan"),
        (measuring, "decision"),
        (precheck_report, "build"),
        (precheck_report, "write"),
        (dilution, "load_causal_lm"),
        (dilution, "summed"),
    ):
        wrap(owner, attribute)
    for owner in (dilution, fluency, menu):  # every merge the rehearsal builds, block by block
        wrap(owner, "walk", lambda args, owner=owner: f"{owner.__name__.split('.')[-1]}: walk")
    for _, diagnostic in plugin_diagnostics():
        wrap(type(diagnostic), "run", lambda args: args[0].name)
    wrap_context(dilution, "mixed")


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's choice)")
    parser.add_argument(
        "--skip", action="append", default=[], help="a diagnostic the whole precheck leaves out (repeatable)"
    )
    parser.add_argument("--memory-of", type=Path, help=argparse.SUPPRESS)  # internal: a fresh process per measurement
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        paths = {p.name: p for p in sorted(args.memory_of.iterdir()) if (p / "config.json").is_file()}
        with PeakMemory() as peak:
            phased(peak)
            whole_precheck(paths, probes(args.memory_of), args.memory_of / "precheck-out", args.skip)
        print(json.dumps(peak.phases))
        print(peak.growth)
        return
    with workdir(args.work, "mm-bench-scale-") as work:
        root = work / f"llama-{args.layers}l-{args.dtype}"
        started = time.perf_counter()
        paths = build(root, args.layers, getattr(torch, args.dtype))
        size = sum(f.stat().st_size for f in paths["base"].glob("*.safetensors")) / 2**30
        (root / "precheck.yml").write_text(yaml.safe_dump(document(paths, probes(root))))  # for cost_line.py --config
        print(
            f"base + 3 experts, {args.layers} layers, {args.dtype}: {size:.2f} GiB each ({time.perf_counter() - started:.0f} s to build);"
            f" {torch.get_num_threads()} torch thread(s)"
        )
        read_files(paths), weight_pass(paths)  # warm: the page cache, torch's kernels
        times = {"read": [], "weights": []}
        for _ in range(args.repeats):
            for name, run in (("read", lambda: read_files(paths)), ("weights", lambda: weight_pass(paths))):
                begun = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - begun)
        t = {name: statistics.median(v) for name, v in times.items()}
        print(
            f"1. weight pass {t['weights']:.1f} s vs reading the files once {t['read']:.1f} s: {t['weights'] / t['read']:.2f}x (target <= 1.5x)"
        )
        done = subprocess.run(
            [sys.executable, __file__, "--memory-of", str(root), *(f"--skip={d}" for d in args.skip)],
            capture_output=True,
            text=True,
            check=True,
        )
        *_, phases, growth = done.stdout.splitlines()
        growth = float(growth) / 1024
        print(
            f"2. whole precheck with {LINES} probe lines per model (--dtype auto): peak anonymous memory {growth:.2f} GiB = {growth / size:.2f}x one model (target <= 1.3x)"
        )
        print("   by phase, GiB above the start (start, peak, end):")
        for label, depth, *mib in json.loads(phases):
            print(
                f"   {'  ' * depth + label:<20}"
                + "".join(f"{m / 1024:7.2f}" for m in mib)
                + f"  peak {mib[1] / 1024 / size:.2f}x"
            )


if __name__ == "__main__":
    main()
