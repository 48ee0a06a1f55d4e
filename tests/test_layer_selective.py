import pytest
import torch
from mergekit.merge_methods import merge_state_dicts, merge_tensors

import mergekit_mergeability  # noqa: F401  (registers the methods)
from mergekit_mergeability.sources.architecture import tensor_position
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tiny import ARCHITECTURES, state_dict


def _models(family):
    return {key: state_dict(family[key]) for key in ("base", "expert0", "expert1")}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cutoff_at_depth_is_task_arithmetic(families, arch):
    models = _models(families[arch])
    params = {"weight": {"base": 1.0, "expert0": 0.7, "expert1": 0.3}}
    ours = merge_state_dicts(models, "layer_selective", base="base", parameters={**params, "cutoff": 4})
    ta = merge_state_dicts(models, "task_arithmetic", base="base", parameters=params)
    for name in models["base"]:
        torch.testing.assert_close(ours[name], ta[name])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cutoff_zero_with_upper_embeddings_is_the_source_exactly(families, arch):
    models = _models(families[arch])
    ours = merge_state_dicts(
        models,
        "layer_selective",
        base="base",
        parameters={"cutoff": 0, "embeddings": "upper", "upper": {"base": False, "expert0": False, "expert1": True}},
    )
    for name, tensor in models["expert1"].items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_layers_split_at_the_cutoff(families, arch):
    models = _models(families[arch])
    ours = merge_state_dicts(models, "layer_selective", base="base", parameters={"cutoff": 2})
    ta = merge_state_dicts(models, "task_arithmetic", base="base", parameters={"weight": 1.0})
    for name in models["base"]:
        position = tensor_position(name)
        lower = position.part == "embedding" or (position.part == "layer" and position.layer < 2)
        expected = ta[name] if lower else models["base"][name]  # no model marked upper: the base
        torch.testing.assert_close(ours[name], expected, msg=name)


def test_layer_1_is_not_layer_11():
    tensors = [torch.zeros(3), torch.ones(3)]
    merged = {
        index: merge_tensors(
            tensors,
            "layer_selective",
            base_index=0,
            parameters={"cutoff": 2},
            name=f"model.layers.{index}.mlp.up_proj.weight",
        )
        for index in (1, 11)
    }
    assert merged[1].tolist() == [1.0] * 3  # merged (task arithmetic)
    assert merged[11].tolist() == [0.0] * 3  # from the base


def test_linear_inner_needs_no_base():
    merged = merge_tensors(
        [torch.zeros(2), torch.full((2,), 4.0)],
        "layer_selective",
        parameters={"cutoff": 1, "inner": "linear", "weight": [3.0, 1.0], "upper": [True, False]},
        name="model.layers.0.self_attn.q_proj.weight",
    )
    assert merged.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base_index": 0, "parameters": {"cutoff": 1, "upper": [False, True, True]}}, "only one model"),
        ({"parameters": {"cutoff": 1}}, "upper: true, or set base_model"),
        ({"parameters": {"cutoff": 1, "upper": [True, False, False]}}, "needs base_model"),
    ],
)
def test_bad_inputs(kwargs, message):
    with pytest.raises(UserError, match=message):
        merge_tensors([torch.zeros(2)] * 3, "layer_selective", name="model.layers.0.mlp.up_proj.weight", **kwargs)
