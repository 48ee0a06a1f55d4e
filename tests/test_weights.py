"""Task-vector statistics streamed from safetensors: known answers on crafted updates."""

import math
import pytest
import torch

from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.weights import WeightStatistics
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tiny import derive, state_dict


def _run(base, experts):
    inputs = DiagnosticInputs(
        ModelInput("base", base),
        tuple(ModelInput(name, path) for name, path in experts.items()),
        PrecheckSettings(quiet=True),
    )
    return WeightStatistics().run(inputs)


@pytest.fixture(scope="module")
def crafted(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("crafted")
    g = torch.Generator().manual_seed(5)
    directions = {k: torch.randn(v.shape, generator=g) * 0.01 for k, v in state_dict(llama["base"]).items()}
    return {
        "a": derive(llama["base"], root / "a", lambda k, v: directions[k]),
        "opposite": derive(llama["base"], root / "opposite", lambda k, v: -directions[k]),
        "double": derive(llama["base"], root / "double", lambda k, v: 2 * directions[k]),
        "layer1": derive(llama["base"], root / "layer1", lambda k, v: directions[k] * (".layers.1." in k)),
    }, directions


def test_cosine_and_sign_conflicts_of_known_updates(llama, crafted):
    experts, _ = crafted
    result = _run(llama["base"], {k: experts[k] for k in ("a", "opposite", "double")})
    assert result.per_pair[("a", "opposite")]["cosine"] == pytest.approx(-1, abs=1e-5)
    assert result.per_pair[("a", "opposite")]["sign_conflict"] == pytest.approx(1, abs=1e-3)
    assert result.per_pair[("a", "double")]["cosine"] == pytest.approx(1, abs=1e-5)
    assert result.per_pair[("a", "double")]["sign_conflict"] == pytest.approx(0, abs=1e-3)
    assert not result.findings


def test_norms_per_layer_match_the_state_dicts(llama, crafted):
    experts, directions = crafted
    result = _run(llama["base"], {"layer1": experts["layer1"], "a": experts["a"]})
    per_layer = result.per_layer["layer1"]["update_norm"]
    assert per_layer[0] == pytest.approx(0, abs=1e-6) and per_layer[2] == pytest.approx(0, abs=1e-6)
    expected = math.sqrt(sum(float(d.square().sum()) for k, d in directions.items() if ".layers.1." in k))
    assert per_layer[1] == pytest.approx(expected, rel=1e-3)
    total = math.sqrt(sum(float(d.square().sum()) for d in directions.values()))
    assert result.per_model["a"]["update_norm"] == pytest.approx(total, rel=1e-3)
    assert len(result.per_layer["a"]["update_norm"]) == 4


def test_nan_weights_are_an_error_finding(llama, tmp_path):
    broken = derive(
        llama["base"],
        tmp_path / "broken",
        lambda k, v: torch.full_like(v, float("nan")) if "layers.0.mlp" in k else 0 * v,
    )
    result = _run(llama["base"], {"broken": broken})
    assert result.per_model["broken"]["nonfinite"] > 0
    assert [f.severity for f in result.findings] == ["error"]
    assert "NaN/Inf" in result.findings[0].message and "broken" in result.findings[0].message


def test_top_singular_value_and_interference_of_known_updates(llama, tmp_path):
    g = torch.Generator().manual_seed(7)
    name = "model.layers.2.mlp.up_proj.weight"
    shape = state_dict(llama["base"])[name].shape
    low_rank = torch.randn(shape[0], 3, generator=g) @ torch.randn(3, shape[1], generator=g) * 0.01
    only = lambda update: lambda k, v: update if k == name else 0 * v  # noqa: E731
    experts = {
        "lora": derive(llama["base"], tmp_path / "lora", only(low_rank)),
        "same": derive(llama["base"], tmp_path / "same", only(low_rank)),
        "undo": derive(llama["base"], tmp_path / "undo", only(-2 * low_rank)),
    }
    result = _run(llama["base"], experts)
    assert result.per_model["lora"]["top_singular_value"] == pytest.approx(
        float(torch.linalg.matrix_norm(low_rank.double(), ord=2)), rel=1e-4
    )
    # lora + same − 2·lora = 0: the rest cancels lora exactly; undo's rest (2·lora) is its exact opposite
    assert result.per_model["lora"]["pool_cosine"] == pytest.approx(-1, abs=1e-5)
    assert result.per_model["undo"]["pool_cosine"] == pytest.approx(-1, abs=1e-5)
    assert result.per_model["lora"]["mean_cosine"] == pytest.approx(0, abs=1e-5)  # (1 + −1) / 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the pass's products run there")
def test_the_pass_on_a_cuda_device_gives_the_cpus_numbers(llama, crafted):
    experts, _ = crafted
    pool = {k: experts[k] for k in ("a", "opposite", "layer1")}
    inputs = DiagnosticInputs(
        ModelInput("base", llama["base"]),
        tuple(ModelInput(name, path) for name, path in pool.items()),
        PrecheckSettings(quiet=True, device="cuda"),
    )
    on_gpu, on_cpu = WeightStatistics().run(inputs), _run(llama["base"], pool)
    for model, values in on_cpu.per_model.items():
        assert on_gpu.per_model[model] == pytest.approx(values, rel=1e-4, abs=1e-6)
    for pair, values in on_cpu.per_pair.items():
        assert on_gpu.per_pair[pair] == pytest.approx(values, rel=1e-4, abs=1e-6)
