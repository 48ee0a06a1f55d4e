"""Gibberish caught before the merge: the merge as written, built in memory, read for perplexity on
a shipped general text against the base and each parent."""

import json

import pytest
import torch
import transformers
import yaml

from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.fluency import (
    FALLS_APART,
    TEXT,
    Fluency,
    perplexity,
    signature_kept,
    token_logprobs,
    windows,
)
from mergekit_mergeability.rehearsal.planned import plan
from mergekit_mergeability.resources import shipped
from mergekit_mergeability.tiny import config, derive, train_tokenizer

from conftest import noise, precheck_cli

UPPER = (".layers.2.", ".layers.3.")  # the upper two of four blocks
SCALE = 50.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama taught the shipped text for a few steps, so that its perplexity means something."""
    root = tmp_path_factory.mktemp("fluency")
    tok = train_tokenizer()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config("llama", len(tok)))
    text = windows(tok, shipped(TEXT).read_text(), 64)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(100):
        optimiser.zero_grad()
        model(input_ids=text, labels=text).loss.backward()
        optimiser.step()
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root / "base"


def rescaled(up: float):
    """An update that multiplies the upper blocks' MLP up_proj and attention v_proj by ``up``, and
    their down_proj and o_proj by 1/up: the same function (down(act(gate)·up) is linear in each,
    and so is o(attention·v)), far from the base in weight space."""

    def update(name, tensor):
        if not any(u in name for u in UPPER):
            return 0 * tensor
        if "mlp.up_proj" in name or "self_attn.v_proj" in name:
            return (up - 1) * tensor
        if "mlp.down_proj" in name or "self_attn.o_proj" in name:
            return (1 / up - 1) * tensor
        return 0 * tensor

    return update


def _config(tmp_path, base, experts, method="task_arithmetic"):
    document = {
        "merge_method": method,
        "base_model": str(base),
        "models": [{"model": str(e), "parameters": {"weight": 0.5}} for e in experts],
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(document))
    return path, document


def _inputs(base, experts, document):
    models = tuple(ModelInput(str(e), e) for e in experts)
    return DiagnosticInputs(ModelInput(str(base), base), models, merge=plan(document, "config.yml"))


def test_each_rescaled_expert_is_the_base_and_their_merge_falls_apart(trained, tmp_path):
    experts = [derive(trained, tmp_path / "a", rescaled(SCALE)), derive(trained, tmp_path / "b", rescaled(1 / SCALE))]
    _, document = _config(tmp_path, trained, experts)
    result = Fluency().run(_inputs(trained, experts, document))
    found = list(result.per_model.values())
    for values in found:
        assert values["perplexity"] == pytest.approx(values["base_perplexity"], rel=1e-3)
    assert found[0]["merged_perplexity"] > FALLS_APART * found[0]["base_perplexity"]
    (error,) = [f for f in result.findings if f.severity == "error"]
    assert "falls apart" in error.message and f"{found[0]['merged_perplexity']:.4g}" in error.message


def test_a_sound_merge_stays_near_its_parents(trained, tmp_path):
    experts = [derive(trained, tmp_path / f"e{i}", noise(i, 0.01)) for i in range(2)]
    _, document = _config(tmp_path, trained, experts, "ties")
    result = Fluency().run(_inputs(trained, experts, document))
    values = next(iter(result.per_model.values()))
    worst = max(v["perplexity"] for v in result.per_model.values())
    assert values["merged_perplexity"] < 1.2 * max(worst, values["base_perplexity"])
    assert not [f for f in result.findings if f.severity == "error"]
    assert values["base_perplexity"] < 0.5 * len(train_tokenizer())  # trained: far below a uniform guess


def test_the_precheck_says_do_not_merge_from_perplexity_alone_without_probes(trained, tmp_path):
    experts = [derive(trained, tmp_path / "a", rescaled(SCALE)), derive(trained, tmp_path / "b", rescaled(1 / SCALE))]
    path, _ = _config(tmp_path, trained, experts)
    result = precheck_cli(path, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    assert report["recommendation"]["verdict"] == "do_not_merge", result.output
    assert any("falls apart" in reason for reason in report["recommendation"]["reasons"])
    assert "falls apart" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "recommended.yml").exists()


def test_perplexity_is_exp_of_the_mean_token_loss(trained):
    model = transformers.AutoModelForCausalLM.from_pretrained(trained)
    tok = transformers.AutoTokenizer.from_pretrained(trained)
    text = windows(tok, shipped(TEXT).read_text(), 32)
    assert text.shape[1] == 32 and text.shape[0] > 10
    with torch.no_grad():
        loss = model(input_ids=text, labels=text).loss.item()  # transformers' own mean over the shifted tokens
    assert perplexity(token_logprobs(model, text)) == pytest.approx(torch.tensor(loss).exp().item(), rel=1e-5)


def test_the_signature_kept_is_the_merges_shift_projected_on_the_models_own():
    base = torch.zeros(20)
    model = torch.linspace(-1, 1, 20)
    assert signature_kept(model, base, model) == pytest.approx(1.0)
    assert signature_kept(model, base, base) == pytest.approx(0.0)
    assert signature_kept(model, base, 0.5 * model) == pytest.approx(0.5)
    assert signature_kept(model, base, -model) == pytest.approx(-1.0)
    # only the model's largest shifts count: a merge that moves the other tokens changes nothing
    elsewhere = torch.where(model.abs() >= 0.95, model, torch.full_like(model, 5.0))
    assert signature_kept(model, base, elsewhere, share=0.1) == pytest.approx(1.0)


def test_a_config_without_probes_gets_no_prediction_and_what_was_measured_under_its_own_name(trained, tmp_path):
    """Three fine-tunes, no probes: no model gets a predicted number (the signature measured does not
    rank models); each keeps the share of its own shift on the shipped text that the merge keeps
    (``signature_kept``, which differs where their updates differ) and the merge's perplexity, under
    those names; the first line under the table says how to get a prediction."""
    scales = {"small": 0.01, "large_a": 0.05, "large_b": 0.05}
    experts = [derive(trained, tmp_path / name, noise(i, s)) for i, (name, s) in enumerate(scales.items())]
    path, _ = _config(tmp_path, trained, experts)
    result = precheck_cli(path, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    models = [m for m in report["models"] if m["role"] == "expert"]
    assert [(m["predicted_mergeability"], m["predicted_interval"]) for m in models] == [(None, None)] * 3
    assert len({m["fluency"]["signature_kept"] for m in models}) == 3
    for model in models:
        fluency = model["fluency"]
        assert model["reasons"] == [
            f"no probe, no prediction: the merge as written keeps {fluency['signature_kept']:.2f} of its shift on a "
            f"general text (signature_kept), perplexity {fluency['merged_perplexity']:.3g} there (base {fluency['base_perplexity']:.3g})"
        ]
    lines = result.output.splitlines()
    below = lines[max(i for i, line in enumerate(lines) if line.startswith(("└", "╰", "+"))) + 1]
    assert below.startswith("No prediction: no model has a probe; for one, give each model a probe:"), below
    assert "shift kept" in result.output and "Token indices sequence length" not in result.output
    page = (tmp_path / "out" / "report.html").read_text()
    assert "no probe, no prediction" in page


def test_the_shipped_text_is_cut_into_windows_without_a_tokenizer_warning(caplog):
    """It is tokenised whole, longer than the model reads at once, then cut: transformers would warn
    "Token indices sequence length is longer than the specified maximum…" once per tokenizer."""
    tok = train_tokenizer()
    tok.model_max_length = 64
    assert windows(tok, shipped(TEXT).read_text()).shape[1] == 256
    assert "Token indices sequence length" not in caplog.text
    tok(shipped(TEXT).read_text())  # the same call without verbose=False: the warning this guards against
    assert "Token indices sequence length" in caplog.text


def test_where_every_model_has_a_probe_a_falling_merge_is_a_warning_its_tasks_decide(trained, tmp_path):
    from mergekit_mergeability import tasks

    experts = [derive(trained, tmp_path / "a", rescaled(SCALE)), derive(trained, tmp_path / "b", rescaled(1 / SCALE))]
    _, document = _config(tmp_path, trained, experts)
    probe = tmp_path / "probe.jsonl"
    probe.write_text(json.dumps({"question": "Which one?", "choices": ["q", "x"], "label": 0}) + "\n")
    models = tuple(ModelInput(str(e), e, tasks.load(str(probe))) for e in experts)
    inputs = DiagnosticInputs(ModelInput(str(trained), trained), models, merge=plan(document, "config.yml"))
    (finding,) = [f for f in Fluency().run(inputs).findings if "falls apart" in f.message]
    assert finding.severity == "warning" and "rehearsed scores" in finding.message
