"""The one-pass top singular value (Nyström sketch over row blocks): known answers."""

import pytest
import torch

from mergekit_mergeability.maths.spectral import TopSingularValue


def _streamed(matrix: torch.Tensor, rows: int = 37) -> float:
    sketch = TopSingularValue(matrix.shape[1])
    for start in range(0, matrix.shape[0], rows):
        sketch.add(matrix[start : start + rows])
    return sketch.value()


def test_exact_for_an_update_of_rank_at_most_the_sketch():
    g = torch.Generator().manual_seed(0)
    low_rank = torch.randn(300, 6, generator=g) @ torch.randn(6, 200, generator=g)  # like a rank-6 LoRA update
    assert _streamed(low_rank) == pytest.approx(float(torch.linalg.matrix_norm(low_rank.double(), ord=2)), rel=1e-6)


def test_a_lower_bound_close_to_the_truth_for_a_decaying_spectrum():
    g = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(300, 200, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(200, 200, generator=g, dtype=torch.float64))
    singular = 0.7 ** torch.arange(200, dtype=torch.float64)
    matrix = u @ torch.diag(singular) @ v.T
    estimate = _streamed(matrix)
    assert 0.95 <= estimate <= 1.0 + 1e-9  # σ_max is 1


def test_zero_update_and_one_row_at_a_time():
    assert _streamed(torch.zeros(10, 8)) == 0.0
    one = torch.tensor([[3.0, 4.0]])
    assert _streamed(one, rows=1) == pytest.approx(5.0)
