"""The built-in diagnostics' measurements, one typed record each.

A record owns its metrics' names: its fields are the keys of its block in precheck.json (a model's
``weights``, ``knowledge``, ``dilution``, ``fluency``; a pair's in ``pairs``), so a metric is
renamed here and in the schema, nowhere else. A diagnostic builds its record and hands the hook
``record.json()`` (third-party diagnostics keep the hook's plain dicts); whoever reads one, from a
diagnostic's result or from a precheck.json on disk, reads it with ``Record.of`` and its fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar, Union

R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    @classmethod
    def of(cls: Type[R], values: Union[None, R, Mapping[str, Any]]) -> R:
        """The record from its block as precheck.json holds it (or a diagnostic's result): keys it
        does not know are left out, metrics it lacks are None; ``None`` (not measured) gives an
        empty record."""
        if isinstance(values, cls):
            return values
        values = cls.renamed(dict(values or {}))
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    @staticmethod
    def renamed(values: Dict[str, Any]) -> Dict[str, Any]:
        """Names older reports used, read as today's (none but where a record says)."""
        return values

    def json(self) -> Dict[str, Any]:
        """Its block of precheck.json: every metric measured (None ones are left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class WeightStats(Record):
    """A task vector τ = model − base (``diagnostics.weights``)."""

    update_norm: Optional[float] = None  # ‖τ‖
    top_singular_value: Optional[float] = None  # the largest σ_max of any updated matrix
    nonfinite: Optional[float] = None  # NaN/Inf values in its weights
    embedding_norm: Optional[float] = None
    head_norm: Optional[float] = None
    pool_cosine: Optional[float] = None  # cos(τ_i, Σ_{j≠i} τ_j)
    mean_cosine: Optional[float] = None  # with the others, on average
    mean_sign_conflict: Optional[float] = None
    layer_update_norm: Optional[List[float]] = None  # ‖τ‖ per decoder layer

    def json(self) -> Dict[str, Any]:
        """As ``Record.json``; the layers are written even when not measured (null)."""
        return {**super().json(), "layer_update_norm": self.layer_update_norm}

    @classmethod
    def measured(
        cls, values: Optional[Mapping[str, Any]], layers: Optional[Mapping[str, List[float]]]
    ) -> "WeightStats":
        """From the weights diagnostic's result: its values for a model, and its per-layer ones."""
        return replace(cls.of(values), layer_update_norm=(layers or {}).get(LAYERS))


LAYERS = "update_norm"  # the weights diagnostic's per-layer metric (``DiagnosticResult.per_layer``)


@dataclass(frozen=True)
class PairWeights(Record):
    """Two task vectors (``diagnostics.weights``): a pair's entry in precheck.json's ``pairs``."""

    cosine: Optional[float] = None
    sign_conflict: Optional[float] = None  # share of coordinates, non-zero in both, whose signs differ


@dataclass(frozen=True)
class PairLayers(Record):
    """Two models layer by layer: their representations' CKA (``diagnostics.representations``; index 0
    the embedding output, then one per decoder block) and their group-specific neurons' overlap
    (``diagnostics.selectivity``, one per block); a pair's entry in precheck.json's ``pairs``."""

    cka: Optional[List[Optional[float]]] = None  # biased linear CKA, answer span
    cka_unbiased: Optional[List[Optional[float]]] = None  # unbiased (minibatch): what the verdict reads
    cka_prompt: Optional[List[Optional[float]]] = None  # biased, prompt span
    specific_overlap: Optional[List[Optional[float]]] = None
    specific_collisions: Optional[List[float]] = None  # experts only
    specific_union: Optional[List[float]] = None


@dataclass(frozen=True)
class KnowledgeStats(Record):
    """The base on a model's probe (``diagnostics.knowledge``): asked as the paper asks it (lettered,
    few-shot: ``maths.choice_scores.TaskKnowledge``'s fields), and ``scored_*`` as its task scores it."""

    accuracy: Optional[float] = None
    mean_p_gold: Optional[float] = None
    mean_gap: Optional[float] = None
    mean_gold_logprob: Optional[float] = None
    mean_gold_logprob_per_token: Optional[float] = None
    letter_accuracy: Optional[float] = None
    mean_letter_p_gold: Optional[float] = None
    instances: Optional[int] = None
    mean_margin: Optional[float] = None
    fewshot: Optional[int] = None
    scored_accuracy: Optional[float] = None
    scored_mean_p_gold: Optional[float] = None
    scored_mean_gap: Optional[float] = None
    scored_mean_gold_logprob_per_token: Optional[float] = None
    scored_mean_margin: Optional[float] = None
    scored_format: Optional[str] = None  # cloze, options, lm-eval, or mixed
    scored_shots: Optional[Any] = None  # an int, or the sorted list where lines differ
    scored_format_declared: Optional[bool] = None

    @classmethod
    def asked(cls, paper: Mapping[str, Any], as_task: Mapping[str, Any], **how: Any) -> "KnowledgeStats":
        """From the probe's two views (``choice_scores.TaskKnowledge`` as dicts): the paper's as it
        is, the task's as the ``scored_*`` metrics it has; ``how``: fewshot and the scored format."""
        known = {f.name for f in fields(cls)}
        scored = {f"scored_{k}": v for k, v in as_task.items() if f"scored_{k}" in known}
        return cls(**{k: v for k, v in paper.items() if k in known}, **scored, **how)

    @staticmethod
    def renamed(values: Dict[str, Any]) -> Dict[str, Any]:
        """``task_*`` before schema 2.2: ``scored_*``."""
        return {**{f"scored_{k[5:]}": v for k, v in values.items() if k.startswith("task_")}, **values}

    @property
    def format(self) -> str:
        """How its task is scored (cloze where the report does not say)."""
        return self.scored_format or CLOZE


CLOZE, OPTIONS, LMEVAL, MIXED = "cloze", "options", "lm-eval", "mixed"  # how a probe is scored
GENERATION = "generation"  # a reference answer (a probe's "answer", a fine-tuning row): its per-token p(gold)
CODE = "code"  # a code task's reference solution (its metric runs code, which the precheck never does): as generation


@dataclass(frozen=True)
class DilutionStats(Record):
    """A model's own probe on merges built in memory (``diagnostics.dilution``): with a ninth of its
    update (``diluted_*``), among its partners (``partnered_*``: the rehearsal), and inside the whole
    config merged with knowledge_weighted's defaults and with TIES."""

    share: Optional[float] = None
    diluted_accuracy: Optional[float] = None
    diluted_mean_p_gold: Optional[float] = None
    diluted_mean_margin: Optional[float] = None
    alone_accuracy: Optional[float] = None  # the model itself (its whole update) on its own probe
    alone_mean_p_gold: Optional[float] = None
    rehearsed: Optional[str] = None
    partnered_share: Optional[float] = None
    partner_share: Optional[float] = None
    partnered_accuracy: Optional[float] = None
    partnered_mean_p_gold: Optional[float] = None
    partnered_task_score: Optional[float] = None  # an lm-eval task's own metric (``task_metric``)
    task_metric: Optional[str] = None
    # each one's standard error over the probe's items (lm-eval's own for a task, where it gives one)
    partnered_accuracy_stderr: Optional[float] = None
    partnered_mean_p_gold_stderr: Optional[float] = None
    partnered_task_score_stderr: Optional[float] = None
    # each one's 95% interval over the probe's items: Wilson's, never zero-width (``maths.stats``)
    partnered_accuracy_interval: Optional[List[float]] = None
    partnered_mean_p_gold_interval: Optional[List[float]] = None
    partnered_task_score_interval: Optional[List[float]] = None
    partnered_items: Optional[int] = None  # the probe's items asked
    knowledge_weighted_accuracy: Optional[float] = None
    knowledge_weighted_mean_p_gold: Optional[float] = None
    ties_accuracy: Optional[float] = None
    ties_mean_p_gold: Optional[float] = None

    def scored(self, merge: str, scored_format: str, suffix: str = "") -> Optional[float]:
        """Its own probe inside ``merge`` (``partnered``, ``knowledge_weighted``, ``ties``), read as
        its task is scored: p(gold) where its options are listed, accuracy where it is cloze, the
        task's own metric where it is an lm-eval task; None for a mix of formats. ``suffix``
        ``_stderr``: that score's standard error over the probe's items, where it was measured;
        ``_interval``: its 95% interval over them."""
        metric = SCORED_BY.get(scored_format)
        return getattr(self, f"{merge}_{metric}{suffix}", None) if metric else None


PARTNERED = "partnered"  # the rehearsal's merge, as ``DilutionStats.scored`` names it
# the formats the rehearsal was decided on -> the metric it reads
SCORED_BY = {
    OPTIONS: "mean_p_gold",
    CLOZE: "accuracy",
    LMEVAL: "task_score",
    GENERATION: "mean_p_gold",
    CODE: "mean_p_gold",
}


@dataclass(frozen=True)
class FluencyStats(Record):
    """The config's merge on a shipped general text (``diagnostics.fluency``)."""

    perplexity: Optional[float] = None  # the model's own
    base_perplexity: Optional[float] = None
    merged_perplexity: Optional[float] = None
    signature_kept: Optional[float] = None  # how much of its log-prob shift on its signature the merge keeps
