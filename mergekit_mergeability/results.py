"""What the commands return, typed: one dataclass per report, with the fields its JSON has.

Each is built from the document its command writes (``from_json``) and gives it back unchanged
(``to_json``: the same keys in the same order), so ``json.dumps(result.to_json())`` is the file.
Nested parts a reader reaches for first are typed too (``PrecheckResult.models``,
``PrecheckResult.recommendation``); the rest stay as the JSON has them, described by each
command's schema (``output/precheck.schema.json``, ``interpolation/schema.json``, ``planner/schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Mapping, Optional

if TYPE_CHECKING:
    from mergekit.config import MergeConfiguration

Json = Dict[str, Any]


@dataclass
class Report:
    """A JSON document as a dataclass: a field per key, in the document's order."""

    _nested: ClassVar[Dict[str, type]] = {}  # field -> the Report type of its items (a list) or of it

    @classmethod
    def from_json(cls, document: Mapping[str, Any], **extra: Any):
        values = {}
        for f in fields(cls):
            if not f.init or f.name in extra or not f.metadata.get("json", True):
                continue  # what the document does not hold keeps its default
            value = document.get(f.name)
            kind = cls._nested.get(f.name)
            if kind is not None and value is not None:
                value = [kind.from_json(v) for v in value] if isinstance(value, list) else kind.from_json(value)
            values[f.name] = value
        return cls(**values, **extra)

    def to_json(self) -> Json:
        """The document, as the command writes it."""
        return {f.name: _json(getattr(self, f.name)) for f in fields(self) if f.metadata.get("json", True)}


def _json(value: Any) -> Any:
    if isinstance(value, Report):
        return value.to_json()
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


NOT_IN_JSON = {"json": False}


@dataclass
class PrecheckModel(Report):
    """One model of a precheck: the base (``role`` base) or an expert, with what was measured and predicted."""

    path: str  # as written in the config
    name: str  # a short unique form of it
    role: str  # "base" | "expert"
    probe: Optional[str]
    knowledge: Optional[Json]  # the base model on this model's probes
    weights: Optional[Json]  # task-vector statistics
    dilution: Optional[Json]  # its own probe at a ninth of its update (the share a mean merge of 9 gives it)
    fluency: Optional[Json]  # the merge as written on a shipped general text: perplexities, its signature kept
    features: Optional[Json]  # the calibration's features
    kept_share: Optional[float]
    predicted_mergeability: Optional[float]  # its own-task score after merging, predicted (experts)
    predicted_interval: Optional[List[float]]  # where it is the rehearsal: ± its probe's items (95%)
    out_of_domain: Optional[List[str]]
    reasons: List[str]
    specific_neurons: Optional[Json]
    dtype: Optional[str]  # what it was loaded in

    @property
    def predicted(self) -> Optional[float]:
        """``predicted_mergeability``."""
        return self.predicted_mergeability


@dataclass
class Recommendation(Report):
    """The verdict and what to merge instead: ``models`` says what each recommended config keeps and drops."""

    verdict: str
    method: Optional[str]
    cutoff: Optional[int]
    weights: Optional[Json]
    knowledge: Optional[Json]
    reasons: List[str]
    pairs: List[List[str]]
    left_out: Optional[List[str]]
    lost: Optional[List[str]]
    # {knowledge_weighted, ties}: the experts' mean predicted score merged each way (None: not predicted)
    knowledge_weighted_against_ties: Optional[Json]
    configured_update: Optional[Json]
    method_choice: Optional[Json]  # the config as written, the menu and the knob grid, rehearsed (None: not rehearsed)
    search: Optional[List[Json]]  # every rehearsed merge: its knobs and what it kept (None: not rehearsed)
    models: List[Json]  # {file, expert, keeps, drops, notes} per recommended config


@dataclass
class PrecheckResult(Report):
    """``precheck.json``; ``recommended`` holds the recommended configs as mergekit parses them."""

    _nested: ClassVar[Dict[str, type]] = {"models": PrecheckModel, "recommendation": Recommendation}

    schema_version: str
    tool: Json
    config: str
    merge_method: str
    base_model: Optional[str]
    settings: Json  # every setting as used (settings.PrecheckSettings)
    models: List[PrecheckModel]
    pairs: List[Json]
    layers: Json
    calibration: Json
    recommendation: Recommendation
    findings: List[Json]
    skipped_diagnostics: List[str]
    failed_diagnostics: List[str]
    diagnostics: Json  # every diagnostic's raw numbers, plugins' included
    stop: List[str]  # reasons to stop the merge: the verdict's, and any plugin's
    # file (recommended.yml, recommended/<expert>.yml) -> the config, model paths absolute;
    # empty on do_not_merge. Each runs with mergekit-yaml or mergekit.merge.run_merge.
    recommended: Dict[str, "MergeConfiguration"] = field(default_factory=dict, metadata=NOT_IN_JSON, repr=False)

    @property
    def verdict(self) -> str:
        """``recommendation.verdict``: merge_as_configured, knowledge_weighted, layer_selective, leave_out,
        sign_election or do_not_merge."""
        return self.recommendation.verdict

    @property
    def experts(self) -> List[PrecheckModel]:
        return [m for m in self.models if m.role == "expert"]


@dataclass
class Evaluation(Report):
    """``evaluation.json``: per task the base, the expert and the merged model, retention and normalised gain."""

    schema_version: str
    config: str
    merged: str
    tasks: List[Json]
    scores: Json  # model -> task -> its lm-eval result


@dataclass
class Mergeability(Report):
    """``mergeability.json``: each pool model's own-task score after merging with random partners."""

    schema_version: str
    pool: str
    method: str
    parameters: Json
    partners: int
    trials: int
    seed: int
    models: List[Json]  # path, task, metric, base_score, expert_score, mergeability, interval, normalised, trials


@dataclass
class Validation(Report):
    """``validation.json``: Spearman of predicted against measured mergeability, and of each input alone."""

    schema_version: str
    precheck: str
    mergeability: str
    target: str
    models: int
    method: Optional[str]
    correlations: List[Json]
    versus_best_single: Optional[Json]


@dataclass
class Calibration(Report):
    """A fitted calibration and how it did out of sample; ``refusals`` say why it was not written
    (empty: it was, to ``written``)."""

    target: str
    knowledge_feature: str
    method: List[str]
    partners: List[int]
    model: Json
    pools: List[Json]
    models: int
    single_features: Json
    domain: Json
    out_of_sample: Json
    beats_best_single_feature: bool
    reads_first: Optional[str] = None  # "rehearsal": the prediction, where a precheck measured it
    refusals: List[str] = field(default_factory=list, metadata=NOT_IN_JSON)
    written: Optional[str] = field(default=None, metadata=NOT_IN_JSON)


@dataclass
class Sweep(Report):
    """``sweep.json``: the λ points scored, the stages, the sweet spot and the chosen config."""

    schema_version: str
    tool: Json
    models: Json
    task_vectors: bool
    task: str
    lm_eval_task: str
    metric: Optional[str]
    settings: Json
    tensors: Json
    points: List[Json]
    stages: Json
    refinement: Json
    sweet_spot: Json
    chosen_model: Optional[str]
    chosen_config: Optional[str] = None  # "chosen.yml" once written


@dataclass
class Plan(Report):
    """``plan.json``: which experts share a merged model, with which merge, and the tasks expected kept."""

    schema_version: str
    tool: Json
    config: str
    base_model: Optional[str]
    settings: Json
    objective: Json
    models: List[Json]
    experts: List[Json]
    compatibility: List[Json]
    calibration: Json
    search: Json
    checked: Optional[Json]
