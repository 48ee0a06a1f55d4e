from pathlib import Path

import pytest

from mergekit_mergeability.diagnostics import Diagnostic, DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.compatibility import Compatibility, tensor_shapes
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.plugins import contributions
from mergekit_mergeability.tiny import make_family, state_dict


def _inputs(base, *models):
    return DiagnosticInputs(
        base=ModelInput(str(base), Path(base)), models=tuple(ModelInput(str(m), Path(m)) for m in models)
    )


def test_the_builtin_plugin_contributes_it_through_the_hook():
    diagnostics = [d for plugin, d in contributions("mergeability_diagnostics") if plugin == "builtin"]
    assert [d.name for d in diagnostics] == ["compatibility", "weights", "knowledge", "representations"]
    assert isinstance(diagnostics[0], Diagnostic)


def test_headers_give_every_shape_without_loading(llama):
    loaded = state_dict(llama["base"])
    assert tensor_shapes(llama["base"]) == {name: tuple(t.shape) for name, t in loaded.items()}


def test_a_compatible_family_has_no_findings(llama):
    result = Compatibility().run(_inputs(llama["base"], llama["expert0"], llama["expert1"]))
    assert result.findings == []
    assert result.per_model[str(llama["expert0"])]["num_layers"] == 4


def test_a_shallower_model_is_caught_naming_model_field_and_tensor(llama, tmp_path):
    shallow = make_family(tmp_path / "shallow", "llama", experts=0, layers=3)["base"]
    findings = Compatibility().run(_inputs(llama["base"], shallow)).findings
    messages = [f.message for f in findings if f.severity == "error"]
    assert any("num_hidden_layers is 3 vs 4" in m and str(shallow) in m for m in messages)
    assert any("model.layers.3.mlp.up_proj.weight is missing" in m for m in messages)


def test_another_architecture_is_caught(llama, families):
    findings = Compatibility().run(_inputs(llama["base"], families["gpt2"]["base"])).findings
    assert any("architectures is ['GPT2LMHeadModel'] vs ['LlamaForCausalLM']" in f.message for f in findings)


def test_a_folder_without_weights_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no .safetensors files"):
        tensor_shapes(tmp_path)
