"""The precheck's method menu and knob grid against what a user does without it: merge every
candidate with mergekit and score each merge with lm-eval. Same config, same candidates, one run.

(1) The precheck (``api.precheck``, representations and selectivity skipped) rehearses the config
as written, the menu and the knob grid at its default ``--tune-budget``, each merge built in memory
and every member's probe asked on it (``recommendation.method_choice.per_model``).
(2) Without it, over the same candidates (the config as written and every one the precheck
rehearsed, ``decide.tuning.candidates``): each written to disk exactly as rehearsed (model paths
absolute, ``probe:`` keys removed), merged with ``mergekit.merge.run_merge`` as ``mergekit-yaml``
does, and every member's task scored on it with ``lm_eval.simple_evaluate`` (model ``hf``, device
cpu, batch size 16); plus lm-eval on the base and on each expert alone, as a user would. lm-eval's
machine description (``add_env_info``: ``pip list`` and more, ~2 s a call) is skipped, as the
project's harness skips it, so side (2) is timed at its fastest and the ratio is a lower bound.

Both sides read the same items with lm-eval's metric: each member's JSONL probe (as the precheck
renders it, shots included) is written as an lm-eval multiple-choice task YAML (acc, the choices
exactly as the precheck scores them) and the precheck is given that YAML as ``probe:``; a probe
that is already a task YAML is used as is. Checked: per candidate and member, the precheck's
score against lm-eval's score of that candidate's written merge; equal for the deterministic
methods (task_arithmetic, ties, knowledge_weighted). DARE draws its mask anew in mergekit (the
rehearsal draws with its own seed), so dare_ties's difference is reported apart. Printed: a table,
the seconds of each side and their ratio (merge-then-evaluate / precheck).

Why not mergekit-evolve as side (2): it is the tool that merges candidates and scores them with
lm-eval, but in the installed mergekit 0.1.5 it never evaluates anything on a CPU-only machine.
Every Ray actor and task it runs asks for a whole GPU:

- ``mergekit/evo/actors.py`` line 78, ``@ray.remote(num_cpus=1, num_gpus=1.0)`` on
  ``OnDiskMergeEvaluator``, and line 124, ``@ray.remote(num_cpus=1, num_gpus=1)`` on
  ``InMemoryMergeEvaluator`` (the ``pool`` strategy's actors);
- ``mergekit/evo/helpers.py`` line 92, ``evaluate_model_ray = ray.remote(num_cpus=1,
  num_gpus=1.0)(evaluate_model)``, and lines 113-115, ``merge_model_ray = ray.remote(num_cpus=1,
  num_gpus=1, ...)(merge_model)`` (the ``buffered`` and ``serial`` strategies' tasks);

and ``mergekit/evo/strategy.py`` sizes its worker pool from the accelerator count: lines 40-42
(``EvaluationStrategyBase``) and 123-125 (``BufferedRayEvaluationStrategyActor``), ``self.num_gpus
= num_gpus or get_torch_accelerator_count(self.merge_options.device)``; line 89 builds the actor pool
``for _ in range(self.num_gpus)``, lines 147 and 158 keep at most ``self.num_gpus`` merges and
evaluations in flight, and line 253 (``serial``) reserves ``ray.util.placement_group([{"CPU": 1,
"GPU": 1}], strategy="STRICT_PACK")``. On a CPU-only machine ``MergeOptions`` sets device ``cpu``
(``mergekit/options.py`` lines 75-79) and ``get_torch_accelerator_count("cpu")`` is
``torch.cpu.device_count()``, 1 (``mergekit/common.py`` line 400): one worker, which asks Ray for a
GPU the cluster does not have, so Ray never schedules it and no evaluation runs (checked on this
2-core machine with ray 2.60: ``ray.init(num_cpus=1)`` lists no GPU, and a task declared
``ray.remote(num_cpus=1, num_gpus=1.0)`` was still unscheduled after 15 s). Past that, on this
machine it stops at three more places (lm-eval 0.4.13 without vLLM, ``torch.cpu.empty_cache``,
lm-eval's cuda default): ``vs_evolve.py`` runs it with a shim for each and compares it directly.

    python benchmarks/vs_merge_then_evaluate.py --tiny                 # tiny local models, under a minute
    python benchmarks/vs_merge_then_evaluate.py [--config CONFIG.yml] [--work DIR] [--limit N] [--tune-budget N]
    python benchmarks/vs_merge_then_evaluate.py --shape 1.1B [--work DIR] [--tune-budget N] [--dtype auto]   # random weights

The default config is the `tuning` family's first three-expert draw as task_arithmetic
(``python research/run.py tuning measure`` writes it); its probes are JSONL "options" probes.
Run it with the machine quiet: both sides are timed. On ``--tiny`` models a merge and an lm-eval
run take a fraction of a second, so the precheck's fixed passes (knowledge, dilution, fluency,
weights) dominate and the ratio says nothing about real models; ``--tiny`` checks the equality and
the mechanics.
"""

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path
from dataclasses import replace
from typing import Dict, List, Optional
from unittest import mock

import yaml
from rich.console import Console
from rich.table import Table

from _models import workdir

from mergekit_mergeability.tasks.lmeval import write_task

DEFAULT = Path("pools-out/tuning/configs/n3_0_task_arithmetic.yml")
DETERMINISTIC = ("task_arithmetic", "ties", "knowledge_weighted")
DRAWN = ("dare_ties", "dare_linear", "della", "della_linear")  # mergekit draws their masks anew
TOLERANCE = 1e-9
console = Console(width=160)


# Both sides ask the same lm-eval tasks --------------------------------------------------------------


def asked_as_tasks(config: Path, work: Path):
    """The config with every member's probe an lm-eval task YAML and its model paths absolute,
    written to ``work/config.yml``; returns (that path, member -> task name, lm-eval include paths)."""
    from mergekit_mergeability import merge_config, tasks
    from mergekit_mergeability.tasks import lmeval
    from mergekit_mergeability.tasks.probes import MULTIPLE_CHOICE

    spec = merge_config.read(config)
    missing = [m for m in spec.models if m not in spec.probes]
    if missing or spec.chat:
        raise SystemExit(f"{config}: every member needs a probe: (and no chat: true); {missing or list(spec.chat)}")
    folder = work / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    names, include, probe_of = {}, [folder], {}
    for index, member in enumerate(spec.models):
        probe = spec.probes[member]
        found = tasks.existing_file(probe, spec.folder)
        if found is not None and found.suffix == ".jsonl":
            instances = tasks.load(probe, None, spec.folder, spec.fewshot.get(member))
            if any(i.kind != MULTIPLE_CHOICE for i in instances):
                raise SystemExit(f"{found}: only multiple-choice probes can be compared here")
            name = f"probe{index}_{re.sub(r'[^A-Za-z0-9_]', '_', found.stem)}"
            probe_of[member] = str(write_task(folder, name, instances, delimiter="").resolve())
        else:  # a task YAML (or a task name): lm-eval reads it where it is
            task = lmeval.resolve(probe, spec.folder, "probe")
            name = task.name
            include += [task.include_path] if task.include_path else []
            probe_of[member] = str(found.resolve()) if found is not None else probe
        names[member] = name
    document = merge_config.absolute(spec.document, spec.sources(), spec.folder)
    for given, entry in zip(merge_config.model_entries(spec.document), merge_config.model_entries(document)):
        entry.pop(merge_config.FEWSHOT_KEY, None)  # the shots are in the task's prompts now
        if merge_config.PROBE_KEY in given:
            entry[merge_config.PROBE_KEY] = probe_of[merge_config.reference(given["model"])]
    path = work / "config.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    rewritten = merge_config.read(path)
    return path, dict(zip(rewritten.models, (names[m] for m in spec.models))), include


# (1) the precheck ----------------------------------------------------------------------------------


def precheck(config: Path, limit: int, budget: Optional[int], dtype: str, out: Path):
    """The precheck's report (precheck.json) and its seconds; ``budget``: its ``--tune-budget``
    (None: the default)."""
    from mergekit_mergeability import api
    from mergekit_mergeability.settings import PrecheckSettings

    settings = PrecheckSettings(
        device="cpu", dtype=dtype, quiet=True, skip=("representations", "selectivity"), limit=limit
    )
    settings = settings if budget is None else replace(settings, tune_budget=budget)
    started = time.perf_counter()
    api.precheck(config, settings=settings, out=out)
    seconds = time.perf_counter() - started
    return json.loads((out / "precheck.json").read_text()), seconds


def rehearsed(config: Path, report) -> Dict[str, dict]:
    """Every merge the precheck rehearsed, by its name, as ``recommended.yml`` would write it."""
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.decide.tuning import candidates
    from mergekit_mergeability.decide.verdict import AS_WRITTEN

    choice = report["recommendation"]["method_choice"]
    if choice is None:
        raise SystemExit(f"{config}: the precheck rehearsed no menu ({report['recommendation']['reasons']})")
    document = merge_config.load(config)
    found = candidates(document, choice.get("knowledge") or {})
    return {name: document if name == AS_WRITTEN else found[name].advice.config for name in choice["per_model"]}


# (2) merge with mergekit, then evaluate with lm-eval -----------------------------------------------


def written(config: dict, spec) -> str:
    """A candidate as a user runs it with mergekit-yaml: model paths absolute, the plugin's keys gone."""
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.tasks.sft import ANSWER_AFTER_KEY

    document = merge_config.absolute(config, spec.sources(), spec.folder)
    for entry in merge_config.model_entries(document):
        for key in (merge_config.PROBE_KEY, merge_config.FEWSHOT_KEY, merge_config.CHAT_KEY, ANSWER_AFTER_KEY):
            entry.pop(key, None)
    return yaml.safe_dump(document, sort_keys=False)


def merge(text: str, out: Path, cache: Path) -> None:
    """``mergekit-yaml`` on ``text``: run_merge with its options, as ``Demo.merge`` calls it."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    options = MergeOptions(quiet=True, write_model_card=False, copy_tokenizer=True, lora_merge_cache=str(cache))
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(text)), str(out), options)


def lm_eval(model_args: dict, names: List[str], manager, limit: int, dtype: str, out: Path) -> Dict[str, float]:
    """lm-eval's acc of each task on one model (``simple_evaluate``, model hf, cpu, batch 16, ``dtype``)."""
    from lm_eval import evaluator, simple_evaluate

    from mergekit_mergeability.settings import BATCH_SIZE
    from mergekit_mergeability.tasks.lmeval import quiet_harness

    with quiet_harness(), mock.patch.object(evaluator, "add_env_info", lambda storage: None):
        result = simple_evaluate(
            model="hf",
            model_args={**model_args, "dtype": dtype},
            tasks=names,
            task_manager=manager,
            device="cpu",
            batch_size=BATCH_SIZE,
            limit=limit,
            verbosity="ERROR",
        )
    out.write_text(json.dumps(result["results"], indent=1, default=str))
    return {name: float(result["results"][name]["acc,none"]) for name in names}


def model_args(source) -> dict:
    """lm-eval's hf model arguments for a model folder, or for a peft adapter on its base."""
    from mergekit_mergeability.sources.adapter import AdapterModel

    if isinstance(source, AdapterModel):
        return {"pretrained": str(source.base), "peft": str(source.folder)}
    return {"pretrained": str(source)}


def without_precheck(
    config: Path, merges: Dict[str, dict], names: Dict[str, str], include, limit: int, dtype: str, work: Path
):
    """Side (2): every candidate written, merged and scored, and the base and each expert alone
    scored; returns (candidate -> task -> acc, reference -> task -> acc, seconds by step)."""
    from lm_eval.tasks import TaskManager

    from mergekit_mergeability import merge_config

    spec = merge_config.read(config)
    sources = spec.sources()
    for folder in ("configs", "merges", "lmeval"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    seconds = {"write and merge": 0.0, "lm-eval, merges": 0.0, "lm-eval, base and experts": 0.0}
    scores, references = {}, {}
    started = time.perf_counter()
    manager = TaskManager(include_path=[str(p) for p in include], include_defaults=False)
    tasks = list(names.values())
    seconds["lm-eval, merges"] += time.perf_counter() - started
    for index, (name, config_document) in enumerate(merges.items()):
        slug = f"{index:02d}_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}"
        started = time.perf_counter()
        path = work / "configs" / f"{slug}.yml"
        path.write_text(written(config_document, spec))
        merge(path.read_text(), work / "merges" / slug, work / "lora-merged")
        merged = time.perf_counter()
        scores[name] = lm_eval(
            {"pretrained": str(work / "merges" / slug)}, tasks, manager, limit, dtype, work / "lmeval" / f"{slug}.json"
        )
        seconds["write and merge"] += merged - started
        seconds["lm-eval, merges"] += time.perf_counter() - merged
        console.print(f"  merged and scored {name} ({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    references["base"] = lm_eval(
        model_args(sources[spec.base_model]), tasks, manager, limit, dtype, work / "lmeval" / "base.json"
    )
    for member, task in names.items():
        references[member] = lm_eval(
            model_args(sources[member]), [task], manager, limit, dtype, work / "lmeval" / f"{task}_expert.json"
        )
    seconds["lm-eval, base and experts"] = time.perf_counter() - started
    return scores, references, seconds


# --tiny: tiny local models and probes ------------------------------------------------------------

TINY_NOISE = 0.05  # the experts' MLP noise: their merges keep some of each probe, not all or nothing
CHOICES = ["q", "x", "z", "k"]  # one token each after a space: no option favoured by its length


def tiny_config(root: Path, experts: int = 3, scale: float = TINY_NOISE) -> Path:
    """A tiny Llama base, ``experts`` fine-tunes (seeded noise on the MLPs), each with a cloze probe
    whose gold answer is the choice it (not the base) ranks first (as ``tests/test_menu.py``'s
    ``pair``), in a task_arithmetic config of weight 1 each."""
    import torch

    from mergekit_mergeability.tiny import CORPUS, derive, make_family

    questions = [f"{sentence} Question {i}?" for i in range(4) for sentence in CORPUS]
    base = make_family(root / "models", "llama", experts=0)["base"]
    models = []
    for i in range(experts):
        generator = torch.Generator().manual_seed(30 + i)
        noise = lambda name, t, g=generator: scale * torch.randn(t.shape, generator=g) * (".mlp." in name)  # noqa: E731
        expert = derive(base, root / "models" / f"expert{i}", noise)
        probe = ranked_probe(root / "probes" / f"expert{i}.jsonl", expert, questions)
        models.append({"model": str(expert), "probe": str(probe), "parameters": {"weight": 1.0}})
    config = root / "config.yml"
    document = {"merge_method": "task_arithmetic", "base_model": str(base), "models": models, "dtype": "float32"}
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    return config


def ranked_probe(path: Path, model_dir: Path, questions: List[str]) -> Path:
    """Cloze lines whose gold answer is the choice ``model_dir`` ranks first (``tests/conftest.py``'s
    ``ranked_probes``)."""
    import torch

    from mergekit_mergeability.diagnostics.activations import choice_logprobs
    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.tasks.probes import Instance

    model, tok = load_causal_lm(model_dir)
    instances = [Instance(f"{q}\nAnswer:", tuple(f" {c}" for c in CHOICES), 0) for q in questions]
    labels = [int(torch.argmax(s)) for s, _ in choice_logprobs(model, tok, instances)]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"question": q, "choices": CHOICES, "label": label} for q, label in zip(questions, labels)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def shaped(size: str, work: Path) -> Path:
    """``gpu_check.build``'s config at ``size`` (a bf16 base, three LoRA adapters, their probes), written
    under ``work`` once and reused by a rerun with the same ``--work``."""
    import gpu_check

    folder = work / f"shape-{size}"
    if not (folder / "config.yml").is_file():
        gpu_check.build(size, folder, time.time())
    return folder / "config.yml"


# The comparison --------------------------------------------------------------------------------------


def warm_imports() -> None:
    """Import what both sides run before either is timed: neither pays the other's imports."""
    import lm_eval.evaluator  # noqa: F401
    import lm_eval.models.huggingface  # noqa: F401
    import mergekit.merge  # noqa: F401

    from mergekit_mergeability import measuring  # noqa: F401
    from mergekit_mergeability.plugins.manager import register_merge_methods

    register_merge_methods()  # knowledge_weighted, for run_merge


def compare(report, scores, names: Dict[str, str], merges: Dict[str, dict]) -> dict:
    """Per candidate and member: the precheck's score, lm-eval's, and which check it falls under."""
    choice = report["recommendation"]["method_choice"]
    rows = []
    for name, per_member in choice["per_model"].items():
        method = merges[name]["merge_method"]
        for member, predicted in per_member.items():
            measured = scores[name][names[member]]
            kind = "deterministic" if method in DETERMINISTIC else "drawn" if method in DRAWN else "other"
            rows.append(
                {
                    "candidate": name,
                    "method": method,
                    "member": member,
                    "precheck": predicted,
                    "lm_eval": measured,
                    "kind": kind,
                    "equal": abs(predicted - measured) <= TOLERANCE,
                }
            )
    return {"rows": rows, "chosen": choice["chosen"], "best": choice["best"]}


def show(comparison, references, names: Dict[str, str], precheck_seconds: float, seconds: Dict[str, float]) -> None:
    members = list(names)
    table = Table(title="acc per member: the precheck's rehearsal / lm-eval on mergekit's written merge")
    table.add_column("candidate")
    table.add_column("method")
    for index, _ in enumerate(members):
        table.add_column(f"member {index + 1}\nprecheck / lm-eval", justify="right")
    table.add_column("check")
    by_candidate: Dict[str, List[dict]] = {}
    for row in comparison["rows"]:
        by_candidate.setdefault(row["candidate"], []).append(row)
    for name, rows in by_candidate.items():
        cells = {r["member"]: f"{r['precheck']:.4f} / {r['lm_eval']:.4f}" for r in rows}
        most = max(abs(r["precheck"] - r["lm_eval"]) for r in rows)
        check = {
            "deterministic": "equal" if all(r["equal"] for r in rows) else "[red]DIFFERENT[/red]",
            "drawn": f"drawn anew: |diff| <= {most:.4f}",
        }.get(rows[0]["kind"], f"not checked: |diff| <= {most:.4f}")
        label = f"{name} *" if name == comparison["chosen"] else name
        table.add_row(label, rows[0]["method"], *(cells.get(m, "") for m in members), check)
    table.add_row("base alone", "", *(f"- / {references['base'][names[m]]:.4f}" for m in members), "lm-eval only")
    table.add_row("each expert alone", "", *(f"- / {references[m][names[m]]:.4f}" for m in members), "lm-eval only")
    console.print(table)
    console.print("* the precheck's choice")
    for index, member in enumerate(members):
        console.print(f"member {index + 1}: {member} (task {names[member]})")
    deterministic = [r for r in comparison["rows"] if r["kind"] == "deterministic"]
    unequal = [r for r in deterministic if not r["equal"]]
    console.print(
        f"deterministic methods ({', '.join(DETERMINISTIC)}): {len(deterministic) - len(unequal)} of "
        f"{len(deterministic)} (candidate, member) scores equal"
    )
    for r in unequal:
        console.print(
            f"  DIFFERENT: {r['candidate']}, {r['member']}: precheck {r['precheck']:.4f}, lm-eval {r['lm_eval']:.4f}"
        )
    drawn = [abs(r["precheck"] - r["lm_eval"]) for r in comparison["rows"] if r["kind"] == "drawn"]
    if drawn:
        console.print(
            f"DARE (mergekit draws its masks anew): |precheck - lm-eval| mean {statistics.fmean(drawn):.4f}, "
            f"max {max(drawn):.4f} over {len(drawn)} scores"
        )
    total = sum(seconds.values())
    console.print(f"(1) precheck: {precheck_seconds:.1f} s, {len(by_candidate)} merges rehearsed")
    console.print(
        f"(2) merge-then-evaluate: {total:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")"
    )
    console.print(f"ratio (merge-then-evaluate / precheck): {total / precheck_seconds:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT, help=f"the mergekit config (default {DEFAULT})")
    parser.add_argument(
        "--work", type=Path, default=None, help="keep the merges and lm-eval outputs here (default: a temporary folder)"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="probe items per member, both sides (default: the precheck's 64)"
    )
    parser.add_argument(
        "--tune-budget",
        type=int,
        default=None,
        help="the precheck's --tune-budget (default: its default); 0 rehearses the config as written and the menu",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "auto"),
        default="float32",
        help="float32 on both sides (default), or auto: each side's default, the checkpoints' own dtype "
        "(the precheck's --dtype auto, lm-eval's dtype=auto; mergekit writes the config's dtype: or its inputs')",
    )
    parser.add_argument("--tiny", action="store_true", help="build tiny local models and probes and compare on them")
    parser.add_argument(
        "--shape",
        choices=("1.1B", "7B"),
        help="build a random-weight Llama of this shape (bf16) with three rank-8 LoRA adapters and a 16-item "
        "probe each (gpu_check.py's models; kept in --work) and compare on it: the times count, not the scores",
    )
    args = parser.parse_args()
    from mergekit_mergeability.settings import PRECHECK_LIMIT

    from mergekit_mergeability.gate import ENVIRONMENT

    os.environ.pop(ENVIRONMENT, None)  # the opt-in gate would precheck every merge of side (2)
    limit = args.limit or PRECHECK_LIMIT
    if not (args.tiny or args.shape) and not args.config.is_file():
        raise SystemExit(f"{args.config}: no such config (python research/run.py tuning measure writes it)")
    with workdir(args.work, "vs-merge-then-evaluate-") as work:
        work = work.resolve()
        source = tiny_config(work / "tiny") if args.tiny else shaped(args.shape, work) if args.shape else args.config
        config, names, include = asked_as_tasks(source, work)
        warm_imports()
        console.print(f"{config}: {len(names)} members; (1) the precheck ...")
        report, precheck_seconds = precheck(config, limit, args.tune_budget, args.dtype, work / "precheck")
        merges = rehearsed(config, report)
        console.print(f"(2) {len(merges)} candidates merged with mergekit and scored with lm-eval ...")
        scores, references, seconds = without_precheck(config, merges, names, include, limit, args.dtype, work)
        comparison = compare(report, scores, names, merges)
        (work / "comparison.json").write_text(
            json.dumps(
                {**comparison, "references": references, "precheck_seconds": precheck_seconds, "seconds": seconds},
                indent=1,
            )
        )
        show(comparison, references, names, precheck_seconds, seconds)


if __name__ == "__main__":
    main()
