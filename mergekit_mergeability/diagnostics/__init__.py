"""The interface every pre-merge diagnostic (a ``precheck`` signal) implements.

A diagnostic declares what it ``needs`` — weights (streamed from safetensors), the
base model, probe data — and returns a ``DiagnosticResult``: numbers per model,
per pair of models, and per layer. ``precheck`` gathers diagnostics from the
``mergeability_diagnostics`` hook, hands each the inputs it asked for, and folds
the results into one report. Built-in signals use exactly this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from enum import Enum
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    FrozenSet,
    List,
    Optional,
    Protocol,
    Tuple,
    Union,
    runtime_checkable,
)

if TYPE_CHECKING:
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.sources import Source


class Need(str, Enum):
    WEIGHTS = "weights"  # the models' safetensors, streamed tensor by tensor
    BASE_MODEL = "base_model"  # a base model must be configured
    PROBES = "probes"  # each model's probe set (instances of its task)


@dataclass(frozen=True)
class ModelInput:
    """One model of the config, as the diagnostic sees it."""

    name: str  # the path or hub id exactly as written in the config
    # A local folder; for a hub id a sources.HubModel: os.PathLike, downloaded the first time it is
    # used as a path (Path(m.path), open, transformers), str() the hub id; or a sources.adapter.AdapterModel.
    path: "Source"
    probes: Optional[Any] = None  # the model's probe set, when PROBES is needed
    shots: Optional[Any] = None  # its fewshot: file's lines, the shots of every item; None: drawn (``probes``)
    dtype: Optional[str] = (
        None  # what a pass loads it in (the precheck resolves dtype auto per model); None: the settings'
    )
    share: Optional[float] = None  # its update's share in the configured merge, where that is a plain sum
    weight: float = 1.0  # its configured ``weight`` (per model, else global, else 1): the recommended merges keep it
    task: Optional[Any] = None  # the lm-eval task (tasks.lmeval.Task) its probe is, scored with the task's own metric

    def load_dtype(self, settings: "PrecheckSettings") -> str:
        return self.dtype or settings.dtype


def _default_settings() -> "PrecheckSettings":
    from mergekit_mergeability.settings import PrecheckSettings

    return PrecheckSettings()


@dataclass(frozen=True)
class DiagnosticInputs:
    base: Optional[ModelInput]
    models: Tuple[ModelInput, ...]  # the non-base models, in config order
    # the precheck's settings, typed (device, dtype, limit, layers, the LAPE quantiles, ...)
    settings: "PrecheckSettings" = field(default_factory=_default_settings)
    tokenizer_source: Optional[str] = None  # the config's tokenizer_source: (or tokenizer.source), as written
    # the configured update size (λ·Σ weight, or λ where the method normalises; 1 where the method
    # does not add task vectors): the scale both recommended merges, knowledge_weighted and TIES, write
    update_size: float = 1.0
    # the config's merge as mergekit plans it, output tensor -> planned.Planned (``planned.plan``);
    # None where it was not planned here (a hub model's config would be fetched)
    merge: Optional[Dict[str, Any]] = None
    # False for a dry run: no tensor's values are read, so a whole model is taken to touch every tensor
    read_weights: bool = True

    @cached_property
    def touched(self) -> Dict[str, FrozenSet[str]]:
        """Each model's name -> the tensors its update touches (``sources.changed``), read once
        per precheck for every diagnostic that rehearses a merge."""
        from mergekit_mergeability.sources import TensorReader, changed, tensor_index, tensors, update_of

        if not self.read_weights:  # headers alone: nothing downloaded, an adapter's targets known from its file
            index = tensor_index(self.base.path)
            known = lambda m: tensors(m.path).known_update() if update_of(m.path) is not None else None  # noqa: E731
            return {m.name: frozenset(known(m) or index) for m in self.models}
        base = TensorReader(self.base.path)
        return {m.name: frozenset(changed(base, m.path)) for m in self.models}

    @cached_property
    def passed_on(self) -> Dict[Tuple[str, str], Any]:
        """What one built-in signal's pass computed for another that runs after it, by (that signal,
        model name): the representations' pass counts the selectivity's active neurons
        (``rows.counted_together``). Taken by the one it is for; kept for this precheck alone."""
        return {}

    @cached_property
    def names(self) -> Dict[str, str]:
        """Each model's short name (``names.short_names``: an adapter's folder name), for progress lines."""
        from mergekit_mergeability.names import short_names

        return short_names([m.name for m in ((self.base,) if self.base else ()) + tuple(self.models)])

    @cached_property
    def written(self) -> bool:
        """Whether the config's merge as written can be built in memory on the loaded base
        (``planned.writable`` over the tensors the updates touch)."""
        from mergekit_mergeability.rehearsal.planned import writable
        from mergekit_mergeability.sources import TensorReader

        return self.merge is not None and writable(  # (no plan: no base's index read, nothing downloaded)
            self.merge, TensorReader(self.base.path).index, set().union(*self.touched.values())
        )


@dataclass
class Finding:
    """Something the user must read: ``error`` stops the precheck before heavy work."""

    severity: str  # "info" | "warning" | "error"
    message: str  # one line naming the model, tensor or field, and what to do


@dataclass
class DiagnosticResult:
    per_model: Dict[str, Dict[str, float]] = field(default_factory=dict)  # model -> metric -> value
    per_pair: Dict[Tuple[str, str], Dict[str, float]] = field(default_factory=dict)  # (a, b) -> metric -> value
    # model, or (a, b) for a pair -> metric -> one value per layer
    per_layer: Dict[Union[str, Tuple[str, str]], Dict[str, List[float]]] = field(default_factory=dict)
    per_instance: Dict[str, List[Dict[str, Any]]] = field(
        default_factory=dict
    )  # model -> one record per probe instance
    findings: List[Finding] = field(default_factory=list)


@runtime_checkable
class Diagnostic(Protocol):
    name: str
    needs: FrozenSet[Need]

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult: ...
