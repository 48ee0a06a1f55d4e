import pytest

from mergekit_mergeability.sources.architecture import TensorPosition, UnknownTensorError, num_layers, tensor_position
from mergekit_mergeability.tiny import ARCHITECTURES, state_dict


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_tensor_of_a_real_model_has_a_position(families, arch):
    names = state_dict(families[arch]["base"])
    positions = {name: tensor_position(name) for name in names}
    assert num_layers(names) == 4
    assert {p.part for p in positions.values()} == {"embedding", "layer", "head"}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.1.mlp.up_proj.weight", TensorPosition("layer", 1)),
        ("model.layers.11.mlp.up_proj.weight", TensorPosition("layer", 11)),
        ("model.layers.11.self_attn.q_proj.bias", TensorPosition("layer", 11)),  # qwen2
        ("transformer.h.3.attn.c_attn.weight", TensorPosition("layer", 3)),  # gpt2
        ("model.embed_tokens.weight", TensorPosition("embedding")),
        ("transformer.wpe.weight", TensorPosition("embedding")),
        ("model.norm.weight", TensorPosition("head")),
        ("lm_head.weight", TensorPosition("head")),
    ],
)
def test_known_positions(name, expected):
    assert tensor_position(name) == expected


def test_unknown_tensor_is_named_in_the_error():
    with pytest.raises(UnknownTensorError, match="my.custom.tensor"):
        tensor_position("my.custom.tensor")
