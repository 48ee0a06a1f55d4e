"""Known answers for CKA and for locating where representations stop being shared."""

import itertools
import math

import pytest
import torch

from mergekit_mergeability.maths.cka import layerwise, linear_cka, minibatch_cka, shared_depth, unbiased_hsic
from mergekit_mergeability.decide.verdict import cutoff_from_curve, divergence_curve


def _data(n=24, d=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("cka", [linear_cka, minibatch_cka])
def test_identical_representations_have_cka_one(cka):
    x, _ = _data()
    assert cka(x, x) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("cka", [linear_cka, minibatch_cka])
def test_symmetric(cka):
    x, y = _data()
    assert cka(x, y) == pytest.approx(cka(y, x), abs=1e-12)


@pytest.mark.parametrize("cka", [linear_cka, minibatch_cka])
def test_invariant_to_orthogonal_maps_and_isotropic_scaling(cka):
    x, y = _data()
    q, _ = torch.linalg.qr(torch.randn(10, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    assert cka(x @ q * 7.5, y) == pytest.approx(cka(x, y), abs=1e-10)


@pytest.mark.parametrize("cka", [linear_cka, minibatch_cka])
def test_not_invariant_to_an_arbitrary_invertible_map(cka):
    x, y = _data()
    stretch = torch.diag(torch.tensor([50.0] + [1.0] * 9, dtype=torch.float64))
    assert abs(cka(x @ stretch, y) - cka(x, y)) > 1e-3


def test_biased_cka_with_fewer_rows_than_features_matches_the_feature_form():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(12, 200, generator=generator, dtype=torch.float64)
    y = x @ torch.randn(200, 200, generator=generator, dtype=torch.float64) + torch.randn(12, 200, dtype=torch.float64)
    x0, y0 = x - x.mean(0), y - y.mean(0)
    feature_form = (y0.T @ x0).square().sum() / ((x0.T @ x0).norm() * (y0.T @ y0).norm())
    assert linear_cka(x, y) == pytest.approx(float(feature_form), abs=1e-12)


def test_biased_cka_matches_the_gram_matrix_form():
    x, y = _data()
    h = torch.eye(24, dtype=torch.float64) - 1 / 24
    k, l = h @ x @ x.T @ h, h @ y @ y.T @ h
    hsic = lambda a, b: (a * b).sum()  # noqa: E731
    assert linear_cka(x, y) == pytest.approx(float(hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))), abs=1e-12)


def _brute_force_unbiased_hsic(k, l):
    """The U-statistic of Song et al. (2012), summed over distinct index tuples."""
    n = k.shape[0]

    def falling(m):
        return math.prod(range(n - m + 1, n + 1))

    pairs = sum(k[i, j] * l[i, j] for i, j in itertools.permutations(range(n), 2)) / falling(2)
    quads = sum(k[i, j] * l[q, r] for i, j, q, r in itertools.permutations(range(n), 4)) / falling(4)
    triples = sum(k[i, j] * l[i, q] for i, j, q in itertools.permutations(range(n), 3)) / falling(3)
    return float(pairs + quads - 2 * triples)


def test_unbiased_hsic_matches_the_brute_force_u_statistic():
    x, y = _data(n=7, d=3, seed=2)
    k, l = x @ x.T, y @ y.T
    assert unbiased_hsic(k, l) == pytest.approx(_brute_force_unbiased_hsic(k, l), rel=1e-9)


def test_unbiased_estimator_removes_the_small_sample_bias():
    # independent noise with many more features than examples: biased CKA is far from 0
    x, y = (torch.randn(16, 500, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (3, 4))
    assert linear_cka(x, y) > 0.4
    assert abs(minibatch_cka(x, y)) < 0.15


def test_minibatches_average_hsic_over_batches_and_fold_a_short_tail():
    x, y = _data(n=22)
    by_hand = [slice(0, 8), slice(8, 16), slice(16, 22)]
    xy = sum(unbiased_hsic(x[s] @ x[s].T, y[s] @ y[s].T) for s in by_hand)
    xx = sum(unbiased_hsic(x[s] @ x[s].T, x[s] @ x[s].T) for s in by_hand)
    yy = sum(unbiased_hsic(y[s] @ y[s].T, y[s] @ y[s].T) for s in by_hand)
    assert minibatch_cka(x, y, batch_size=8) == pytest.approx(xy / math.sqrt(xx * yy), rel=1e-12)
    assert not math.isnan(minibatch_cka(x, y, batch_size=10))  # 10 + 12: a 2-row tail is folded in


def test_layerwise_gives_one_value_per_layer():
    x, y = _data()
    stacked_x, stacked_y = torch.stack([x, x, x]), torch.stack([x, y, -x])
    values = layerwise(stacked_x, stacked_y)
    assert values[0] == pytest.approx(1) and values[2] == pytest.approx(1) and values[1] < 0.9


@pytest.mark.parametrize(
    "curve, expected",
    [
        ([1.0, 0.99, 0.98, 0.5, 0.4], 3),  # diverges at index 3
        ([1.0, 0.5, 0.99, 0.98, 0.4, 0.3], 4),  # a one-layer dip at index 1 is ignored
        ([1.0, 0.99, 0.3, 0.2, 0.95, 0.3, 0.2], 2),  # a one-layer recovery at index 4 is ignored
        ([1.0, 0.99, 0.98, 0.97], 4),  # never diverges
        ([1.0, 0.99, 0.5, 0.4, 0.95], 2),  # the last layer rising alone is ignored too
        ([1.0, 0.99, 0.98, 0.5], 4),  # ... and so is the last layer dipping alone
        ([0.2, 0.1, 0.1], 0),  # nothing shared
    ],
)
def test_shared_depth(curve, expected):
    assert shared_depth(curve, threshold=0.9) == expected


def test_cutoff_counts_the_blocks_whose_outputs_stay_shared():
    # index 3 = output of block 2 is the first divergent one: blocks 0 and 1 are merged
    assert cutoff_from_curve([1.0, 0.99, 0.98, 0.5, 0.4], 0.9) == 2
    assert cutoff_from_curve([1.0, 0.99, 0.98, 0.97], 0.9) is None
    # --layers leaves some indices out (NaN or None); the cut-off keeps the model's own indices
    assert cutoff_from_curve([float("nan"), 0.99, 0.98, 0.5, 0.4], 0.9) == 2
    nan = float("nan")
    assert cutoff_from_curve([nan] * 5 + [0.99, 0.98, 0.97, 0.5, 0.4, 0.3, 0.3, 0.2], 0.9) == 7  # --layers 5-12
    assert cutoff_from_curve([None, None, 0.95, 0.96, 0.5, 0.4], 0.9) == 3


def test_divergence_is_measured_between_fine_tunes_not_against_the_base():
    curves = {("base", "a"): [1.0, 0.1], ("base", "b"): [1.0, 0.2], ("a", "b"): [0.9, 0.8]}
    assert divergence_curve(curves, "base") == [0.9, 0.8]
    assert divergence_curve({("base", "a"): [1.0, 0.1]}, "base") == [1.0, 0.1]


def test_the_unbiased_estimator_does_not_drift_with_the_number_of_probe_rows():
    """Why the verdict reads the unbiased CKA: with few rows against many features the
    biased one calls unrelated representations similar, and how similar depends on n."""
    g = torch.Generator().manual_seed(0)
    biased, unbiased = {}, {}
    for n in (64, 512):
        x, y = (torch.randn(n, 576, generator=g, dtype=torch.float64) for _ in range(2))
        biased[n], unbiased[n] = linear_cka(x, y), minibatch_cka(x, y)
    assert biased[64] > 0.9 and biased[512] < 0.6  # the same (absent) relation, a different verdict
    assert abs(unbiased[64]) < 0.05 and abs(unbiased[512]) < 0.05
