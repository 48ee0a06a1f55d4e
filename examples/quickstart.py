"""Merge tiny local models with the plugin's methods through the stock mergekit-yaml,
then show how much of each expert's update every merge kept.

The experts are random perturbations of a tiny Llama: this shows the mechanics
(what each method does to each update), not mergeability on real tasks — that is
the demo's job on SmolLM2-135M.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.table import Table

from mergekit_mergeability.methods import knowledge_weights
from mergekit_mergeability.tiny import make_family, state_dict

KNOWLEDGE = {"expert0": 0.9, "expert1": 0.6, "expert2": 0.2}  # the base's accuracy on each expert's task


def configs(models):
    experts = [{"model": str(models[k])} for k in KNOWLEDGE]
    base = str(models["base"])
    return {
        "task_arithmetic (mean)": {
            "merge_method": "task_arithmetic",
            "base_model": base,
            "models": [{**e, "parameters": {"weight": 1 / 3}} for e in experts],
        },
        "knowledge_weighted": {
            "merge_method": "knowledge_weighted",
            "base_model": base,
            "models": [{**e, "parameters": {"knowledge": k}} for e, k in zip(experts, KNOWLEDGE.values())],
            "parameters": {"temperature": 1.0},
        },
        "layer_selective (cutoff 2, upper = expert2)": {
            "merge_method": "layer_selective",
            "base_model": base,
            "models": [
                {**e, "parameters": {"weight": 1 / 3, "upper": k == "expert2"}} for e, k in zip(experts, KNOWLEDGE)
            ],
            "parameters": {"cutoff": 2},
        },
    }


def kept(merged, base, expert):
    """Projection of the merged update on the expert's update: 1 = all of it kept."""
    delta = torch.cat([(expert[n] - base[n]).flatten() for n in base])
    moved = torch.cat([(merged[n] - base[n]).flatten() for n in base])
    return (moved @ delta / (delta @ delta)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("quickstart-out"), help="work folder (replaced)")
    out = parser.parse_args().out
    shutil.rmtree(out, ignore_errors=True)
    models = make_family(out / "models", "llama", experts=3)
    weights = {s: state_dict(p) for s, p in models.items()}
    console = Console()
    table = Table(
        "merge",
        *(f"{k}\n(base knows {v:.0%})" for k, v in KNOWLEDGE.items()),
        title="share of each expert's update kept",
    )
    for label, config in configs(models).items():
        path = out / f"{config['merge_method']}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        merged_dir = out / f"merged-{config['merge_method']}"
        console.print(f"[bold]mergekit-yaml[/bold] {path} {merged_dir}")
        bin_dir = Path(sys.executable).parent
        subprocess.run([bin_dir / "mergekit-yaml", path, merged_dir, "--no-write-model-card", "--quiet"], check=True)
        merged = state_dict(merged_dir)
        table.add_row(label, *(f"{kept(merged, weights['base'], weights[k]):.2f}" for k in KNOWLEDGE))
    console.print(table)
    w = knowledge_weights(list(KNOWLEDGE.values()), temperature=1.0)
    console.print(
        "knowledge weights at temperature 1: " + ", ".join(f"{k} {x:.2f}" for k, x in zip(KNOWLEDGE, w.tolist()))
    )
    console.print(f"configs and merged models are in {out}/")


if __name__ == "__main__":
    main()
