"""Spearman with its permutation null and bootstrap interval: known answers."""

import pytest

from mergekit_mergeability.maths.stats import (
    correlate,
    mean_score_interval,
    ratio_interval,
    spearman,
    standard_error,
    wilson_interval,
)


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)


def test_permutation_p_value_of_a_perfect_ranking_is_two_in_n_factorial():
    # with 5 models only 2 of the 120 orderings reach |ρ| = 1 (two-sided)
    result = correlate([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], permutations=20_000, resamples=500)
    assert result.spearman == pytest.approx(1)
    assert result.p_permutation == pytest.approx(2 / 120, abs=0.004)
    assert result.interval[1] == pytest.approx(1)


def test_unrelated_values_are_not_significant_and_the_interval_covers_zero():
    x = [0.1, 0.9, 0.4, 0.7, 0.2, 0.8, 0.5, 0.3, 0.6, 1.0]
    y = [0.5, 0.4, 0.9, 0.1, 0.7, 0.3, 0.2, 0.8, 1.0, 0.6]
    result = correlate(x, y, permutations=2_000, resamples=500)
    assert result.p_permutation > 0.2
    assert result.interval[0] < 0 < result.interval[1]


def test_seeded_results_are_reproducible():
    x, y = [1, 3, 2, 5, 4, 6], [2, 1, 4, 3, 6, 5]
    assert correlate(x, y, permutations=500, resamples=200, seed=3) == correlate(
        x, y, permutations=500, resamples=200, seed=3
    )


def test_too_few_pairs_is_an_error():
    with pytest.raises(ValueError, match="at least 3"):
        correlate([1, 2], [1, 2])


def test_the_standard_error_is_lm_evals():
    """Sample standard deviation over √n, as lm-eval's ``mean_stderr``: for 0/1 items with mean a,
    √(a(1 − a)/(n − 1)); none from one item."""
    assert standard_error([1, 0, 1, 1]) == pytest.approx((0.75 * 0.25 / 3) ** 0.5)
    assert standard_error([0.2, 0.4, 0.6]) == pytest.approx(0.2 / 3**0.5)
    assert standard_error([0.5, 0.5]) == 0.0 and standard_error([0.7]) is None


def test_wilsons_interval_known_values():
    """Wilson's score interval, 95%: 16 of 16 right leaves [0.806, 1] (p ± 1.96·SE would say [1, 1]);
    0 of 16 mirrors it; 8 of 16 is [0.280, 0.720] (textbook values, z = 1.95996)."""
    low, high = wilson_interval(16, 16)
    assert low == pytest.approx(0.8064, abs=1e-4) and high == 1.0
    assert wilson_interval(0, 16) == pytest.approx((0.0, 1 - 0.8064), abs=1e-4)
    assert wilson_interval(8, 16) == pytest.approx((0.2800, 0.7200), abs=1e-4)
    assert wilson_interval(0, 0) is None


def test_a_mean_score_interval_is_never_zero_width_and_is_wilsons_for_right_or_wrong_items():
    assert mean_score_interval([1.0] * 16) == pytest.approx(wilson_interval(16, 16))
    assert mean_score_interval([1, 0, 1, 1]) == pytest.approx(wilson_interval(3, 4))
    low, high = mean_score_interval([0.9] * 16)
    assert low < 0.9 < high
    assert mean_score_interval([]) is None


def test_a_ratio_of_totals_and_its_interval_over_paired_items():
    assert ratio_interval([2, 4, 6], [1, 2, 3]) == (2.0, (2.0, 2.0))  # every resample keeps the ratio
    ratio, (low, high) = ratio_interval([1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1])
    assert ratio == 1.0 and low < 1.0 < high  # as many won as lost: not above 1
    ratio, (low, high) = ratio_interval([1] * 10 + [0] * 2, [0] * 8 + [1] * 4)
    assert ratio == 2.5 and 1.0 < low < ratio < high
