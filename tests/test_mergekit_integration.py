"""Our methods through mergekit itself: the stock mergekit-yaml, run_merge, and our CLI."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.merge_methods import merge_state_dicts
from mergekit.options import MergeOptions

import mergekit_mergeability  # noqa: F401
from mergekit_mergeability.sources.architecture import tensor_position
from mergekit_mergeability.cli import main as cli
from conftest import shipped_config
from mergekit_mergeability.tiny import state_dict

BIN = Path(sys.executable).parent
OFFLINE = ["--no-write-model-card", "--lazy-unpickle"]


def _below(name, cutoff):
    """The embedding and blocks below the cut-off: the merged part of a layer_selective model."""
    position = tensor_position(name)
    return position.part == "embedding" or (position.part == "layer" and position.layer < cutoff)


def _models(family):
    return {key: state_dict(family[key]) for key in ("base", "expert0", "expert1")}


def test_stock_mergekit_yaml_runs_knowledge_weighted(llama, tmp_path):
    config = shipped_config("knowledge_weighted.yml", llama, tmp_path)
    done = subprocess.run([BIN / "mergekit-yaml", config, tmp_path / "out", *OFFLINE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    merged = state_dict(tmp_path / "out")
    expected = merge_state_dicts(
        _models(llama),
        "knowledge_weighted",
        base="base",
        parameters={
            "knowledge": {"expert0": 0.85, "expert1": 0.30},
            "temperature": 1.0,
            "ties": True,
            "density": 0.5,
            "scale": 1.0,
        },
    )
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor)


@pytest.mark.parametrize(
    "name", ["knowledge_weighted_plain.yml", "layer_selective.yml", "layer_selective_interpolate.yml"]
)
def test_every_shipped_config_merges_with_run_merge(llama, tmp_path, name):
    config = MergeConfiguration.model_validate(yaml.safe_load(shipped_config(name, llama, tmp_path).read_text()))
    run_merge(config, str(tmp_path / "out"), MergeOptions(write_model_card=False, quiet=True))
    merged = state_dict(tmp_path / "out")
    assert set(merged) == set(state_dict(llama["base"]))


def test_layer_patch_config_takes_upper_layers_from_the_marked_expert(llama, tmp_path):
    config = MergeConfiguration.model_validate(
        yaml.safe_load(shipped_config("layer_selective.yml", llama, tmp_path).read_text())
    )
    run_merge(config, str(tmp_path / "out"), MergeOptions(write_model_card=False, quiet=True))
    merged, models = state_dict(tmp_path / "out"), _models(llama)
    ta = merge_state_dicts(models, "task_arithmetic", base="base", parameters={"weight": 1.0})
    assert merged.keys() == models["base"].keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, ta[name] if _below(name, 2) else models["expert1"][name], msg=name)


def test_interpolate_config_moves_the_lower_layers_halfway_and_keeps_the_base_above(llama, tmp_path):
    """θ_base + 0.5 (θ_expert − θ_base) for the embedding and blocks 0–1; θ_base from block 2 on, norm and head too."""
    config = MergeConfiguration.model_validate(
        yaml.safe_load(shipped_config("layer_selective_interpolate.yml", llama, tmp_path).read_text())
    )
    run_merge(config, str(tmp_path / "out"), MergeOptions(write_model_card=False, quiet=True))
    merged, models = state_dict(tmp_path / "out"), _models(llama)
    base, expert = models["base"], models["expert0"]
    lower = {name for name in base if _below(name, 2)}
    assert merged.keys() == base.keys() and lower and base.keys() - lower
    for name, tensor in merged.items():
        expected = base[name] + 0.5 * (expert[name] - base[name]) if name in lower else base[name]
        torch.testing.assert_close(tensor, expected, msg=name)
        assert not torch.equal(expert[name], base[name]), name  # every tensor tells the two answers apart


@pytest.mark.parametrize(
    "edit, message",
    [
        (("knowledge: 0.30", "knowledge: 1.30"), "'knowledge' of model"),
        (("    parameters:\n      knowledge: 0.30\n", ""), "needs parameter 'knowledge'"),
        (("temperature: 1.0", "temperature: 0"), "'temperature'"),
        (("base_model: ./models/base\n", ""), "requires a base"),
    ],
)
def test_bad_knowledge_weighted_config_one_line_and_nothing_written(llama, tmp_path, edit, message):
    _assert_rejected("knowledge_weighted.yml", llama, tmp_path, edit, message)


@pytest.mark.parametrize(
    "edit, message",
    [
        (("cutoff: 2 ", "cutoff: 9 "), "cutoff 9 is beyond the model's 4 layers"),
        (
            ("  - model: ./models/expert_a\n", "  - model: ./models/expert_a\n    parameters: {upper: true}\n"),
            "only one model",
        ),
        (("base_model: ./models/base\n", ""), "needs base_model"),
    ],
)
def test_bad_layer_selective_config_one_line_and_nothing_written(llama, tmp_path, edit, message):
    _assert_rejected("layer_selective.yml", llama, tmp_path, edit, message)


def _assert_rejected(name, family, tmp_path, edit, message):
    config = shipped_config(name, family, tmp_path, edit)
    result = CliRunner().invoke(cli, ["merge", str(config), str(tmp_path / "out"), *OFFLINE])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no output, no partial folder


def test_merge_command_writes_the_model_and_no_partial(llama, tmp_path):
    config = shipped_config("layer_selective.yml", llama, tmp_path)
    result = CliRunner().invoke(cli, ["merge", str(config), str(tmp_path / "out"), *OFFLINE])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer_selective.yml", "out"]


def test_methods_lists_mergekit_and_ours_with_parameters():
    result = CliRunner().invoke(cli, ["methods"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for expected in (
        "knowledge_weighted",
        "layer_selective",
        "task_arithmetic",
        "ties",
        "builtin",
        "mergekit",
        "cutoff (int) required",
    ):
        assert expected in result.output
