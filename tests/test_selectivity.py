"""Neuron selectivity (LAPE): the maths on hand-computed arrays, the diagnostic on tiny models
whose neurons are set to fire for one probe group only, and precheck end to end."""

import json
import math

import jsonschema
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.cli import main
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.selectivity import (
    Selectivity,
    activation_modules,
    activation_probabilities,
)
from mergekit_mergeability.diagnostics.rows import probe_groups
from mergekit_mergeability.maths import lape
from mergekit_mergeability.decide.verdict import cutoff_from_curve, decide_cutoff, divergence_curve
from mergekit_mergeability.output.precheck_report import SCHEMA
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tasks import load
from mergekit_mergeability.tiny import ARCHITECTURES, derive, train_tokenizer

DIGITS, LETTERS = "0123456789", "QXZJK"  # bytes the tiny tokenizer never merged: one token each
FIRES_FOR_DIGITS, FIRES_FOR_LETTERS, FIRES_FOR_ALL = range(0, 4), range(4, 6), range(6, 10)


# the maths


def test_normalised_entropy_known_values():
    # G=2, one layer, 4 neurons: one-group, one-group, even, never fires
    p = np.array([[[0.6, 0.0, 0.3, 0.0]], [[0.0, 0.2, 0.3, 0.0]]])
    assert lape.normalised_entropy(p).tolist() == [[0.0, 0.0, 1.0, 0.0]]
    # shares 1/4, 3/4: -(1/4 ln 1/4 + 3/4 ln 3/4) / ln 2
    h = lape.normalised_entropy(np.array([[[0.1]], [[0.3]]]))[0, 0]
    assert h == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) / math.log(2))
    # three groups, even: 1
    assert lape.normalised_entropy(np.full((3, 1, 1), 0.4))[0, 0] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        lape.normalised_entropy(np.ones((1, 1, 1)))


def test_kth_smallest_is_torch_kthvalue():
    values = np.array([0.5, 0.1, 0.9, 0.3, 0.7])
    assert lape.kth_smallest(values, 0.8) == 0.7  # k = round(5 · 0.8) = 4
    assert lape.kth_smallest(values, 0.8) == torch.tensor(values).kthvalue(4).values.item()
    assert lape.kth_smallest(values, 0.0) == 0.1


P = np.array(  # G=2, L=2, N=5
    [
        [[0.9, 0.0, 0.8, 0.7, 0.1], [0.4, 0.2, 0.0, 0.5, 0.3]],  # group 0
        [[0.0, 0.9, 0.8, 0.1, 0.1], [0.6, 0.0, 0.0, 0.0, 0.3]],  # group 1
    ]
)


def _specific(p, entropy_quantile, activation_quantile=lape.ACTIVATION_QUANTILE):
    return np.argwhere(lape.specific(p, *lape.thresholds([p], entropy_quantile, activation_quantile))).tolist()


def test_specific_neurons_hand_computed():
    # 20 p values; the 70% bar is the 14th smallest = 0.5
    assert lape.kth_smallest(P, 0.7) == 0.5
    # above the bar: l0 n0 (g0), l0 n1 (g1), l0 n2 (g0 and g1: every group, never a candidate),
    # l0 n3 (g0), l1 n0 (g1). Entropies: l0 n0 and l0 n1 0; l0 n3 H(1/8, 7/8) = 0.54; l1 n0 H(0.4, 0.6) = 0.97
    assert lape.normalised_entropy(P)[0, 3] == pytest.approx(
        -(math.log(1 / 8) / 8 + 7 / 8 * math.log(7 / 8)) / math.log(2)
    )
    # keep round(10 · 0.2) = 2: the cut is the 2nd smallest entropy, 0
    assert lape.thresholds([P], 0.2, 0.7) == (0.5, 0.0)
    assert _specific(P, 0.2, 0.7) == [[0, 0, 0], [1, 0, 1]]
    three = lape.specific(P, *lape.thresholds([P], 0.3, 0.7))
    assert np.argwhere(three).tolist() == [[0, 0, 0], [0, 0, 3], [1, 0, 1]]
    assert lape.counts(three).tolist() == [[2, 0], [1, 0]]
    # a quota past the candidates (cut = inf) keeps them all, l0 n2 still out
    assert _specific(P, 1.0, 0.7) == [[0, 0, 0], [0, 0, 3], [1, 0, 1], [1, 1, 0]]
    # a quota of 1 neuron keeps both tied at entropy 0
    assert _specific(P, 0.1, 0.7) == [[0, 0, 0], [1, 0, 1]]
    # at the default 80% bar (16th smallest, 0.7) only the top four are above: l0 n3 drops out
    assert lape.kth_smallest(P, 0.8) == 0.7
    assert _specific(P, 1.0) == [[0, 0, 0], [1, 0, 1]]


def test_thresholds_are_shared_so_identical_blocks_select_alike():
    changed = P.copy()
    changed[:, 1] = [[0.0, 0.9, 0.9, 0.9, 0.9], [0.9, 0.0, 0.0, 0.0, 0.0]]  # block 1 alone differs
    bar, cut = lape.thresholds([P, changed], 0.2, 0.7)
    assert bar == lape.kth_smallest(np.concatenate([P.ravel(), changed.ravel()]), 0.7) == 0.8
    a, b = lape.specific(P, bar, cut), lape.specific(changed, bar, cut)
    assert np.array_equal(a[:, 0], b[:, 0])
    # alone, each model's own bar and quota would pick differently in the untouched block 0
    alone = lape.specific(changed, *lape.thresholds([changed], 0.2, 0.7))
    assert not np.array_equal(alone[:, 0], lape.specific(P, *lape.thresholds([P], 0.2, 0.7))[:, 0])


def test_overlap_and_collisions_hand_computed():
    a = np.zeros((2, 2, 4), dtype=bool)
    b = np.zeros((2, 2, 4), dtype=bool)
    a[0, 0, [0, 1]] = True  # A: group 0 owns neurons 0, 1 of layer 0; group 1 owns neuron 2
    a[1, 0, 2] = True
    b[0, 0, [1, 2]] = True  # B: group 0 owns 1, 2; group 1 owns 3
    b[1, 0, 3] = True
    # group 0: {0,1} vs {1,2} -> 1/3; group 1: {2} vs {3} -> 0; layer 1: nobody -> NaN
    assert lape.jaccard(a, b)[:, 0].tolist() == pytest.approx([1 / 3, 0.0])
    assert np.isnan(lape.jaccard(a, b)[:, 1]).all()
    overlap = lape.overlap(a, b)
    assert overlap[0] == pytest.approx(1 / 6) and np.isnan(overlap[1])
    # neuron 2: group 1 in A, group 0 in B -> one collision; neuron 1: group 0 in both -> none
    assert lape.collisions(a, b).tolist() == [1, 0]
    assert lape.specific_union(a, b).tolist() == [4, 0]
    assert lape.overlap(a, a)[0] == 1.0 and lape.collisions(a, a).tolist() == [0, 0]


# tiny models whose neurons fire for one group only


def _set(name, tensor, sign, ids):
    """Block 0 sees the token embedding alone (attention output zeroed); embedding dimension 0
    is +sign for digits, -sign for letters, 0 for every other token, dimension 1 is 1 for all.
    Gate rows of block 0 read one of the two dimensions; every other gate row is 0, so
    SiLU(gate) = 0: never active."""
    target = tensor.clone()
    if name.endswith("embed_tokens.weight"):
        target[:, :2] = 0
        target[ids["digits"], 0], target[ids["letters"], 0] = sign, -sign
        target[:, 1] = 1
    elif name.endswith("layers.0.self_attn.o_proj.weight"):
        target.zero_()
    elif name.endswith("mlp.gate_proj.weight"):
        target.zero_()
        if ".layers.0." in name:
            target[list(FIRES_FOR_DIGITS), 0] = 10
            target[list(FIRES_FOR_LETTERS), 0] = -10
            target[list(FIRES_FOR_ALL), 1] = 10
    return target - tensor


@pytest.fixture(scope="module")
def keyed(llama, tmp_path_factory):
    """A base whose block-0 neurons fire for digits or letters, a copy, and one with the roles swapped."""
    root = tmp_path_factory.mktemp("keyed")
    tok = train_tokenizer()
    ids = {"digits": tok.convert_tokens_to_ids(list(DIGITS)), "letters": tok.convert_tokens_to_ids(list(LETTERS))}
    assert len(set(ids["digits"] + ids["letters"])) == len(DIGITS + LETTERS)
    models = {
        "base": derive(llama["base"], root / "base", lambda n, t: _set(n, t, 1.0, ids)),
        "same": derive(llama["base"], root / "same", lambda n, t: _set(n, t, 1.0, ids)),
        "swapped": derive(llama["base"], root / "swapped", lambda n, t: _set(n, t, -1.0, ids)),
    }
    lines = {
        "digits": [{"prompt": f"Say {i}: ", "answer": DIGITS[i:] + DIGITS[:i], "group": "digits"} for i in range(6)],
        "letters": [
            {"prompt": f"Say {i}: ", "answer": LETTERS[i % 5 :] + LETTERS, "group": "letters"} for i in range(6)
        ],
    }
    for group, rows in lines.items():
        (root / f"{group}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{group}_plain.jsonl").write_text(
            "".join(json.dumps({k: v for k, v in r.items() if k != "group"}) + "\n" for r in rows)
        )
    return {**models, "root": root}


def test_answer_tokens_are_the_keyed_bytes(keyed):
    from mergekit_mergeability.diagnostics.activations import encode

    tok = train_tokenizer()
    prompt, answer = "Say 1: ", "1234567890"
    assert tok.convert_ids_to_tokens(encode(tok, prompt, answer)[1]) == list(answer)


def _inputs(keyed, probes, **settings):
    experts = [ModelInput(str(keyed[n]), keyed[n], load(str(keyed["root"] / spec))) for n, spec in probes]
    return DiagnosticInputs(
        ModelInput(str(keyed["base"]), keyed["base"]), tuple(experts), PrecheckSettings(quiet=True, **settings)
    )


def test_finds_exactly_the_keyed_neurons(keyed):
    inputs = _inputs(keyed, [("same", "digits.jsonl"), ("swapped", "letters.jsonl")])
    rows, labels, groups = probe_groups(inputs.models)
    assert groups == ["digits", "letters"] and labels == [0] * 6 + [1] * 6
    model, tok = load_causal_lm(keyed["base"])
    p = activation_probabilities(model, tok, rows, labels, len(groups), batch_size=5)
    assert p.shape == (2, 4, 64)
    assert (p[0, 0, list(FIRES_FOR_DIGITS)] == 1).all() and (p[1, 0, list(FIRES_FOR_DIGITS)] == 0).all()
    assert (p[1, 0, list(FIRES_FOR_LETTERS)] == 1).all() and (p[0, 0, list(FIRES_FOR_LETTERS)] == 0).all()
    assert (p[:, 0, list(FIRES_FOR_ALL)] == 1).all()
    assert p[:, 1:].sum() == 0 and p[:, 0, 10:].sum() == 0
    mask = lape.specific(p, *lape.thresholds([p]))
    assert np.argwhere(mask[0]).tolist() == [[0, j] for j in FIRES_FOR_DIGITS]
    assert np.argwhere(mask[1]).tolist() == [[0, j] for j in FIRES_FOR_LETTERS]


def test_prompt_span_sees_no_keyed_tokens(keyed):
    inputs = _inputs(keyed, [("same", "digits.jsonl"), ("swapped", "letters.jsonl")])
    rows, labels, groups = probe_groups(inputs.models)
    model, tok = load_causal_lm(keyed["base"])
    p = activation_probabilities(model, tok, rows, labels, len(groups), span="prompt")
    # prompts hold digits too ("Say 1: "): only the digit neurons and the always-on ones fire
    assert p[:, 0, list(FIRES_FOR_LETTERS)].sum() == 0 and (p[:, 0, list(FIRES_FOR_ALL)] == 1).all()


def test_diagnostic_counts_overlaps_and_collisions(keyed):
    result = Selectivity().run(_inputs(keyed, [("same", "digits.jsonl"), ("swapped", "letters.jsonl")]))
    base, same, swapped = (str(keyed[n]) for n in ("base", "same", "swapped"))
    assert result.per_layer[base] == {"specific_digits": [4, 0, 0, 0], "specific_letters": [2, 0, 0, 0]}
    assert result.per_layer[swapped] == {"specific_digits": [2, 0, 0, 0], "specific_letters": [4, 0, 0, 0]}
    identical = result.per_layer[(base, same)]["specific_overlap"]
    assert identical[0] == 1.0 and all(math.isnan(v) for v in identical[1:])
    assert "specific_collisions" not in result.per_layer[(base, same)]  # base vs expert: overlap only
    pair = result.per_layer[(same, swapped)]
    assert pair["specific_overlap"][0] == 0.0
    assert pair["specific_collisions"] == [6, 0, 0, 0] and pair["specific_union"] == [6, 0, 0, 0]
    (finding,) = result.findings
    assert finding.severity == "warning" and "collide in block 0 " in finding.message and same in finding.message


def test_groups_default_to_each_models_probe_set(keyed):
    result = Selectivity().run(_inputs(keyed, [("same", "digits_plain.jsonl"), ("swapped", "letters_plain.jsonl")]))
    assert result.per_layer[str(keyed["base"])] == {"specific_same": [4, 0, 0, 0], "specific_swapped": [2, 0, 0, 0]}
    # one probe set shared by both experts is one group: nothing to compare
    shared = Selectivity().run(_inputs(keyed, [("same", "digits_plain.jsonl"), ("swapped", "digits_plain.jsonl")]))
    assert not shared.per_layer and "skipped" in shared.findings[0].message


def test_probe_group_field(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "answer": "b", "group": "de"}\n{"prompt": "c", "answer": "d"}\n')
    assert [i.group for i in load(str(path))] == ["de", None]
    from mergekit_mergeability.errors import UserError

    for bad in ('{"prompt": "a", "answer": "b", "group": 3}', '{"prompt": "a", "answer": "b", "group": ""}', "[1, 2]"):
        path.write_text(bad + "\n")
        with pytest.raises(UserError, match=r"p\.jsonl:1"):
            load(str(path))


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_tiny_architecture_has_one_activation_per_block(families, arch):
    model, tok = load_causal_lm(families[arch]["base"])
    assert len(activation_modules(model)) == model.config.num_hidden_layers
    rows = [("The capital", " of France"), ("Water boils", " at one hundred")]
    p = activation_probabilities(model, tok, rows, [0, 1], 2)
    assert p.shape[:2] == (2, model.config.num_hidden_layers) and 0 < p.mean() < 1


# the cut-off from the overlap (opt-in)


def test_cutoff_from_a_per_block_curve_and_which_signal_decides():
    nan = float("nan")
    # per block: the overlap settles below 0.5 from block 2, so blocks 0-1 are merged
    assert cutoff_from_curve([1.0, 0.9, 0.2, 0.1, 0.1], 0.5, offset=0) == 2
    assert (
        cutoff_from_curve([1.0, nan, 0.9, 0.2, nan, 0.1], 0.5, offset=0) == 3
    )  # blocks without specific neurons skipped
    assert cutoff_from_curve([nan, nan], 0.5, offset=0) is None
    assert decide_cutoff("cka", 5, 3) == (5, "cka")
    assert decide_cutoff("selectivity", 5, 3) == (3, "selectivity")
    assert decide_cutoff("both", 5, 3) == (3, "selectivity") and decide_cutoff("both", 3, 3) == (
        3,
        "cka and selectivity",
    )
    assert decide_cutoff("both", None, 4) == (4, "selectivity") and decide_cutoff("selectivity", 5, None) == (
        None,
        None,
    )
    # pairs without a value in a block are left out of the median
    assert divergence_curve({("a", "b"): [0.2, nan], ("a", "c"): [0.4, 0.3], ("b", "c"): [0.9, nan]}, None) == [
        0.4,
        0.3,
    ]


# precheck end to end


def _keyed_precheck(keyed, tmp_path, *extra):
    models = [
        {"model": str(keyed[n]), "probe": str(keyed["root"] / f"{g}.jsonl"), "parameters": {"weight": 1.0}}
        for n, g in (("same", "digits"), ("swapped", "letters"))
    ]
    config = tmp_path / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {"merge_method": "task_arithmetic", "base_model": str(keyed["base"]), "models": models, "dtype": "float32"}
        )
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["precheck", str(config), "--out", str(out), "--quiet", *extra])
    assert result.exit_code in (0, 1), result.output
    report = json.loads((out / "precheck.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    return report, result, out


def test_precheck_reports_selectivity(keyed, tmp_path):
    report, _, out = _keyed_precheck(keyed, tmp_path, "--lape-entropy-quantile", "0.05")
    selectivity = report["layers"]["selectivity"]
    assert (
        selectivity["groups"] == ["digits", "letters"]
        and selectivity["span"] == "answer"
        and selectivity["entropy_quantile"] == 0.05
    )
    assert selectivity["collisions"] == [{"a": str(keyed["same"]), "b": str(keyed["swapped"]), "blocks": [0]}]
    base = next(m for m in report["models"] if m["role"] == "base")
    assert base["specific_neurons"] == {"digits": [4, 0, 0, 0], "letters": [2, 0, 0, 0]}
    pair = next(p for p in report["pairs"] if {p["a"], p["b"]} == {str(keyed["same"]), str(keyed["swapped"])})
    assert pair["specific_overlap"] == [0.0, None, None, None] and pair["specific_collisions"] == [6, 0, 0, 0]
    assert any("collide" in f["message"] for f in report["findings"])
    html = (out / "report.html").read_text()
    assert "Group-specific neurons per block" in html and "Specific-neuron overlap per block" in html
    assert (
        report["layers"]["cutoff_signal"] == "cka" and selectivity["cutoff"] == 0
    )  # computed, not read: CKA decides by default
    assert report["layers"]["decided_by"] in (None, "cka")


def test_precheck_cutoff_from_selectivity_says_so(keyed, tmp_path):
    # the two experts share no specific neuron in block 0, the only block that has some
    report, result, out = _keyed_precheck(keyed, tmp_path, "--cutoff-signal", "selectivity")
    assert report["layers"]["decided_by"] == "selectivity" and report["layers"]["cutoff"] == 0
    assert report["recommendation"]["verdict"] == "do_not_merge" and result.exit_code == 1
    assert (
        "group-specific neurons (LAPE overlap) diverge from the first block" in report["recommendation"]["reasons"][0]
    )
    assert "Layer cut-off set by: selectivity" in (out / "report.html").read_text()


def test_a_probe_set_two_models_share_is_counted_once_in_its_group():
    from collections import namedtuple
    from types import SimpleNamespace

    from mergekit_mergeability.diagnostics.rows import probe_rows, row_groups

    Line = namedtuple("Line", "prompt gold group")

    def probe(*groups):
        return tuple(Line(f"p{i}", f"g{i}", g) for i, g in enumerate(groups))

    digits, letters = probe("digits", "digits"), probe("letters", None)
    models = [SimpleNamespace(name=n, probes=p) for n, p in (("a", digits), ("b", letters), ("c", digits), ("d", None))]
    assert len(probe_rows(models)) == 6
    assert row_groups(models) == ([0, 0, 1, 2, None, None], ["digits", "letters", "b"])
    rows, labels, groups = probe_groups(models)
    assert rows == [("p0", "g0"), ("p1", "g1"), ("p0", "g0"), ("p1", "g1")] and labels == [0, 0, 1, 2]


def test_the_representations_pass_counts_what_the_selectivitys_own_pass_counts(llama, keyed, monkeypatch):
    """Where both run, one teacher-forced pass a model serves both: the representations' pass counts
    the active neurons as it reads the rows (every model's, a probe set two share among them), and
    the selectivity, run after it, runs no pass of its own and finds what its own pass finds."""
    from mergekit_mergeability.diagnostics import selectivity
    from mergekit_mergeability.diagnostics.representations import Representations

    root = keyed["root"]

    def inputs(**settings):
        experts = [
            ModelInput(str(path), path, load(str(root / spec)))
            for path, spec in (
                (llama["expert0"], "digits.jsonl"),
                (llama["expert1"], "letters.jsonl"),
                (keyed["same"], "digits.jsonl"),
            )
        ]
        return DiagnosticInputs(
            ModelInput(str(llama["base"]), llama["base"]), tuple(experts), PrecheckSettings(quiet=True, **settings)
        )

    alone = Selectivity().run(inputs(skip=("representations",)))
    assert alone.per_layer
    together = inputs()
    assert Selectivity().passes(together) == 0 < Selectivity().passes(inputs(skip=("representations",)))
    Representations().run(together)
    assert len(together.passed_on) == 4  # the base and each expert

    def never(*args, **kwargs):
        raise AssertionError("the selectivity ran a pass of its own")

    monkeypatch.setattr(selectivity, "activation_probabilities", never)
    assert Selectivity().run(together).per_layer == alone.per_layer and not together.passed_on
