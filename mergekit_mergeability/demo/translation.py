"""The demo's translators and paper 3 ("One Model to Translate Them All?") on them.

Three experts translate English into rule-made languages (``languages.py``), each trained on
its own 320 sentences and scored on 40 it never saw: ``zorbish_a`` and ``kelvic_a`` on the same
English into different languages, ``zorbish_b`` on other English into Zorbish. Each pair
(different targets, shared target) is merged four ways: as configured (task_arithmetic), with
TIES, as the precheck recommends, and with paper 3's layer patch (the upper third of the
blocks from the target language's expert, the rest merged). chrF and BLEU (sacrebleu) on the
held-out sentences say what each merge kept; the precheck's layer-wise CKA and LAPE overlap
say where the pair's representations part; and each of paper 3's findings is checked.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.resources import shipped
from mergekit_mergeability.records import PairLayers

PAIRS = {"different_targets": ("zorbish_a", "kelvic_a"), "shared_target": ("zorbish_a", "zorbish_b")}
LOST = 0.5  # a merge "loses most" of a translator when it keeps less than this share of its chrF
MARGIN = 0.1  # a finding's "more" or "better": by at least this much (chrF kept, or CKA)


def rows() -> List[dict]:
    return [json.loads(line) for line in shipped("demo/translation.jsonl").read_text().splitlines() if line.strip()]


def train(demo) -> Dict[str, Path]:
    """Each translator: a rank-r update of up_proj in the upper blocks, trained on its own
    training sentences only (the held-out ones score it)."""
    from mergekit_mergeability.demo import training
    from mergekit_mergeability.demo.checkpoints import save_expert
    from mergekit_mergeability.sources.cache import Cache
    from mergekit_mergeability.progress import task

    data, s = rows(), demo.s
    names = list(dict.fromkeys(r["expert"] for r in data))
    recipe = [
        data,
        s.translation_layers,
        s.translation_rank,
        s.translation_steps,
        s.translation_batch,
        s.translation_lr,
    ]
    home = demo.cache / "experts" / f"translators-{Cache.key(*recipe)[:12]}"  # new data or settings: new experts
    made = {}
    with task("experts: English into invented languages", len(names), demo.quiet) as advance:
        for index, name in enumerate(names):
            folder = home / f"translate_{name}"
            if not folder.is_dir():
                model, tokenizer = demo.model()
                own = [r for r in data if r["expert"] == name and r["split"] == "train"]
                changed = training.translation_expert(
                    model,
                    tokenizer,
                    own,
                    s.translation_layers,
                    s.translation_rank,
                    100 + index,
                    s.translation_steps,
                    s.translation_lr,
                    s.translation_batch,
                )
                save_expert(demo.base(), changed, folder)
            made[name] = folder
            advance(1)
    return made


def config(base: Path, translators: Dict[str, Path], first: str, second: str) -> Dict[str, Any]:
    """A pair as a user would write it: task arithmetic, each update at full weight."""
    return {
        "merge_method": "task_arithmetic",
        "base_model": str(base),
        "models": [
            {"model": str(translators[first]), "probe": f"demo_translate_{first}"},
            # upper: ignored by task_arithmetic; layer_selective takes the upper blocks from it
            {"model": str(translators[second]), "probe": f"demo_translate_{second}", "parameters": {"upper": True}},
        ],
        "parameters": {"weight": 1.0},
        "dtype": "float32",
    }


def patch_cutoff(precheck: Dict[str, Any]) -> int:
    """Paper 3's layer patch: the upper third of the blocks from the target language's expert."""
    blocks = len(precheck["layers"]["divergence"]) - 1  # its entry 0 is the embeddings
    return round(blocks * 2 / 3)


def patched(document: Dict[str, Any], expert: str, cutoff: int) -> Dict[str, Any]:
    """``document``'s pair as a layer patch for ``expert``: blocks below ``cutoff`` merged
    (task_arithmetic), blocks from ``cutoff`` on, final norm and head from ``expert``."""
    return {
        **document,
        "merge_method": "layer_selective",
        "models": [{**m, "parameters": {"upper": m["model"] == expert}} for m in document["models"]],
        "parameters": {"weight": 1.0, "cutoff": cutoff, "inner": "task_arithmetic"},
    }


def plans(demo, name: str, path: Path, precheck: Dict[str, Any]) -> List[Tuple[str, Path, Optional[str]]]:
    """(merge, its config, the expert it is for; None: both) for one pair."""
    import yaml

    document = yaml.safe_load(path.read_text())
    out: List[Tuple[str, Path, Optional[str]]] = [("task_arithmetic", path, None)]
    ties = {**document, "merge_method": "ties", "parameters": {"weight": 1.0, "density": 0.5}}
    out.append(("ties", demo.write_config(f"{name}_ties", ties), None))
    folder = demo.out / "precheck" / name
    advice = precheck["recommendation"]["models"]
    if not advice:  # do_not_merge: nothing recommended to score
        return out
    # a model served apart (leave_out's recommended/<model>.yml, no base_model) is not a merge to score
    merges = lambda a: "base_model" in yaml.safe_load((folder / a["file"]).read_text())  # noqa: E731
    per_expert = [a for a in advice if a["expert"] and a["file"] != "recommended.yml" and merges(a)]
    recommended = [("recommended", folder / a["file"], a["expert"]) for a in per_expert] or [
        ("recommended", folder / advice[0]["file"], None)
    ]
    if [yaml.safe_load(p.read_text()) for _, p, _ in recommended] != [
        document
    ]:  # the same merge as configured: scored once
        out += recommended
    cutoff = patch_cutoff(precheck)
    for expert in [m["model"] for m in document["models"]]:
        out.append(
            (
                "layer patch",
                demo.write_config(f"{name}_patch_{Path(expert).name}", patched(document, expert, cutoff)),
                expert,
            )
        )
    return out


def score(demo, name: str, label: str, path: Path, expert: Optional[str] = None) -> List[Dict[str, Any]]:
    """Merge ``path`` with mergekit and score it on each expert's held-out sentences (only
    ``expert``'s when given): per expert chrF, BLEU, kept (merged chrF ÷ alone), and the
    expert's and the base's own scores."""
    from mergekit_mergeability.evaluation import merge_scores
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.sources.cache import Cache

    spec = merge_config.read(path)
    cutoff = (spec.document.get("parameters") or {}).get("cutoff")
    report = merge_scores.evaluate(spec, demo.merge(path), None, demo.run_settings(), Cache(demo.cache / "scores"))
    merge_scores.write(
        report, demo.out / "evaluation" / name / f"{label.replace(' ', '_')}_{Path(expert).name if expert else 'both'}"
    )
    scores, rows = report["scores"], []
    for row in report["tasks"]:
        if expert is None or row["expert_model"] == expert:
            rows.append(
                {
                    "merge": label,
                    "method": spec.merge_method,
                    "cutoff": cutoff,
                    "expert": Path(row["expert_model"]).name.removeprefix("translate_"),
                    **scores["merged"][row["task"]]["metrics"],
                    "kept": row["retention"],
                    "alone": scores[row["expert_model"]][row["task"]]["metrics"],
                    "base": scores[spec.base_model][row["task"]]["metrics"],
                    "signatures": row["signatures"],
                }
            )
    return rows


def compare(demo, name: str, path: Path, precheck: Dict[str, Any]) -> Dict[str, Any]:
    """Every merge of one pair, scored on each expert's held-out sentences; ``advice`` names
    the merge the precheck advised ("task_arithmetic" when it said merge as configured)."""
    plan = plans(demo, name, path, precheck)
    rows = [row for label, config, expert in plan for row in score(demo, name, label, config, expert)]
    return {
        "experts": {r["expert"]: {"alone": r["alone"], "base": r["base"]} for r in rows},
        "merges": [{k: v for k, v in r.items() if k not in ("alone", "base", "signatures")} for r in rows],
        "advice": "recommended" if any(label == "recommended" for label, _, _ in plan) else "task_arithmetic",
        "chosen": _chosen(precheck["recommendation"]),
        "signatures": rows[0]["signatures"],
    }


def _chosen(recommendation: Dict[str, Any]) -> Optional[str]:
    """The rehearsed merge the precheck wrote (``method_by_rehearsal``: "mean", "ties d0.3" ...), else None."""
    if recommendation["verdict"] != "method_by_rehearsal":
        return None
    return recommendation["method_choice"]["chosen"].replace("_", " ")


def kept(result: Dict[str, Any], merge: str) -> Dict[str, float]:
    return {m["expert"]: m["kept"] for m in result["merges"] if m["merge"] == merge}


def layer_signals(precheck: Dict[str, Any]) -> Dict[str, List[float]]:
    """Per block: CKA between the two experts (target span, the unbiased estimator the
    precheck's cut-off reads; index 0 is the embeddings), the lowest CKA of any pair, and LAPE
    overlap of group-specific neurons, expert vs expert and base vs each expert (mean)."""
    pairs = precheck["pairs"]
    base = precheck["base_model"]
    between = PairLayers.of(next(p for p in pairs if base not in (p["a"], p["b"])))
    from_base = [PairLayers.of(p) for p in pairs if base in (p["a"], p["b"])]
    signals = {
        "cka_experts": between.cka_unbiased,
        "cka_lowest": [min(values) for values in zip(*(PairLayers.of(p).cka_unbiased for p in pairs))],
    }
    if between.specific_overlap is not None:
        signals["overlap_experts"] = between.specific_overlap
        signals["overlap_base"] = [statistics.fmean(values) for values in zip(*(p.specific_overlap for p in from_base))]
    return signals


def findings(
    results: Dict[str, Dict[str, Any]],
    signals: Dict[str, Dict[str, List[float]]],
    base_counts: Sequence[int],
    updated: Sequence[int],
) -> List[Dict[str, Any]]:
    """Paper 3's findings, each checked on the demo's translators: what it says, what we
    measured, and whether it reproduces. A "more" or "better" needs a gap of at least
    ``MARGIN``, so that a tie on 40 sentences does not pass."""
    mean = statistics.fmean
    kept_by = {name: mean(kept(r, "task_arithmetic").values()) for name, r in results.items()}
    blocks = len(signals["different_targets"]["cka_experts"]) - 1
    # the lowest third of the blocks the experts trained (those below are the base's, by construction)
    lower = list(updated)[: max(1, len(updated) // 3)]
    lowest_lower = min(
        s["cka_lowest"][b + 1] for s in signals.values() for b in lower
    )  # CKA's entry 0 is the embeddings
    final = {name: s["cka_experts"][-1] for name, s in signals.items()}
    out = [
        {
            "finding": "merging degrades translation, sharply when the targets differ, mildly when they are shared",
            "measured": f"task_arithmetic keeps {kept_by['different_targets']:.2f} of chrF (different targets, mean of the two experts) vs {kept_by['shared_target']:.2f} (shared target)",
            "reproduces": kept_by["different_targets"] + MARGIN <= kept_by["shared_target"],
        },
        {
            "finding": "lower blocks stay shared (CKA ≥ 0.97 between all models)",
            "measured": f"lowest CKA of any two models in the lowest trained blocks, {lower[0]}–{lower[-1]}: {lowest_lower:.3f}",
            "reproduces": lowest_lower >= 0.97,
        },
        {
            "finding": "the final block diverges, more when the targets differ",
            "measured": f"final-block CKA between the experts: {final['different_targets']:.2f} (different) vs {final['shared_target']:.2f} (shared)",
            "reproduces": final["different_targets"] + MARGIN <= final["shared_target"]
            and final["shared_target"] < lowest_lower,
        },
    ]
    if base_counts:
        middle = [base_counts[b] for b in range(blocks // 3, 2 * blocks // 3)]
        top = [base_counts[b] for b in range(2 * blocks // 3, blocks)]
        out.append(
            {
                "finding": "language-specific neurons sit in the first MLP block and the upper blocks",
                "measured": f"base's specific neurons: block 0 {base_counts[0]}, upper third {mean(top):.0f} per block, middle third {mean(middle):.0f}",
                "reproduces": base_counts[0] > 2 * mean(middle) and mean(top) > 2 * mean(middle),
            }
        )
    changed = list(updated)[1:]  # a gate changes from the block after the first trained up_proj
    if "overlap_base" in signals["different_targets"] and changed:
        overlap = mean(signals["different_targets"]["overlap_base"][b] for b in changed)
        out.append(
            {
                "finding": "fine-tuning redistributes specific neurons (base vs fine-tune Jaccard ≈ 0.12)",
                "measured": f"mean base vs expert overlap, different-target pair, blocks {changed[0]}–{changed[-1]} (whose gates changed): {overlap:.2f}",
                "reproduces": overlap < 0.5,
            }
        )
    patch = {name: kept(r, "layer patch") for name, r in results.items()}
    plain = {name: kept(r, "task_arithmetic") for name, r in results.items()}
    out.append(
        {
            "finding": "the layer patch (upper blocks from the target language's expert) recovers translation",
            "measured": "chrF kept, patch vs task_arithmetic: "
            + "; ".join(
                f"{n.split('_')[0]} {e} {patch[n][e]:.2f} vs {plain[n][e]:.2f}" for n in results for e in patch[n]
            ),
            "reproduces": mean(patch["different_targets"].values())
            >= mean(plain["different_targets"].values()) + MARGIN
            and all(patch[n][e] >= plain[n][e] for n in results for e in patch[n]),
        }
    )
    return out


def lost_by_advice(results: Dict[str, Dict[str, Any]]) -> List[str]:
    """Pairs where the precheck's advice kept less than ``LOST`` of every translator's chrF."""
    return [name for name, result in results.items() if all(k < LOST for k in kept(result, result["advice"]).values())]


def plot(
    signals: Dict[str, Dict[str, List[float]]], cutoffs: Dict[str, Optional[int]], patch: int, threshold: float
) -> bytes:
    """CKA and LAPE overlap between each pair's experts, per block, with the precheck's CKA
    threshold and cut-offs and paper 3's patch."""
    from mergekit_mergeability.output.plots import png

    def draw(fig, ax):
        for (name, s), colour in zip(signals.items(), ("tab:red", "tab:blue")):
            label = name.replace("_", " ")
            blocks = range(len(s["cka_experts"]) - 1)
            ax.plot(blocks, s["cka_experts"][1:], color=colour, label=f"CKA (unbiased), {label}")
            if "overlap_experts" in s:
                ax.plot(blocks, s["overlap_experts"], color=colour, linestyle=":", label=f"LAPE overlap, {label}")
            if cutoffs.get(name) is not None:
                ax.axvline(cutoffs[name] - 0.5, color=colour, alpha=0.4, linestyle="--")
        ax.axvline(patch - 0.5, color="grey", alpha=0.5, label=f"paper 3's patch (blocks ≥ {patch})")
        ax.axhline(
            threshold, color="black", alpha=0.3, linestyle="-.", label=f"the precheck's CKA threshold ({threshold})"
        )
        ax.set_xlabel("block (dashed: the precheck's cut-off for the pair of that colour)")
        ax.set_ylabel("between the two experts")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small", loc="lower left")

    return png(draw, "Where the translators part: CKA (target span) and LAPE overlap per block", width=9)


def section(
    demo, configs: Dict[str, Path], prechecks: Dict[str, Dict[str, Any]], updated: Sequence[int]
) -> Dict[str, Any]:
    """Step 4's translation half: every merge of both pairs, their layer signals, paper 3's
    findings; the plot and JSON are written under ``out/translation``."""
    results = {
        name: compare(demo, f"translation_{name}", configs[f"translation_{name}"], prechecks[f"translation_{name}"])
        for name in PAIRS
    }
    signals = {name: layer_signals(prechecks[f"translation_{name}"]) for name in PAIRS}
    precheck = prechecks["translation_different_targets"]
    selectivity = precheck["diagnostics"].get("selectivity", {}).get("per_layer", {}).get(precheck["base_model"], {})
    base_counts = [sum(values) for values in zip(*selectivity.values())] if selectivity else []
    advice = {name: prechecks[f"translation_{name}"]["recommendation"] for name in PAIRS}
    cutoffs = {name: a["cutoff"] for name, a in advice.items()}
    patch = patch_cutoff(precheck)
    summary = {
        "pairs": {
            name: {
                **results[name],
                "signals": signals[name],
                "verdict": advice[name]["verdict"],
                "cutoff": cutoffs[name],
            }
            for name in PAIRS
        },
        "patch_cutoff": patch,
        "trained_blocks": list(updated),
        "findings": findings(results, signals, base_counts, updated),
        "advice_lost_most": lost_by_advice(results),
    }
    folder = demo.out / "translation"
    summary["files"] = (
        f"{folder / 'translation.json'}, {folder / 'layers.png'}; reports: {demo.out / 'precheck' / 'translation_*' / 'report.html'}"
    )
    write_atomic(folder / "layers.png", plot(signals, cutoffs, patch, precheck["layers"]["cka_threshold"]))
    write_atomic(folder / "translation.json", json.dumps(summary, indent=2) + "\n")
    return summary


def print_section(console, summary: Dict[str, Any], smoke_test: bool = False) -> None:
    """The translation tables and paper 3's findings; ``smoke_test`` (tiny random models) says
    that the numbers mean nothing there."""
    from mergekit_mergeability.output.terminal import wrapping_table

    pairs = summary["pairs"]
    table = wrapping_table(
        "Translators on held-out sentences",
        "pair",
        "merge",
        "expert",
        "chrF",
        "BLEU",
        "kept",
        caption=f"kept = merged chrF ÷ alone; ★ the precheck's advice\npatch (paper 3): blocks ≥ {summary['patch_cutoff']} from the target language's expert",
    )
    for name, pair in pairs.items():
        short = name.split("_")[0]
        for expert, scores in pair["experts"].items():
            table.add_row(
                short, "alone", expert, f"{scores['alone']['chrf']:.1f}", f"{scores['alone']['bleu']:.1f}", "1.00"
            )
        for m in pair["merges"]:
            written = " ".join(str(part) for part in (m["method"], m["cutoff"]) if part is not None)
            label = {
                "layer patch": "patch",
                "recommended": f"{pair['chosen']} ({written})" if pair.get("chosen") else written,
            }.get(m["merge"], m["merge"])
            star = " ★" if m["merge"] == pair["advice"] else ""
            table.add_row(short, label + star, m["expert"], f"{m['chrf']:.1f}", f"{m['bleu']:.1f}", f"{m['kept']:.2f}")
    console.print(table)
    for key, value in (next(iter(pairs.values()))["signatures"] or {}).items():
        console.print(f"[dim]{key.removesuffix('_signature')}: {value}[/dim]")
    layers = wrapping_table(
        "CKA and LAPE overlap between each pair's experts",
        "block",
        "CKA diff.",
        "CKA shared",
        "LAPE diff.",
        "LAPE shared",
        caption="CKA: unbiased, target span (as the precheck reads it)\nLAPE: Jaccard overlap of group-specific neurons",
    )
    blocks = len(pairs["different_targets"]["signals"]["cka_experts"]) - 1
    first = summary["trained_blocks"][0]  # below it every model is the base: a few rows suffice
    cutoffs = {c for c in (p["cutoff"] for p in pairs.values()) if c is not None}
    for block in sorted(
        {0, first // 2, first - 1, *range(first, blocks, 2), first + 1, blocks - 1, *cutoffs} & set(range(blocks))
    ):
        cka = [f"{pairs[n]['signals']['cka_experts'][block + 1]:.2f}" for n in PAIRS]
        overlap = [
            f"{pairs[n]['signals']['overlap_experts'][block]:.2f}" if "overlap_experts" in pairs[n]["signals"] else "–"
            for n in PAIRS
        ]
        layers.add_row(f"{block} ◀" if block in cutoffs else str(block), *cka, *overlap)
    console.print(layers)
    if cutoffs:
        console.print("[dim]◀ the precheck's cut-off: from this block up, each expert's own[/dim]")
    title = "Paper 3's findings on these translators"
    console.print(
        f"[bold]{title}[/bold]"
        + (" [yellow](tiny random models: a smoke test, the findings mean nothing here)[/yellow]" if smoke_test else "")
    )
    for f in summary["findings"]:
        mark = "[green]reproduces[/green]" if f["reproduces"] else "[yellow]does not reproduce[/yellow]"
        console.print(f"- {f['finding']}: {mark} ({f['measured']})")
    for name in summary["advice_lost_most"]:
        verdict = pairs[name]["verdict"].replace("_", " ")
        console.print(
            f"[bold red]The precheck's advice failed on {name.replace('_', ' ')}[/bold red]: it said {verdict}, and that merge kept less than {LOST:.0%} of every translator's chrF."
        )
    console.print(f"wrote {summary['files']}")
