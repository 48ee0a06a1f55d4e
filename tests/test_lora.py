"""PEFT adapters as pool members: references, factors, base + ΔW, and one-line refusals."""

import json
import shutil

import peft
import pytest
import torch

from mergekit_mergeability.sources import load_causal_lm, resolve, tensor_index, tensors
from mergekit_mergeability.sources.adapter import AdapterModel
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tiny import make_adapter, state_dict

TARGETS = [
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
]


@pytest.fixture(scope="module")
def adapter(llama, tmp_path_factory):
    return make_adapter(llama["base"], tmp_path_factory.mktemp("lora") / "adapter", TARGETS, rank=3, alpha=6, seed=1)


def test_both_references_resolve_to_the_adapter_on_its_base(llama, adapter):
    plain, joined = resolve(str(adapter)), resolve(f"{llama['base']}+{adapter}")
    for found in (plain, joined):
        assert isinstance(found, AdapterModel)
        assert found.base == llama["base"].resolve() and found.folder == adapter.resolve()
        assert str(found) == f"{llama['base'].resolve()}+{adapter.resolve()}"  # mergekit's syntax, runs as is
    assert set(plain.targets()) == set(TARGETS)
    assert tensor_index(plain).keys() == tensor_index(llama["base"]).keys()


def test_reader_and_loaded_model_are_base_plus_scaled_product(llama, adapter):
    model = resolve(str(adapter))
    base = state_dict(llama["base"])
    raw = state_dict(adapter)
    reader = tensors(model)
    loaded, _ = load_causal_lm(model)
    loaded_state = loaded.state_dict()
    for name in TARGETS:
        module = "base_model.model." + name[: -len(".weight")]
        expected = base[name] + 2.0 * raw[f"{module}.lora_B.weight"] @ raw[f"{module}.lora_A.weight"]  # alpha 6 / r 3
        assert torch.allclose(reader[name], expected, atol=1e-6)
        assert torch.allclose(reader.rows(name, 2, 5), expected[2:5], atol=1e-6)
        assert torch.allclose(loaded_state[name], expected, atol=1e-6)
    untouched = "model.layers.2.mlp.down_proj.weight"
    assert torch.equal(reader[untouched], base[untouched]) and torch.equal(loaded_state[untouched], base[untouched])


def test_readers_of_one_base_share_its_mapping_until_the_last_goes(llama, adapter, tmp_path):
    import gc

    from safetensors.torch import save_file

    from mergekit_mergeability.sources import folder

    name = TARGETS[0]
    readers = [tensors(resolve(str(adapter))) for _ in range(3)] + [tensors(resolve(str(llama["base"])))]
    assert len({id(r._handle(name)) for r in readers}) == 1  # a pool of adapters maps its base once
    copy = shutil.copytree(llama["base"], tmp_path / "base")
    first = tensors(resolve(str(copy)))
    before = first[name].clone()
    state = state_dict(copy)
    state[name] = state[name] + 1
    for file in copy.glob("*.safetensors"):  # rewritten while a reader still maps the old file
        file.unlink()
    save_file(state, str(first.index[name].file), metadata={"format": "pt"})
    assert torch.equal(tensors(resolve(str(copy)))[name], before + 1)
    del first
    gc.collect()
    assert not any(key[0].startswith(str(copy)) for key in folder._mapped.keys())  # unmapped with its last reader


@pytest.mark.parametrize(
    "arch,settings,modules",
    [
        ("llama", dict(target_modules=["up_proj", "v_proj"], use_rslora=True, alpha_pattern={"v_proj": 3}), 2 * 4),
        ("gpt2", dict(target_modules=["c_attn"], fan_in_fan_out=True), 4),  # Conv1D stores its weight transposed
    ],
)
def test_peft_saved_adapter_matches_merge_and_unload(families, tmp_path, arch, settings, modules):
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(families[arch]["base"])
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=12, init_lora_weights=False, **settings))
    wrapped.save_pretrained(tmp_path / "peft")
    expected = wrapped.merge_and_unload().state_dict()
    reader = tensors(resolve(f"{families[arch]['base']}+{tmp_path / 'peft'}"))
    assert len(reader.targets) == modules
    for name in reader.index:
        assert torch.allclose(reader[name], expected[name], atol=1e-6), name


def test_an_adapter_of_another_base_is_refused_in_one_line(llama, adapter, tmp_path):
    other = shutil.copytree(llama["base"], tmp_path / "other_base")
    with pytest.raises(UserError) as caught:
        resolve(str(adapter), base=other)
    message = str(caught.value)
    assert (
        "\n" not in message
        and str(adapter.resolve()) in message
        and str(other) in message
        and str(llama["base"].resolve()) in message
    )
    assert isinstance(resolve(f"{other}+{adapter}", base=other), AdapterModel)  # named explicitly, it is applied there


@pytest.mark.parametrize(
    "damage,expected",
    [
        (lambda f: (f / "adapter_config.json").write_text("{not json"), "adapter_config.json: not JSON"),
        (
            lambda f: (f / "adapter_config.json").write_text(
                json.dumps({"peft_type": "IA3", "base_model_name_or_path": "x"})
            ),
            "peft_type IA3",
        ),
        (lambda f: (f / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors"),
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(
                (f / "adapter_model.safetensors").read_bytes()[:-5]
            ),
            "truncated",
        ),
    ],
)
def test_a_damaged_adapter_is_named_in_one_line(llama, adapter, tmp_path, damage, expected):
    folder = shutil.copytree(adapter, tmp_path / "damaged")
    damage(folder)
    with pytest.raises(UserError, match=expected) as caught:
        resolve(f"{llama['base']}+{folder}")
    assert "\n" not in str(caught.value)


def test_an_adapter_for_another_shape_is_refused(llama, tmp_path):
    folder = make_adapter(llama["base"], tmp_path / "a", TARGETS[:1])
    from safetensors.torch import save_file

    raw = state_dict(folder)
    raw["base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"] = torch.zeros(7, 4)
    save_file(raw, folder / "adapter_model.safetensors")
    with pytest.raises(UserError, match="model.layers.0.mlp.up_proj.weight is \\[7, 32\\], in the base"):
        resolve(str(folder))


def test_an_adapter_is_refused_where_adapters_are_not_measured(llama, adapter):
    with pytest.raises(UserError, match="a model\\+adapter reference.*merge_and_unload"):
        resolve(f"{llama['base']}+{adapter}", adapters=False)
    with pytest.raises(UserError, match="a peft adapter folder, not a model"):
        resolve(str(adapter), adapters=False)


def test_an_adapter_the_demo_saves_loads_in_peft_without_missing_keys(llama, tmp_path):
    """The demo's experts touch a few layers: their adapter_config names those layers, so peft (as
    mergekit loads ``base+adapter``) builds LoRA there alone and reports no missing adapter keys."""
    import warnings

    from transformers import AutoModelForCausalLM

    from mergekit_mergeability.demo.checkpoints import save_adapter

    generator = torch.Generator().manual_seed(0)
    name, untouched = "model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"
    base = state_dict(llama["base"])
    rows, columns = base[name].shape
    a, b = torch.randn(2, columns, generator=generator), torch.randn(rows, 2, generator=generator)
    folder = save_adapter(llama["base"], {name: (a, b)}, tmp_path / "expert")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama["base"]), folder)
    assert not [w for w in caught if "missing adapter keys" in str(w.message)]
    merged = wrapped.merge_and_unload().state_dict()
    assert torch.allclose(merged[name], base[name] + b @ a, atol=1e-5)
    assert torch.equal(merged[untouched], base[untouched])
