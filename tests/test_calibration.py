"""calibrate: known answers on planted relations and on pure noise, fitting maths and the command."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mergekit_mergeability.cli import main
from mergekit_mergeability.maths.fitting import (
    fit,
    held_out_predictions,
    p_value,
    permutation_null,
    single_features,
    within_pools,
)
from mergekit_mergeability.decide.calibration import Calibration

NAMES, DIRECTIONS = ["knows", "size", "noise"], [+1, -1, +1]


def _planted(n=60, seed=0, noise=0.05):
    """y rises with feature 0 and falls with feature 1 (their prior directions); feature 2 is noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = 1 / (1 + np.exp(-(1.5 * x[:, 0] - 1.0 * x[:, 1]))) + noise * rng.normal(size=n)
    return x, y, ["pool"] * n


def test_recovers_a_planted_monotone_relation_out_of_sample():
    x, y, groups = _planted()
    model = fit(x, y, NAMES, DIRECTIONS)
    assert model.weights[0] > model.weights[1] > 2 * model.weights[2]
    held_out = within_pools(held_out_predictions(x, y, groups, NAMES, DIRECTIONS), y, groups)
    singles = single_features(x, y, groups, NAMES, DIRECTIONS)
    assert held_out > 0.9 > max(singles.values())  # the combination beats each input alone
    null = permutation_null(x, y, groups, NAMES, DIRECTIONS, permutations=100)
    assert p_value(held_out, null) == pytest.approx(1 / 101)  # no shuffle comes close


def test_pure_noise_is_not_significant_against_the_permutation_null():
    rng = np.random.default_rng(1)
    x, y, groups = rng.normal(size=(40, 3)), rng.normal(size=40), ["pool"] * 40
    held_out = within_pools(held_out_predictions(x, y, groups, NAMES, DIRECTIONS), y, groups)
    assert p_value(held_out, permutation_null(x, y, groups, NAMES, DIRECTIONS, permutations=100)) > 0.1


def test_a_feature_against_its_prior_direction_gets_no_weight():
    x, y, _ = _planted()
    model = fit(x, y, NAMES, [-1, -1, +1])  # feature 0 helps, but its prior says it hurts
    assert model.weights[0] == 0
    ranked = model.predict(np.array([[0.0, -2.0, 0.0], [0.0, 2.0, 0.0]]))
    assert ranked[0] > ranked[1]  # monotone: a smaller "size" never predicts less


def test_fitted_within_pools_no_weight_goes_to_what_only_sets_a_pools_level():
    """Two pools at different levels: feature 2 is constant inside each pool and differs between
    them exactly as their levels do; feature 0 ranks the models inside each pool. Pooled, the fit
    spends weight on feature 2; within pools, none (the known answer), and only feature 0 ranks."""
    rng = np.random.default_rng(3)
    ranks = rng.normal(size=60)
    level = np.repeat([0.0, 1.0], 30)
    x = np.column_stack([ranks, rng.normal(size=60), level])
    y = 0.1 * ranks + 0.5 * level
    groups = ["a"] * 30 + ["b"] * 30
    assert fit(x, y, NAMES, [+1, -1, +1]).weights[2] > 0.1
    within = fit(x, y, NAMES, [+1, -1, +1], groups=groups)
    assert within.weights[2] == 0
    assert within.weights[0] > 0.05 > within.weights[1]
    # the prediction's level still follows the features: the fitted pools' mean at their mean
    assert within.predict(x.mean(axis=0, keepdims=True))[0] == pytest.approx(y.mean())


def test_missing_features_count_as_typical():
    x, y, _ = _planted()
    model = fit(x, y, NAMES, DIRECTIONS)
    assert model.predict(np.array([[np.nan, np.nan, np.nan]]))[0] == pytest.approx(y.mean())


def _pool_files(tmp_path, x, y, tag):
    names = [f"./{tag}{i}" for i in range(len(y))]
    models = [
        {
            "path": n,
            "role": "expert",
            "knowledge": {"scored_mean_p_gold": float(a)},
            "weights": {"update_norm": float(np.exp(b)), "pool_cosine": float(c)},
        }
        for n, (a, b, c) in zip(names, x)
    ]
    (tmp_path / f"{tag}_precheck.json").write_text(json.dumps({"models": models}))
    rows = [{"path": n, "mergeability": float(v)} for n, v in zip(names, y)]
    (tmp_path / f"{tag}_mergeability.json").write_text(
        json.dumps({"method": "task_arithmetic", "partners": 8, "trials": 5, "models": rows})
    )
    return [str(tmp_path / f"{tag}_precheck.json"), str(tmp_path / f"{tag}_mergeability.json")]


def test_calibrate_writes_a_fit_that_precheck_can_load(tmp_path):
    x, y, _ = _planted(n=40)
    files = _pool_files(tmp_path, x[:20], y[:20], "a") + _pool_files(tmp_path, x[20:], y[20:], "b")
    result = CliRunner().invoke(
        main, ["calibrate", *files, "--out", str(tmp_path / "cal.json"), "--permutations", "50"]
    )
    assert result.exit_code == 0, result.output
    calibration = Calibration.load(tmp_path / "cal.json")
    document = calibration.document
    assert set(document["out_of_sample"]) == {"leave_one_model_out", "leave_one_pool_out"}
    assert document["provenance"]["command"].startswith("mergekit-mergeability calibrate")
    weights = {f["name"]: f["weight"] for f in document["model"]["features"]}
    assert (
        weights["scored_p_gold"] > 0 and weights["relative_norm"] > 0 and "p_gold" not in weights
    )  # the lettered view is reported, not fitted
    knows, doubts = (
        calibration.predict({"scored_p_gold": 2.0, "relative_norm": -1.0}),
        calibration.predict({"scored_p_gold": -2.0, "relative_norm": 1.0}),
    )
    assert knows[0] > doubts[0] and "↑ p(gold) as the task asks" in knows[1][0]


def _calibrated_two_pools(tmp_path, x, y, *flags):
    """``calibrate`` through the CLI on x, y split into two pools of 20, once per flag: each written file, loaded."""
    files = _pool_files(tmp_path, x[:20], y[:20], "a") + _pool_files(tmp_path, x[20:], y[20:], "b")
    loaded = []
    for flag in flags:
        out = tmp_path / f"{flag}.json"
        result = CliRunner().invoke(main, ["calibrate", *files, flag, "--out", str(out), "--permutations", "50"])
        assert result.exit_code == 0, result.output
        loaded.append(Calibration.load(out))
    return loaded


def test_the_rehearsal_is_the_prediction_where_measured_and_the_fitted_model_elsewhere(tmp_path):
    """A model's partnered accuracy (its probe on a rehearsed merge) is its prediction as it is,
    clipped to [0, 1], whatever its knowledge and weights say; without it, the fitted model's;
    ``--no-rehearsal`` reads the fitted model everywhere."""
    x, y, _ = _planted(n=40)
    rehearsed, fitted = _calibrated_two_pools(tmp_path, x, y, "--rehearsal", "--no-rehearsal")
    assert rehearsed.reads_first == "rehearsal" and fitted.reads_first is None
    knows = {"scored_p_gold": 2.0, "relative_norm": -1.0}
    alone = fitted.predict(knows)[0]
    assert alone > 0.5 and rehearsed.predict(knows)[0] == alone  # not measured: the fitted model
    value, reasons = rehearsed.predict({**knows, "rehearsal": 0.25})
    assert value == 0.25 and reasons == [
        "rehearsed merge: its own task scores 0.25 there",
        f"knowledge and weights alone: {alone:.2f}",
    ]
    assert rehearsed.predict({**knows, "rehearsal": 1.5})[0] == 1.0
    assert fitted.predict({**knows, "rehearsal": 0.25})[0] == alone


def test_the_terminal_table_says_a_rehearsed_prediction_by_its_interval_and_keeps_other_reasons_whole():
    from mergekit_mergeability.output.terminal import brief

    reasons = [
        "rehearsed merge: its own task scores 0.69 there (95% interval 0.64–0.74 over its probe's items)",
        "x: 1",
    ]
    assert brief({"reasons": reasons, "predicted_interval": [0.64, 0.74]}) == "rehearsed 0.64–0.74; x: 1"
    assert brief({"reasons": ["↑ p(gold) 0.30"], "predicted_interval": [0.1, 0.5]}) == "↑ p(gold) 0.30"


def test_the_rehearsal_is_read_as_the_task_is_scored():
    """Options listed: the rehearsal is the partnered p(gold); cloze (or a report that does not say):
    the partnered accuracy; a format it was never decided on (an lm-eval task's): none."""
    from mergekit_mergeability.decide.features import features

    partnered = {"partnered_accuracy": 0.5, "partnered_mean_p_gold": 0.37}
    models = [
        {"path": "listed", "role": "expert", "knowledge": {"scored_format": "options"}, "dilution": partnered},
        {"path": "cloze", "role": "expert", "knowledge": {"scored_format": "cloze"}, "dilution": partnered},
        {"path": "unsaid", "role": "expert", "knowledge": {}, "dilution": partnered},
        {"path": "unprobed", "role": "expert", "knowledge": None, "dilution": None},
        {"path": "task", "role": "expert", "knowledge": {"scored_format": "lm-eval"}, "dilution": partnered},
    ]
    table = features(models)
    names = ("listed", "cloze", "unsaid", "unprobed", "task")
    assert [table[m]["rehearsal"] for m in names] == [0.37, 0.5, 0.5, None, None]


def test_calibrate_within_pools_gives_no_weight_to_what_sets_a_pools_level(tmp_path):
    """Pool b keeps 0.5 more than pool a, and its pool cosine is higher by 1: fitted on both
    pools at once the cosine earns weight for the level; fitted within pools it earns none."""
    x, y, _ = _planted(n=40)
    level = np.repeat([0.0, 1.0], 20)
    x[:, 2] = level + 0.01 * np.random.default_rng(5).normal(size=40)
    y = y + 0.5 * level
    cosine = {}
    for calibration in _calibrated_two_pools(tmp_path, x, y, "--pooled", "--within-pools"):
        document = calibration.document
        cosine[document["fitted"]] = {f["name"]: f["weight"] for f in document["model"]["features"]}["pool_cosine"]
    assert cosine["pooled"] > 0.1 and cosine["within pools"] < 0.01


def test_calibrate_refuses_noise_and_writes_nothing(tmp_path):
    rng = np.random.default_rng(2)
    files = _pool_files(tmp_path, rng.normal(size=(30, 3)), rng.normal(size=30), "noise")
    result = CliRunner().invoke(
        main, ["calibrate", *files, "--out", str(tmp_path / "cal.json"), "--permutations", "50"]
    )
    assert result.exit_code == 1 and "not written" in result.output
    assert not (tmp_path / "cal.json").exists()


def test_calibrate_wants_pairs(tmp_path):
    result = CliRunner().invoke(main, ["calibrate", str(tmp_path / "one.json")])
    assert result.exit_code == 2 and "pairs of files" in result.output


def test_the_report_names_the_shipped_calibration_wherever_installed_and_any_other_by_its_path():
    from mergekit_mergeability.output.html import _calibration_name

    assert _calibration_name("/opt/venv/site-packages/mergekit_mergeability/decide/calibration.json") == (
        "the shipped calibration"
    )
    assert _calibration_name("/home/me/calibration.json") == "the calibration <code>/home/me/calibration.json</code>"
