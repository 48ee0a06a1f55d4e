"""Statistics of a LoRA update ΔW = s·B·A without forming ΔW (B: out × r, A: r × in).

Every quantity reduces to r × r products, so it costs O((out + in)·r²), not out × in:

    ‖ΔW‖_F²          = s² tr((BᵀB)(AAᵀ))
    ⟨ΔW₁, ΔW₂⟩_F     = s₁s₂ tr((B₁ᵀB₂)(A₂A₁ᵀ))
    σ_max(ΔW)        = |s| σ_max(R_B R_Aᵀ),   B = Q_B R_B,  Aᵀ = Q_A R_A   (Q orthonormal)

Sign agreement has no such form (sign is not linear): ``row_blocks`` streams ΔW a few
rows at a time, so at most one block of it is ever in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Tuple

import torch


@dataclass(frozen=True)
class LowRank:
    """ΔW = scale · b @ a, as a PEFT LoRA module stores it (b: out × r, a: r × in)."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def shape(self) -> Tuple[int, int]:
        return self.b.shape[0], self.a.shape[1]

    def materialise(self) -> torch.Tensor:
        return self.scale * (self.b.double() @ self.a.double())


def squared_norm(update: LowRank) -> float:
    """‖ΔW‖_F²."""
    return inner(update, update)


def inner(first: LowRank, second: LowRank) -> float:
    """⟨ΔW₁, ΔW₂⟩_F = tr(ΔW₁ᵀ ΔW₂), through r₁ × r₂ products."""
    left = first.b.double().T @ second.b.double()  # r₁ × r₂
    right = second.a.double() @ first.a.double().T  # r₂ × r₁
    return first.scale * second.scale * float((left * right.T).sum())


def cosine(first: LowRank, second: LowRank) -> float:
    norms = math.sqrt(max(squared_norm(first), 0.0) * max(squared_norm(second), 0.0))
    return inner(first, second) / norms if norms > 0 else 0.0


def top_singular_value(update: LowRank) -> float:
    """σ_max(ΔW) exactly, from the SVD of an r × r core."""
    _, r_b = torch.linalg.qr(update.b.double())
    _, r_a = torch.linalg.qr(update.a.double().T)
    return abs(update.scale) * float(torch.linalg.matrix_norm(r_b @ r_a.T, ord=2))


def nonfinite(update: LowRank) -> int:
    """How many entries of ΔW are NaN or ±Inf: every entry of a row of B, or a column of A,
    holding one (a NaN or an Inf in a sum of products leaves no entry finite)."""
    rows = int((~torch.isfinite(update.b)).any(dim=1).sum())
    columns = int((~torch.isfinite(update.a)).any(dim=0).sum())
    out, inner = update.shape
    return out * inner - (out - rows) * (inner - columns)


def finite(update: LowRank) -> LowRank:
    """The update with its factors' NaN and Inf entries set to 0."""
    clean = lambda t: torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)  # noqa: E731
    return LowRank(clean(update.a), clean(update.b), update.scale)


def row_blocks(update: LowRank, elements: int = 1 << 16, dtype: torch.dtype = torch.float64) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """``(start, stop, ΔW[start:stop])`` in blocks of about ``elements`` values."""
    rows, columns = update.shape
    step = max(1, elements // max(columns, 1))
    a, b = update.a.to(dtype), update.b.to(dtype)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        yield start, stop, update.scale * (b[start:stop] @ a)


def sign_counts(first: LowRank, second: LowRank, elements: int = 1 << 16) -> Tuple[float, float]:
    """(agree − disagree, agree + disagree) over the coordinates non-zero in both, streamed."""
    difference = total = 0.0
    for (_, _, x), (_, _, y) in zip(row_blocks(first, elements), row_blocks(second, elements)):
        sx, sy = torch.sign(x), torch.sign(y)
        difference += float((sx * sy).sum())
        total += float((sx.abs() * sy.abs()).sum())
    return difference, total


def sign_conflict(first: LowRank, second: LowRank, elements: int = 1 << 16) -> float:
    """TIES's sign-conflict rate: the share of coordinates, non-zero in both, where signs differ."""
    difference, total = sign_counts(first, second, elements)
    return (total - difference) / (2 * total) if total else 0.0
