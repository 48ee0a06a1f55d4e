"""The precheck on a lent GPU, measured once (issue 52): time, GPU memory and the cost line at 1.1B
and 7B shapes, and the CPU's per-item reads against the GPU's.

What it measures, on random-weight Llama-shaped models written to local disk in bf16 (a 1.1B shape,
``scale.SHAPE`` and ``scale.build``; a 7B shape, Llama-2-7B's: hidden 4096, MLP 11008, 32 layers, 32
heads, vocabulary 32000), each the base of three peft LoRA adapters (rank 8 on every layer's q_proj
and v_proj) with a 16-item multiple-choice probe each (random weights: the scores mean nothing,
only the times and the agreement count):

1. per size, a whole precheck on ``--device`` (cuda): its wall time, each phase's time beside the
   cost line's estimate for it (``api.precheck_cost``: ``.estimate``, ``.phases``, ``.line()``),
   ``torch.cuda.max_memory_allocated()`` and the process's peak RSS;
2. the 1.1B config in float32 on the CPU and on the GPU with the same small settings (``--limit``
   4, representations and selectivity skipped, ``--tune-budget 0``; fewer shots or items where
   the CPU's cost line says the run would pass ``--cpu-budget``): every per-item read (knowledge,
   dilution and the menu's candidates, as their diagnostics return them, and precheck.json's
   knowledge ``per_instance``) must agree to 1e-3; the largest difference, and PASS or FAIL.

Each part runs in a child process with a timeout, so a failed or slow part is recorded and the
rest goes on; nothing runs past ``--deadline`` seconds after the start (the shell script's, the
environment's set-up included). The 7B base is written in the background (two threads) while the
1.1B parts run, unless ``--serial``. Results: ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.txt``
(``$OUT``: default ./gpu-check-out), beside the compared and timed precheck.json files (seven
files: the device runner returns eight at most); the models under build/gpu-check (git-ignored,
``--work``; kept, so a rerun on the same machine skips writing them).

On one H100 (16 cores) the whole run should take about 6-8 min, and never more than the 8 min
deadline (estimates, nothing of it has run on a GPU yet): the environment 20-40 s; the 1.1B base
10-20 s; its precheck (bf16, 16 items, the default knob grid) 1-2.5 min, mostly model loads and the
CPU-built TIES merges of the menu and grid, its forward passes a few seconds; the CPU comparison
1-1.5 min (capped by its cost line at ``--cpu-budget`` 90 s) and the GPU's 20-40 s; the 7B precheck
(bf16, 16 items, ``--tune-budget 0``) 2-5 min, its base (40-70 s) written meanwhile. Each part pays
5-10 s of process start. Should the 7B menu's CPU merges outlast the deadline, the run is stopped
there and its finished phases, GPU peak so far and the phase it was in are kept.
docs/scale.md records its results once run.

    bash benchmarks/gpu_check.sh                # on the GPU machine: sets up the environment, then runs this
    python benchmarks/gpu_check.py [--sizes 1.1B,7B] [--limit 16] [--compare-limit 4] [--deadline 480] ...
    python benchmarks/gpu_check.py --tiny       # the same code path on tiny shapes, CPU only (2-5 min on 2 cores)

Every option has an environment variable (``GPU_CHECK_`` and its name: GPU_CHECK_SIZES=1.1B).
"""

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

SHAPE_7B = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32
)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
LLAMA = {"architectures": ["LlamaForCausalLM"]}  # config.json names it: mergekit plans the merge by it
# size -> (config.json's shape, decoder layers); "1.1B" is scale.SHAPE, filled in on import
SIZES = {
    "tiny": ({**TINY, **LLAMA}, 2),
    "tiny2": ({**TINY, **LLAMA, "num_key_value_heads": 4}, 3),  # --tiny's stand-in for the 7B: built in the background
    "7B": ({**SHAPE_7B, **LLAMA}, 32),
}
# per size, the timed run's --tune-budget unless given: the grid's merges are built on the CPU (at 7B, 64 tensors
# of 4096x4096 a candidate), left out at 7B to keep within the deadline
TUNE_DEFAULT = {"7B": 0, "tiny2": 0}
EXPERTS = 3
ITEMS = 16  # probe items per expert
RANK = 8
TARGETS = ("q_proj", "v_proj")
TOLERANCE = 1e-3
COMPARE_SKIP = ("representations", "selectivity")
RESERVE = 15  # seconds kept back from the deadline for writing the results
WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heath", "inlet", "juniper", "kelp", "lagoon"]


def stamp(t0: float) -> str:
    return f"[{time.strftime('%H:%M:%S')} +{time.time() - t0:5.0f}s]"


def say(t0: float, *words) -> None:
    print(stamp(t0), *words, flush=True)


# ---------------------------------------------------------------- the models, adapters, probes, config


@contextlib.contextmanager
def shaped_as(shape: dict):
    """scale.build with ``shape`` in place of its 1.1B SHAPE (it reads the module's global)."""
    import scale

    kept = scale.SHAPE
    scale.SHAPE = shape
    try:
        yield scale
    finally:
        scale.SHAPE = kept


def probe_lines(expert: int) -> list:
    """Expert ``expert``'s probe: ITEMS multiple-choice lines of its own; expert 1's asked as
    lettered options (its menu reads are then p_gold, not 0/1)."""
    lines = []
    for j in range(ITEMS):
        choices = [WORDS[(expert * 5 + j + k) % len(WORDS)] for k in range(3 + j % 2)]
        line = {"question": f"Set {expert}, item {j}: which word is {WORDS[j % len(WORDS)]}'s partner?"}
        line.update(choices=choices, label=j % len(choices))
        if expert == 1:
            line["format"] = "options"
        lines.append(line)
    return lines


def build(size: str, root: Path, t0: float) -> dict:
    """``root``/base (bf16 safetensors, one shard per layer, via scale.build), three LoRA adapters,
    their probes and the mergekit config naming each ``base+adapter``."""
    import torch
    import yaml

    from mergekit_mergeability.tiny import make_adapter

    shape, layers = SIZES[size]
    record = {"size": size, "layers": layers, "shape": shape}
    say(t0, f"{size}: writing the base ({layers} layers, hidden {shape['hidden_size']}, bf16) to {root} ...")
    started = time.perf_counter()
    with shaped_as(shape) as scale:
        base = scale.build(root / "models", layers, torch.bfloat16, experts=0)["base"]
    record["base_seconds"] = time.perf_counter() - started
    record["base_gib"] = sum(f.stat().st_size for f in base.glob("*.safetensors")) / 2**30
    parameters = record["base_gib"] * 2**30 / 2
    say(
        t0,
        f"{size}: base {record['base_gib']:.2f} GiB ({parameters / 1e9:.2f}B values) in {record['base_seconds']:.0f} s",
    )
    started = time.perf_counter()
    targets = [f"model.layers.{i}.self_attn.{name}.weight" for i in range(layers) for name in TARGETS]
    models = []
    for e in range(EXPERTS):
        adapter = make_adapter(base, root / f"adapter{e}", targets, rank=RANK, alpha=2.0 * RANK, seed=e + 1, scale=0.02)
        probe = root / f"probe{e}.jsonl"
        probe.write_text("".join(json.dumps(line) + "\n" for line in probe_lines(e)))
        models.append({"model": f"{base}+{adapter}", "probe": str(probe), "parameters": {"weight": 1.0}})
    config = root / "config.yml"
    document = {"merge_method": "task_arithmetic", "base_model": str(base), "models": models}
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    record.update(adapter_seconds=time.perf_counter() - started, config=str(config))
    return record


# ---------------------------------------------------------------- one precheck, timed phase by phase


class Phases:
    """Each diagnostic's run and the menu's rehearsal timed (as benchmarks/cost_line.py does), its
    per-item reads kept, and the record written to ``path`` after every phase (a run stopped at
    its timeout still tells how far it got)."""

    def __init__(self, record: dict, path: Path, device: str, t0: float):
        self.record, self.path, self.cuda, self.t0 = record, path, device.startswith("cuda"), t0
        record.setdefault("measured", {})
        record.setdefault("items", {})

    def timed(self, name: str, run, *args):
        import torch

        say(self.t0, f"  {self.record['label']}: {name} ...")
        self.record["running"] = {"phase": name, "since": time.time()}  # read where the run is stopped
        write(self.path, self.record)
        started = time.perf_counter()
        result = run(*args)
        if self.cuda:
            torch.cuda.synchronize()
            self.record["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30  # so far
        spent = time.perf_counter() - started
        self.record["measured"][name] = spent
        self.record.pop("running", None)
        items = getattr(result, "per_instance", None)
        if items:
            self.record["items"][name] = items
        say(self.t0, f"  {self.record['label']}: {name} {spent:.1f} s")
        write(self.path, self.record)
        return result

    @contextlib.contextmanager
    def installed(self):
        from mergekit_mergeability import menu, plugins

        phases, listed, rehearse = self, plugins.plugin_diagnostics, menu.rehearse

        class Timed:
            def __init__(self, diagnostic):
                self._diagnostic = diagnostic

            def __getattr__(self, name):
                return getattr(self._diagnostic, name)

            def run(self, inputs):
                return phases.timed(self._diagnostic.name, self._diagnostic.run, inputs)

        plugins.plugin_diagnostics = lambda *a, **k: [(plugin, Timed(d)) for plugin, d in listed(*a, **k)]
        menu.rehearse = lambda *args: phases.timed("menu", rehearse, *args)
        try:
            yield
        finally:
            plugins.plugin_diagnostics, menu.rehearse = listed, rehearse


def cost_of(config: str, settings) -> dict:
    from mergekit_mergeability import api

    started = time.perf_counter()
    cost = api.precheck_cost(config, settings=settings)
    return {
        "seconds": time.perf_counter() - started,
        "line": cost.line(),
        "by_phase": cost.by_phase(),
        "estimate": cost.estimate,
        "phases": cost.phases,
        "passes": cost.passes,
        "elsewhere": {d: c.estimate for d, c in cost.elsewhere.items()},
    }


def precheck(spec: dict, path: Path, t0: float) -> dict:
    """The cost line, then the precheck of ``spec['config']`` with ``spec['settings']``, timed; with
    ``spec['budget']``, fewer shots, then fewer items, until the cost line's estimate fits it."""
    import torch

    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = spec["settings"]["device"]
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 as float32: the comparison's 1e-3 needs it
        torch.backends.cudnn.allow_tf32 = False
        torch.cuda.reset_peak_memory_stats()
    settings = PrecheckSettings(**{k: tuple(v) if k == "skip" else v for k, v in spec["settings"].items()})
    record = {"label": spec["label"], "size": spec["size"], "threads": torch.get_num_threads(), "ok": False}
    say(t0, f"{spec['label']}: the cost line ...")
    record["cost"] = cost_of(spec["config"], settings)
    say(t0, f"{spec['label']}: {record['cost']['line']}")
    budget = spec.get("budget")
    if budget and (record["cost"]["estimate"] or 0) > budget:
        tries = [dataclasses.replace(settings, fewshot=0)]
        tries += [dataclasses.replace(settings, fewshot=0, limit=n) for n in (2, 1) if n < settings.limit]
        for smaller in tries:
            cost = cost_of(spec["config"], smaller)
            say(
                t0,
                f"{spec['label']}: over the {budget:.0f} s budget; fewshot {smaller.fewshot}, limit {smaller.limit}:",
            )
            say(t0, f"  {cost['line']}")
            record["cost"], settings = cost, smaller
            if (cost["estimate"] or 0) <= budget:
                break
        record["adapted"] = True
    record["settings"] = settings.to_json()
    if device.startswith("cuda"):
        record["gpu_peak_cost_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    out = Path(spec["out"])
    shutil.rmtree(out, ignore_errors=True)
    phases = Phases(record, path, device, t0)
    started = time.perf_counter()
    with phases.installed():
        api.precheck(spec["config"], settings=dataclasses.replace(settings, quiet=True), out=out)
    record["wall"] = time.perf_counter() - started
    if device.startswith("cuda"):
        record["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record["gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    record["rss_peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    record["precheck_json"] = str(out / "precheck.json")
    record["ok"] = True
    say(t0, f"{spec['label']}: precheck {record['wall']:.1f} s (the cost line said {fmt(record['cost']['estimate'])})")
    return record


# ---------------------------------------------------------------- comparing two runs' per-item reads


def numbers(value, where=""):
    """Every number (bools as such) of a JSON value, by where it sits."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from numbers(item, f"{where}[{i}]")
    elif isinstance(value, (bool, int, float)):
        yield where, value


def compare(a: dict, b: dict) -> dict:
    """Per-item reads of two precheck runs: the largest difference of the continuous ones, and
    the flips of the 0/1 ones (correct or not; a cloze item's menu read)."""
    sides = []
    for record in (a, b):
        report = json.loads(Path(record["precheck_json"]).read_text())
        knowledge = {m["path"]: (m.get("knowledge") or {}).get("per_instance") for m in report["models"]}
        sides.append({"items": record.get("items", {}), "precheck.json knowledge": knowledge})
    ours, theirs = (dict(numbers(side)) for side in sides)
    largest, flips, missing = (0.0, None), [], sorted(set(ours) ^ set(theirs))
    for key in sorted(set(ours) & set(theirs)):
        x, y = ours[key], theirs[key]
        if isinstance(x, bool) or isinstance(y, bool) or ({x, y} <= {0, 1} and x != y):
            if x != y:
                flips.append(key)
            continue
        if x != x and y != y:  # both NaN
            continue
        difference = abs(x - y)
        if not difference <= largest[0]:
            largest = (difference, key)
    passed = largest[0] <= TOLERANCE and not flips and not missing and bool(ours)
    return {
        "values": len(set(ours) & set(theirs)),
        "largest": largest[0],
        "largest_at": largest[1],
        "flips": flips[:20],
        "flip_count": len(flips),
        "missing": missing[:20],
        "tolerance": TOLERANCE,
        "passed": passed,
    }


# ---------------------------------------------------------------- the orchestrator


def write(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def fmt(seconds) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


class Run:
    def __init__(self, args):
        self.args, self.t0 = args, args.started
        self.deadline = args.started + args.deadline
        self.work, self.out = args.work, args.out
        self.results = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(args.started)), "steps": []}
        self.results["arguments"] = {k: str(v) for k, v in vars(args).items()}
        self.background = None

    def left(self) -> float:
        return self.deadline - RESERVE - time.time()

    def child(self, step: str, spec: dict, background: bool = False):
        path = self.work / "results" / f"{spec['label']}.json"
        path.unlink(missing_ok=True)
        command = [sys.executable, os.path.abspath(__file__), "--step", step, "--spec", json.dumps(spec)]
        command += ["--result", str(path), "--started", str(self.t0), "--work", str(self.work), "--out", str(self.out)]
        process = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if background:
            return process, path, time.time()
        overlapped = self.background is not None and self.background[1].poll() is None
        record = self.finish(step, spec, process, path, time.time())
        record["overlapped_background_build"] = overlapped  # its timings shared the cores with it
        return record

    def finish(self, step: str, spec: dict, process, path: Path, started: float) -> dict:
        timeout = max(1.0, self.left())
        try:
            rc = process.wait(timeout=timeout)
            error = None if rc == 0 else f"exit status {rc}"
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            rc, error = None, f"stopped at the deadline, after {time.time() - started:.0f} s"
        record = json.loads(path.read_text()) if path.is_file() else {}
        running = record.pop("running", None)
        if error and running:  # the phase it was in, and for how long
            record["stopped_in"] = {"phase": running["phase"], "after": time.time() - running["since"]}
            error += f", {running['phase']} running for {record['stopped_in']['after']:.0f} s"
        record.update(step=step, label=spec["label"], seconds=time.time() - started)
        if error and not record.get("error"):
            record["error"] = error
        record["ok"] = error is None and record.get("ok", False)
        self.results["steps"].append(record)
        if not record["ok"]:
            say(self.t0, f"FAILED {spec['label']}: {record.get('error')}")
        self.save()
        return record

    def save(self) -> None:
        self.results["seconds"] = time.time() - self.t0
        write(self.out / "gpu_check.json", self.results)

    def environment(self) -> None:
        import importlib.metadata as metadata

        import torch

        found = {"python": platform.python_version(), "cores": os.cpu_count(), "host": platform.node()}
        for name in ("torch", "transformers", "mergekit", "peft", "safetensors", "mergekit-mergeability"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                found[name] = metadata.version(name)
        found["cuda"] = torch.cuda.is_available()
        if found["cuda"]:
            found["gpu"] = torch.cuda.get_device_name(0)
            found["gpu_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        total, _, free = shutil.disk_usage(self.work)
        found.update(work=str(self.work), disk_free_gib=free / 2**30, disk_gib=total / 2**30)
        self.results["environment"] = found
        say(self.t0, "environment:", json.dumps(found))
        if self.args.device.startswith("cuda") and not found["cuda"]:
            say(self.t0, "no CUDA device here: the GPU parts will fail (--tiny runs on the CPU)")

    def settings(self, device: str, dtype: str, limit: int, **more) -> dict:
        return {"device": device, "dtype": dtype, "limit": limit, **more}

    def main(self) -> int:
        try:
            self.parts()
        except Exception as error:  # the orchestrator's own failure: recorded beside what was measured
            traceback.print_exc()
            self.results["steps"].append(
                {"label": "gpu_check", "ok": False, "error": f"{type(error).__name__}: {error}"}
            )
        if self.background and self.background[1].poll() is None:
            self.background[1].kill()
        self.save()
        table(self.results, self.out / "gpu_check.txt")
        print((self.out / "gpu_check.txt").read_text(), flush=True)
        say(self.t0, f"done: {self.out / 'gpu_check.json'}")
        failed = any(not s.get("ok") for s in self.results["steps"])
        return 1 if failed or not self.results.get("compare", {}).get("passed", True) else 0

    def parts(self) -> None:
        args = self.args
        say(
            self.t0,
            f"gpu_check: sizes {args.sizes}, comparison at {args.compare_size or '-'}; deadline {args.deadline} s",
        )
        self.environment()
        need = list(dict.fromkeys(([args.compare_size] if args.compare_size else []) + args.sizes))
        configs = {}  # size -> its config.yml, once built
        if need:
            configs.update(self.built([need[0]]))
        later = need[1:]
        if later and not args.serial:
            say(self.t0, f"writing {', '.join(later)} in the background (2 threads) meanwhile")
            spec = {"label": "build-" + "-".join(later), "sizes": later, "threads": 2}
            self.background = (spec, *self.child("build", spec, background=True))
        for size in need:
            if size not in configs:
                configs.update(self.built([size]))
            if not configs.get(size):
                say(self.t0, f"{size}: no models, its parts skipped")
                continue
            if size in args.sizes:
                self.timed(size, configs[size])
            if size == args.compare_size:
                self.comparison(size, configs[size])

    def built(self, sizes: list) -> dict:
        """Each size's config.yml (None where its build failed): the background build's, where it
        writes these sizes, else a build now."""
        if self.background is None or not set(sizes) & set(self.background[0]["sizes"]):
            record = self.child("build", {"label": "build-" + "-".join(sizes), "sizes": sizes})
        else:
            spec, process, path, started = self.background
            if process.poll() is None:
                say(self.t0, f"waiting for the background build of {', '.join(spec['sizes'])} ...")
            record = self.finish("build", spec, process, path, started)
            self.background, sizes = None, spec["sizes"]
        return {size: record.get("configs", {}).get(size) for size in sizes}

    def timed(self, size: str, config: str) -> None:
        args = self.args
        tune = args.tune_budget if args.tune_budget is not None else TUNE_DEFAULT.get(size)
        settings = self.settings(args.device, args.dtype, args.limit, tune_budget=tune)
        if self.left() < 30:
            return self.skip(f"precheck-{size}-{args.device}", "no time left before the deadline")
        label = f"precheck-{size}-{args.device}"
        out = self.work / size / label
        self.child("precheck", {"label": label, "size": size, "config": config, "settings": settings, "out": str(out)})
        self.keep(out / "precheck.json", f"{label}.json")

    def comparison(self, size: str, config: str) -> None:
        args = self.args
        first, second = args.compare_devices
        records = []
        for i, device in enumerate((first, second)):
            label = f"compare-{size}-{device}" + ("-2" if i and device == first else "")
            if self.left() < 30:
                return self.skip(label, "no time left before the deadline")
            if records:  # the second side asks exactly what the first one did
                kept = records[0]["settings"]
                settings = {k: kept[k] for k in ("dtype", "limit", "skip", "tune_budget", "fewshot")}
                settings["device"] = device
                budget, threads = None, None
            else:
                settings = self.settings(device, "float32", args.compare_limit, skip=list(COMPARE_SKIP), tune_budget=0)
                budget = min(args.cpu_budget, self.left() / 3) if device == "cpu" else None
                building = self.background is not None and self.background[1].poll() is None
                threads = max(1, (os.cpu_count() or 2) - 2) if building and device == "cpu" else None
            out = self.work / size / label
            spec = {"label": label, "size": size, "config": config, "settings": settings, "out": str(out)}
            record = self.child("precheck", {**spec, "budget": budget, "threads": threads})
            if not record.get("ok"):
                return
            records.append(record)
            self.keep(out / "precheck.json", f"{label}.json")
        result = compare(*records)
        result.update(size=size, devices=[first, second], settings=records[0]["settings"])
        self.results["compare"] = result
        verdict = "PASS" if result["passed"] else "FAIL"
        say(
            self.t0,
            f"compare {first} vs {second}: {result['values']} values, largest difference {result['largest']:.3g}"
            f" ({result['largest_at'] or '-'}), {result['flip_count']} flips: {verdict}",
        )
        self.save()

    def skip(self, label: str, why: str) -> None:
        say(self.t0, f"skipped {label}: {why}")
        self.results["steps"].append({"label": label, "ok": False, "error": f"skipped: {why}"})
        self.save()

    def keep(self, path: Path, name: str) -> None:
        if path.is_file():
            shutil.copyfile(path, self.out / name)


def table(results: dict, path: Path) -> None:
    """The short text table: environment, builds, timed prechecks by phase, the comparison."""
    env = results.get("environment", {})
    lines = [
        f"gpu_check {results['started']}, {results.get('seconds', 0):.0f} s in all; {env.get('gpu', 'no GPU')},"
        f" {env.get('cores')} cores; torch {env.get('torch')}, transformers {env.get('transformers')}",
        "",
    ]
    steps = results["steps"]
    for step in steps:
        if step.get("step") == "build":
            for size, record in step.get("builds", {}).items():
                lines.append(
                    f"build {size}: base {record['base_gib']:.2f} GiB in {record['base_seconds']:.0f} s,"
                    f" {EXPERTS} adapters in {record['adapter_seconds']:.1f} s"
                )
    lines.append("")
    header = f"{'run':28s} {'wall':>8s} {'estimate':>9s} {'ratio':>6s} {'GPU peak':>9s} {'RSS peak':>9s}  settings"
    lines.append(header)
    for step in steps:
        if step.get("step") != "precheck" or "cost" not in step:
            continue
        estimate, wall = step["cost"].get("estimate"), step.get("wall")
        ratio = f"{wall / estimate:5.2f}x" if wall and estimate else "     -"
        gpu = f"{step['gpu_peak_gib']:7.2f} G" if "gpu_peak_gib" in step else "        -"
        rss = f"{step['rss_peak_gib']:7.2f} G" if "rss_peak_gib" in step else "        -"
        s = step.get("settings", {})
        said = f"{s.get('dtype')} limit {s.get('limit')} fewshot {s.get('fewshot')} tune {s.get('tune_budget', '-')}"
        said = said.replace("tune None", "tune default")
        said += f" skip {','.join(s.get('skip') or []) or '-'}" + ("" if step.get("ok") else f"  [{step.get('error')}]")
        said += " (beside the background build)" if step.get("overlapped_background_build") else ""
        lines.append(f"{step['label']:28s} {fmt(wall):>8s} {fmt(estimate):>9s} {ratio} {gpu} {rss}  {said}")
        lines.append(f"  cost line: {step['cost'].get('line')}")
        for name, seconds in step.get("measured", {}).items():
            guess = step["cost"].get("phases", {}).get(name)
            passes = step["cost"].get("passes", {}).get(name)
            counted = f"{passes:,} passes" if passes else "not counted"
            lines.append(f"  {name:26s} {fmt(seconds):>8s} {fmt(guess):>9s}  {counted}")
        if step.get("stopped_in"):
            name, after = step["stopped_in"]["phase"], step["stopped_in"]["after"]
            guess = step["cost"].get("phases", {}).get(name)
            lines.append(f"  {name:26s} >{after:6.1f} s {fmt(guess):>9s}  stopped at the deadline")
    compared = results.get("compare")
    lines.append("")
    if compared:
        verdict = "PASS" if compared["passed"] else "FAIL"
        lines.append(
            f"compare {compared['size']} {' vs '.join(compared['devices'])}, float32: {compared['values']} per-item values;"
            f" largest difference {compared['largest']:.3g} (tolerance {compared['tolerance']:g}) at {compared['largest_at'] or '-'};"
            f" {compared['flip_count']} flips, {len(compared['missing'])} unmatched: {verdict}"
        )
    else:
        lines.append("compare: not run")
    failed = [f"{s['label']}: {s.get('error')}" for s in steps if not s.get("ok")]
    lines += ["", "failures: " + ("; ".join(failed) if failed else "none")]
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- entry points


def step(args) -> None:
    """One part, in this (child) process: its record to ``--result``, an error recorded too."""
    spec = json.loads(args.spec)
    record = {"label": spec["label"], "ok": False}
    try:
        if args.step == "build":
            import torch

            if spec.get("threads"):
                torch.set_num_threads(spec["threads"])
            sizes = spec["sizes"]
            record.update(builds={}, configs={})
            for size in sizes:
                built = build(size, args.work / size, args.started)
                record["builds"][size] = built
                record["configs"][size] = built["config"]
                write(args.result, record)
            record["ok"] = True
        else:
            record = precheck(spec, args.result, args.started)
    except Exception as error:  # recorded, and the next part goes on
        traceback.print_exc()
        record.update(ok=False, error=f"{type(error).__name__}: {error}"[:2000])
    write(args.result, record)
    sys.exit(0 if record.get("ok") else 1)


def parser() -> argparse.ArgumentParser:
    def env(name: str, default):
        return os.environ.get(f"GPU_CHECK_{name.upper()}", default)

    def listed(text: str) -> list:
        return [s for s in text.split(",") if s]

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (both sides cpu): tests the script")
    p.add_argument("--sizes", type=listed, default=env("sizes", None), help="timed precheck sizes (1.1B,7B)")
    p.add_argument("--compare-size", default=env("compare_size", None), help="the compared config's size (1.1B)")
    p.add_argument("--device", default=env("device", None), help="where the timed prechecks run (cuda)")
    p.add_argument("--compare-devices", type=listed, default=env("compare_devices", None), help="cpu,cuda")
    p.add_argument("--dtype", default=env("dtype", "bfloat16"), help="the timed prechecks' dtype")
    p.add_argument("--limit", type=int, default=int(env("limit", ITEMS)), help="probe items per expert, timed runs")
    p.add_argument("--compare-limit", type=int, default=int(env("compare_limit", 4)))
    p.add_argument("--tune-budget", type=int, default=env("tune_budget", None), help="timed runs (default: 0 at 7B)")
    p.add_argument(
        "--cpu-budget", type=float, default=float(env("cpu_budget", 90)), help="the CPU side's estimate cap, s"
    )
    p.add_argument("--deadline", type=float, default=float(env("deadline", 480)), help="seconds after --started")
    p.add_argument("--serial", action="store_true", default=bool(env("serial", "")), help="no background build")
    p.add_argument("--work", type=Path, default=env("work", None), help="where models are written (kept for reruns)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    p.add_argument("--started", type=float, default=time.time(), help="the start the deadline counts from (epoch)")
    p.add_argument("--step", choices=["build", "precheck"], help=argparse.SUPPRESS)  # a child's part
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    if args.tune_budget is not None:
        args.tune_budget = int(args.tune_budget)
    tiny = args.tiny
    args.sizes = args.sizes if args.sizes is not None else (["tiny", "tiny2"] if tiny else ["1.1B", "7B"])
    args.compare_size = (args.compare_size if args.compare_size is not None else ("tiny" if tiny else "1.1B")) or None
    args.device = args.device or ("cpu" if tiny else "cuda")
    args.compare_devices = args.compare_devices or (["cpu", "cpu"] if tiny else ["cpu", "cuda"])
    # build/ is git-ignored, and on the checkout's disk (the GPU machine's 64 GiB; /tmp may be smaller)
    default_work = Path(__file__).resolve().parent.parent / "build" / ("gpu-check-tiny" if tiny else "gpu-check")
    args.work = Path(args.work or default_work).resolve()
    args.out = args.out.resolve()
    if args.step:
        return step(args)
    unknown = [s for s in [*args.sizes, args.compare_size] if s and s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown sizes {unknown}; known: {', '.join(SIZES)}")
    if len(args.compare_devices) != 2:
        raise SystemExit("--compare-devices: two devices, comma-separated (cpu,cuda)")
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(Run(args).main())


sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale.py and its neighbours
SIZES["1.1B"] = ({**__import__("scale").SHAPE, **LLAMA}, 22)

if __name__ == "__main__":
    main()
