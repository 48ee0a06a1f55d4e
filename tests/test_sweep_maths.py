"""Known answers for the sweep's maths: Pass@k, Mean@k, Vote@k, stages, refinement, sweet spot."""

import itertools
import math

import pytest

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.maths import sampling, stages
from mergekit_mergeability.interpolation.sweeping import grid


def _subsets_with_a_hit(n, c, k):
    """Pass@k by its definition: the share of k-subsets of n answers (c correct) holding a correct one."""
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(answers, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_answer():
    assert sampling.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert sampling.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert sampling.pass_at_k(4, 1, 4) == 1.0 and sampling.pass_at_k(8, 0, 3) == 0.0
    for n, c, k in itertools.product(range(1, 8), range(0, 8), range(1, 8)):
        if c <= n and k <= n:
            assert sampling.pass_at_k(n, c, k) == pytest.approx(_subsets_with_a_hit(n, c, k))
    assert sampling.pass_at_k(1000, 3, 500) == pytest.approx(1 - math.comb(997, 500) / math.comb(1000, 500))
    with pytest.raises(ValueError):
        sampling.pass_at_k(3, 1, 4)


def test_mean_pass_and_vote_over_problems():
    correct = [[True, False, False, False], [False, False, False, False], [True, True, True, False]]
    scores = [[float(x) for x in row] for row in correct]
    assert sampling.mean_at(scores) == pytest.approx((0.25 + 0 + 0.75) / 3)
    assert sampling.pass_at(correct, 1) == pytest.approx(sampling.mean_at(scores))
    assert sampling.pass_at(correct, 4) == pytest.approx(2 / 3)
    # problem 1: "7" twice (wrong) beats "5" once; problem 2: a tie goes to the first given ("9", right)
    answers = [["5", "7", "7", "3"], ["9", "4", "4", "9"]]
    assert sampling.vote_at(answers, [[True, False, False, False], [True, False, False, True]]) == pytest.approx(0.5)
    assert (
        sampling.reported_ks(1) == [1]
        and sampling.reported_ks(6) == [1, 2, 4, 6]
        and sampling.reported_ks(8) == [1, 2, 4, 8]
    )


def _logistic(x):
    return 1 / (1 + math.exp(-x))


LAMBDAS = [round(0.1 * i, 1) for i in range(11)]


def test_stages_on_synthetic_curves():
    # the marker rises around 0.45 (0.16 at 0.4, 0.84 at 0.5, 0.99 at 0.6); accuracy later (0.73 of its rise at 0.6, 0.95 at 0.7)
    marker = [_logistic((lam - 0.45) / 0.03) for lam in LAMBDAS]
    accuracy = [0.2 + 0.6 * _logistic((lam - 0.55) / 0.05) for lam in LAMBDAS]
    found = stages.detect(LAMBDAS, {"marker_rate": marker, "accuracy": accuracy})
    assert (found.leading, found.jumping) == ("marker_rate", ("marker_rate", "accuracy"))
    assert (found.stage2, found.stage3, found.transition) == (0.4, 0.7, (0.4, 0.5))
    assert [found.stage(lam) for lam in LAMBDAS] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    # B → A: the marker falls from 0.5 on (0.84 there), both curves have settled by 0.7
    mirrored = stages.detect(LAMBDAS, {"marker_rate": marker[::-1], "accuracy": accuracy[::-1]})
    assert (mirrored.stage2, mirrored.stage3, mirrored.transition) == (0.5, 0.7, (0.5, 0.6))
    # the marker barely moves: accuracy leads
    flat_marker = [0.05 * m for m in marker]
    assert stages.detect(LAMBDAS, {"marker_rate": flat_marker, "accuracy": accuracy}).leading == "accuracy"
    # nothing moves by MIN_JUMP: no transition, no stages
    none = stages.detect(LAMBDAS, {"marker_rate": flat_marker, "accuracy": [0.5 + 0.01 * lam for lam in LAMBDAS]})
    assert none.leading is None and none.stage(0.5) is None


def test_refinement_locates_a_step_with_fewer_evaluations_than_a_fine_grid():
    edge = 0.637

    def measure(lam):
        calls.append(lam)
        return {"marker_rate": float(lam >= edge), "accuracy": 0.3 + 0.5 * (lam >= edge)}

    for resolution in (0.025, 0.005):
        calls = []
        points = {lam: measure(lam) for lam in LAMBDAS}
        added = stages.refine(points, measure, resolution, budget=20)
        lambdas = sorted(points)
        low, high = stages.detect(lambdas, {k: [points[lam][k] for lam in lambdas] for k in stages.CURVES}).transition
        assert low < edge <= high and high - low <= 2 * resolution + 1e-9
        assert len(calls) == len(set(calls)) == len(points) == 11 + len(added)
        assert len(points) < stages.uniform_points(0, 1, resolution)
    assert stages.uniform_points(0, 1, 0.025) == 21 and stages.uniform_points(0, 1, 0.005) == 101
    assert len(points) == 11 + 4  # 0.65, 0.625, 0.6375, 0.63125: each halves the step's interval
    # a budget stops refinement early
    points = {lam: measure(lam) for lam in LAMBDAS}
    assert len(stages.refine(points, measure, 0.001, budget=2)) == 2


def test_sweet_spot_matches_the_best_accuracy_with_fewest_tokens_or_keeps_to_a_budget():
    lambdas, accuracy, tokens = [0, 0.5, 0.8, 1], [0.1, 0.6, 0.79, 0.8], [2, 15, 17, 22]
    spot = stages.sweet_spot(lambdas, accuracy, tokens, tolerance=0.02)
    assert (
        spot.lam == 0.8
    )  # 0.79 is within 0.02 of 0.8 at fewer tokens; λ = 0 has more accuracy per token but is no match
    assert stages.sweet_spot(lambdas, accuracy, tokens, tolerance=0.0).lam == 1
    assert stages.sweet_spot(lambdas, accuracy, tokens, tolerance=0.02, budget=16).lam == 0.5
    over = stages.sweet_spot(lambdas, accuracy, tokens, tolerance=0.02, budget=1)
    assert over.lam is None and "fewest: 2.0 at λ = 0" in over.reason


def test_lambda_grids():
    assert grid("0:1:0.1") == tuple(LAMBDAS)
    assert grid("0.2:0.5:0.2") == (0.2, 0.4, 0.5)  # the stop is always included
    assert grid("1, 0, 0.5,0.5") == (0, 0.5, 1)
    for bad in ("0:1", "1:0:0.1", "0:1:0", "a,b", "0.5"):
        with pytest.raises(UserError, match="--lambdas"):
            grid(bad)
