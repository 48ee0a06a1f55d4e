"""--dtype auto, the precheck's default: the config's dtype:, else each checkpoint's own, else float32."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from click.testing import CliRunner

from mergekit_mergeability.sources import load_causal_lm, load_dtype
from mergekit_mergeability.cli import main

PROBE = [{"question": f"Item {i}: which one?", "choices": ["Paris", "water"], "label": i % 2} for i in range(6)]


def _saved_in(source: Path, folder: Path, dtype: torch.dtype) -> Path:
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    model.save_pretrained(folder)
    for tokenizer_file in source.glob("tokenizer*"):
        shutil.copy(tokenizer_file, folder)
    return folder


@pytest.fixture(scope="module")
def bf16(llama, tmp_path_factory):
    """The tiny llama family saved in bfloat16 (config.json says so), with a probe."""
    root = tmp_path_factory.mktemp("bf16")
    family = {name: _saved_in(llama[name], root / name, torch.bfloat16) for name in ("base", "expert0", "expert1")}
    family["probe"] = root / "probe.jsonl"
    family["probe"].write_text("".join(json.dumps(r) + "\n" for r in PROBE))
    return family


def _config(folder: Path, family, **top) -> Path:
    models = [
        {"model": str(family[f"expert{i}"]), "probe": str(family["probe"]), "parameters": {"weight": 0.5}}
        for i in range(2)
    ]
    path = folder / "config.yml"
    path.write_text(
        yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(family["base"]), "models": models, **top})
    )
    return path


def _loads(config: Path, out: Path, monkeypatch, *extra):
    """Run the precheck; the dtype of every model it loaded, and its report."""
    loaded = []
    from_pretrained = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        model = from_pretrained(*args, **kwargs)
        loaded.append(next(model.parameters()).dtype)
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    result = CliRunner().invoke(
        main, ["precheck", str(config), "--out", str(out), "--quiet", "--cka-batch-size", "0", *extra]
    )
    assert result.exit_code in (0, 1), result.output
    monkeypatch.undo()
    return loaded, json.loads((out / "precheck.json").read_text())


def test_auto_loads_each_checkpoint_in_its_own_dtype_unless_told(bf16, tmp_path, monkeypatch):
    config = _config(tmp_path, bf16)
    loaded, report = _loads(config, tmp_path / "auto", monkeypatch)
    assert len(loaded) >= 3 and set(loaded) == {torch.bfloat16}  # knowledge, representations, selectivity: all of them
    assert report["settings"]["dtype"] == "auto" and {m["dtype"] for m in report["models"]} == {"bfloat16"}
    loaded, report = _loads(config, tmp_path / "fp32", monkeypatch, "--dtype", "float32")
    assert len(loaded) >= 3 and set(loaded) == {torch.float32}
    assert {m["dtype"] for m in report["models"]} == {"float32"}


def test_the_configs_dtype_wins_over_the_checkpoints(bf16, tmp_path, monkeypatch):
    loaded, report = _loads(
        _config(tmp_path, bf16, dtype="float16"), tmp_path / "out", monkeypatch, "--skip", "selectivity"
    )
    assert loaded and set(loaded) == {torch.float16}
    assert {m["dtype"] for m in report["models"]} == {"float16"}


def test_knowledge_in_bfloat16_is_finite_and_close_to_float32(bf16, tmp_path, monkeypatch):
    config = _config(tmp_path, bf16)
    skip = ["--skip", "representations", "--skip", "selectivity"]
    numbers = {}
    for dtype in ("auto", "float32"):
        _, report = _loads(config, tmp_path / dtype, monkeypatch, "--dtype", dtype, *skip)
        numbers[dtype] = [
            i["p_gold"] for m in report["models"] if m["knowledge"] for i in m["knowledge"]["per_instance"]
        ]
    assert len(numbers["auto"]) == len(numbers["float32"]) == 12
    assert all(math.isfinite(p) for p in numbers["auto"])
    assert numbers["auto"] != numbers["float32"]  # the two runs did compute in different precisions
    assert max(abs(a - b) for a, b in zip(numbers["auto"], numbers["float32"])) < 0.02


def test_load_dtype_reads_either_spelling_of_the_checkpoints_dtype(tmp_path):
    def folder(name, **config):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
        return path

    assert load_dtype("auto", folder("new", dtype="bfloat16")) == "bfloat16"  # transformers 5
    assert load_dtype("auto", folder("old", torch_dtype="float16")) == "float16"  # before it
    assert load_dtype("auto", folder("none")) == "float32"
    assert load_dtype("auto", folder("odd", torch_dtype="int8")) == "float32"  # not a dtype to run a model in
    assert load_dtype("auto", tmp_path / "new", configured="torch.float16") == "float16"
    assert (
        load_dtype("auto", tmp_path / "new", configured="int64") == "bfloat16"
    )  # mergekit's, but not loadable: the checkpoint's
    assert load_dtype("float32", tmp_path / "new", configured="float16") == "float32"  # what the user asked for wins


def test_load_causal_lm_resolves_auto_for_other_callers(bf16):
    model, _ = load_causal_lm(bf16["base"], dtype="auto")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_evaluate_scores_each_checkpoint_in_its_own_dtype_unless_told(bf16, llama):
    """evaluate's default is the precheck's: a 7B bfloat16 checkpoint is not loaded in float32 (28 GiB)."""
    from mergekit_mergeability.evaluation.scorer import Scorer
    from mergekit_mergeability.settings import RunSettings
    from mergekit_mergeability.sources.cache import Cache

    assert RunSettings().dtype == "auto"
    own = Scorer(bf16["base"], RunSettings(device="cpu"), Cache(None))
    assert own.dtype == "bfloat16" and next(own.base_module()[0].parameters()).dtype == torch.bfloat16
    assert Scorer(llama["base"], RunSettings(device="cpu"), Cache(None)).dtype == "float32"
    assert Scorer(bf16["base"], RunSettings(device="cpu", dtype="float32"), Cache(None)).dtype == "float32"


def test_a_dtype_mergekit_does_not_know_is_one_line(bf16, tmp_path):
    result = CliRunner().invoke(
        main, ["precheck", str(_config(tmp_path, bf16, dtype="float33")), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2 and not (tmp_path / "out").exists(), result.output
    assert (
        result.output.strip()
        == f"Error: {tmp_path / 'config.yml'}: dtype: 'float33' is not a dtype mergekit knows; use bfloat16, float16 or float32"
    )
