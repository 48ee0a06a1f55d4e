import json
import re
import shutil
from pathlib import Path

import pytest

from mergekit_mergeability.diagnostics import Diagnostic, DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.compatibility import Compatibility, tensor_shapes
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.plugins import contributions
from mergekit_mergeability.tiny import make_family, state_dict

from conftest import relabelled, widened


def _inputs(base, *models):
    return DiagnosticInputs(
        base=ModelInput(str(base), Path(base)), models=tuple(ModelInput(str(m), Path(m)) for m in models)
    )


def test_the_builtin_plugin_contributes_it_through_the_hook():
    diagnostics = [d for plugin, d in contributions("mergeability_diagnostics") if plugin == "builtin"]
    assert [d.name for d in diagnostics] == [
        "compatibility",
        "weights",
        "knowledge",
        "fluency",
        "dilution",
        "representations",
        "selectivity",
    ]
    assert isinstance(diagnostics[0], Diagnostic)


def test_headers_give_every_shape_without_loading(llama):
    loaded = state_dict(llama["base"])
    assert tensor_shapes(llama["base"]) == {name: tuple(t.shape) for name, t in loaded.items()}


def test_a_compatible_family_has_no_findings(llama):
    result = Compatibility().run(_inputs(llama["base"], llama["expert0"], llama["expert1"]))
    assert result.findings == []
    assert result.per_model[str(llama["expert0"])]["num_layers"] == 4


def test_a_shallower_model_is_one_line_naming_both_models_field_and_first_tensor(llama, tmp_path):
    shallow = make_family(tmp_path / "shallow", "llama", experts=0, layers=3)["base"]
    findings = Compatibility().run(_inputs(llama["base"], shallow)).findings
    [message] = [f.message for f in findings if f.severity == "error"]
    assert message.startswith(
        f"{shallow} vs {llama['base']}: num_hidden_layers is 3 vs 4 (9 tensors of {llama['base']} missing from {shallow}; first: model.layers.3."
    )


def test_a_wider_model_is_one_line_not_one_per_tensor(llama, tmp_path):
    wide = widened(llama["base"], tmp_path / "wide")
    findings = Compatibility().run(_inputs(llama["base"], wide)).findings
    [message] = [f.message for f in findings if f.severity == "error"]
    assert f"{wide} vs {llama['base']}: hidden_size is 48 vs 32 (" in message
    assert re.search(r"\((\d+) tensors differ in shape; first: \S+ \[\d+(, \d+)?\] vs \[\d+(, \d+)?\]\)$", message), (
        message
    )


def test_another_architecture_is_caught(llama, families):
    findings = Compatibility().run(_inputs(llama["base"], families["gpt2"]["base"])).findings
    assert any("architectures is ['GPT2LMHeadModel'] vs ['LlamaForCausalLM']" in f.message for f in findings)


def test_a_folder_without_weights_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no weights"):
        tensor_shapes(tmp_path)


def test_different_vocabularies_with_equal_shapes_are_an_error_unless_mergekit_aligns_them(llama, tmp_path):
    other_words = relabelled(llama["expert0"], tmp_path / "relabelled")
    inputs = _inputs(llama["base"], other_words)
    [error] = [f.message for f in Compatibility().run(inputs).findings if f.severity == "error"]
    assert (
        f"{other_words} vs {llama['base']}: vocabularies differ: 2 of " in error
        and "first: id 5 is" in error
        and "tokenizer_source" in error
    )
    aligned = DiagnosticInputs(inputs.base, inputs.models, tokenizer_source="union")
    findings = Compatibility().run(aligned).findings
    assert [f.severity for f in findings] == ["info"] and "tokenizer_source: union aligns them" in findings[0].message


def _edited(source, folder, file, **changes):
    """A copy of a model folder with keys of one of its JSON files changed (None: removed)."""
    copy = shutil.copytree(source, folder)
    settings = json.loads((copy / file).read_text())
    settings.update(changes)
    (copy / file).write_text(json.dumps({k: v for k, v in settings.items() if v is not None}))
    return copy


def _fim(source, folder):
    """A copy whose tokenizer has fill-in-the-middle tokens, as a code model's has."""
    copy = shutil.copytree(source, folder)
    fast = json.loads((copy / "tokenizer.json").read_text())
    top = max(fast["model"]["vocab"].values())
    fast["added_tokens"] += [
        {
            "id": top + i,
            "content": t,
            "special": True,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
        }
        for i, t in enumerate(["<fim_prefix>", "<fim_middle>", "<fim_suffix>"], 1)
    ]
    (copy / "tokenizer.json").write_text(json.dumps(fast))
    return copy


@pytest.mark.parametrize(
    "change, severity, said",
    [
        ("rope_theta", "warning", "RoPE differs (rope_theta is 500000.0 vs 10000.0)"),
        ("rope_scaling", "warning", "RoPE differs (factor is 4.0 vs None; rope_type is linear vs default)"),
        ("model_type", "warning", "model_type is mistral vs llama; the shapes agree"),
        ("fim", "warning", "has fill-in-the-middle tokens (<fim_middle>, <fim_prefix>, <fim_suffix>)"),
        ("chat_template", "info", "chat templates differ"),
    ],
)
def test_models_that_differ_in_one_setting_get_one_line_for_it(llama, tmp_path, change, severity, said):
    """mergekit's own pre-merge checker's findings, at its severities, each on tiny models that differ in it alone."""
    base, copy = llama["base"], tmp_path / "changed"
    theta = {"rope_theta": 500000.0, "rope_type": "default"}
    changed = {
        "rope_theta": lambda: _edited(llama["expert0"], copy, "config.json", rope_parameters=theta),
        "rope_scaling": lambda: _edited(
            llama["expert0"],
            copy,
            "config.json",
            rope_parameters={"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0},
        ),
        "model_type": lambda: _edited(llama["expert0"], copy, "config.json", model_type="mistral"),
        "fim": lambda: _fim(llama["expert0"], copy),
        "chat_template": lambda: _edited(
            llama["expert0"], copy, "tokenizer_config.json", chat_template="{{ messages }}"
        ),
    }[change]()
    findings = [
        f
        for f in Compatibility().run(_inputs(base, changed)).findings
        if said.split(" (")[0].split(";")[0] in f.message
    ]
    assert [(f.severity, said in f.message) for f in findings] == [(severity, True)], findings
    assert findings[0].message.startswith(f"{changed} vs {base}: ") and "\n" not in findings[0].message
    assert Compatibility().run(_inputs(base, llama["expert1"])).findings == []  # the unchanged pair says nothing


def test_rope_settings_are_read_where_any_transformers_version_wrote_them():
    from mergekit_mergeability.diagnostics.compatibility import rope_settings

    old = {"rope_theta": 1e6, "rope_scaling": {"type": "linear", "rope_type": "linear", "factor": 2.0}}
    new = {"rope_parameters": {"rope_theta": 1e6, "rope_type": "linear", "factor": 2.0}}
    assert rope_settings(old) == rope_settings(new) == {"rope_theta": 1e6, "rope_type": "linear", "factor": 2.0}
    assert rope_settings({}) == {}


def test_special_tokens_differing_are_a_warning_and_chat_templates_an_info_line(llama, tmp_path):
    chat = shutil.copytree(llama["expert0"], tmp_path / "chat")
    settings = json.loads((chat / "tokenizer_config.json").read_text())
    settings.update(eos_token="Paris", chat_template="{{ messages }}")
    (chat / "tokenizer_config.json").write_text(json.dumps(settings))
    findings = Compatibility().run(_inputs(llama["base"], chat)).findings
    assert [f.severity for f in findings] == ["warning", "info"]
    assert "eos_token 'Paris' vs '<eos>'" in findings[0].message and "chat templates differ" in findings[1].message


def test_models_without_tokenizer_files_skip_the_comparison(llama, tmp_path):
    bare = shutil.copytree(llama["expert0"], tmp_path / "bare", ignore=shutil.ignore_patterns("tokenizer*"))
    findings = Compatibility().run(_inputs(llama["base"], bare)).findings
    assert [(f.severity, f.message) for f in findings] == [
        ("info", f"{bare} vs {llama['base']}: tokenizers not compared, {bare} has no tokenizer files")
    ]


def test_tokenizer_files_shared_by_many_fine_tunes_are_parsed_once(llama, tmp_path):
    """A pool of fine-tunes that ship their base's own tokenizer files: each file read, parsed once."""
    from mergekit_mergeability.sources import vocabulary

    copies = [shutil.copytree(llama["expert0"], tmp_path / f"copy{i}") for i in range(3)]
    vocabulary._parsed.cache_clear()
    first = vocabulary.read(copies[0])
    parsed = vocabulary._parsed.cache_info().misses
    others = [vocabulary.read(folder) for folder in copies[1:]]
    assert parsed >= 1 and vocabulary._parsed.cache_info().misses == parsed
    assert others == [first, first] and others[0].tokens is not first.tokens  # equal, each its own map
