"""`plan`: the conditional features against hand-computed values and mergekit's own TIES, the
search against every assignment, and the command end to end on tiny models (known answers)."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from mergekit_mergeability.api import probe_items
from mergekit_mergeability.cli import main as cli
from mergekit_mergeability.planner import conditional, deciding, planning, reports, search
from mergekit_mergeability.planner.conditional_fit import load
from mergekit_mergeability.planner.reports import SCHEMA
from mergekit_mergeability.tiny import derive, make_adapter, state_dict

from conftest import noise, ranked_probes

BIN = Path(sys.executable).parent
FAST = ["--fewshot", "0", "--dtype", "float32"]  # the lettered few-shot view is measured, not planned on
PREDICTED = ["--budget-evals", "0"]  # the plan from the prediction alone, no merge built (the default checks)
QUESTIONS = ["Which one is it?", "Pick the right one.", "What is the answer?"]
CHOICES = ["Paris", "water", "fox", "dog"]


def pool_of(gram, parts=None, conflict=None, knowledge=None, base=None) -> conditional.Pool:
    gram = np.asarray(gram, dtype=float)
    n = len(gram)
    norms = np.sqrt(np.diag(gram))
    return conditional.Pool(
        names=tuple(f"m{i}" for i in range(n)),
        gram=gram,
        sign_conflict=np.zeros((n, n)) if conflict is None else np.asarray(conflict, dtype=float),
        parts=norms[:, None] if parts is None else np.asarray(parts, dtype=float),
        part_names=(0,) if parts is None else tuple(range(np.asarray(parts).shape[1])),
        expert_features=np.full((n, len(conditional.EXPERT)), np.nan),
        knowledge=np.full(n, 0.5) if knowledge is None else np.asarray(knowledge, dtype=float),
        base_score=np.zeros(n) if base is None else np.asarray(base, dtype=float),
        expert_score=np.ones(n),
    )


def only_coefficient(weight=0.2, intercept=0.5, std=0.1, mean=0.3) -> conditional.ConditionalCalibration:
    """A calibration that reads own_coefficient alone (monotone): tests that do not depend on the shipped fit."""
    features = [{"name": "own_coefficient", "direction": 1, "mean": mean, "std": std, "weight": weight}]
    document = {"rules": {"task_arithmetic": {"model": {"intercept": intercept, "features": features}}}}
    return conditional.ConditionalCalibration.from_document(document)


# The maths, against hand-computed values


HAND = [[4.0, 2.0, 0.0], [2.0, 9.0, -3.0], [0.0, -3.0, 1.0]]


def test_own_coefficient_of_a_mean_merge_from_a_hand_built_gram():
    pool = pool_of(HAND)
    c = conditional.own_coefficients(pool, [0, 1, 2], conditional.Merge("task_arithmetic"))
    np.testing.assert_allclose(c, [(4 + 2 + 0) / 3 / 4, (2 + 9 - 3) / 3 / 9, (0 - 3 + 1) / 3 / 1])
    weighted = conditional.with_weights(conditional.Merge("task_arithmetic"), {"m0": 1.0, "m1": 0.5, "m2": 2.0})
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1, 2], weighted), [(4 + 1) / 4, (2 + 4.5 - 6) / 9, (-1.5 + 2) / 1]
    )
    # the precheck's kept share is c_i / w_i: ``predict.kept_shares`` from norms and cosines agrees
    from mergekit_mergeability.decide.verdict import kept_shares

    norms = {f"m{i}": math.sqrt(HAND[i][i]) for i in range(3)}
    cosines = {
        (f"m{i}", f"m{j}"): HAND[i][j] / (norms[f"m{i}"] * norms[f"m{j}"]) for i in range(3) for j in range(i + 1, 3)
    }
    kept = kept_shares({"m0": 1.0, "m1": 0.5, "m2": 2.0}, norms, cosines)
    np.testing.assert_allclose(
        [kept[f"m{i}"] * w for i, w in enumerate((1.0, 0.5, 2.0))],
        conditional.own_coefficients(pool, [0, 1, 2], weighted),
    )


def test_partner_features_by_hand():
    conflict = [[0, 0.4, 0.5], [0.4, 0, 0.6], [0.5, 0.6, 0]]
    features = conditional.conditional_features(
        pool_of(HAND, conflict=conflict), [0, 1, 2], conditional.Merge("task_arithmetic")
    )
    # τ0·(τ1 + τ2) = 2, ‖τ1 + τ2‖² = 9 + 1 − 6 = 4, ‖τ0‖ = 2
    assert features["partner_cosine"][0] == pytest.approx(2 / (2 * 2))
    # τ2·(τ0 + τ1) = −3, ‖τ0 + τ1‖² = 4 + 9 + 4 = 17
    assert features["partner_cosine"][2] == pytest.approx(-3 / (1 * math.sqrt(17)))
    np.testing.assert_allclose(features["partner_sign_conflict"], [0.45, 0.5, 0.55])
    np.testing.assert_allclose(features["merged_count"], math.log(3))


def test_over_the_whole_pool_the_partner_features_are_the_precheck_interference():
    from mergekit_mergeability.diagnostics.weights import interference

    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 4))
    gram = a @ a.T
    conflict = rng.uniform(0.3, 0.6, (6, 6))
    conflict = (conflict + conflict.T) / 2
    np.fill_diagonal(conflict, 0)
    names = [f"m{i}" for i in range(6)]
    norms = np.sqrt(np.diag(gram))
    pairs = {
        (names[i], names[j]): {"cosine": gram[i, j] / (norms[i] * norms[j]), "sign_conflict": conflict[i, j]}
        for i in range(6)
        for j in range(i + 1, 6)
    }
    theirs = interference(names, torch.tensor(gram), pairs)
    ours = conditional.conditional_features(
        pool_of(gram, conflict=conflict), range(6), conditional.Merge("task_arithmetic")
    )
    np.testing.assert_allclose(ours["partner_cosine"], [theirs[m]["pool_cosine"] for m in names])
    np.testing.assert_allclose(ours["partner_sign_conflict"], [theirs[m]["mean_sign_conflict"] for m in names])


@pytest.mark.parametrize("density", [0.5, 1.0])
def test_ties_approximation_matches_mergekits_ties_on_gaussian_task_vectors(density):
    """The approximation is exact for Gaussian task vectors up to sampling error (~0.02; bound 0.07)."""
    from mergekit.merge_methods import merge_tensors

    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 3))
    gram = a @ a.T + np.diag(rng.uniform(0.5, 2, 6))
    vectors = rng.standard_normal((100_000, 6)) @ np.linalg.cholesky(gram).T / math.sqrt(100_000)
    pool = pool_of(vectors.T @ vectors)  # the Gram matrix of exactly these vectors
    base = torch.zeros(len(vectors))
    tensors = [base] + [torch.tensor(vectors[:, i], dtype=torch.float32) for i in range(6)]
    merged = (
        merge_tensors(
            tensors,
            "ties",
            ids=["base", *pool.names],
            base_index=0,
            parameters={"weight": 1.0, "density": density},
            name="t",
        )
        .double()
        .numpy()
    )
    exact = merged @ vectors / np.sum(vectors * vectors, axis=0)
    approx = conditional.own_coefficients(pool, range(6), conditional.Merge("ties", density=density))
    assert np.abs(approx - exact).max() < 0.07, (approx, exact)
    assert np.abs(approx - exact).mean() < 0.03


def test_trimming_by_knowledge_matches_the_knowledge_weighted_merge_on_gaussian_task_vectors():
    """knowledge_weighted with ties and density_by_knowledge: each member trimmed at its own density
    d + (1 − d)·k, against the registered method run on the same vectors (bound as above)."""
    from mergekit.merge_methods import merge_tensors

    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 3))
    gram = a @ a.T + np.diag(rng.uniform(0.5, 2, 5))
    vectors = rng.standard_normal((100_000, 5)) @ np.linalg.cholesky(gram).T / math.sqrt(100_000)
    knowledge = [0.05, 0.3, 0.6, 0.9, 1.0]
    pool = pool_of(vectors.T @ vectors, knowledge=knowledge)
    tensors = [torch.zeros(len(vectors))] + [torch.tensor(vectors[:, i], dtype=torch.float32) for i in range(5)]
    parameters = {"knowledge": knowledge, "temperature": 0.3, "density": 0.5, "ties": True}
    exact, approx = {}, {}
    for by_knowledge in (True, False):
        merged = merge_tensors(
            tensors, "knowledge_weighted", base_index=0, parameters={**parameters, "density_by_knowledge": by_knowledge}
        )
        exact[by_knowledge] = merged.double().numpy() @ vectors / np.sum(vectors * vectors, axis=0)
        merge = conditional.Merge(
            "knowledge_weighted", temperature=0.3, ties=True, density=0.5, by_knowledge=by_knowledge
        )
        approx[by_knowledge] = conditional.own_coefficients(pool, range(5), merge)
        assert np.abs(approx[by_knowledge] - exact[by_knowledge]).max() < 0.07
    # the change trimming by knowledge makes (up to −0.07 here), on the same sampled coordinates
    change, predicted = exact[True] - exact[False], approx[True] - approx[False]
    assert np.abs(change).max() > 0.05 and np.abs(predicted - change).max() < 0.035, (predicted, change)


def test_ties_never_dilutes_updates_on_disjoint_layers_but_a_mean_does():
    """Alone in its layer, an update keeps what trimming leaves: for a Gaussian one, the energy of
    its top-density entries, 2(tφ(t) + 1 − Φ(t)) at t = Φ⁻¹(1 − density/2); a mean halves it."""
    from scipy.stats import norm

    t = norm.ppf(0.75)
    trimmed = 2 * (t * norm.pdf(t) + 1 - norm.cdf(t))
    parts = [[1.0, 0.0], [0.0, 2.0]]
    pool = pool_of([[1.0, 0.0], [0.0, 4.0]], parts=parts)
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1], conditional.Merge("ties", density=0.5)),
        [trimmed, trimmed],
        atol=0.01,
    )
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1], conditional.Merge("ties", density=1.0)), [1.0, 1.0], atol=1e-6
    )
    # ties' lambda (knowledge_weighted's scale) multiplies the disjoint mean: the weights divide out, it does not
    for merge in (
        conditional.Merge("ties", density=1.0, scale=0.5),
        conditional.Merge("knowledge_weighted", temperature=0.3, ties=True, scale=0.5),
    ):
        np.testing.assert_allclose(conditional.own_coefficients(pool, [0, 1], merge), [0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1], conditional.Merge("task_arithmetic")), [0.5, 0.5]
    )


def test_cancelling_updates_keep_nothing_along_their_own_direction_under_either_merge():
    pool = pool_of([[1.0, -1.0], [-1.0, 1.0]])
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1], conditional.Merge("task_arithmetic")), [0, 0], atol=1e-12
    )
    # sampling error ~0.04 (the coordinates' sign election is a coin flip here); an unrelated pair keeps ~0.6
    np.testing.assert_allclose(
        conditional.own_coefficients(pool, [0, 1], conditional.Merge("ties", density=0.5)), [0, 0], atol=0.08
    )


def test_layer_selective_keeps_the_upper_models_own_upper_layers():
    parts = [[1.0, 1.0], [1.0, 1.0]]  # each update: half its energy below the cut-off, half above
    pool = pool_of([[2.0, 0.0], [0.0, 2.0]], parts=parts, knowledge=[0.9, 0.1])
    merge = conditional.Merge("layer_selective", cutoff=1)
    # upper = the member the base knows least (m1): its own upper half whole, its lower half halved
    np.testing.assert_allclose(conditional.own_coefficients(pool, [0, 1], merge), [0.25, 0.75])


def test_a_prediction_falls_back_to_the_nearest_measured_rule_and_says_so():
    calibration = only_coefficient()
    pool = pool_of(HAND)
    ties = calibration.predict(pool, [0, 1], conditional.Merge("ties", density=0.5))
    assert ties.rule == "task_arithmetic" and ties.fallback
    mean = calibration.predict(pool, [0, 1], conditional.Merge("task_arithmetic"))
    assert mean.rule == "task_arithmetic" and not mean.fallback
    alone = calibration.predict(pool, [2], conditional.Merge("task_arithmetic"))
    assert alone.rule == "alone" and alone.values.tolist() == [1.0]


def test_shipped_calibration_reads_own_coefficient_and_records_how_to_refit_it():
    calibration = load()
    fitted = calibration.fitted["task_arithmetic"]
    weights = dict(zip(fitted.model.names, fitted.model.weights))
    assert weights["own_coefficient"] > 0
    assert calibration.document["provenance"]["command"].startswith("python research/plan.py fit")
    held = calibration.document["out_of_sample"]["task_arithmetic"]["leave_one_expert_out"]
    assert all(cell["interval"] is not None for cell in held["by_size"].values())


# The search


def _random_pool(seed: int, n: int) -> conditional.Pool:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, 3))
    gram = a @ a.T + np.diag(rng.uniform(0.2, 1.0, n))
    return pool_of(gram, base=rng.choice([0.0, 0.5, 1.0], n))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("slots", [1, 2])
def test_search_finds_the_best_assignment_on_pools_small_enough_to_enumerate(seed, slots):
    pool = _random_pool(seed, 6)
    calibration = only_coefficient()
    merges = [conditional.Merge("task_arithmetic"), conditional.Merge("ties", density=0.5)]
    score = lambda members, merge: calibration.predict(pool, list(members), merge, domain=False).values  # noqa: E731
    found = search.search(len(pool), merges, slots, score, pool.base_score)
    best = search.exhaustive(len(pool), merges, slots, score, pool.base_score)
    assert found.objective == pytest.approx(best)


def test_search_finds_a_planted_group():
    """Four updates pulling together (cosine 0.8) and four that cancel each other pairwise
    (cosine −0.9) and are orthogonal to the rest: the plan merges the four and leaves the rest out."""
    gram = np.zeros((8, 8))
    gram[:4, :4] = 0.8
    for a, b in ((4, 5), (6, 7)):
        gram[a, b] = gram[b, a] = -0.9
    np.fill_diagonal(gram, 1.0)
    pool = pool_of(gram, base=[0.0] * 4 + [0.6] * 4)
    calibration = only_coefficient()
    merges = [conditional.Merge("task_arithmetic")]
    score = lambda members, merge: calibration.predict(pool, list(members), merge, domain=False).values  # noqa: E731
    found = search.search(8, merges, 1, score, pool.base_score)
    assert found.slots[0].members == (0, 1, 2, 3)
    assert found.objective == pytest.approx(search.exhaustive(8, merges, 1, score, pool.base_score))


# End to end on tiny models


def _config(path: Path, base: Path, experts, probes) -> Path:
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(base),
        "models": [
            {"model": str(e), "probe": str(p), "parameters": {"weight": 1 / len(experts)}}
            for e, p in zip(experts, probes)
        ],
        "dtype": "float32",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cancelling(llama, tmp_path_factory):
    """a, b = −a (the same update on layer 1's up_proj, negated) and c, orthogonal to both
    (layer 2's down_proj), each with a probe the base half knows."""
    root = tmp_path_factory.mktemp("plan_cancel")
    base = llama["base"]
    up = lambda name: "layers.1.mlp.up_proj" in name  # noqa: E731
    a = derive(base, root / "a", noise(11, 0.05, up))
    opposite = noise(11, 0.05, up)  # the same draws again, negated
    b = derive(base, root / "b", lambda name, tensor: -opposite(name, tensor))
    c = derive(base, root / "c", noise(12, 0.05, lambda name: "layers.2.mlp.down_proj" in name))
    probes = [ranked_probes(root / f"{k}.jsonl", base, QUESTIONS, CHOICES, pick=1) for k in "abc"]
    config = _config(root / "pool.yml", base, [a, b, c], probes)
    out = root / "plan"
    result = CliRunner().invoke(cli, ["plan", str(config), "--out", str(out), "--quiet", *FAST, *PREDICTED])
    assert result.exit_code == 0, result.output
    return root, config, out, (a, b, c)


def test_plan_keeps_cancelling_experts_apart(cancelling):
    root, config, out, (a, b, c) = cancelling
    plan = json.loads((out / "plan.json").read_text())
    jsonschema.validate(plan, json.loads(SCHEMA.read_text()))
    model_of = {e["path"]: e["model"] for e in plan["experts"]}
    assert model_of[str(a)] is None or model_of[str(a)] != model_of[str(b)]
    assert plan["objective"]["planned"] >= plan["objective"]["references"]["configured"]["value"]
    for k in (2, 3):
        other = root / f"plan_k{k}"
        result = CliRunner().invoke(
            cli,
            [
                "plan",
                str(config),
                "--out",
                str(other),
                "--models",
                str(k),
                "--precheck",
                str(out / "precheck.json"),
                "-q",
                *PREDICTED,  # the search's plan: a and b cancel in their weights, not on these probes
            ],
        )
        assert result.exit_code == 0, result.output
        found = {e["path"]: e["model"] for e in json.loads((other / "plan.json").read_text())["experts"]}
        assert found[str(a)] is None or found[str(a)] != found[str(b)]


def test_planned_configs_run_with_the_stock_mergekit_yaml(cancelling, tmp_path):
    root, config, out, experts = cancelling
    plan = json.loads((out / "plan.json").read_text())
    for model in plan["models"]:
        written = tmp_path / Path(model["file"]).stem
        done = subprocess.run(
            [BIN / "mergekit-yaml", out / model["file"], written, "--no-write-model-card", "--lazy-unpickle"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        asked = {e["model"]: e.get("probe") for e in yaml.safe_load((out / model["file"]).read_text())["models"]}
        pool = {e["model"]: e["probe"] for e in yaml.safe_load(config.read_text())["models"]}
        assert asked == {m: pool[m] for m in model["members"]}  # each member's probe: evaluate reads it
        merged, base = state_dict(written), state_dict(Path(plan["base_model"]))
        members = {str(e): state_dict(e) for e in experts if str(e) in model["members"]}
        if model["method"] in ("alone",) or model["method"].startswith("task_arithmetic"):
            share = 1 / len(members)
            for name in base:
                expected = base[name] + sum(share * (m[name] - base[name]) for m in members.values())
                torch.testing.assert_close(merged[name], expected, rtol=1e-5, atol=1e-6)


def test_plan_writes_nothing_on_bad_input(cancelling, tmp_path):
    root, config, out, _ = cancelling
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    result = CliRunner().invoke(
        cli, ["plan", str(config), "--out", str(busy), "--precheck", str(out / "precheck.json"), *PREDICTED]
    )
    assert result.exit_code == 2 and "not an earlier plan's folder" in result.output
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]
    fresh = tmp_path / "fresh"
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            str(config),
            "--out",
            str(fresh),
            "--precheck",
            str(out / "precheck.json"),
            "--methods",
            "slerp",
            *PREDICTED,
        ],
    )
    assert result.exit_code == 2 and "--methods slerp" in result.output and not fresh.exists()
    other = tmp_path / "other.yml"
    other.write_text(config.read_text().replace(str(cancelling[3][2]), str(cancelling[3][0]) + "_missing"))
    result = CliRunner().invoke(
        cli, ["plan", str(other), "--out", str(fresh), "--precheck", str(out / "precheck.json"), *PREDICTED]
    )
    assert result.exit_code == 2 and not fresh.exists()
    (tmp_path / "afile").write_text("mine")
    result = CliRunner().invoke(cli, ["plan", str(config), "--out", str(tmp_path / "afile" / "sub"), *PREDICTED])
    assert result.exit_code == 2 and "afile is a file, so the folder cannot be made" in result.output
    document = yaml.safe_load(config.read_text())
    del document["models"][1]["probe"]  # the plan would count its task lost: refused before any work
    unprobed = tmp_path / "unprobed.yml"
    unprobed.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(cli, ["plan", str(unprobed), "--out", str(fresh), "--budget-evals", "0"])
    name = Path(document["models"][1]["model"]).name
    assert result.exit_code == 2 and not fresh.exists()
    assert f"models[1] ({name}) has no probe: key" in result.output and f"--probe {name}=SPEC" in result.output


LORA_TARGETS = ("model.layers.{}.self_attn.q_proj.weight", "model.layers.{}.mlp.up_proj.weight")


def test_a_pool_of_adapters_plans_as_the_same_pool_materialised(llama, tmp_path):
    from mergekit_mergeability.sources import resolve
    from mergekit_mergeability.sources.adapter import materialise

    base = llama["base"]
    adapters, full, probes = tmp_path / "adapters", tmp_path / "full", tmp_path / "probes"
    probes.mkdir()
    # e3 is e0 negated (same factors, alpha −4): the pair cancels
    specs = [((0, 1), 2, 4.0, 0), ((1,), 3, 4.0, 1), ((2, 3), 4, 8.0, 2), ((0, 1), 2, -4.0, 0)]
    for i, (layers, rank, alpha, seed) in enumerate(specs):
        targets = [t.format(layer) for layer in layers for t in LORA_TARGETS]
        make_adapter(base, adapters / f"e{i}", targets, rank=rank, alpha=alpha, seed=seed)
        materialise(resolve(str(adapters / f"e{i}")), full / f"e{i}")
        if i < 2:
            ranked_probes(probes / f"e{i}.jsonl", base, QUESTIONS, CHOICES, pick=i)
        else:  # the base knows e2 as e0, e3 as e1
            shutil.copy(probes / f"e{i - 2}.jsonl", probes / f"e{i}.jsonl")
    runner = CliRunner()
    native = runner.invoke(
        cli, ["plan", "--pool", str(adapters), "--probes", str(probes), "--out", str(tmp_path / "a"), "-q"]
    )
    assert native.exit_code == 0, native.output
    done = runner.invoke(
        cli,
        ["plan", "--pool", str(full), "--base", str(base), "--probes", str(probes), "--out", str(tmp_path / "b"), "-q"],
    )
    assert done.exit_code == 0, done.output
    ours, theirs = (json.loads((tmp_path / k / "plan.json").read_text()) for k in "ab")
    assert [e["model"] for e in ours["experts"]] == [e["model"] for e in theirs["experts"]]
    assert [m["method"] for m in ours["models"]] == [m["method"] for m in theirs["models"]]
    # TIES is predicted through a sampled approximation, which the two pools' statistics (equal to
    # float rounding) move by a few 1e-4 on one CPU and up to 2.3e-3 on another (no AVX-512)
    assert ours["objective"]["planned"] == pytest.approx(theirs["objective"]["planned"], rel=5e-3)
    for x, y in zip(ours["experts"], theirs["experts"]):
        assert x["planned"] == pytest.approx(y["planned"], rel=5e-3, abs=1e-6)


def test_a_pool_folder_without_a_probe_for_a_member_is_refused(llama, tmp_path):
    adapters = tmp_path / "adapters"
    make_adapter(llama["base"], adapters / "e0", [LORA_TARGETS[0].format(0)], seed=1)
    (tmp_path / "probes").mkdir()
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--pool",
            str(adapters),
            "--probes",
            str(tmp_path / "probes"),
            "--out",
            str(tmp_path / "o"),
            *PREDICTED,
        ],
    )
    assert result.exit_code == 2 and "no probe for e0" in result.output and not (tmp_path / "o").exists()
    assert "--probe e0=SPEC" in result.output


def test_a_probe_given_on_the_command_line_stands_in_for_a_pool_folders_missing_file(llama, tmp_path):
    adapters, probes = tmp_path / "adapters", tmp_path / "probes"
    probes.mkdir()
    for i in range(2):
        make_adapter(llama["base"], adapters / f"e{i}", [LORA_TARGETS[0].format(i)], seed=i)
    ranked_probes(probes / "e1.jsonl", llama["base"], QUESTIONS, CHOICES, pick=1)
    elsewhere = ranked_probes(tmp_path / "e0-items.jsonl", llama["base"], QUESTIONS, CHOICES, pick=0)
    out = tmp_path / "o"
    pool = ["plan", "--pool", str(adapters), "--probes", str(probes), "--out", str(out), "--budget-evals", "1", "-q"]
    result = CliRunner().invoke(cli, [*pool, "--probe", f"e0={elsewhere}"])
    assert result.exit_code == 0, result.output
    probed = {
        Path(m["path"].split("+")[-1]).name: m["probe"]
        for m in json.loads((out / "precheck.json").read_text())["models"]
    }
    assert Path(probed["e0"]).name == "e0-items.jsonl" and Path(probed["e1"]).name == "e1.jsonl"
    checked = json.loads((out / "plan.json").read_text())["checked"]["candidates"]  # the rehearsal asked both
    assert checked and all(c["measured"] is not None for c in checked)


def test_decide_states_the_objective_and_its_references(cancelling):
    root, config, out, _ = cancelling
    report = json.loads((out / "precheck.json").read_text())
    merges, _ = deciding.candidate_merges(report, ["task_arithmetic", "ties"])
    decision = deciding.decide(report, load(), merges, 1)
    alone = decision.references["alone"].total
    assert decision.references["base"].total <= decision.objective <= alone
    assert decision.objective == pytest.approx(decision.objective_of([(p.members, p.merge) for p in decision.planned]))
    shutil.rmtree(root / "plan_k2", ignore_errors=True)


def checked_plan(cancelling, out: Path, budget: int) -> dict:
    """plan.json of the cancelling pool planned with ``--budget-evals budget`` into ``out``."""
    _, config, measured, _ = cancelling
    arguments = ["plan", str(config), "--out", str(out), "--precheck", str(measured / "precheck.json")]
    result = CliRunner().invoke(cli, arguments + ["--budget-evals", str(budget), "--no-cache", "-q", *FAST])
    assert result.exit_code == 0, result.output
    return json.loads((out / "plan.json").read_text())


def test_budget_evals_measure_the_best_candidates_and_keep_the_best_measured(cancelling, tmp_path):
    plan = checked_plan(cancelling, tmp_path / "checked", 4)
    found = plan["checked"]
    assert found["spent"] <= 4 and found["candidates"]
    by_label = {c["label"]: c for c in found["candidates"]}
    choice, top = found["choice"], max(c["measured"] for c in found["candidates"])
    # the baseline is the reference (a merge of everything) measured best; the best is measured best
    references = [c for c in found["candidates"] if c["label"].startswith("reference: ")]
    assert by_label[choice["baseline"]]["measured"] == max(c["measured"] for c in references)
    assert by_label[choice["best"]]["measured"] == top
    # the best is written only where its pick holds on the probe halves it was not made on
    assert found["chosen"] == (choice["best"] if choice["gain"] > 0 else choice["baseline"])
    chosen = by_label[found["chosen"]]
    assert [sorted(m["members"]) for m in plan["models"]] == [sorted(m["members"]) for m in chosen["models"]]
    for candidate in found["candidates"]:
        assert 0 <= candidate["measured"] <= len(plan["experts"])
    # the report leads with what decided: the chosen plan's measured keep, then the rehearsal's table
    page = (tmp_path / "checked" / "report.html").read_text()
    headline = page[page.index("<h1>") : page.index("</h1>")]
    assert f"{chosen['measured']:.2f} of {len(plan['experts'])} tasks kept on the probes, measured" in headline
    assert page.index("checked by rehearsal") < page.index("Planned models")
    # a pool whose every pair is predicted alike gets a sentence, not a graph that shows nothing
    pairs = plan["compatibility"]
    alike = reports.render({**plan, "compatibility": [{**p, "predicted": 0.5} for p in pairs]})
    apart = reports.render({**plan, "compatibility": [{**p, "predicted": 0.5 + 0.1 * i} for i, p in enumerate(pairs)]})
    assert "Every pair of experts is predicted to keep 0.50 merged alone" in alike and "alt='the pool" not in alike
    assert "alt='the pool: each expert" in apart and "Every pair" not in apart


class Rehearsed:
    """A stand-in for ``planning.Measurer`` whose probe reads are set by hand (8 items per probe):
    merging everything reads 0.5 on every item, as does the base; a member of any other merge reads
    ``on_a`` on the probe's half A and ``on_b`` on half B (a value for every item of the half, or a
    list of its four items' values)."""

    quiet = True

    def __init__(self, pool_size: int, on_a, on_b):
        from mergekit_mergeability.decide.verdict import halves

        self.size, (first, second) = pool_size, halves(8)
        self.split = [0.0] * 8
        for half, values in ((first, on_a), (second, on_b)):
            for i, value in zip(half, values if isinstance(values, list) else [values] * 4):
                self.split[i] = value

    def base_items(self, report=None):
        return [[0.5] * 8 for _ in range(self.size)]

    def items(self, members, merge):
        return [[0.5] * 8 if len(members) == self.size else list(self.split) for _ in members]


NOISY = [1.0, 1.0, 0.0, 0.5]  # a half's four items: mean 0.625, spread from 0 to 1


@pytest.mark.parametrize(
    "on_a, on_b, gains, written",
    [(1.0, 0.25, False, False), (0.75, 0.75, True, True), (NOISY, NOISY, True, False), (0.625, 0.625, True, True)],
)
def test_a_split_is_written_over_merging_everything_only_where_it_holds_on_held_out_probe_items(
    cancelling, on_a, on_b, gains, written
):
    """Known answer: a split whose members read 1.0 on half A of their probes and 0.25 on half B
    measures best (0.625 a member against 0.5), but each half's pick read on the other half keeps
    less than merging everything, so merging everything is written; one that reads 0.75 on both
    halves is written. One that reads 0.625 on both halves, item by item from 0 to 1, gains on the
    other half too, but within the items' noise (the gain's interval reaches 0): not written; the
    same 0.625 on every item is."""
    from mergekit_mergeability import merge_config

    _, config, out, _ = cancelling
    report = json.loads((out / "precheck.json").read_text())
    spec = merge_config.read(config)
    merges, _ = deciding.candidate_merges(report, None)
    decision = deciding.decide(report, load(), merges, 1, names=spec.models)
    checked = planning.verify(decision, Rehearsed(len(decision.pool), on_a, on_b), 4)
    choice, chosen = checked["choice"], checked["chosen"]["label"]
    assert choice.baseline.startswith(planning.REFERENCE) and not choice.best.startswith(planning.REFERENCE)
    assert (chosen == choice.best) is written and (chosen == choice.baseline) is not written
    assert (choice.gain > 0) is gains and (choice.gain_interval[0] > 0) is written


def test_the_base_read_from_the_precheck_is_the_base_asked(cancelling):
    """The rehearsal takes each expert's items on the base from the precheck's knowledge pass
    (no pass of its own); they equal the base asked the same probes, item for item."""
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.sources.cache import Cache

    _, config, out, _ = cancelling
    report = json.loads((out / "precheck.json").read_text())
    spec = merge_config.read(config)
    decision = deciding.decide(report, load(), deciding.candidate_merges(report, None)[0], 1, names=spec.models)
    settings = PrecheckSettings(dtype="float32", quiet=True)
    measurer = planning.Measurer(spec, settings, Cache(None), decision.pool, probe_items(spec, settings))
    stored, asked = measurer.base_items(report), measurer.base_items()
    assert [len(items) for items in stored] == [len(measurer.probes[n]) for n in decision.pool.names]
    assert np.allclose(np.concatenate(stored), np.concatenate(asked), atol=1e-6)


def test_the_choice_is_said_with_its_interval_and_why_a_plan_is_not_written_where_it_reaches_zero():
    everything = {"members": ["/p/a", "/p/b", "/p/c"], "method": "ties (density 0.5)"}
    candidates = [
        {"label": "reference: everything with TIES", "models": [everything]},
        {"label": "planned", "models": [{"members": ["/p/a", "/p/b"], "method": "ties (density 0.5)"}]},
    ]

    def said(chosen, best, low, high=1.0):
        choice = {"baseline": "reference: everything with TIES", "best": best, "gain": 0.5}
        choice.update(gain_interval=[low, high], runner_up=None, items_to_separate=None)
        return reports._choice_said({"chosen": chosen, "choice": choice, "candidates": candidates})

    held = said("planned", "planned", 0.2)
    assert held.startswith("\u201cplanned\u201d chosen:")
    assert "+0.50 tasks (95% interval +0.20 to +1.00) against \u201ceverything with TIES\u201d" in held
    assert "cannot tell" not in held
    kept = said("reference: everything with TIES", "planned", -0.3)
    assert kept.startswith("\u201cplanned\u201d (ties of a, b; c left out) measured best but is not chosen")
    assert kept.endswith(
        "includes zero: these probes cannot tell the two apart, so \u201ceverything with TIES\u201d is written."
    )
    assert "keeps less there" in said("reference: everything with TIES", "planned", -0.5, -0.1)
    tied = [
        {"label": "reference: everything with TIES", "measured": 2.0, "models": [everything]},
        {"label": "reference: everything, the mean merge", "measured": 2.0, "models": [everything]},
        {"label": "the search's plan, c left out", "measured": 2.0, "models": candidates[1]["models"]},
    ]
    choice = {"baseline": tied[0]["label"], "best": tied[0]["label"], "gain": 0.0, "gain_interval": [0.0, 0.0]}
    level = reports._choice_said({"chosen": tied[0]["label"], "choice": choice, "candidates": tied})
    assert level == (
        "\u201ceverything with TIES\u201d measured best (level with \u201ceverything, the mean merge\u201d;"
        " \u201cthe search's plan, c left out\u201d: a tie keeps the merge of everything) and is written."
    )


@pytest.fixture(scope="module")
def opposed(llama, tmp_path_factory):
    """a, b = −a (large, on the head: in the tiny model only the head moves its favourite answer) and
    c (small, layer 2's down_proj), each with a probe whose gold answers are its own favourites, a's
    and b's among choices where the base prefers another: each knows its task alone, the base knows
    c's but neither a's nor b's, and a and b merged are the base."""
    root = tmp_path_factory.mktemp("plan_opposed")
    base = llama["base"]
    head = lambda name: "lm_head" in name  # noqa: E731
    a = derive(base, root / "a", noise(21, 2.0, head))
    opposite = noise(21, 2.0, head)
    b = derive(base, root / "b", lambda name, tensor: -opposite(name, tensor))
    c = derive(base, root / "c", noise(22, 0.05, lambda name: "layers.2.mlp.down_proj" in name))
    questions = [f"Question {k}: which one is it?" for k in range(8)]
    choices = {a: CHOICES, b: ["water", "dog", "cat", "house"], c: CHOICES}
    probes = [ranked_probes(root / f"{e.name}.jsonl", e, questions, choices[e], pick=0) for e in (a, b, c)]
    config = _config(root / "pool.yml", base, [a, b, c], probes)
    out = root / "plan"
    result = CliRunner().invoke(cli, ["plan", str(config), "--out", str(out), "--quiet", *FAST, *PREDICTED])
    assert result.exit_code == 0, result.output
    return config, out, (a, b, c)


def test_the_rehearsal_keeps_cancelling_experts_apart_where_the_conditional_model_merges_them(opposed):
    """Known answer (issue 41): a conditional model blind to merging (each member keeps inside any
    merge what it keeps alone) plans a, b = −a and c in one model. The finalists' rehearsal
    measures that a and b cancel there and that leaving either out gets its task back, and the plan
    kept is not the blind one."""
    from mergekit_mergeability import merge_config
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.sources.cache import Cache

    class Blind(conditional.ConditionalCalibration):
        def predict(self, pool, members, merge, domain=True):
            kept = np.nan_to_num(pool.expert_score[list(members)], nan=1.0)
            return conditional.Prediction(kept, "blind", False, [[] for _ in members])

    config, out, (a, b, c) = opposed
    shipped, spec = load(), merge_config.read(config)
    report = json.loads((out / "precheck.json").read_text())
    merges, _ = deciding.candidate_merges(report, ["task_arithmetic"])
    decision = deciding.decide(report, Blind(shipped.fitted, shipped.document), merges, 1, names=spec.models)
    assert list(decision.pool.base_score) == [0, 0, 1] and list(decision.pool.expert_score) == [1, 1, 1]
    assert [set(s.members) for s in decision.search.slots] == [{0, 1}]  # the blind plan merges a and b
    settings = PrecheckSettings(fewshot=0, dtype="float32", quiet=True)
    measurer = planning.Measurer(spec, settings, Cache(None), decision.pool, probe_items(spec, settings))
    checked = planning.verify(decision, measurer, 4)
    measured = {c["label"]: c["measured"] for c in checked["candidates"]}
    assert measured["the search's plan"] == 1  # a and b cancel: each at the base's 0; c's task the base's own
    repaired = [label for label in measured if label.startswith("the search's plan, ")]
    assert len(repaired) == 2 and all(measured[label] == 2 for label in repaired)  # a's or b's task back
    assert checked["chosen"]["label"] != "the search's plan" and checked["chosen"]["measured"] == 2
    assert checked["spent"] <= 4


def test_the_commands_default_methods_are_the_plans():
    from mergekit_mergeability.cli import plan as command

    default = next(p.default for p in command.params if p.name == "methods")
    assert default.split(",") == list(deciding.DEFAULT_METHODS)


def test_a_layer_selective_model_runs_with_mergekit_and_keeps_its_upper_models_top(cancelling, tmp_path):
    """With a cut-off measured (here written into the precheck), layer_selective is a candidate;
    a planned layer_selective model's config runs with the stock mergekit-yaml: blocks below the
    cut-off merged, above it the upper model's own."""
    from mergekit_mergeability.sources.architecture import tensor_position
    from mergekit_mergeability.planner import reports, planning
    from mergekit_mergeability import merge_config

    root, config, out, (a, b, c) = cancelling
    report = json.loads((out / "precheck.json").read_text())
    report["layers"]["cutoff"] = 2
    merges, notes = deciding.candidate_merges(report, ["layer_selective"])
    assert merges == [conditional.Merge("layer_selective", cutoff=2)] and not notes
    spec = merge_config.read(config)
    decision = deciding.decide(report, load(), merges, 1, names=spec.models)
    members = (spec.models.index(str(a)), spec.models.index(str(c)))
    planning.choose(decision, [(members, merges[0])])
    document = reports.document(decision, spec, report, load(), {})
    [(file, text)] = reports.configs(decision, spec, document).items()
    (tmp_path / "model.yml").write_text(text)
    written = yaml.safe_load(text)
    upper = [e["model"] for e in written["models"] if (e.get("parameters") or {}).get("upper")]
    assert len(upper) == 1 and written["parameters"]["cutoff"] == 2 and written["merge_method"] == "layer_selective"
    done = subprocess.run(
        [
            BIN / "mergekit-yaml",
            tmp_path / "model.yml",
            tmp_path / "merged",
            "--no-write-model-card",
            "--lazy-unpickle",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    merged, top, base = state_dict(tmp_path / "merged"), state_dict(Path(upper[0])), state_dict(Path(spec.base_model))
    below = [n for n in merged if tensor_position(n).part == "layer" and tensor_position(n).layer < 2]
    above = [n for n in merged if tensor_position(n).part == "layer" and tensor_position(n).layer >= 2]
    for name in above:
        torch.testing.assert_close(merged[name], top[name])
    members_state = [state_dict(a), state_dict(c)]
    for name in below:
        expected = base[name] + sum(0.5 * (m[name] - base[name]) for m in members_state)
        torch.testing.assert_close(merged[name], expected, rtol=1e-5, atol=1e-6)


def test_the_precheck_weighs_knowledge_weighted_against_ties_on_the_same_merge(cancelling):
    from mergekit_mergeability.planner import conditional_fit
    from mergekit_mergeability.planner.deciding import knowledge_weighted_against_ties as against

    _, _, out, _ = cancelling
    report, shipped = json.loads((out / "precheck.json").read_text()), conditional_fit.load()
    kw, ties = against(report, shipped)
    assert 0 <= kw <= 1 and 0 <= ties <= 1
    recorded = report["recommendation"]["knowledge_weighted_against_ties"]
    assert recorded.pop("by") == "conditional prediction"  # no rehearsal ran here (no dilution)
    assert recorded == pytest.approx({"knowledge_weighted": kw, "ties": ties})
    experts = [m for m in report["models"] if m["role"] == "expert"]
    assert against({**report, "models": experts[:1]}, shipped) is None  # one expert: no merge
    blind = [{**m, "knowledge": None} for m in experts]
    assert against({**report, "models": blind}, shipped) is None  # no probes: not predicted


def test_the_rest_of_an_update_that_is_rounding_residue_is_no_part():
    """‖τ‖ = 5 over layers of norm 3 and 4 leaves nothing; in float32 it may leave 1e-6, which must
    not become a part of its own (it would add samples and move every coordinate: an adapter pool
    and the same pool materialised planned apart). A real rest of norm 1 stays."""
    layers = {"layer_update_norm": [3.0, 4.0]}
    parts, names = conditional._parts([layers, layers, layers], np.array([5.0, 5.0 + 1e-7, math.sqrt(26.0)]))
    assert names[-1] == "rest"
    np.testing.assert_allclose(parts[:, -1], [0.0, 0.0, 1.0])


def test_the_check_measures_merging_everything_beside_the_finalists_and_never_keeps_less(cancelling, tmp_path):
    """The references (every expert with TIES, the mean merge, as configured) are measured outside
    the budget; the plan written measures at least as much as each of them."""
    found = checked_plan(cancelling, tmp_path / "checked", 1)["checked"]
    labels = [c["label"] for c in found["candidates"]]
    assert {"reference: everything with TIES", "reference: everything, the mean merge"} <= set(labels)
    assert found["spent"] <= 1
    chosen = next(c for c in found["candidates"] if c["label"] == found["chosen"])
    assert all(chosen["measured"] >= c["measured"] for c in found["candidates"] if c["label"].startswith("reference"))


def test_two_plans_that_build_the_same_models_are_measured_once():
    """The config's equal weights and the mean merge build one model: one key, one measurement;
    another weighting, another method or another subset is another key."""
    pool = pool_of(np.eye(3))
    names = pool.names
    mean = [((0, 1, 2), conditional.Merge(conditional.TASK_ARITHMETIC))]
    written = [((2, 1, 0), conditional.Merge(conditional.TASK_ARITHMETIC, weights=tuple((n, 1 / 3) for n in names)))]
    assert planning.built(pool, mean) == planning.built(pool, written)
    others = [
        [
            (
                (0, 1, 2),
                conditional.Merge(
                    conditional.TASK_ARITHMETIC, weights=((names[0], 0.5), (names[1], 0.25), (names[2], 0.25))
                ),
            )
        ],
        [((0, 1, 2), conditional.Merge(conditional.TIES, density=0.5))],
        [
            ((0, 1), conditional.Merge(conditional.TASK_ARITHMETIC)),
            ((2,), conditional.Merge(conditional.TASK_ARITHMETIC)),
        ],
    ]
    assert len({planning.built(pool, a) for a in [mean, *others]}) == 4


def test_the_plans_precheck_asks_only_what_the_plan_reads(cancelling, tmp_path):
    """No fluency, dilution or menu; not the lettered view, whatever --fewshot says, since the
    shipped calibration reads the probe as scored."""
    _, config, _, _ = cancelling
    out = tmp_path / "lean"
    result = CliRunner().invoke(
        cli, ["plan", str(config), "--out", str(out), "--quiet", "--fewshot", "3", "--dtype", "float32", *PREDICTED]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "precheck.json").read_text())
    assert load().document["knowledge_feature"].startswith("scored_")
    knowledge = [m["knowledge"] for m in report["models"] if m["role"] == "expert"]
    assert all(k["scored_mean_p_gold"] is not None for k in knowledge)
    assert {(k.get("fewshot"), k.get("mean_p_gold"), k.get("letter_accuracy")) for k in knowledge} == {(None,) * 3}
    ran = set(report.get("diagnostics") or {})
    assert {"knowledge", "weights"} <= ran and not ran & {
        "fluency",
        "dilution",
        "menu",
        "representations",
        "selectivity",
    }


def test_the_conditional_model_reads_only_what_plans_precheck_measures():
    """Its features are the shipped fit's, and none is the dilution's: plan's precheck skips that
    pass, so a refit on archives that hold diluted_* values must not read them."""
    shipped = json.loads(Path(conditional.__file__).with_name("conditional.json").read_text())
    assert shipped["features"] == conditional.FEATURES
    assert "dilution" in planning.SKIPPED and not any(name.startswith("diluted_") for name in conditional.FEATURES)


def test_the_pool_graphs_colour_bar_spans_the_pairs_predicted_and_no_graph_when_they_are_alike(monkeypatch):
    """Matplotlib widens a constant's range to ±0.1: a bar up to 1.10 for scores that end at 1. Where
    every pair is predicted alike the graph would show nothing, and the page says so instead."""
    from matplotlib.figure import Figure

    bars = []
    monkeypatch.setattr(Figure, "colorbar", lambda self, mappable, **kw: bars.append(mappable.norm))
    experts = [{"path": f"e{i}", "name": f"e{i}", "model": 1} for i in range(3)]
    drawn = {}
    for scores in ([0.6, 0.7, 0.9], [1.0, 0.998, 1.0]):
        pairs = [{"a": f"e{a}", "b": f"e{b}", "predicted": v} for (a, b), v in zip([(0, 1), (0, 2), (1, 2)], scores)]
        drawn[scores[1]] = reports._graph({"experts": experts, "compatibility": pairs})
    assert drawn[0.7] is not None and drawn[0.998] is None
    assert [(n.vmin, n.vmax) for n in bars] == [(0.6, 0.9)]
