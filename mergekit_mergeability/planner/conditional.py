"""The conditional prediction: expert i's own-task score inside one merge (subset S, method m),
from the weight pass's statistics alone; no forward pass per candidate.

The precheck's calibration predicts a score after a mean merge with 8 random partners. A plan
compares merges, so the features that depend on the merge are recomputed per candidate from the
pool's Gram matrix G_ij = τ_i·τ_j (update norms and pairwise cosines), its pairwise TIES sign
conflicts and each update's norm per decoder layer:

    own_coefficient        +  c_i = (u·τ_i) / ‖τ_i‖², u the merged update: how much of its own
                              update the merged model holds along τ_i (1: all of it; a mean of
                              9 unrelated updates: 1/9). The precheck's kept share is c_i / w_i.
    partner_cosine         +  cos(τ_i, Σ_{j∈S∖i} w_j τ_j): the partners pull along or against it
    partner_sign_conflict  −  mean TIES sign-conflict rate between τ_i and the partners
    merged_count           −  log |S|

With S the whole pool and equal weights, partner_cosine and partner_sign_conflict are the
precheck's pool_cosine and mean_sign_conflict; with 8 random partners their sample versions.
The expert's own features (its base knowledge as its task is scored, its update's size and top
singular value against the pool's median) are the calibration's, unchanged.

How c_i is computed, per method (``Merge``):

- task_arithmetic, linear, knowledge_weighted without ties: u = Σ_j w_j τ_j, so
  c_i = Σ_j w_j G_ij / G_ii, exact.
- ties, knowledge_weighted with ties: an approximation. Each update's coordinates are modelled
  as Gaussian, jointly with covariance G split over the decoder layers in proportion to the
  layers' norms (G^l_ij = κ_ij n_il n_jl, κ chosen so that Σ_l G^l = G); trimming to the top
  ``density`` share by magnitude, sign election and the disjoint mean are then run on a fixed
  sample of such coordinates (``Coordinates``), exactly as mergekit runs them on tensors. Exact
  for Gaussian task vectors up to sampling error (tests/test_plan.py checks it against
  mergekit's own ``ties``); for real updates, heavier-tailed and structured within a layer, an
  approximation. Updates on disjoint layers never meet, as in the real merge.
- layer_selective: u = Σ_j w_j τ_j below the cut-off plus the upper model's own update above
  it, with the same per-layer split of G.

The prediction itself (``ConditionalCalibration``) is a monotone linear model of these features
(``maths.calibration``), one per merge rule, fitted on measured trials (``plan.fit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mergekit_mergeability.maths import fitting
from mergekit_mergeability.maths.merging import DEFAULT_TEMPERATURE
from mergekit_mergeability.decide.features import CALIBRATED, POOL_LEVEL, features as expert_features
from mergekit_mergeability.records import KnowledgeStats, PairWeights, WeightStats
from mergekit_mergeability.decide.verdict import KEPT_CAP

# The expert's own features: the calibration's, less those that depend on who it is merged with and
# the dilution's, which plan's precheck does not run (planning.SKIPPED): a refit must not read them
EXPERT: Dict[str, int] = {
    name: d for name, d in CALIBRATED.items() if name not in POOL_LEVEL and not name.startswith("diluted_")
}
CONDITIONAL: Dict[str, int] = {
    "own_coefficient": +1,
    "partner_cosine": +1,
    "partner_sign_conflict": -1,
    "merged_count": -1,
}
FEATURES: Dict[str, int] = {**EXPERT, **CONDITIONAL}
# knowledge_weighted's knowledge values: the base's p(gold) as the task is scored, the precheck
# calibration's choice on the measured families (decide/calibration.json, knowledge_feature)
KNOWLEDGE_FEATURE = "scored_p_gold"
# Gaussian coordinates for the TIES approximation: per part (decoder layer) that some update
# changes, SAMPLES, or fewer when many parts share ROWS; with the control variate (below) the
# sampling error on c_i is about 0.02 (tests/test_plan.py checks it against mergekit's ties)
SAMPLES, ROWS = 2048, 4096
SEED = 0
REST_FLOOR = 1e-6  # a share of ‖τ‖² (0.1% of its norm) the unnamed rest must exceed to be a part

# Merge rules: which fitted model predicts a merge, and where a rule without one falls back to
TASK_ARITHMETIC, LINEAR, TIES = "task_arithmetic", "linear", "ties"
KNOWLEDGE_WEIGHTED, KNOWLEDGE_WEIGHTED_TIES, LAYER_SELECTIVE = (
    "knowledge_weighted",
    "knowledge_weighted_ties",
    "layer_selective",
)
FALLBACK = {
    TASK_ARITHMETIC: (),
    LINEAR: (TASK_ARITHMETIC,),
    TIES: (TASK_ARITHMETIC,),
    KNOWLEDGE_WEIGHTED: (TASK_ARITHMETIC,),
    KNOWLEDGE_WEIGHTED_TIES: (TIES, KNOWLEDGE_WEIGHTED, TASK_ARITHMETIC),
    LAYER_SELECTIVE: (TASK_ARITHMETIC,),
}
METHODS = (TASK_ARITHMETIC, LINEAR, TIES, KNOWLEDGE_WEIGHTED, LAYER_SELECTIVE)  # mergekit method names we model


@dataclass(frozen=True)
class Merge:
    """One way to merge a subset: a mergekit method and its knobs. ``scale`` is the merged
    update's total weight (task_arithmetic's Σ weights, ties' lambda, knowledge_weighted's
    scale); ``weights`` (model → weight) replaces the equal shares, as a config can."""

    method: str
    density: float = 1.0  # ties; knowledge_weighted with ties
    temperature: Optional[float] = None  # knowledge_weighted
    ties: bool = False  # knowledge_weighted
    by_knowledge: bool = False  # knowledge_weighted with ties: density_by_knowledge
    cutoff: Optional[int] = None  # layer_selective: blocks below are merged
    scale: float = 1.0
    weights: Optional[Tuple[Tuple[str, float], ...]] = None

    @property
    def rule(self) -> str:
        if self.method == KNOWLEDGE_WEIGHTED and self.ties:
            return KNOWLEDGE_WEIGHTED_TIES
        return self.method

    @property
    def trims(self) -> bool:
        return self.rule in (TIES, KNOWLEDGE_WEIGHTED_TIES)

    def label(self) -> str:
        knobs = []
        if self.method == KNOWLEDGE_WEIGHTED:
            knobs.append(f"τ {self.temperature:g}")
        if self.trims:
            knobs.append(f"density {self.density:g}" + (" by knowledge" if self.by_knowledge else ""))
        if self.method == LAYER_SELECTIVE:
            knobs.append(f"cut-off {self.cutoff}")
        name = "knowledge_weighted+ties" if self.rule == KNOWLEDGE_WEIGHTED_TIES else self.method
        return f"{name} ({', '.join(knobs)})" if knobs else name


@dataclass
class Pool:
    """What the plan knows of a pool, all from one precheck: per expert (in ``names`` order) its
    features, the base's own score on its task and the expert's; per pair the Gram matrix and
    sign conflicts; per expert and part (decoder layer, embedding, head, rest) its update norm."""

    names: Tuple[str, ...]
    gram: np.ndarray  # (n, n)
    sign_conflict: np.ndarray  # (n, n), 0 on the diagonal
    parts: np.ndarray  # (n, P): ‖τ_i‖ per part, Σ_p parts² = diag(gram)
    part_names: Tuple[Any, ...]  # a decoder layer's index, "embedding", "head" or "rest"
    expert_features: np.ndarray  # (n, len(EXPERT)), nan where not measured
    knowledge: np.ndarray  # (n,) knowledge_weighted's knowledge values, nan where not measured
    base_score: np.ndarray  # (n,) the base's own score on each task
    expert_score: np.ndarray  # (n,) each expert's own score on its task
    _coordinates: Optional["Coordinates"] = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def norms(self) -> np.ndarray:
        return np.sqrt(np.clip(np.diag(self.gram), 0, None))

    def coordinates(self) -> "Coordinates":
        if self._coordinates is None:
            self._coordinates = Coordinates(self)
        return self._coordinates

    def index(self, name: str) -> int:
        return self.names.index(name)


def from_report(
    report: Mapping[str, Any],
    names: Optional[Sequence[str]] = None,
    knowledge_feature: str = KNOWLEDGE_FEATURE,
    expert_scores: Optional[Mapping[str, float]] = None,
    base_scores: Optional[Mapping[str, float]] = None,
) -> Pool:
    """The pool of a precheck report (precheck.json as a dict), its experts in ``names`` order
    (default: the report's). The base's own score on a task is ``base_scores``' where given
    (measured), else its accuracy there as the task is scored (the precheck's: what
    ``mergeability`` measures as ``base_score`` for a multiple-choice probe); an expert's own
    score is ``expert_scores``' where given, else 1 (a fine-tune that does its task)."""
    experts = {m["path"]: m for m in report["models"] if m["role"] == "expert"}
    names = tuple(names or experts)
    missing = [n for n in names if n not in experts]
    if missing:
        raise KeyError(missing[0])
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    weights = [WeightStats.of(experts[name].get("weights")) for name in names]
    norms = np.array([w.update_norm or 0.0 for w in weights], dtype=float)
    cosine, conflict = np.eye(n), np.zeros((n, n))
    for pair in report.get("pairs", []):
        i, j, stats = index.get(pair["a"]), index.get(pair["b"]), PairWeights.of(pair)
        if i is None or j is None or stats.cosine is None:
            continue
        cosine[i, j] = cosine[j, i] = stats.cosine
        conflict[i, j] = conflict[j, i] = stats.sign_conflict or 0.0
    table = expert_features([experts[name] for name in names])
    values = lambda name, keys: [np.nan if table[name].get(k) is None else table[name][k] for k in keys]  # noqa: E731
    parts, part_names = _parts(weights, norms)
    base = []
    for name in names:
        knowledge = KnowledgeStats.of(experts[name].get("knowledge"))
        asked = knowledge.accuracy if knowledge.scored_accuracy is None else knowledge.scored_accuracy
        score = (base_scores or {}).get(name, asked)
        base.append(np.nan if score is None else score)
    return Pool(
        names=names,
        gram=cosine * np.outer(norms, norms),
        sign_conflict=conflict,
        parts=parts,
        part_names=part_names,
        expert_features=np.array([values(name, EXPERT) for name in names], dtype=float).reshape(n, len(EXPERT)),
        knowledge=np.array([values(name, [knowledge_feature])[0] for name in names], dtype=float),
        base_score=np.array(base, dtype=float),
        expert_score=np.array([(expert_scores or {}).get(name, 1.0) for name in names], dtype=float),
    )


def _parts(weights: Sequence[WeightStats], norms: np.ndarray) -> Tuple[np.ndarray, Tuple[Any, ...]]:
    """‖τ_i‖ per decoder layer, embedding, head, and the rest (tensors of no layer); ``weights``: the
    records, or their blocks as precheck.json holds them."""
    weights = [WeightStats.of(w) for w in weights]
    depth = max((len(w.layer_update_norm or ()) for w in weights), default=0)
    rows = []
    for w, total in zip(weights, norms):
        layers = list(w.layer_update_norm or ())
        known = [*layers, *[0.0] * (depth - len(layers)), w.embedding_norm or 0.0, w.head_norm or 0.0]
        rest_squared = total**2 - sum(v * v for v in known)
        # what the named parts leave of the total; below REST_FLOOR of it, the residue of the
        # subtraction in floating point (which would add a part to sample and move every sample)
        rest = math.sqrt(rest_squared) if rest_squared > REST_FLOOR * total**2 else 0.0
        rows.append([*known, rest])
    return np.array(rows, dtype=float).reshape(len(norms), depth + 3), (*range(depth), "embedding", "head", "rest")


def member_weights(pool: Pool, members: Sequence[int], merge: Merge) -> np.ndarray:
    """Each member's weight in the merged update (linear rules: u = Σ w_j τ_j)."""
    members = list(members)
    if merge.weights is not None:
        given = dict(merge.weights)
        raw = np.array([given.get(pool.names[i], 1.0) for i in members], dtype=float)
        return raw * merge.scale
    if merge.method == KNOWLEDGE_WEIGHTED:
        logits = (1 - known_values(pool, members)) / (merge.temperature or DEFAULT_TEMPERATURE)
        shares = np.exp(logits - logits.max())
        return merge.scale * shares / shares.sum()
    if merge.trims:  # ties: weight 1 each, the disjoint mean divides by the agreeing weights
        return np.full(len(members), float(merge.scale))
    return np.full(len(members), merge.scale / len(members))


def known_values(pool: Pool, members: Sequence[int]) -> np.ndarray:
    """The members' knowledge values; one not measured counts as the others' mean (0.5: none is)."""
    known = pool.knowledge[list(members)]
    return np.where(np.isnan(known), np.nanmean(known) if np.isfinite(known).any() else 0.5, known)


def member_densities(pool: Pool, members: Sequence[int], merge: Merge) -> np.ndarray:
    """Each member's trim density: the merge's, raised to d + (1 − d)·k where it trims by knowledge."""
    if merge.by_knowledge and merge.method == KNOWLEDGE_WEIGHTED:
        from mergekit_mergeability.methods.knowledge_weighted import known_density

        return np.array([known_density(merge.density, k) for k in known_values(pool, members)])
    return np.full(len(members), float(merge.density))


def own_coefficients(pool: Pool, members: Sequence[int], merge: Merge) -> np.ndarray:
    """c_i = (u·τ_i)/‖τ_i‖² for every member: exact for the linear rules, the Gaussian
    approximation for the trimming ones (see the module docstring)."""
    members = np.asarray(members, dtype=int)
    g = pool.gram[np.ix_(members, members)]
    own = np.diag(g)
    safe = np.where(own > 0, own, 1.0)
    w = member_weights(pool, members, merge)
    if merge.trims:
        # the disjoint mean divides the weights out; the merge's scale (ties' lambda) multiplies after
        along = merge.scale * pool.coordinates().trimmed_dots(members, w, member_densities(pool, members, merge))
    elif merge.method == LAYER_SELECTIVE:
        low, high = split_gram(pool, merge.cutoff or 0)
        upper = upper_member(pool, members)
        along = low[np.ix_(members, members)] @ w + high[members, upper]
    else:
        along = g @ w
    return np.where(own > 0, along / safe, 0.0)


def kept_shares(pool: Pool, members: Sequence[int], merge: Merge) -> np.ndarray:
    """Each member's kept share, (Σ_j w_j τ_j · τ_i) / (w_i ‖τ_i‖²) over its whole update, as
    ``decide.verdict.kept_shares`` gives the precheck's from norms and cosines, here from the pool's
    Gram matrix for a whole candidate at once: 1 untouched by the others, 0 cancelled.
    layer_selective: 1 (its upper member keeps its own blocks above the cut-off)."""
    members = np.asarray(members, dtype=int)
    if merge.method == LAYER_SELECTIVE:
        return np.ones(len(members))
    g = pool.gram[np.ix_(members, members)]
    w = member_weights(pool, members, merge)
    scale = w * np.diag(g)
    return np.where(scale > 0, (g @ w) / np.where(scale > 0, scale, 1.0), 1.0)


def upper_member(pool: Pool, members: Sequence[int]) -> int:
    """layer_selective's upper model in a plan: the member the base knows least (the one a merge
    loses first; the precheck's choice when no model is marked), by pool index."""
    members = list(members)
    known = pool.knowledge[members]
    if not np.isfinite(known).any():
        return members[0]
    return members[int(np.nanargmin(known))]


def split_gram(pool: Pool, cutoff: int) -> Tuple[np.ndarray, np.ndarray]:
    """G split into the parts below a layer cut-off (and the embeddings, which layer_selective
    merges) and the rest, each part's share as ``layer_grams`` models it."""
    low = np.array([p == "embedding" or (isinstance(p, int) and p < cutoff) for p in pool.part_names])
    kappa = coupling(pool)
    below = pool.parts[:, low] @ pool.parts[:, low].T
    above = pool.parts[:, ~low] @ pool.parts[:, ~low].T
    return kappa * below, kappa * above


def coupling(pool: Pool) -> np.ndarray:
    """κ_ij = G_ij / Σ_l n_il n_jl: the cosine per shared part that reproduces G when the
    pair's cosine is the same in every part they both update (1 on the diagonal)."""
    shared = pool.parts @ pool.parts.T
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(shared > 0, pool.gram / shared, 0.0)
    return np.clip(kappa, -1.0, 1.0)


class Coordinates:
    """A fixed sample of Gaussian coordinates of every update at once, per decoder layer: rows
    y ~ N(0, G^l) with G^l_ij = κ_ij n_il n_jl, SAMPLES rows per part that any update changes.
    Taking the columns of a subset gives that subset's joint sample, so every candidate merge
    is evaluated on the same coordinates (common random numbers: differences between candidates
    are not sampling noise). An update that leaves a part unchanged is exactly 0 there."""

    def __init__(self, pool: Pool, seed: int = SEED):
        rng = np.random.default_rng(seed)
        kappa = coupling(pool)
        n = len(pool)
        used = [p for p in range(pool.parts.shape[1]) if (pool.parts[:, p] > 0).any()]
        samples = min(SAMPLES, max(128, ROWS // max(len(used), 1)))
        blocks, sigmas = [], []
        self.sampled_gram = np.zeros((n, n))  # the covariance actually sampled (Σ_l G^l, each made PSD)
        for p in used:
            column = pool.parts[:, p]
            values, vectors = np.linalg.eigh(kappa * np.outer(column, column))
            # the symmetric square root: unlike an eigenvector basis (which turns freely inside a
            # repeated eigenvalue) it moves little when G moves little, so two measurements of one
            # pool (adapters, and the same adapters materialised) draw nearly the same coordinates
            factor = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
            factor[column == 0] = 0.0
            self.sampled_gram += factor @ factor.T
            blocks.append(factor @ rng.standard_normal((factor.shape[1], samples)))
            sigmas.append(np.broadcast_to(column[:, None], (n, samples)))
        # stored update by update (n × rows): a subset's coordinates are contiguous rows
        # float32: half the memory traffic of the search's innermost loop, far below the sampling error
        self.y = (np.hstack(blocks) if blocks else np.zeros((n, 0))).astype(np.float32)
        self.squares = self.y * self.y
        self.cubes = self.squares * self.y
        self.square_sums = self.squares.sum(axis=1, dtype=float)
        self.fourth_sums = (self.squares.astype(float) ** 2).sum(axis=1)
        self.sigma = (np.hstack(sigmas) if sigmas else np.zeros((n, 0))).astype(np.float32)
        self.samples = samples
        self._kept: Dict[float, np.ndarray] = {}

    def kept(self, density: float) -> np.ndarray:
        """Each coordinate after trimming to the top ``density`` share by magnitude (per update
        and part: the threshold is σ Φ⁻¹(1 − density/2))."""
        if density not in self._kept:
            from scipy.stats import norm

            threshold = 0.0 if density >= 1 else float(norm.ppf(1 - density / 2))
            self._kept[density] = np.where(np.abs(self.y) >= threshold * self.sigma, self.y, 0.0)
        return self._kept[density]

    def kept_members(self, members: np.ndarray, densities: np.ndarray) -> np.ndarray:
        """The members' coordinates, each trimmed at its own density."""
        if np.all(densities == densities[0]):
            return self.kept(float(densities[0]))[members]
        from scipy.stats import norm

        thresholds = np.where(densities >= 1, 0.0, norm.ppf(1 - np.minimum(densities, 1) / 2)).astype(np.float32)
        y = self.y[members]
        return np.where(np.abs(y) >= thresholds[:, None] * self.sigma[members], y, 0.0)

    def trimmed_dots(self, members: np.ndarray, w: np.ndarray, densities: np.ndarray) -> np.ndarray:
        """u·τ_i for each member, u the TIES merge of the members' sampled coordinates: trim
        (each at its density), weight, elect the sign of the sum, average the agreeing entries
        (mergekit's ``ties``, normalize on; knowledge_weighted's ties branch is the same)."""
        trimmed = self.kept_members(members, densities) * w.astype(np.float32)[:, None]  # (members, rows)
        elected = np.where(trimmed.sum(axis=0) >= 0, 1.0, -1.0)
        agree = trimmed * elected > 0
        divisor = w.astype(np.float32) @ agree
        merged = (trimmed * agree).sum(axis=0) / np.where(divisor == 0, 1.0, divisor)
        own, squares, cubes = self.y[members], self.squares[members], self.cubes[members]
        # Control variates with known means remove most of the sampling noise: a_i = y_i² (mean
        # G_ii) and b_i = (s − y_i)·y_i with s = Σ_j y_j (mean Σ_{j≠i} G_ij), β by least squares
        # per member from sums of powers (no rows × members temporaries beyond the inputs).
        s = own.sum(axis=0)
        rows = self.y.shape[1]
        a, aa = self.square_sums[members], self.fourth_sums[members]
        t = own @ merged
        cubed_s = cubes @ s
        b = own @ s - a
        bb = squares @ (s * s) - 2 * cubed_s + aa
        ab = cubed_s - aa
        ta = cubes @ merged
        tb = squares @ (merged * s) - ta
        c_aa, c_bb, c_ab = aa - a * a / rows, bb - b * b / rows, ab - a * b / rows
        c_ta, c_tb = ta - t * a / rows, tb - t * b / rows
        det = c_aa * c_bb - c_ab * c_ab
        both = det > 1e-9 * np.maximum(c_aa * c_bb, 1e-30)
        safe = np.where(both, det, 1.0)
        # where one control is degenerate (b ≡ 0: no partner shares the update's parts), the other alone
        only_a = ~both & (c_aa > 0)
        beta_a = np.where(
            both, (c_ta * c_bb - c_tb * c_ab) / safe, np.where(only_a, c_ta / np.where(only_a, c_aa, 1), 0)
        )
        beta_b = np.where(both, (c_tb * c_aa - c_ta * c_ab) / safe, 0.0)
        g = self.sampled_gram[np.ix_(members, members)]
        mean_a, mean_b = np.diag(g) * self.samples, (g.sum(axis=1) - np.diag(g)) * self.samples
        estimate = t - beta_a * (a - mean_a) - beta_b * (b - mean_b)
        return (estimate / self.samples).astype(float)


def conditional_features(
    pool: Pool, members: Sequence[int], merge: Merge, wanted: Sequence[str] = tuple(CONDITIONAL)
) -> Dict[str, np.ndarray]:
    """The members' merge-dependent features (``CONDITIONAL``, or those ``wanted``), in
    ``members`` order; the partner features are nan for a merge of one."""
    members = np.asarray(members, dtype=int)
    k = len(members)
    found: Dict[str, np.ndarray] = {}
    if "own_coefficient" in wanted:
        found["own_coefficient"] = own_coefficients(pool, members, merge)
    if "partner_cosine" in wanted:
        g = pool.gram[np.ix_(members, members)]
        own = np.diag(g)
        w = member_weights(pool, members, merge)
        pulled = g @ w - w * own  # τ_i · Σ_{j≠i} w_j τ_j
        rest = np.sqrt(np.clip(w @ g @ w - 2 * w * (g @ w) + w * w * own, 0, None))
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = rest * np.sqrt(np.clip(own, 0, None))
            found["partner_cosine"] = (
                np.where(scale > 0, pulled / np.where(scale > 0, scale, 1), 0.0) if k > 1 else np.full(k, np.nan)
            )
    if "partner_sign_conflict" in wanted:
        within = pool.sign_conflict[np.ix_(members, members)].sum(axis=1)
        found["partner_sign_conflict"] = within / (k - 1) if k > 1 else np.full(k, np.nan)
    if "merged_count" in wanted:
        found["merged_count"] = np.full(k, math.log(k))
    return found


def design(pool: Pool, members: Sequence[int], merge: Merge, names: Sequence[str]) -> np.ndarray:
    """The feature matrix (members × ``names``) the conditional model reads."""
    members = np.asarray(members, dtype=int)
    conditional = conditional_features(pool, members, merge, [n for n in names if n in CONDITIONAL])
    own = dict(zip(EXPERT, pool.expert_features[members].T))
    columns = [conditional[name] if name in conditional else own[name] for name in names]
    return np.column_stack(columns) if columns else np.zeros((len(members), 0))


@dataclass(frozen=True)
class Fitted:
    """One merge rule's model, with what it was fitted on (feature ranges: its domain)."""

    rule: str
    model: fitting.Linear
    ranges: Mapping[str, Tuple[float, float]]
    sizes: Tuple[int, ...]  # the merge sizes |S| among its trials
    trials: int


@dataclass(frozen=True)
class Prediction:
    values: np.ndarray  # per member, in [0, 1]
    rule: str  # the fitted model that predicted it
    fallback: bool  # True: no model fitted on this merge's own rule
    outside: List[List[str]]  # per member: features beyond the fitted range


RANGE_SLACK = 0.25  # as the precheck's domain check: a share of the fitted range


@dataclass(frozen=True)
class ConditionalCalibration:
    fitted: Mapping[str, Fitted]
    document: Mapping[str, Any]

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> "ConditionalCalibration":
        fitted = {}
        for rule, entry in document["rules"].items():
            fitted[rule] = Fitted(
                rule,
                fitting.Linear.from_dict(entry["model"]),
                {k: (float(v[0]), float(v[1])) for k, v in entry.get("ranges", {}).items()},
                tuple(entry.get("sizes", ())),
                int(entry.get("trials", 0)),
            )
        return cls(fitted, document)

    def model_for(self, rule: str) -> Tuple[Optional[Fitted], bool]:
        """The rule's own model, else the first of its fallbacks that is fitted (True: a fallback)."""
        if rule in self.fitted:
            return self.fitted[rule], False
        for other in FALLBACK.get(rule, (TASK_ARITHMETIC,)):
            if other in self.fitted:
                return self.fitted[other], True
        return None, True

    def predict(self, pool: Pool, members: Sequence[int], merge: Merge, domain: bool = True) -> Prediction:
        """Each member's predicted own-task score inside this merge; a merge of one is the expert
        itself. ``domain``: also say which features lie outside the fitted range (not needed
        while searching)."""
        members = np.asarray(members, dtype=int)
        if len(members) == 1:
            return Prediction(pool.expert_score[members].copy(), "alone", False, [[]])
        chosen, fallback = self.model_for(merge.rule)
        if chosen is None:
            raise LookupError(f"no conditional model fitted for {merge.rule} nor any fallback")
        x = design(pool, members, merge, chosen.model.names)
        values = np.clip(chosen.model.predict(x), 0.0, 1.0)
        kept = kept_shares(pool, members, merge)  # capped as the precheck caps: a cancelled update keeps nothing
        values = np.where(kept < KEPT_CAP, np.minimum(values, np.clip(kept, 0.0, None)), values)
        return Prediction(values, chosen.rule, fallback, _outside(chosen, x) if domain else [[] for _ in members])


def _outside(chosen: Fitted, x: np.ndarray) -> List[List[str]]:
    weighed = [j for j, w in enumerate(chosen.model.weights) if w > 0]
    found = []
    for row in x:
        beyond = []
        for j in weighed:
            name = chosen.model.names[j]
            if name not in chosen.ranges or np.isnan(row[j]):
                continue
            low, high = chosen.ranges[name]
            slack = RANGE_SLACK * (high - low)
            if not low - slack <= row[j] <= high + slack:
                beyond.append(f"{name} {row[j]:.2f} outside the fitted {low:.2f}–{high:.2f}")
        found.append(beyond)
    return found


def with_weights(merge: Merge, weights: Mapping[str, float]) -> Merge:
    return replace(merge, weights=tuple(sorted(weights.items())))
