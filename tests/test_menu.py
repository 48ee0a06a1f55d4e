"""Method choice by rehearsal: the config as written and a small menu, each merged in memory as its
recommended.yml would be written, every model's own probe asked on each."""

import json

import pytest
import yaml

from mergekit_mergeability.decide.advice import menu
from mergekit_mergeability.decide.verdict import (
    AS_WRITTEN,
    MENU,
    MERGE_AS_CONFIGURED,
    METHOD_BY_REHEARSAL,
    choose_method,
    recommend,
)
from mergekit_mergeability.maths.stats import grouped_difference
from mergekit_mergeability.tiny import CORPUS, derive

from conftest import noise, precheck_cli, ranked_probes

QUESTIONS = [f"{sentence} Question {i}?" for i in range(4) for sentence in CORPUS]
CHOICES = ["q", "x", "z", "k"]  # one token each after a space: no option favoured by its length


def test_the_grouped_difference_is_the_mean_of_each_groups_mean_and_a_constant_one_has_no_spread():
    mean, (low, high) = grouped_difference([[1.0, 1.0], [0.5, 0.5, 0.5]], [[0.0, 0.0], [0.25, 0.25, 0.25]])
    assert mean == pytest.approx((1.0 + 0.25) / 2) and low == pytest.approx(mean) and high == pytest.approx(mean)
    mean, (low, high) = grouped_difference([[1, 0, 1, 0]], [[0, 1, 0, 1]])
    assert mean == 0 and low < 0 < high


def test_a_candidate_is_chosen_only_where_it_keeps_more_beyond_the_probes_noise():
    written = {"a": [0, 0, 1, 0] * 5, "b": [1, 0, 0, 0] * 5}
    clear = choose_method({AS_WRITTEN: written, "ties": {"a": [1] * 20, "b": [1, 1, 0, 1] * 5}})
    assert (clear.best, clear.chosen) == ("ties", "ties") and clear.interval[0] > 0
    assert clear.kept == {AS_WRITTEN: 0.25, "ties": pytest.approx((1 + 0.75) / 2)}
    noisy = choose_method({AS_WRITTEN: written, "mean": {"a": [0, 1, 0, 0] * 5, "b": [1, 0, 0, 1, 0] * 4}})
    assert noisy.best == "mean" and noisy.chosen == AS_WRITTEN and noisy.interval[0] <= 0 < noisy.margin
    tied = choose_method({AS_WRITTEN: written, "dare_ties": written})
    assert tied.best == tied.chosen == AS_WRITTEN


def test_the_verdict_says_the_margin_and_keeps_the_config_as_written_within_noise():
    written = {"a": [0.2] * 8, "b": [0.4] * 8}
    chosen = choose_method({AS_WRITTEN: written, "mean": {"a": [0.6] * 8, "b": [0.5] * 8}})
    recommendation = recommend("ties", {}, {}, {}, None, [], choice=chosen)
    assert (recommendation.verdict, recommendation.method) == (METHOD_BY_REHEARSAL, "task_arithmetic")
    assert "mean keeps 0.55" in recommendation.reasons[0] and "against 0.30 as written" in recommendation.reasons[0]
    within = choose_method({AS_WRITTEN: written, "mean": {"a": [0.0, 0.6] * 4, "b": [0.4, 0.3] * 4}})
    kept = recommend("ties", {}, {}, {}, None, [], choice=within)
    assert (
        kept.verdict == MERGE_AS_CONFIGURED and kept.method == "ties" and "within the probes' noise" in kept.reasons[0]
    )


def test_each_menu_config_is_the_users_with_the_candidates_method():
    document = {
        "merge_method": "ties",
        "base_model": "base",
        "parameters": {"lambda": 0.5, "density": 0.3},
        "models": [{"model": m, "parameters": {"weight": 1.0}} for m in ("a", "b", "c")],
    }
    configs = {name: advice.config for name, advice in menu(document, {"a": 0.9, "b": 0.2, "c": 0.5}).items()}
    assert {name: c["merge_method"] for name, c in configs.items()} == MENU
    assert [e["parameters"]["weight"] for e in configs["mean"]["models"]] == [pytest.approx(1 / 3)] * 3
    assert configs["mean"]["parameters"]["lambda"] == 1.0 and "density" not in configs["mean"]["parameters"]
    assert (
        configs["ties"]["parameters"]
        == configs["dare_ties"]["parameters"]
        == {
            "density": 0.5,
            "normalize": True,
            "lambda": 0.5,  # the configured update size: ties normalises its weights by default, so lambda
        }
    )
    assert "knowledge_weighted" not in menu(document, {"a": 0.9, "b": None, "c": 0.5})  # not every task known
    assert document["parameters"] == {"lambda": 0.5, "density": 0.3}  # the user's config untouched


@pytest.fixture(scope="module")
def pair(llama, tmp_path_factory):
    """Two fine-tunes of the tiny base, each probed on what it, not the base, ranks first."""
    root = tmp_path_factory.mktemp("menu")
    base = llama["base"]
    experts = [derive(base, root / f"e{i}", noise(30 + i, 1.0, lambda n: ".mlp." in n)) for i in range(2)]
    probes = [ranked_probes(root / f"p{i}.jsonl", e, QUESTIONS, CHOICES, pick=0) for i, e in enumerate(experts)]
    return base, experts, probes


def _precheck(tmp_path, base, experts, probes, weight):
    models = [{"model": str(e), "probe": str(p), "parameters": {"weight": weight}} for e, p in zip(experts, probes)]
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    result = precheck_cli(config, tmp_path / "out", "--skip", "representations", "--skip", "selectivity")
    assert result.exit_code in (0, 1), result.output
    return json.loads((tmp_path / "out" / "precheck.json").read_text())


def test_a_config_that_pushes_away_from_its_experts_gets_the_menus_best_merge_written(pair, tmp_path):
    """Weights −1: the merge as written moves away from what each expert learned; the mean merge
    moves toward it. The menu says so, and recommended.yml is the merge it rehearsed."""
    base, experts, probes = pair
    report = _precheck(tmp_path, base, experts, probes, -1.0)
    choice = report["recommendation"]["method_choice"]
    assert set(choice["kept"]) == {AS_WRITTEN, "mean", "ties", "dare_ties"}  # no knowledge_weighted at weights < 0
    assert choice["chosen"] == choice["best"] != AS_WRITTEN and choice["interval"][0] > 0
    assert report["recommendation"]["verdict"] == METHOD_BY_REHEARSAL
    written = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    assert written["merge_method"] == MENU[choice["best"]]
    for model in (m for m in report["models"] if m["role"] == "expert"):
        # the menu's as-written reading is dilution's rehearsal of the same merge (cloze: accuracy)
        assert choice["per_model"][AS_WRITTEN][model["path"]] == model["dilution"]["partnered_accuracy"]
        assert model["dilution"]["rehearsed"] == "written"


def test_a_sound_config_keeps_its_method_unless_another_keeps_more_beyond_noise(pair, tmp_path):
    base, experts, probes = pair
    report = _precheck(tmp_path, base, experts, probes, 1.0)
    choice, verdict = report["recommendation"]["method_choice"], report["recommendation"]["verdict"]
    assert (choice["chosen"] == AS_WRITTEN) == (verdict == MERGE_AS_CONFIGURED)
    assert set(choice["kept"]) == {AS_WRITTEN, *MENU}  # positive weights, knowledge known: every candidate
