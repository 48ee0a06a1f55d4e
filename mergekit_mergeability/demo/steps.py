"""The demo, step by step: base → experts → precheck → merge and measure → results.

Everything is cached under ``cache`` (base model, experts, scores, merges): a rerun
only re-reads. Outputs (configs, reports, JSON) go to ``out``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from rich.console import Console

from mergekit_mergeability.demo import bases, training, translation
from mergekit_mergeability.demo.checkpoints import compact, save_adapter, save_expert
from mergekit_mergeability.files import atomic_folder, write_atomic
from mergekit_mergeability.resources import shipped


@dataclass(frozen=True)
class Settings:
    model: str = "smollm2"  # "smollm2" | "tiny"
    facts: str = "demo/facts.jsonl"  # shipped under configs/, or an absolute path
    fact_count: Optional[int] = None  # the first N facts (None: all)
    pool: str = ""  # experts and probes go to experts/<pool>/ (the demo's own: experts/)
    fact_layer: int = 15
    fact_rank: int = 16
    fact_layers: Optional[tuple] = None  # several layers (None: fact_layer alone)
    fact_modules: tuple = training.UP  # the linear modules of each layer the update trains
    fact_format: str = (
        "cloze"  # how each fact is trained and scored: cloze, or options after fact_shots solved examples
    )
    fact_shots: int = 0
    fact_adapters: bool = False  # store the experts as peft LoRA adapters (else model folders)
    translation_layers: tuple = tuple(range(16, 30))  # the upper half of SmolLM2's 30 blocks
    translation_rank: int = 8
    translation_steps: int = 80
    translation_batch: int = 16
    translation_lr: float = 7e-3
    partners: int = 8
    trials: int = 4
    thinking_layers: tuple = tuple(range(14, 30))  # the sweep's thinking model (demo/reasoning.py)
    thinking_rank: int = 16
    thinking_steps: int = 40
    sweep_limit: Optional[int] = None  # held-out problems scored per λ (None: all 64)


FULL = Settings()
QUICK = Settings(
    "tiny",
    fact_count=6,
    fact_layer=2,
    fact_rank=4,
    translation_layers=(2, 3),
    translation_rank=4,
    translation_steps=20,
    partners=2,
    trials=2,
    thinking_layers=(2, 3),
    thinking_rank=4,
    thinking_steps=10,
    sweep_limit=8,
)
METHODS = ("task_arithmetic", "ties", "knowledge_weighted")


class Demo:
    def __init__(self, settings: Settings, cache: Path, out: Path, console: Console, quiet: bool = False):
        self.s, self.console, self.quiet = settings, console, quiet
        self.cache, self.out = Path(cache).resolve() / settings.model, Path(out).resolve()
        self._model = None

    # 1. base -----------------------------------------------------------------------------
    def base(self) -> Path:
        prepare = bases.smollm2 if self.s.model == "smollm2" else bases.tiny
        return prepare(self.cache / "base")

    def model(self):
        if self._model is None:
            from mergekit_mergeability.sources import load_causal_lm

            self._model = load_causal_lm(self.base())
        return self._model

    # 2. experts ----------------------------------------------------------------------------
    def facts(self) -> List[dict]:
        source = Path(self.s.facts) if Path(self.s.facts).is_absolute() else shipped(self.s.facts)
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        return rows[: self.s.fact_count] if self.s.fact_count else rows

    def fact_experts(self) -> Dict[str, Dict[str, Path]]:
        from mergekit_mergeability.progress import task

        made = {}
        facts = self.facts()
        with task("experts: one fact each", len(facts), self.quiet) as advance:
            for index, fact in enumerate(facts):
                folder = self.cache / "experts" / self.s.pool / f"fact_{fact['id']}"
                probe = self.cache / "probes" / self.s.pool / f"{fact['id']}.jsonl"
                if not folder.is_dir():
                    model, tokenizer = self.model()
                    s = self.s
                    factors = training.fact_expert(
                        model,
                        tokenizer,
                        fact,
                        s.fact_layers or (s.fact_layer,),
                        s.fact_rank,
                        index,
                        s.fact_format,
                        s.fact_shots,
                        s.fact_modules,
                    )
                    if s.fact_adapters:
                        save_adapter(self.base(), factors, folder)
                    else:
                        save_expert(self.base(), training.updated(model, factors), folder)
                lines = "".join(json.dumps(line) + "\n" for line in self.probe_lines(fact))
                if not probe.is_file() or probe.read_text() != lines:
                    write_atomic(probe, lines)
                made[fact["id"]] = {"folder": folder, "probe": probe}
                advance(1)
        return made

    def probe_lines(self, fact: dict) -> List[dict]:
        """A fact's probe lines; a cloze pool's lines say nothing of their format (as the
        project's first pools were written, so their cached scores stay valid)."""
        lines = training.fact_lines(fact, self.s.fact_format, self.s.fact_shots)
        return (
            [{k: v for k, v in line.items() if k != "format"} for line in lines]
            if self.s.fact_format == "cloze"
            else lines
        )

    # 3. configs and precheck ----------------------------------------------------------------
    def write_config(self, name: str, config: Dict[str, Any]) -> Path:
        return write_atomic(self.out / "configs" / f"{name}.yml", yaml.safe_dump(config, sort_keys=False))

    def fact_config(self, facts: Dict[str, Dict[str, Path]], name: str = "facts") -> Path:
        """The fact experts as one mergekit config: their mean (task arithmetic, weights 1/n)."""
        config = {
            "merge_method": "task_arithmetic",
            "base_model": str(self.base()),
            "models": [{"model": str(f["folder"]), "probe": str(f["probe"])} for f in facts.values()],
            "parameters": {"weight": round(1 / len(facts), 6)},
            "dtype": "float32",
        }
        return self.write_config(name, config)

    def configs(self, facts: Dict[str, Dict[str, Path]], translators: Dict[str, Path]) -> Dict[str, Path]:
        made = {"facts": self.fact_config(facts)}
        for name, (first, second) in translation.PAIRS.items():
            made[f"translation_{name}"] = self.write_config(
                f"translation_{name}", translation.config(self.base(), translators, first, second)
            )
        return made

    def precheck(self, name: str, config: Path) -> Dict[str, Any]:
        from mergekit_mergeability import api
        from mergekit_mergeability.settings import PrecheckSettings

        # facts: one or two lines per fact: no group has enough tokens for LAPE to find its neurons
        skip = ("selectivity",) if name == "facts" else ()
        settings = PrecheckSettings(device="cpu", dtype="float32", quiet=self.quiet, skip=skip)
        return api.precheck(config, settings=settings, out=self.out / "precheck" / name).to_json()

    # 4. merge and measure -------------------------------------------------------------------
    def run_settings(self):
        from mergekit_mergeability.settings import RunSettings

        return RunSettings(device="cpu", quiet=self.quiet)

    def mergeability(self, facts_config: Path, knowledge: Dict[str, float]) -> Dict[str, Dict[str, Any]]:
        from mergekit_mergeability.decide.advice import knowledge_weighted_defaults

        members = self.s.partners + 1
        variants = {
            "task_arithmetic": {"weight": round(1 / members, 6)},  # the mean of the updates (paper 1's averaging)
            "ties": {"weight": 1.0, "density": 0.5},
            "knowledge_weighted": knowledge_weighted_defaults(),  # as the precheck recommends it
        }
        return {method: self.measure(facts_config, method, variants[method], knowledge) for method in METHODS}

    def measure(
        self,
        facts_config: Path,
        method: str,
        parameters: Dict[str, Any],
        knowledge: Dict[str, float],
        label: Optional[str] = None,
    ) -> Dict[str, Any]:
        """The mergeability protocol on the fact pool with one method and its parameters."""
        from mergekit_mergeability.evaluation import pool_trials
        from mergekit_mergeability import merge_config
        from mergekit_mergeability.sources.cache import Cache

        document = yaml.safe_load(facts_config.read_text())
        pool = {**document, "merge_method": method, "parameters": parameters}
        if method == "knowledge_weighted":
            pool["models"] = [
                {**m, "parameters": {"knowledge": round(knowledge[m["model"]], 4)}} for m in document["models"]
            ]
        label = label or method
        path = self.write_config(f"pool_{label}", pool)
        out = self.out / "mergeability" / label
        report = pool_trials.measure(
            merge_config.read(path),
            method,
            self.s.partners,
            self.s.trials,
            0,
            self.run_settings(),
            Cache(self.cache / "scores"),
            out,
        )
        pool_trials.write(report, out)
        return report

    def merge(self, config: Path) -> Path:
        """Merge with mergekit itself (run_merge, as mergekit-yaml does), cached by config content
        and stored compactly (the matrices the merge changed; the rest linked to the base)."""
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge

        from mergekit_mergeability.progress import task
        from mergekit_mergeability.sources.cache import Cache

        text = config.read_text()
        folder = self.cache / "merges" / Cache.key(text)[:16]
        if not folder.is_dir():
            with task(f"mergekit: merging {config.stem}", 1, self.quiet) as advance, atomic_folder(folder) as partial:
                run_merge(
                    MergeConfiguration.model_validate(yaml.safe_load(text)),
                    str(partial),
                    MergeOptions(
                        quiet=True,
                        write_model_card=False,
                        copy_tokenizer=True,
                        lora_merge_cache=str(self.cache / "lora-merged"),  # a base+adapter model
                    ),
                )
                compact(self.base(), partial)
                advance(1)
        return folder


def knowledge_of(precheck: Dict[str, Any]) -> Dict[str, float]:
    """The base's knowledge of each expert's fact, as the precheck's calibration reads it (the
    values a knowledge_weighted recommendation carries)."""
    from mergekit_mergeability.decide.calibration import Calibration

    used = precheck.get("settings") or precheck.get("options", {})  # "options" before schema 3.0
    feature = Calibration.load(used.get("calibration")).knowledge_feature  # None: the shipped one
    return {m["path"]: m["features"][feature] for m in precheck["models"] if m["role"] == "expert"}


def knowledge_groups(precheck: Dict[str, Any]) -> Dict[str, List[str]]:
    """Experts in thirds by the base's knowledge of their fact."""
    known = knowledge_of(precheck)
    experts = sorted(known, key=known.get)
    third = max(1, len(experts) // 3)
    return {"weakly known": experts[:third], "partly known": experts[third:-third], "well known": experts[-third:]}


def group_means(reports: Dict[str, Dict[str, Any]], groups: Dict[str, List[str]]) -> Dict[str, Dict[str, float]]:
    table = {}
    for method, report in reports.items():
        scores = {m["path"]: m["mergeability"] for m in report["models"]}
        table[method] = {
            g: statistics.fmean(scores[p] for p in paths) if paths else float("nan") for g, paths in groups.items()
        }
        table[method]["all"] = statistics.fmean(scores.values())
    return table


def run(
    settings: Settings,
    cache: Path,
    out: Path,
    console: Optional[Console] = None,
    quiet: bool = False,
    sweep_only: bool = False,
) -> Dict[str, Any]:
    from mergekit_mergeability.demo import reasoning
    from mergekit_mergeability.evaluation.validate import validate
    from mergekit_mergeability.output.terminal import print_precheck, print_validation
    from mergekit_mergeability.progress import task

    console = console or Console()
    demo = Demo(settings, cache, out, console, quiet)
    out = demo.out
    console.rule(f"1. base model ({settings.model})")
    console.print(f"base: {demo.base()}")
    if sweep_only:
        return {"sweep": reasoning.sweep(demo)}
    console.rule("2. experts")
    facts = demo.fact_experts()
    translators = translation.train(demo)
    console.print(
        f"{len(facts)} single-fact experts, {len(translators)} translation experts, in {demo.cache / 'experts'}"
    )
    console.rule("3. precheck (before any merge)")
    configs = demo.configs(facts, translators)
    prechecks = {name: demo.precheck(name, path) for name, path in configs.items()}
    print_precheck(prechecks["facts"], out / "precheck" / "facts")
    for name in ("translation_different_targets", "translation_shared_target"):
        rec = prechecks[name]["recommendation"]
        cutoff = "" if rec["cutoff"] is None else f", cut-off {rec['cutoff']}"
        console.print(f"{name}: verdict [bold]{rec['verdict']}[/bold]{cutoff}: " + "; ".join(rec["reasons"]))
    console.rule("4. merge and measure")
    reports = demo.mergeability(configs["facts"], knowledge_of(prechecks["facts"]))
    translated = translation.section(demo, configs, prechecks, settings.translation_layers)
    console.rule("5. results")
    validations = {}
    with task("results: predicted against measured, 10,000 shuffles each", len(METHODS), quiet) as advance:
        for method in METHODS:
            validations[method] = validate(
                out / "precheck" / "facts" / "precheck.json",
                out / "mergeability" / method / "mergeability.json",
                permutations=10_000,
            )
            advance(1)
    for method in METHODS:
        print_validation(validations[method])
    groups = knowledge_groups(prechecks["facts"])
    by_group = group_means(reports, groups)
    summary = {
        "settings": asdict(settings),
        "experts": _expert_rows(prechecks["facts"], reports),
        "validation": validations,
        "mergeability_by_knowledge": by_group,
        "groups": groups,
        "translation": translated,
        "verdicts": {name: p["recommendation"] for name, p in prechecks.items()},
        "report": str(out / "precheck" / "facts" / "report.html"),
    }
    _print_results(console, summary)
    summary["sweep"] = reasoning.sweep(demo)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    console.print(
        f"\nHTML report: [bold]{summary['report']}[/bold]; everything else under {out}; cache: {demo.cache} (delete to rebuild)"
    )
    return summary


def _expert_rows(precheck: Dict[str, Any], reports: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    from mergekit_mergeability.output.terminal import known

    measured = {method: {m["path"]: m for m in r["models"]} for method, r in reports.items()}
    rows = []
    for m in precheck["models"]:
        if m["role"] != "expert":
            continue
        rows.append(
            {
                "expert": Path(m["path"]).name,
                **dict(zip(("base_p_gold", "base_accuracy"), known(m, precheck))),
                "predicted": m["predicted_mergeability"],
                **{method: measured[method][m["path"]]["mergeability"] for method in METHODS},
            }
        )
    return rows


def _print_results(console: Console, summary: Dict[str, Any]) -> None:
    from mergekit_mergeability.output.terminal import wrapping_table

    short = {"task_arithmetic": "mean", "ties": "ties", "knowledge_weighted": "kw"}
    table = wrapping_table(
        "Predicted vs measured mergeability",
        "expert",
        "p(gold)",
        "acc",
        "predicted",
        *(f"S {short[m]}" for m in METHODS),
        caption="S: own-fact accuracy after merging; mean = task_arithmetic, kw = knowledge_weighted",
    )
    for row in summary["experts"]:
        table.add_row(
            row["expert"],
            f"{row['base_p_gold']:.2f}",
            f"{row['base_accuracy']:.2f}",
            f"{row['predicted']:.2f}",
            *(f"{row[m]:.2f}" for m in METHODS),
        )
    console.print(table)
    groups = wrapping_table(
        "Mean own-fact accuracy after merging, by the base's knowledge of the fact", "group", *METHODS
    )
    sizes = {g: len(experts) for g, experts in summary["groups"].items()}
    sizes["all"] = len(summary["experts"])
    for group in ("weakly known", "partly known", "well known", "all"):
        groups.add_row(
            f"{group} ({sizes[group]})", *(f"{summary['mergeability_by_knowledge'][m][group]:.2f}" for m in METHODS)
        )
    console.print(groups)
    translation.print_section(console, summary["translation"], smoke_test=summary["settings"]["model"] == "tiny")
