"""Statistics of a LoRA update ΔW = s·B·A without forming ΔW (B: out × r, A: r × in).

Every quantity reduces to r × r products, so it costs O((out + in)·r²), not out × in:

    ‖ΔW‖_F²          = s² tr((BᵀB)(AAᵀ))
    ⟨ΔW₁, ΔW₂⟩_F     = s₁s₂ tr((B₁ᵀB₂)(A₂A₁ᵀ))    (for a pool at once: ``gram``)
    σ_max(ΔW)        = |s| σ_max(R_B R_Aᵀ),   B = Q_B R_B,  Aᵀ = Q_A R_A   (Q orthonormal)

Sign agreement has no such form (sign is not linear): ``row_blocks`` streams ΔW a few
rows at a time, so at most one block of it is ever in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence, Tuple

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
    return float(gram([first, second])[0, 1])


def gram(updates: Sequence[LowRank], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """⟨ΔW_i, ΔW_j⟩_F for every pair of updates of one shape (k × k), from the stacked factors:
    entry (i, j) is the sum of block (i, j) of (BᵀB) ⊙ (AAᵀ), B = [s₁B₁ … s_kB_k], A = [A₁; …; A_k]."""
    b = torch.cat([u.scale * u.b.to(dtype) for u in updates], dim=1)  # out × Σr
    a = torch.cat([u.a.to(dtype) for u in updates], dim=0)  # Σr × in
    products = (b.T @ b) * (a @ a.T)
    owner = torch.repeat_interleave(torch.arange(len(updates)), torch.tensor([u.a.shape[0] for u in updates]))
    rows = torch.zeros(len(updates), products.shape[1], dtype=dtype).index_add_(0, owner, products)
    return torch.zeros(len(updates), len(updates), dtype=dtype).index_add_(1, owner, rows)


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


def row_blocks(
    update: LowRank, elements: int = 1 << 16, dtype: torch.dtype = torch.float64
) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """``(start, stop, ΔW[start:stop])`` in blocks of about ``elements`` values."""
    for start, stop, block in stacked_row_blocks([update], elements, dtype):
        yield start, stop, block[0]


def stacked_row_blocks(
    updates: Sequence[LowRank], elements: int = 1 << 20, dtype: torch.dtype = torch.float32
) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """``(start, stop, block)`` with block[i] = ΔW_i[start:stop] for updates of one shape, about
    ``elements`` values in all (so memory stays flat however many updates there are). One
    batched product per block; factors of lower rank are padded with zeros."""
    rows, columns = updates[0].shape
    rank = max(u.a.shape[0] for u in updates)
    b = torch.zeros(len(updates), rows, rank, dtype=dtype)
    a = torch.zeros(len(updates), rank, columns, dtype=dtype)
    for i, u in enumerate(updates):
        b[i, :, : u.b.shape[1]] = u.scale * u.b.to(dtype)
        a[i, : u.a.shape[0]] = u.a.to(dtype)
    step = max(1, elements // (len(updates) * max(columns, 1)))
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        yield start, stop, torch.bmm(b[:, start:stop], a)


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
