"""Which experts share a merged model, with which merge: a search over assignments.

Up to K merged models (slots); each expert goes into at most one, or stays out. The objective
is the expected number of the pool's tasks kept:

    Σ_slots Σ_{i∈S} score(i | S, merge)  +  Σ_{i outside every slot} outside_i

with ``score`` the conditional prediction and ``outside_i`` what the pool's task i keeps
without its expert (the base's own score). A slot's merge is the best of the candidates for
its members, so moves change membership only.

Search: greedy from nothing (add the move that gains most until none gains), and from
"everything in one slot"; then steepest-ascent local search from each (add, remove, move
between slots, swap with an expert outside, exchange between slots) and from a few seeded
random kicks of the best state, keeping the best. Every slot value is memoised by (members,
merge), so revisited states cost nothing. On pools small enough to enumerate, the tests check
it against every assignment.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

WIDTH = 8  # experts paired each way by swaps and exchanges
# A move must gain more than this (in tasks) to be taken, and states within it of each other are
# tied, the one merging fewer experts preferred: rounding (an adapter pool and the same pool
# materialised differ by ~1e-7) must not decide between equally good plans.
TOLERANCE = 1e-5
Score = Callable[[Tuple[int, ...], Hashable], np.ndarray]  # (members sorted, merge) -> per member


@dataclass
class Slot:
    members: Tuple[int, ...]
    merge: Optional[Hashable]  # None: empty
    value: float  # Σ of the members' scores


@dataclass
class Result:
    slots: List[Slot]
    objective: float
    evaluations: int  # distinct (members, merge) scored
    seconds: float
    starts: Dict[str, float] = field(default_factory=dict)  # objective reached from each start

    def assignment(self, n: int) -> List[Optional[int]]:
        found: List[Optional[int]] = [None] * n
        for index, slot in enumerate(self.slots):
            for i in slot.members:
                found[i] = index
        return found


class Objective:
    """Slot values, memoised; ``best(members)`` is the best merge for them and its value."""

    def __init__(self, score: Score, merges: Sequence[Hashable], outside: np.ndarray, memo: Optional[Dict] = None):
        self.score, self.merges, self.outside = score, list(merges), np.asarray(outside, dtype=float)
        self._values: Dict[Tuple[Tuple[int, ...], Hashable], float] = {} if memo is None else memo
        self._new = 0
        self._best: Dict[Tuple[int, ...], Tuple[Optional[Hashable], float]] = {}

    @property
    def evaluations(self) -> int:
        return self._new

    def value(self, members: Tuple[int, ...], merge: Hashable) -> float:
        key = (members, merge)
        if key not in self._values:
            self._values[key] = float(np.sum(self.score(members, merge)))
            self._new += 1
        return self._values[key]

    def best(self, members: Tuple[int, ...]) -> Tuple[Optional[Hashable], float]:
        if not members:
            return None, 0.0
        if members not in self._best:
            scored = [(self.value(members, m), -k, m) for k, m in enumerate(self.merges)]
            value, _, merge = max(scored, key=lambda s: (s[0], s[1]))  # ties: the earlier merge
            self._best[members] = (merge, value)
        return self._best[members]

    def total(self, slots: Sequence[Tuple[int, ...]]) -> float:
        inside = set(itertools.chain.from_iterable(slots))
        return sum(self.best(s)[1] for s in slots) + float(
            sum(self.outside[i] for i in range(len(self.outside)) if i not in inside)
        )


def search(
    n: int,
    merges: Sequence[Hashable],
    slots: int,
    score: Score,
    outside: np.ndarray,
    seed: int = 0,
    kicks: Optional[int] = None,
    progress: Callable[[int], None] = lambda done: None,
    memo: Optional[Dict] = None,
) -> Result:
    """The best assignment found of n experts to at most ``slots`` merged models. ``memo``
    (a dict) shares slot values between searches of one pool."""
    started = time.perf_counter()
    objective = Objective(score, merges, outside, memo)
    rng = random.Random(seed)
    kicks = kicks_for(n) if kicks is None else kicks
    starts = {
        "greedy": _local(objective, _greedy(objective, n, slots)),
        "everything": _local(objective, [tuple(range(n))] + [()] * (slots - 1)),
    }
    reached = {name: objective.total(state) for name, state in starts.items()}
    best = starts["greedy"]
    if _better(objective, starts["everything"], best):
        best = starts["everything"]
    progress(2)
    for _ in range(kicks):
        kicked = _kick(best, n, slots, rng)
        candidate = _local(objective, kicked)
        if _better(objective, candidate, best):
            best = candidate
        progress(1)
    reached["kicks"] = objective.total(best)
    result = [Slot(members, *objective.best(members)) for members in best]
    return Result(result, objective.total(best), objective.evaluations, time.perf_counter() - started, reached)


def _better(objective: "Objective", state, than) -> bool:
    """More tasks kept by more than TOLERANCE; or as many, merging fewer experts."""
    gained = objective.total(state) - objective.total(than)
    if abs(gained) > TOLERANCE:
        return gained > 0
    return sum(map(len, state)) < sum(map(len, than))


def kicks_for(n: int) -> int:
    """Random restarts from the best state: more where each costs little."""
    return 4 if n <= 30 else 2 if n <= 60 else 1


def _greedy(objective: Objective, n: int, slots: int) -> List[Tuple[int, ...]]:
    state: List[Tuple[int, ...]] = [()] * slots
    while True:
        inside = set(itertools.chain.from_iterable(state))
        current = [objective.best(s)[1] for s in state]
        best_gain, best_move = TOLERANCE, None
        for i in range(n):
            if i in inside:
                continue
            tried_empty = False
            for s in range(slots):
                if not state[s]:
                    if tried_empty:  # empty slots are all alike
                        continue
                    tried_empty = True
                gain = objective.best(_with(state[s], i))[1] - current[s] - objective.outside[i]
                if gain > best_gain:
                    best_gain, best_move = gain, (i, s)
        if best_move is None:
            return state
        i, s = best_move
        state[s] = _with(state[s], i)


def _local(objective: Objective, state: List[Tuple[int, ...]]) -> List[Tuple[int, ...]]:
    """Steepest-ascent local search until no move gains. Swaps and exchanges pair only the
    WIDTH most promising experts each way (by what adding or removing each alone would gain):
    a full neighbourhood is quadratic in the pool and rarely holds the only improving move."""
    state = list(state)
    n, slots, outside = len(objective.outside), len(state), objective.outside
    while True:
        values = [objective.best(members)[1] for members in state]
        where = {i: s for s, members in enumerate(state) for i in members}
        out = [i for i in range(n) if i not in where]
        changes = {}  # move -> (new slots by index, gain)

        def consider(move, new: Dict[int, Tuple[int, ...]], shift: float) -> None:
            gain = sum(objective.best(m)[1] - values[s] for s, m in new.items()) + shift
            changes[move] = (new, gain)

        for i in where:
            consider(("remove", i), {where[i]: _without(state[where[i]], i)}, outside[i])
            for t in range(slots):
                if t != where[i]:
                    consider(("move", i, t), {where[i]: _without(state[where[i]], i), t: _with(state[t], i)}, 0.0)
        for i in out:
            for t in range(slots):
                consider(("add", i, t), {t: _with(state[t], i)}, -outside[i])
        leaving = sorted(where, key=lambda i: -changes[("remove", i)][1])[:WIDTH]
        joining = sorted(out, key=lambda i: -max(changes[("add", i, t)][1] for t in range(slots)))[:WIDTH]
        for i in leaving:
            for j in joining:
                consider(("swap", i, j), {where[i]: _with(_without(state[where[i]], i), j)}, outside[i] - outside[j])
            for j in leaving:
                a, b = where[i], where[j]
                if i < j and a != b:
                    new = {a: _with(_without(state[a], i), j), b: _with(_without(state[b], j), i)}
                    consider(("exchange", i, j), new, 0.0)
        move, (new, gain) = max(changes.items(), key=lambda item: item[1][1], default=(None, (None, 0.0)))
        if gain <= TOLERANCE:
            return state
        for s, members in new.items():
            state[s] = members


def _kick(state, n: int, slots: int, rng: random.Random) -> List[Tuple[int, ...]]:
    """A random reassignment of about a fifth of the experts (at least two)."""
    assigned = {i: s for s, members in enumerate(state) for i in members}
    for i in rng.sample(range(n), max(2, n // 5) if n >= 2 else n):
        choice = rng.randrange(-1, slots)
        if choice < 0:
            assigned.pop(i, None)
        else:
            assigned[i] = choice
    return [tuple(sorted(i for i, s in assigned.items() if s == k)) for k in range(slots)]


def _with(members: Tuple[int, ...], i: int) -> Tuple[int, ...]:
    return tuple(sorted((*members, i)))


def _without(members: Tuple[int, ...], i: int) -> Tuple[int, ...]:
    return tuple(m for m in members if m != i)


def exhaustive(n: int, merges: Sequence[Hashable], slots: int, score: Score, outside: np.ndarray) -> float:
    """The best objective over every assignment ((slots + 1)^n of them): for checking ``search``."""
    objective = Objective(score, merges, outside)
    best = -np.inf
    for labels in itertools.product(range(-1, slots), repeat=n):
        state = [tuple(i for i in range(n) if labels[i] == s) for s in range(slots)]
        best = max(best, objective.total(state))
    return float(best)
