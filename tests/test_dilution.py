"""The dilution signal: the base plus a share of each update, asked the model's own probe as its task scores it."""

import pytest
import torch

from mergekit_mergeability import tasks
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics import dilution
from mergekit_mergeability.diagnostics.dilution import Dilution, diluted
from mergekit_mergeability.diagnostics.knowledge import base_knowledge
from mergekit_mergeability.maths.stats import wilson_interval
from mergekit_mergeability.tiny import CORPUS, derive, state_dict

from conftest import noise, precheck_cli, ranked_probes

QUESTIONS = [f"{sentence} Question {i}?" for i in range(2) for sentence in CORPUS]


@pytest.fixture(scope="module")
def expert(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("dilution")
    base = llama["base"]
    folder = derive(base, root / "expert", noise(7, 0.2, lambda name: ".mlp." in name))
    probe = ranked_probes(root / "probe.jsonl", base, QUESTIONS, ["Paris", "water", "fox", "dog"], pick=2)
    return base, folder, tasks.load(str(probe))


def _scored(base, model, instances):
    """The knowledge diagnostic's view of ``instances`` as scored, with ``base`` as the model asked."""
    inputs = DiagnosticInputs(ModelInput("base", base), (ModelInput("m", model, instances),))
    found = base_knowledge(inputs).per_model["m"]
    return found["scored_accuracy"], found["scored_mean_p_gold"], found["scored_mean_margin"]


@pytest.mark.parametrize("share", [0.0, 1 / 9, 0.5, 1.0])
def test_a_share_of_the_update_scores_as_the_model_built_by_hand(expert, tmp_path, share):
    base, folder, instances = expert
    theirs = state_dict(folder)
    by_hand = derive(base, tmp_path / "by_hand", lambda name, tensor: share * (theirs[name] - tensor))
    inputs = DiagnosticInputs(ModelInput("base", base), (ModelInput("m", folder, instances),))
    found = Dilution(share).run(inputs).per_model["m"]
    accuracy, p_gold, margin = _scored(by_hand, by_hand, instances)
    assert found["share"] == share
    assert found["diluted_accuracy"] == accuracy
    assert found["diluted_mean_p_gold"] == pytest.approx(p_gold, abs=1e-6)
    assert found["diluted_mean_margin"] == pytest.approx(margin, abs=1e-5)
    assert (margin > 0) == (accuracy == 1) or 0 < accuracy < 1


@pytest.mark.parametrize(
    ("room", "share"),
    [(0.0, 1 / 9), (100.0, 0.5)],
    ids=["model-by-model, three models share a mean merge", "summed-once, its share above a third"],
)
def test_the_partnered_view_scores_as_the_expected_merge_built_by_hand(
    expert, llama, tmp_path, monkeypatch, room, share
):
    """Models, one with a probe: its partnered view is θ_base + s'·τ_0 + (1 − s')/(N − 1)·Σ τ_j,
    s' = max(1/9, 1/N), built by hand (one of the partners an adapter), whether the others' updates
    are summed once or read for each patch; a model alone has no partnered view."""
    from mergekit_mergeability.sources import resolve, tensors
    from mergekit_mergeability.tiny import make_adapter

    monkeypatch.setattr(dilution, "SUM_SHARE", room)  # of the loaded base: the partners' sum held, or not
    summing, original = [], dilution.summed
    monkeypatch.setattr(dilution, "summed", lambda *a: summing.append(original(*a)) or summing[-1])

    base, folder, instances = expert
    second = derive(base, tmp_path / "second", noise(8, 0.1))
    targets = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    adapter = resolve(str(make_adapter(base, tmp_path / "adapter", targets, rank=2, seed=3, scale=0.3)))
    updates = [state_dict(folder), state_dict(second), tensors(adapter)]
    mine = max(share, 1 / 3)  # three models: no more than two partners to draw
    others = (1 - mine) / 2

    def expected(name, tensor):
        moved = mine * (updates[0][name] - tensor) + others * (updates[1][name] - tensor)
        return moved + (others * (updates[2][name] - tensor) if name in targets else 0)

    by_hand = derive(base, tmp_path / "by_hand", expected)
    models = (ModelInput("m", folder, instances), ModelInput("second", second), ModelInput("adapter", adapter))
    found = Dilution(share).run(DiagnosticInputs(ModelInput("base", base), models)).per_model
    accuracy, p_gold, _ = _scored(by_hand, by_hand, instances)
    assert [total is None for total in summing] == [room == 0]  # the path the test names was taken
    assert set(found) == {"m"} and found["m"]["partner_share"] == pytest.approx(others)
    assert found["m"]["partnered_share"] == pytest.approx(mine) and found["m"]["share"] == share
    assert found["m"]["partnered_accuracy"] == accuracy
    assert found["m"]["partnered_mean_p_gold"] == pytest.approx(p_gold, abs=1e-6)
    assert found["m"]["partnered_mean_p_gold"] != pytest.approx(found["m"]["diluted_mean_p_gold"], rel=1e-3)
    alone = Dilution(share).run(DiagnosticInputs(ModelInput("base", base), models[:1])).per_model["m"]
    assert "partnered_accuracy" not in alone


def test_the_ends_are_the_base_and_the_expert_and_the_share_moves_between(expert):
    base, folder, instances = expert
    inputs = DiagnosticInputs(ModelInput("base", base), (ModelInput("m", folder, instances),))
    p = {share: Dilution(share).run(inputs).per_model["m"]["diluted_mean_p_gold"] for share in (0.0, 0.5, 1.0)}
    assert p[0.0] == pytest.approx(_scored(base, base, instances)[1], abs=1e-6)
    assert p[1.0] == pytest.approx(_scored(folder, folder, instances)[1], abs=1e-6)
    assert p[0.5] != pytest.approx(p[0.0], rel=1e-3) and p[0.5] != pytest.approx(p[1.0], rel=1e-3)


def test_an_adapter_is_diluted_through_its_factors_and_the_base_is_never_written(llama, tmp_path):
    """The rehearsed tensors are swapped in: the loaded base's own keep their values throughout (a
    base mapped from its files stays mapped), and are the module's again afterwards."""
    from mergekit_mergeability.sources import TensorReader, load_causal_lm, resolve, tensors
    from mergekit_mergeability.tiny import make_adapter

    targets = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    adapter = resolve(str(make_adapter(llama["base"], tmp_path / "adapter", targets, rank=2, seed=3, scale=0.3)))
    module, _ = load_causal_lm(llama["base"])
    own = module.state_dict()
    before = {name: tensor.clone() for name, tensor in own.items()}
    formed = tensors(adapter)
    with diluted(module, TensorReader(llama["base"]), adapter, 0.25) as inside:
        state = inside.state_dict()
        for name in targets:
            assert torch.allclose(state[name], before[name] + 0.25 * (formed[name] - before[name]), atol=1e-6)
            assert torch.equal(own[name], before[name])
        untouched = "model.layers.2.mlp.down_proj.weight"
        assert torch.equal(state[untouched], before[untouched])
    after = module.state_dict()
    assert all(after[name].data_ptr() == own[name].data_ptr() for name in targets)
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())


def test_the_precheck_predicts_from_the_dilution_it_measured(expert, tmp_path):
    """The decision reads the dilution features the report holds: none is "taken as typical"."""
    import json

    import yaml

    from mergekit_mergeability.decide import verdict
    from mergekit_mergeability.decide.calibration import Calibration
    from mergekit_mergeability.decide.features import features

    base, folder, _ = expert
    probe = ranked_probes(tmp_path / "probe.jsonl", base, QUESTIONS, ["Paris", "water", "fox", "dog"], pick=2)
    second = derive(base, tmp_path / "second", noise(8, 0.05))
    models = [{"model": str(m), "probe": str(probe), "parameters": {"weight": 1.0}} for m in (folder, second)]
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    result = precheck_cli(config, tmp_path / "out", "--skip", "representations", "--skip", "selectivity")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    table = features(report["models"])
    page = (tmp_path / "out" / "report.html").read_text()
    assert ">rehearsal</th>" in page
    for model in (m for m in report["models"] if m["role"] == "expert"):
        assert model["features"]["diluted_p_gold"] == model["dilution"]["diluted_mean_p_gold"] is not None
        assert model["features"]["partnered_accuracy"] == model["dilution"]["partnered_accuracy"] is not None
        # a cloze probe: the rehearsal is its partnered accuracy, and the shipped prediction reads it first
        assert model["features"]["rehearsal"] == model["dilution"]["partnered_accuracy"]
        assert f'data-value="{model["dilution"]["partnered_accuracy"]}"' in page
        assert not any("taken as typical" in reason for reason in model["reasons"])
        calibrated = Calibration.load(None).predict(table[model["path"]])[0]
        assert calibrated == pytest.approx(model["dilution"]["partnered_accuracy"])
        if model["kept_share"] >= verdict.KEPT_CAP:
            assert model["predicted_mergeability"] == pytest.approx(calibrated)
            # with its probe's noise: lm-eval's standard error kept, and Wilson's 95% interval over its items
            accuracy, stderr, n = calibrated, model["dilution"]["partnered_accuracy_stderr"], len(QUESTIONS)
            assert stderr == pytest.approx((accuracy * (1 - accuracy) / (n - 1)) ** 0.5)
            assert model["dilution"]["partnered_items"] == n
            low, high = model["predicted_interval"]
            assert (low, high) == pytest.approx(wilson_interval(accuracy * n, n))
            assert low < accuracy < high or (low < accuracy == high == 1) or (low == accuracy == 0 < high)
            assert f"95% interval {low:.2f}–{high:.2f} over its probe's items" in model["reasons"][0]


def test_a_config_of_few_models_rehearses_its_merge_as_configured(expert, tmp_path):
    """Two models of a plain weighted sum (task_arithmetic, weights 1 and 0.5): the partnered view
    is that merge, θ_base + τ_0 + 0.5·τ_1, built by hand; without shares, the mean merge of both."""
    base, folder, instances = expert
    second = derive(base, tmp_path / "second", noise(8, 0.1))
    updates = [state_dict(folder), state_dict(second)]

    def by_hand(shares):
        return derive(
            base,
            tmp_path / f"by_hand_{shares[0]}_{shares[1]}",
            lambda name, t: shares[0] * (updates[0][name] - t) + shares[1] * (updates[1][name] - t),
        )

    for shares, merge in (((1.0, 0.5), "configured"), ((None, None), "mean")):
        models = (ModelInput("m", folder, instances, share=shares[0]), ModelInput("second", second, share=shares[1]))
        found = Dilution().run(DiagnosticInputs(ModelInput("base", base), models)).per_model["m"]
        expected = shares if merge == "configured" else (0.5, 0.5)
        merged = by_hand(expected)
        accuracy, p_gold, _ = _scored(merged, merged, instances)
        assert found["rehearsed"] == merge and found["partnered_share"] == pytest.approx(expected[0])
        assert found["partner_share"] == pytest.approx(expected[1])
        assert (found["partnered_accuracy"], found["partnered_mean_p_gold"]) == (
            accuracy,
            pytest.approx(p_gold, abs=1e-6),
        )


@pytest.mark.parametrize("method", ["ties", "dare_ties", "breadcrumbs"])
def test_a_config_of_few_models_rehearses_the_merge_mergekit_writes(expert, tmp_path, method):
    """Two models merged with a method that trims (no plain sum): the partnered view is the config's
    own merge, planned by mergekit and built in memory, scored as mergekit's written merge scores."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    from mergekit_mergeability.rehearsal.planned import plan

    base, folder, instances = expert
    second = derive(base, tmp_path / "second", noise(8, 0.1))
    density = 1.0 if method == "dare_ties" else 0.5  # DARE at density 1 draws nothing: mergekit's own merge
    document = {
        "merge_method": method,
        "base_model": str(base),
        "dtype": "float32",
        "models": [{"model": str(m), "parameters": {"weight": 1.0, "density": density}} for m in (folder, second)],
    }
    run_merge(MergeConfiguration.model_validate(document), str(tmp_path / "out"), MergeOptions(write_model_card=False))
    models = (ModelInput("m", folder, instances), ModelInput("second", second, instances))
    inputs = DiagnosticInputs(ModelInput("base", base), models, merge=plan(document, "config.yml"))
    found = Dilution().run(inputs).per_model
    written = derive(base, tmp_path / "written", lambda name, t: state_dict(tmp_path / "out")[name] - t)
    accuracy, p_gold, _ = _scored(written, written, instances)
    for name in ("m", "second"):
        assert found[name]["rehearsed"] == "written" and "partnered_share" not in found[name]
        assert found[name]["partnered_accuracy"] == accuracy
        assert found[name]["partnered_mean_p_gold"] == pytest.approx(p_gold, abs=1e-6)
    mean = Dilution().run(DiagnosticInputs(ModelInput("base", base), models)).per_model["m"]
    assert mean["rehearsed"] == "mean"  # not planned: the stand-in, which scores otherwise
    assert mean["partnered_mean_p_gold"] != pytest.approx(p_gold, rel=1e-3)


def test_an_lm_eval_task_probe_is_rehearsed_and_read_with_its_own_metric_as_lm_eval_reads_it(
    expert, tmp_path, monkeypatch
):
    """A probe that is an lm-eval task YAML: on the merge as written, it scores what lm-eval scores
    on the merge mergekit writes, read with the task's metric. A multiple-choice task read by acc
    is read off its choices' log-probs, without lm-eval's own run."""
    import json

    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    from mergekit_mergeability.rehearsal.planned import plan
    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.tasks import harness, scoring_task

    base, folder, _ = expert
    second = derive(base, tmp_path / "second", noise(8, 0.1))
    data = tmp_path / "animals.jsonl"
    rows = [
        {"question": f"{q} ({i})", "choices": ["cow", "cat", "duck", "dog"], "label": i % 4}
        for i, q in enumerate(QUESTIONS)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task_yaml = tmp_path / "animals.yaml"
    task_yaml.write_text(
        "task: animals\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n"
    )
    document = {
        "merge_method": "ties",
        "base_model": str(base),
        "dtype": "float32",
        "models": [{"model": str(m), "parameters": {"weight": 1.0, "density": 0.5}} for m in (folder, second)],
    }
    run_merge(MergeConfiguration.model_validate(document), str(tmp_path / "out"), MergeOptions(write_model_card=False))
    task = scoring_task(str(task_yaml))
    models = (ModelInput("m", folder, tasks.load(str(task_yaml)), task=task), ModelInput("second", second))
    inputs = DiagnosticInputs(ModelInput("base", base), models, merge=plan(document, "config.yml"))
    real = harness.score

    def never(*args, **kwargs):
        raise AssertionError("lm-eval's own run scored a task the choices' log-probs read")

    monkeypatch.setattr(harness, "score", never)
    found = Dilution().run(inputs).per_model["m"]
    monkeypatch.setattr(harness, "score", real)
    written = derive(base, tmp_path / "written", lambda name, t: state_dict(tmp_path / "out")[name] - t)
    model, tokenizer = load_causal_lm(written)
    expected = harness.score(model, tokenizer, task)
    assert found["rehearsed"] == "written" and found["task_metric"] == expected["primary"] == "acc"
    assert found["partnered_task_score"] == pytest.approx(expected["score"])
    assert 0 < expected["score"] < 1  # a score that can tell a wrong model from a right one
    # its noise: lm-eval's own acc_stderr, which for n items right or wrong is √(acc(1 − acc)/(n − 1))
    n, acc = len(rows), expected["score"]
    assert (
        found["partnered_task_score_stderr"]
        == pytest.approx(expected["stderr"])
        == pytest.approx((acc * (1 - acc) / (n - 1)) ** 0.5)
    )


def test_the_configured_shares_are_those_of_a_plain_weighted_sum():
    from mergekit_mergeability.decide.advice import configured_shares

    models = [{"model": "a", "parameters": {"weight": 1.0}}, {"model": "b", "parameters": {"weight": 3.0}}]
    document = {"merge_method": "task_arithmetic", "base_model": "base", "models": models}
    assert configured_shares(document) == {"a": 1.0, "b": 3.0}
    assert configured_shares({**document, "parameters": {"lambda": 0.5}}) == {"a": 0.5, "b": 1.5}
    assert configured_shares({**document, "merge_method": "linear"}) == {"a": 0.25, "b": 0.75}  # normalised
    assert configured_shares({**document, "merge_method": "ties"}) == {}  # trims and elects: not a sum


@pytest.mark.parametrize("weights, lam", [((1.0, 1.0, 1.0), 1 / 3), ((1.0, 2.0, 0.5), 0.4)])
def test_the_compared_merges_score_as_the_recommended_configs_merge(expert, tmp_path, weights, lam):
    """Three models with probes, configured as task_arithmetic with these weights and lambda: each
    one's own probe on the whole config merged as the advice writes knowledge_weighted (shares by
    the base's p(gold) on each probe, times the weights, at the configured update size) and TIES
    (density 0.5, the weights normalised, lambda the configured update size), as the models
    mergekit's own merge_tensors builds from those written configs score it."""
    from mergekit_mergeability.decide.advice import advise, update_size
    from mergekit_mergeability.rehearsal.inmemory import load_update, merge_updates
    from mergekit_mergeability.sources import TensorReader

    base, folder, instances = expert
    others = [derive(base, tmp_path / f"other{i}", noise(20 + i, 0.15, lambda n: ".mlp." in n)) for i in range(2)]
    probe = ranked_probes(tmp_path / "other.jsonl", base, QUESTIONS, ["Paris", "water", "fox", "dog"], pick=0)
    paths = {"m": (folder, instances), **{f"o{i}": (o, tasks.load(str(probe))) for i, o in enumerate(others)}}
    models = tuple(
        ModelInput(name, path, probes, weight=w) for (name, (path, probes)), w in zip(paths.items(), weights)
    )
    document = {
        "merge_method": "task_arithmetic",
        "base_model": "base",
        "models": [{"model": m.name, "parameters": {"weight": m.weight}} for m in models],
        "parameters": {"lambda": lam},
    }
    inputs = DiagnosticInputs(ModelInput("base", base), models, update_size=update_size(document))
    found = Dilution().run(inputs).per_model
    reader = TensorReader(base)
    updates = {m.name: load_update(reader, m.path, m.name) for m in models}
    known = {m.name: _scored(base, base, m.probes)[1] for m in models}
    assert known["m"] != known["o0"]  # the shares differ
    names = {m.name: m.name for m in models}
    for verdict, method in (("knowledge_weighted", "knowledge_weighted"), ("sign_election", "ties")):
        recommendation = {"verdict": verdict, "knowledge": known, "weights": None, "left_out": [], "cutoff": None}
        (advice,) = advise(recommendation, document, names, {m.name: 0.9 for m in models})
        assert advice.config["merge_method"] == method
        per_model = {e["model"]: e.get("parameters", {}) for e in advice.config["models"]}
        merged = merge_updates(reader, updates, method, advice.config["parameters"], per_model)
        by_hand = derive(base, tmp_path / method, lambda name, t: merged[name] - t if name in merged else 0 * t)
        for m in models:
            accuracy, p_gold, _ = _scored(by_hand, by_hand, m.probes)
            assert found[m.name][f"{method}_accuracy"] == accuracy
            # the advice writes knowledge to 4 places, the rehearsal reads it whole
            assert found[m.name][f"{method}_mean_p_gold"] == pytest.approx(p_gold, abs=1e-4)
    alone = (
        Dilution().run(DiagnosticInputs(ModelInput("base", base), (models[0], ModelInput("x", others[0])))).per_model
    )
    assert "ties_accuracy" not in alone["m"]  # a model without a probe: no knowledge, no shares to compare
