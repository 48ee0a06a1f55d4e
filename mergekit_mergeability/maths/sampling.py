"""Accuracy from n answers per problem (paper 2's metrics: Mean@k, Pass@k, Vote@k).

Each function takes one row per problem, one entry per sampled answer. Greedy
decoding is n = 1, where all three are plain accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import fmean
from typing import Hashable, List, Sequence


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of the chance that k of the n answers include a correct one:
    1 − C(n − c, k) / C(n, k) (Chen et al. 2021, arXiv 2107.03374). Exact integer
    binomials: no overflow or cancellation at any n."""
    if not 0 < k <= n or not 0 <= correct <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= correct <= n; got n={n}, correct={correct}, k={k}")
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def mean_at(scores: Sequence[Sequence[float]]) -> float:
    """Mean@n: the mean score over every answer to every problem (= Pass@1)."""
    return fmean(fmean(row) for row in scores)


def pass_at(correct: Sequence[Sequence[bool]], k: int) -> float:
    """Pass@k over problems, each with its own n answers (n >= k)."""
    return fmean(pass_at_k(len(row), sum(row), k) for row in correct)


def vote_at(answers: Sequence[Sequence[Hashable]], correct: Sequence[Sequence[bool]]) -> float:
    """Vote@n: the share of problems whose most frequent answer is correct. A tie goes to
    the tied answer given first, so the result does not depend on hash order."""
    hits = []
    for given, right in zip(answers, correct):
        counts = Counter(given)
        top = max(counts.values())
        winner = next(a for a in given if counts[a] == top)
        hits.append(right[given.index(winner)])
    return fmean(hits)


def reported_ks(n: int) -> List[int]:
    """The k for which Pass@k is reported from n answers: 1, 2, 4, … and n."""
    return sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
