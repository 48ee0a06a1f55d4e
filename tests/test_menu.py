"""Method choice by rehearsal: the config as written and a small menu, each merged in memory as its
recommended.yml would be written, every model's own probe asked on each."""

import json
import math

import pytest
import yaml

from mergekit_mergeability.decide.advice import menu
from mergekit_mergeability.decide.verdict import (
    AS_WRITTEN,
    MENU,
    MERGE_AS_CONFIGURED,
    METHOD_BY_REHEARSAL,
    choose_method,
    halves,
    recommend,
)
from mergekit_mergeability.maths.stats import grouped_difference, paired_margin
from mergekit_mergeability.settings import TUNE_CANDIDATES
from mergekit_mergeability.tiny import CORPUS, derive

from conftest import noise, precheck_cli, ranked_probes

QUESTIONS = [f"{sentence} Question {i}?" for i in range(4) for sentence in CORPUS]
CHOICES = ["q", "x", "z", "k"]  # one token each after a space: no option favoured by its length


def test_the_grouped_difference_is_the_mean_of_each_groups_mean_and_a_constant_one_has_no_spread():
    mean, (low, high) = grouped_difference([[1.0, 1.0], [0.5, 0.5, 0.5]], [[0.0, 0.0], [0.25, 0.25, 0.25]])
    assert mean == pytest.approx((1.0 + 0.25) / 2) and low == pytest.approx(mean) and high == pytest.approx(mean)
    mean, (low, high) = grouped_difference([[1, 0, 1, 0]], [[0, 1, 0, 1]])
    assert mean == 0 and low < 0 < high


def test_the_halves_are_fixed_disjoint_and_cover_every_item():
    a, b = halves(9)
    assert sorted(a + b) == list(range(9)) and not set(a) & set(b) and (len(a), len(b)) == (5, 4)
    assert (a, b) == halves(9)


def _by_half(n: int, on_a: float, on_b: float):
    a, _ = halves(n)
    return [on_a if i in a else on_b for i in range(n)]


def test_a_pick_is_kept_only_where_it_holds_on_the_half_it_was_not_made_on():
    written = {"a": [0.5] * 8, "b": [0.5] * 8}
    clear = choose_method({AS_WRITTEN: written, "ties": {"a": [0.9] * 8, "b": _by_half(8, 0.7, 0.8)}})
    assert (clear.best, clear.chosen, clear.picked) == ("ties", "ties", ("ties", "ties"))
    assert clear.gain == pytest.approx(((0.9 - 0.5) + (0.75 - 0.5)) / 2) and clear.gain_interval[0] > 0
    assert clear.halves["ties"] == (pytest.approx((0.9 + 0.7) / 2), pytest.approx((0.9 + 0.8) / 2))
    # x wins half A and loses half B; y the other way round: each half's pick, read on the other half,
    # keeps less than the config as written, so x (best over all items) is not chosen
    x, y = _by_half(8, 1.0, 0.25), _by_half(8, 0.4, 0.75)
    noisy = choose_method({AS_WRITTEN: written, "x": {"a": x, "b": x}, "y": {"a": y, "b": y}})
    assert noisy.best == "x" and noisy.margin == pytest.approx(0.125) and noisy.picked == ("x", "y")
    assert noisy.gain == pytest.approx(((0.25 - 0.5) + (0.4 - 0.5)) / 2) and noisy.chosen == AS_WRITTEN
    tied = choose_method({AS_WRITTEN: written, "dare_ties": written})
    assert tied.best == tied.chosen == AS_WRITTEN and tied.gain == 0


def test_against_a_named_baseline_a_one_item_probe_counts_in_half_a_only():
    """plan's use: the baseline is the best merge of everything, not the config as written, and a
    pool's probes may hold one item each. With every probe at one item nothing is held out, so no
    pick can be checked and the baseline stays; with two items a pick that holds is kept."""
    one = {"ref": {"a": [0.0], "b": [1.0]}, "subset": {"a": [1.0], "b": [1.0]}}
    unchecked = choose_method(one, baseline="ref")
    assert (unchecked.best, unchecked.chosen, unchecked.baseline) == ("subset", "ref", "ref")
    assert unchecked.halves["subset"] == (1.0, 0.0) and unchecked.gain == 0
    two = {"ref": {"a": [0.0, 0.0], "b": [1.0, 1.0]}, "subset": {"a": [1.0, 1.0], "b": [1.0, 1.0]}}
    held = choose_method(two, baseline="ref")
    assert held.chosen == "subset" and held.picked == ("subset", "subset") and held.gain == pytest.approx(0.5)


def test_where_the_top_two_cannot_be_told_apart_it_says_how_many_items_would():
    written = {"a": [0.0] * 16}
    close = choose_method({AS_WRITTEN: written, "p": {"a": [1, 0] * 8}, "q": {"a": [1, 0, 0, 1] * 4}})
    assert close.runner_up in ("p", "q") and close.items_to_separate is None  # equal means: nothing would
    p, q = [1, 1, 0, 0] * 4, [1, 0, 1, 0] * 3 + [1, 0, 0, 0]  # p ahead by one item of 16
    apart = choose_method({AS_WRITTEN: written, "p": {"a": p}, "q": {"a": q}}, methods={"p": "ties", "q": "ties"})
    margin, (low, high) = grouped_difference([p], [q])
    spread = (high - low) / (2 * 1.96)
    assert low <= 0 and apart.items_to_separate == math.ceil(16 * (1.96 * spread / margin) ** 2) > 16
    said = recommend("ties", {}, {}, {}, None, [], choice=apart).reasons[0]
    assert f"the probes cannot tell p from q: about {apart.items_to_separate} items per probe would" in said


def test_the_verdict_says_what_the_pick_kept_on_the_held_out_halves():
    written = {"a": [0.2] * 8, "b": [0.4] * 8}
    chosen = choose_method({AS_WRITTEN: written, "mean": {"a": [0.6] * 8, "b": [0.5] * 8}})
    recommendation = recommend("ties", {}, {}, {}, None, [], choice=chosen)
    assert (recommendation.verdict, recommendation.method) == (METHOD_BY_REHEARSAL, "task_arithmetic")
    assert "mean keeps 0.55" in recommendation.reasons[0] and "against 0.30 as written" in recommendation.reasons[0]
    assert "read on the other half, the pick keeps +0.250" in recommendation.reasons[0]
    x, y = _by_half(8, 1.0, 0.0), _by_half(8, 0.0, 0.6)
    within = choose_method({AS_WRITTEN: written, "x": {"a": x, "b": x}, "y": {"a": y, "b": y}}, methods={"x": "ties"})
    kept = recommend("ties", {}, {}, {}, None, [], choice=within)
    assert (
        kept.verdict == MERGE_AS_CONFIGURED
        and kept.method == "ties"
        and "keep the config as written" in kept.reasons[0]
    )
    grid = choose_method(
        {AS_WRITTEN: written, "mean x1.5": {"a": [0.9] * 8, "b": [0.9] * 8}}, methods={"mean x1.5": "task_arithmetic"}
    )
    assert recommend("ties", {}, {}, {}, None, [], choice=grid).method == "task_arithmetic"


def test_where_both_halves_pick_the_baseline_the_verdict_and_the_report_say_so_without_a_zero_gain():
    from dataclasses import asdict

    from mergekit_mergeability.output.html import _menu_table

    # one member's item lies in half A only: x loses on either half yet leads over all items
    (in_a,), (in_b,) = halves(2)
    two = [0.0, 0.0]
    two[in_a], two[in_b] = 0.6, 0.1
    written, x = {"one": [0.5], "two": two}, {"one": [1.0], "two": [0.0, 0.0]}
    choice = choose_method({AS_WRITTEN: written, "x": x}, methods={"x": "ties"})
    assert choice.best == "x" and choice.picked == (AS_WRITTEN, AS_WRITTEN) and choice.chosen == AS_WRITTEN
    reason = recommend("ties", {}, {}, {}, None, [], choice=choice).reasons[0]
    assert "picked on either half of each probe's items, the config as written keeps the most there" in reason
    page = _menu_table(asdict(choice), {})
    assert "picked the config as written itself, so it stays" in page and "+0.000" not in page


def test_the_report_sets_a_tasks_own_metric_beside_the_item_by_item_read_of_the_same_merge():
    from dataclasses import asdict

    from mergekit_mergeability.output.html import _menu_table

    choice = asdict(
        choose_method(
            {AS_WRITTEN: {"/m/a": [0.5, 0.7], "/m/b": [0.6] * 2}, "mean": {"/m/a": [0.8] * 2, "/m/b": [0.7] * 2}}
        )
    )
    names = {"/m/a": "a", "/m/b": "b"}
    knowledge = {"scored_format": "lm-eval"}
    translated = {"rehearsed": "written", "task_metric": "chrf", "partnered_task_score": 0.69}
    described = [{"path": "/m/a", "knowledge": knowledge, "dilution": translated}, {"path": "/m/b", "dilution": {}}]
    page = _menu_table(choice, names, described)
    assert "a chrf 0.69 there, 0.600 here" in page and " b " not in page.split("task's own metric:")[1]
    assert "own metric" not in _menu_table(choice, names, [{"path": "/m/a", "dilution": {}}])


def test_a_rehearsed_layer_patch_stands_unless_a_merge_beats_it_on_held_out_items():
    """Where the representations part (cut-off 20) and the patch was rehearsed beside the merges, it
    is the choice's baseline: a merge replaces it only where it keeps more on both halves; where the
    probes tell nothing (every candidate reads the same, as whole generated sentences do), the patch
    stands. Unrehearsed, the patch is written as before."""
    from mergekit_mergeability.decide.verdict import LAYER_SELECTIVE, PATCH

    def choice(mean, patch, written={"a": [0.2] * 8, "b": [0.4] * 8}):
        return choose_method({AS_WRITTEN: written, "mean": mean, PATCH: patch}, baseline=PATCH)

    patched = recommend(
        "ties", {}, {}, {}, 20, [], choice=choice({"a": [0.5] * 8, "b": [0.5] * 8}, {"a": [0.8] * 8, "b": [0.7] * 8})
    )
    assert (patched.verdict, patched.method, patched.cutoff) == (LAYER_SELECTIVE, "layer_selective", 20)
    assert patched.reasons[0].endswith("merge blocks 0–19, keep each expert's own blocks above")
    assert patched.reasons[1].startswith("rehearsed, the layer patch at block 20 keeps the most")
    merged = recommend(
        "ties", {}, {}, {}, 20, [], choice=choice({"a": [0.6] * 8, "b": [0.5] * 8}, {"a": [0.3] * 8, "b": [0.4] * 8})
    )
    assert (merged.verdict, merged.method, merged.cutoff) == (METHOD_BY_REHEARSAL, "task_arithmetic", None)
    assert "mean keeps 0.55 on its models' own probes against 0.35 for the patch" in merged.reasons[0]
    assert "the pick keeps +0.200 over the layer patch at block 20" in merged.reasons[0]
    assert (
        merged.reasons[1]
        == "representations stay shared up to block 19 and diverge above, but a merge keeps more than the layer patch there"
    )
    nothing = {"a": [0.0] * 8, "b": [0.0] * 8}
    silent = recommend("ties", {}, {}, {}, 20, [], choice=choice(nothing, nothing, nothing))
    assert (silent.verdict, silent.cutoff) == (LAYER_SELECTIVE, 20)
    written = recommend(
        "ties", {}, {}, {}, 20, [], choice=choice({"a": [0.3] * 8, "b": [0.3] * 8}, {"a": [0.1] * 8, "b": [0.2] * 8})
    )
    assert (written.verdict, written.method) == (MERGE_AS_CONFIGURED, "ties")
    unrehearsed = recommend("ties", {}, {}, {}, 20, [], choice=choose_method({AS_WRITTEN: nothing, "mean": nothing}))
    assert (unrehearsed.verdict, unrehearsed.cutoff) == (LAYER_SELECTIVE, 20)


def test_the_paired_margin_is_the_mean_of_each_groups_mean_with_its_standard_error():
    margin, se = paired_margin([[1.0, 0.0, 1.0, 0.0], [0.5]], [[0.0, 0.0, 0.0, 0.0], [0.0]])
    # group 1: differences 1,0,1,0 (mean 0.5, sample variance 1/3, over 4 items); group 2: one item, no spread
    assert margin == pytest.approx((0.5 + 0.5) / 2) and se == pytest.approx(math.sqrt((1 / 3) / 4) / 2)


def test_the_stepped_choice_moves_the_method_then_its_knobs_each_only_on_a_margin_above_its_noise():
    written = {"a": [0.5] * 8, "b": [0.5] * 8}
    steady = {"a": [0.7] * 8, "b": [0.7] * 8}  # the mean merge: +0.2 on every item
    noisy_knob = {"a": [0.95, 0.45] * 4, "b": [0.95, 0.45] * 4}  # ±0.25 around the mean merge, item by item
    steady_knob = {"a": [0.75] * 8, "b": [0.75] * 8}
    far_knob = {"a": [0.99] * 8, "b": [0.99] * 8}  # best of all, but a knob of TIES, which is not chosen
    parents = {"mean x0.75": "mean", "mean, a x2": "mean", "ties d0.3": "ties"}
    # margin of the noisy knob over the mean merge: 0.0 on average, so it cannot clear its standard error
    noisy = choose_method(
        {AS_WRITTEN: written, "mean": steady, "ties": written, "mean, a x2": noisy_knob}, parents=parents
    )
    assert noisy.chosen == "mean" and [s[:2] for s in noisy.steps] == [("mean", AS_WRITTEN), ("mean, a x2", "mean")]
    assert noisy.steps[0][2] == pytest.approx(0.2) and noisy.steps[0][3] == 0
    clear = choose_method({AS_WRITTEN: written, "mean": steady, "mean x0.75": steady_knob}, parents=parents)
    assert clear.chosen == "mean x0.75" and clear.steps[1][2] == pytest.approx(0.05)
    # the far knob is TIES's; TIES keeps as written, so only the mean merge's knobs are weighed
    other = choose_method(
        {AS_WRITTEN: written, "mean": steady, "ties": written, "ties d0.3": far_knob}, parents=parents
    )
    assert other.best == "ties d0.3" and other.chosen == "mean" and len(other.steps) == 1
    # a method ahead by less than one standard error is not chosen; the config as written's knob then is
    ahead = {"a": [0.9, 0.2] * 4, "b": [0.9, 0.2] * 4}  # +0.05 over as written with 0.35 sd a member
    written_knob = {"a": [0.6] * 8, "b": [0.6] * 8}
    held = choose_method(
        {AS_WRITTEN: written, "mean": ahead, "as written, lambda x0.75": written_knob},
        parents={"as written, lambda x0.75": AS_WRITTEN},
    )
    assert held.steps[0][:2] == ("mean", AS_WRITTEN) and held.chosen == "as written, lambda x0.75"
    # without parents the cross-fitted rule chooses, as before
    assert choose_method({AS_WRITTEN: written, "mean": steady, "ties d0.3": far_knob}).chosen == "ties d0.3"


def test_the_lower_bound_choice_takes_the_highest_margin_less_one_standard_error_and_above_zero():
    written = {"a": [0.5] * 8, "b": [0.5] * 8}
    steady = {"a": [0.6] * 8, "b": [0.6] * 8}  # +0.1 on every item: standard error 0, bound +0.1
    # +0.2 on average, ±0.35 item by item: se = sqrt(2 * 0.35²·8/7 / 8) / 2 ≈ 0.094, bound ≈ +0.106
    wide = {"a": [1.05, 0.35] * 4, "b": [1.05, 0.35] * 4}
    wider = {"a": [1.15, 0.25] * 4, "b": [1.15, 0.25] * 4}  # +0.2 ± 0.45: bound ≈ +0.079
    scores = {AS_WRITTEN: written, "mean": steady, "ties": wider, "mean x2": wide}
    margin, error = paired_margin([wide["a"], wide["b"]], [written["a"], written["b"]])
    assert margin == pytest.approx(0.2) and error == pytest.approx(0.35 * (8 / 7) ** 0.5 / 8**0.5 / 2**0.5)
    assert choose_method(scores, bound=1.0).chosen == "mean x2"  # 0.2 − 0.0935 beats 0.1 − 0
    assert choose_method(scores, bound=2.0).chosen == "mean"  # 0.2 − 0.187 falls below 0.1
    assert choose_method(scores).chosen == "ties"  # the cross-fitted rule takes the highest mean (ties: earlier)
    # nothing whose bound clears 0: the config as written stays
    noisy = {"a": [0.9, 0.2] * 4, "b": [0.9, 0.2] * 4}  # +0.05 ± 0.35: bound < 0
    assert choose_method({AS_WRITTEN: written, "mean": noisy}, bound=1.0).chosen == AS_WRITTEN
    assert choose_method({AS_WRITTEN: written, "mean": noisy}, bound=0.0).chosen == "mean"


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


def _precheck(tmp_path, base, experts, probes, weight, *options):
    models = [{"model": str(e), "probe": str(p), "parameters": {"weight": weight}} for e, p in zip(experts, probes)]
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    result = precheck_cli(config, tmp_path / "out", "--skip", "representations", "--skip", "selectivity", *options)
    assert result.exit_code in (0, 1), result.output
    return json.loads((tmp_path / "out" / "precheck.json").read_text())


def test_a_config_that_pushes_away_from_its_experts_gets_the_menus_best_merge_written(pair, tmp_path):
    """Weights −1: the merge as written moves away from what each expert learned; the mean merge
    moves toward it. The menu says so, and recommended.yml is the merge it rehearsed."""
    base, experts, probes = pair
    report = _precheck(tmp_path, base, experts, probes, -1.0)
    choice, search = report["recommendation"]["method_choice"], report["recommendation"]["search"]
    menu_rehearsed = {AS_WRITTEN, "mean", "ties", "dare_ties"}  # no knowledge_weighted at weights < 0
    assert menu_rehearsed < set(choice["kept"]) and len(choice["kept"]) == len(menu_rehearsed) + TUNE_CANDIDATES
    assert [c["name"] for c in search] == list(choice["kept"]) and search[0]["name"] == AS_WRITTEN
    assert choice["chosen"] == choice["best"] != AS_WRITTEN and choice["gain"] > 0
    assert report["recommendation"]["verdict"] == METHOD_BY_REHEARSAL
    written = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    chosen = next(c for c in search if c["name"] == choice["best"])
    assert written["merge_method"] == chosen["method"] == report["recommendation"]["method"]
    if chosen["weights"]:  # the knobs precheck.json lists are the ones recommended.yml carries
        assert [(m.get("parameters") or {}).get("weight") for m in written["models"]] == list(
            chosen["weights"].values()
        )
    for model in (m for m in report["models"] if m["role"] == "expert"):
        # the menu's as-written reading is dilution's rehearsal of the same merge (cloze: accuracy)
        assert choice["per_model"][AS_WRITTEN][model["path"]] == model["dilution"]["partnered_accuracy"]
        assert model["dilution"]["rehearsed"] == "written"


def test_a_sound_config_keeps_its_method_unless_another_keeps_more_beyond_noise(pair, tmp_path):
    base, experts, probes = pair
    report = _precheck(tmp_path, base, experts, probes, 1.0)
    choice, verdict = report["recommendation"]["method_choice"], report["recommendation"]["verdict"]
    assert (choice["chosen"] == AS_WRITTEN) == (verdict == MERGE_AS_CONFIGURED)
    assert {AS_WRITTEN, *MENU} < set(choice["kept"])  # positive weights, knowledge known: every candidate
    (tmp_path / "untuned").mkdir()
    untuned = _precheck(tmp_path / "untuned", base, experts, probes, 1.0, "--tune-budget", "0")
    assert set(untuned["recommendation"]["method_choice"]["kept"]) == {AS_WRITTEN, *MENU}  # the menu alone


def test_the_config_as_written_is_built_once_the_menu_reading_it_off_the_dilutions_pass(pair, tmp_path, monkeypatch):
    """The dilution's partnered pass already asks every member's probe on the merge as written; the
    menu takes those reads and builds no merge twice. Without the dilution it builds that one too,
    and reads the same."""
    from mergekit_mergeability import menu
    from mergekit_mergeability.diagnostics import dilution
    from mergekit_mergeability.rehearsal.stream import as_planned

    base, experts, probes = pair
    built = []

    def counted(name, plan):
        built.append(id(plan))
        return as_planned(name, plan)

    monkeypatch.setattr(dilution, "as_planned", counted)
    monkeypatch.setattr(menu, "as_planned", counted)
    report = _precheck(tmp_path, base, experts, probes, -1.0)
    read = report["recommendation"]["method_choice"]["per_model"][AS_WRITTEN]
    assert len(built) == len(set(built)) == len(report["recommendation"]["method_choice"]["kept"])
    (tmp_path / "alone").mkdir()
    alone = _precheck(tmp_path / "alone", base, experts, probes, -1.0, "--skip", "dilution")
    assert alone["recommendation"]["method_choice"]["per_model"][AS_WRITTEN] == read


def test_probes_of_fewer_than_16_items_are_named_in_one_warning():
    from mergekit_mergeability.output.precheck_report import _few_items

    def expert(name, n):
        return {"name": name, "role": "expert", "knowledge": {"per_instance": [{}] * n}}

    models = [{"name": "base", "role": "base", "knowledge": None}, expert("a", 2), expert("b", 16), expert("c", 15)]
    (finding,) = _few_items(models)
    assert finding["severity"] == "warning" and "fewer than 16 items: a (2), c (15);" in finding["message"]
    assert _few_items([expert("b", 16), {"name": "d", "role": "expert", "knowledge": None}]) == []


def test_the_report_marks_a_merge_rehearsed_at_the_update_size_as_written_by_its_lambda():
    from dataclasses import asdict

    from mergekit_mergeability.output.html import _menu_table

    choice = asdict(choose_method({AS_WRITTEN: {"a": [0.5, 0.7]}, "ties": {"a": [0.4, 0.4]}}))
    search = [{"name": "ties", "method": "ties", "lambda": 2.0}, {"name": "mean", "method": "task_arithmetic"}]
    page = _menu_table(choice, {}, [], search)
    assert "ties (λ 2)" in page and "mergekit's default for it is λ 1, which was not rehearsed" in page
    assert "(λ" not in _menu_table(choice, {}, [], [{"name": "ties", "method": "ties", "lambda": 1.0}])
