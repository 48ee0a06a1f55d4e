# %% [markdown]
# # The Python API, cell by cell
#
# Everything the CLI does, from Python: precheck a merge, merge what it recommends, score the
# merge, measure mergeability, and read every result as an object. It runs offline in a few
# minutes on a CPU, on tiny random models (`mergekit_mergeability.tiny`): the numbers mean
# nothing, the calls are the ones you would make on real fine-tunes.
#
#     python examples/api.py --out api-out
#
# Run it as a script, or cell by cell (`# %%`) in an editor that knows the format.

# %%
import argparse
import json
from pathlib import Path

import mergekit_mergeability as mm
from mergekit_mergeability.tiny import make_family

parser = argparse.ArgumentParser(description="The Python API on tiny offline models.")
parser.add_argument("--out", type=Path, default=Path("api-out"), help="work folder")
out = parser.parse_args().out

# %% [markdown]
# ## Three fine-tunes of one base, each with the task it was tuned for
#
# A probe is a JSONL file of multiple-choice questions: what the fine-tune should still answer
# after the merge. A mergekit config names it with a `probe:` key beside `model:` (mergekit
# ignores the key, so the same file still runs with `mergekit-yaml`).

# %%
models = make_family(out / "models", "llama", experts=3)
questions = ["The capital of France is", "Water boils at one hundred", "The quick brown fox jumps over the"]
choices = ["Paris.", "degrees.", "dog.", "fox."]


def probe(name: str, gold: int) -> str:
    path = out / f"{name}.jsonl"
    lines = [{"question": q, "choices": choices, "label": (gold + i) % len(choices)} for i, q in enumerate(questions)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


config = {
    "merge_method": "task_arithmetic",
    "base_model": str(models["base"]),
    "models": [
        {"model": str(models[name]), "probe": probe(name, i), "parameters": {"weight": 1 / 3}}
        for i, name in enumerate(["expert0", "expert1", "expert2"])
    ],
    "dtype": "float32",
}

# %% [markdown]
# ## Precheck: will they merge well?
#
# `mm.precheck` takes the config (a file, or its document as here) and the settings as one
# frozen object; every default is stated once, in `mergekit_mergeability.settings`. With `out`
# it also writes precheck.json, the recommended configs and report.html.

# %%
settings = mm.PrecheckSettings(limit=16, device="cpu", quiet=True)
result = mm.precheck(config, settings=settings, out=out / "precheck")
print("verdict:", result.verdict)
for model in result.experts:
    print(f"  {model.name}: predicted mergeability {model.predicted:.2f}; {'; '.join(model.reasons)}")
print("settings as used:", {k: result.settings[k] for k in ("limit", "device", "dtype", "fewshot")})

# %% [markdown]
# The result is precheck.json, typed: `result.to_json()` is the file.

# %%
written = json.loads((out / "precheck" / "precheck.json").read_text())
assert result.to_json() == written
print("models in the report:", [m["name"] for m in written["models"]])

# %% [markdown]
# ## Merge what it recommends
#
# `result.recommended` holds each recommended config as mergekit parses it (a
# `MergeConfiguration`, model paths absolute): hand it to mergekit's own `run_merge`.

# %%
from mergekit.merge import MergeOptions, run_merge  # noqa: E402  (mergekit's API, not ours)

merged = out / "merged"
if result.recommended:
    file, recommended = next(iter(result.recommended.items()))
    print(f"merging {file}: {recommended.merge_method}")
    run_merge(recommended, str(merged), MergeOptions(quiet=True, write_model_card=False, copy_tokenizer=True))

# %% [markdown]
# ## Score the merge on each expert's task
#
# `mm.evaluate` scores the base, the merged model and each expert on the expert's probe, as an
# lm-eval task; `RunSettings` are what every command that runs models shares.

# %%
if merged.is_dir():
    evaluation = mm.evaluate(config, merged, settings=mm.RunSettings(device="cpu", quiet=True))
    for task in evaluation.tasks:
        print(
            f"  {Path(task['task']).stem}: base {task['base']:.2f}, expert {task['expert']:.2f}, merged {task['merged']:.2f}"
        )

# %% [markdown]
# ## Measure mergeability: each model's own-task score after merging with random partners
#
# Will it Merge?'s protocol, merged in memory. Without `out`, nothing is written.

# %%
measured = mm.mergeability(config, partners=1, trials=1, settings=mm.RunSettings(device="cpu", quiet=True))
for row in measured.models:
    print(
        f"  {Path(row['path']).name}: mergeability {row['mergeability']:.2f} (expert alone {row['expert_score']:.2f})"
    )
print("done; files in", out)
