"""LoRA statistics from the factors alone, checked against the materialised ΔW (float64)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mergekit_mergeability.maths import lowrank
from mergekit_mergeability.maths.lowrank import LowRank


def _pair(seed: int, out: int, inner: int, ranks=(3, 5)):
    g = torch.Generator().manual_seed(seed)
    make = lambda r, s: LowRank(
        torch.randn(r, inner, generator=g, dtype=torch.float64),
        torch.randn(out, r, generator=g, dtype=torch.float64),
        s,
    )  # noqa: E731
    return make(ranks[0], 0.5), make(ranks[1], -2.0)


def _materialised_sign_conflict(x: torch.Tensor, y: torch.Tensor) -> float:
    both = (x != 0) & (y != 0)
    return float((torch.sign(x[both]) != torch.sign(y[both])).double().mean())


def _check(first: LowRank, second: LowRank) -> None:
    x, y = first.materialise(), second.materialise()
    assert lowrank.squared_norm(first) == pytest.approx(float(x.square().sum()), rel=1e-6)
    assert lowrank.inner(first, second) == pytest.approx(
        float((x * y).sum()), rel=1e-6, abs=1e-9 * float(x.norm() * y.norm())
    )
    expected_cosine = float((x * y).sum() / (x.norm() * y.norm()))
    assert lowrank.cosine(first, second) == pytest.approx(expected_cosine, rel=1e-6, abs=1e-12)
    assert lowrank.top_singular_value(first) == pytest.approx(float(torch.linalg.matrix_norm(x, ord=2)), rel=1e-6)
    assert lowrank.top_singular_value(second) == pytest.approx(float(torch.linalg.matrix_norm(y, ord=2)), rel=1e-6)
    assert lowrank.sign_conflict(first, second, elements=37) == pytest.approx(
        _materialised_sign_conflict(x, y), rel=1e-6
    )


SHAPES = [(1, 1, (1, 1)), (7, 3, (3, 5)), (40, 24, (4, 8)), (64, 17, (16, 2)), (5, 90, (6, 6))]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("out,inner,ranks", SHAPES)
def test_statistics_equal_the_materialised_update(seed, out, inner, ranks):
    _check(*_pair(seed, out, inner, ranks))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 48), st.integers(1, 48), st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_statistics_on_any_shape(out, inner, r1, r2, seed):
    _check(*_pair(seed, out, inner, (r1, r2)))


def test_row_blocks_cover_the_update_once():
    first, _ = _pair(0, 23, 11)
    blocks = list(lowrank.row_blocks(first, elements=30))
    assert [b[0] for b in blocks] == list(range(0, 23, 2)) and blocks[-1][1] == 23
    assert torch.allclose(torch.cat([b[2] for b in blocks]), first.materialise())


def test_zero_update_has_zero_statistics():
    zero = LowRank(torch.zeros(2, 6, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64), 1.0)
    other, _ = _pair(1, 4, 6)
    assert lowrank.squared_norm(zero) == 0 and lowrank.top_singular_value(zero) == 0
    assert lowrank.cosine(zero, other) == 0 and lowrank.sign_conflict(zero, other) == 0


def test_gram_of_a_pool_of_mixed_ranks_equals_the_materialised_dot_products():
    g = torch.Generator().manual_seed(3)
    updates = [
        LowRank(
            torch.randn(r, 13, generator=g, dtype=torch.float64), torch.randn(9, r, generator=g, dtype=torch.float64), s
        )
        for r, s in ((1, 1.0), (4, -0.5), (2, 3.0), (7, 0.1))
    ]
    flat = torch.stack([u.materialise().flatten() for u in updates])
    assert torch.allclose(lowrank.gram(updates), flat @ flat.T, rtol=1e-10, atol=1e-10)
    assert torch.allclose(lowrank.gram(updates, torch.float32).double(), flat @ flat.T, rtol=1e-5, atol=1e-4)
