"""What a command runs with, typed: every default stated once, here, beside the constant it names.

``RunSettings`` is what every command that runs models shares (lm-eval's names where it has
them); ``PrecheckSettings`` adds the precheck's (plan reads the same); ``SweepSettings`` the
interpolation sweep's. They travel as they are from the Python API (``mergekit_mergeability.api``)
and the CLI down to the code that reads them: a diagnostic receives ``DiagnosticInputs.settings``,
a ``PrecheckSettings``.

Settings are frozen: derive a variant with ``dataclasses.replace(settings, limit=16)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, FrozenSet, Optional, Tuple

from mergekit_mergeability.decide.verdict import DEFAULT_OVERLAP_THRESHOLD, DEFAULT_THRESHOLD
from mergekit_mergeability.maths.lape import ACTIVATION_QUANTILE, ENTROPY_QUANTILE

AUTO = "auto"  # device: cuda if available (on a Ray cluster: if the cluster has GPUs); dtype: see sources.load_dtype
DTYPES = ("float32", "bfloat16", "float16")  # what models can be loaded in, besides auto
BATCH_SIZE = 16
PRECHECK_LIMIT = 64  # probe instances per model: enough for the knowledge signal, cheap for the passes
# Solved examples before each question; chosen by measurement on the project's fit pool
# (research/pools.py, README "How the prediction was fitted"), never on the held-out pool.
DEFAULT_FEWSHOT = 3
TUNE_CANDIDATES = 10  # the default --tune-budget: this many candidates of the knob grid, each one pass over every probe
CUTOFF_SIGNALS = ("cka", "selectivity", "both")  # what sets the layer cut-off (decide.verdict.decide_cutoff)
SELECTIVITY_SPANS = ("answer", "prompt")  # the tokens of a probe line whose MLP activations LAPE counts
LAMBDAS = tuple(round(i / 10, 1) for i in range(11))  # the sweep's grid: 0 to 1 by 0.1
MARKER = "</think>"
NOT_RECORDED = ("quiet",)  # changes what is printed, never a result: left out of the reports


@dataclass(frozen=True)
class RunSettings:
    """What every command that runs models shares."""

    limit: Optional[int] = None  # instances per task or probe set; None: all of them
    device: str = AUTO  # cpu, cuda, cuda:1, mps…
    dtype: str = AUTO  # what the models are loaded in (auto: each checkpoint's own); statistics stay float32
    batch_size: int = BATCH_SIZE
    quiet: bool = False  # no progress bars
    confirm_run_unsafe_code: bool = False  # lm-eval's opt-in: run code tasks' generated code to score them

    def to_json(self) -> Dict[str, Any]:
        """The settings as a report records them: sets as sorted lists, tuples as lists, ``quiet`` left out."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in NOT_RECORDED}


@dataclass(frozen=True)
class PrecheckSettings(RunSettings):
    """The precheck's settings (``plan`` measures with them too). A diagnostic reads them as
    ``inputs.settings``; a third party's diagnostic reads the fields it knows and ignores the rest."""

    limit: Optional[int] = PRECHECK_LIMIT
    dtype: str = AUTO  # the config's dtype:, else each checkpoint's own torch_dtype, else float32
    fewshot: int = DEFAULT_FEWSHOT  # solved examples before each multiple-choice probe question
    calibration: Optional[str] = None  # a calibration file from `calibrate`; None: the one shipped
    layers: Optional[FrozenSet[int]] = None  # only compare these representation layers; None: all
    cka_threshold: float = DEFAULT_THRESHOLD
    cka_batch_size: int = 0  # rows per minibatch of the unbiased CKA; 0: one batch of all rows
    selectivity_span: str = SELECTIVITY_SPANS[0]
    lape_entropy_quantile: float = ENTROPY_QUANTILE
    lape_activation_quantile: float = ACTIVATION_QUANTILE
    cutoff_signal: str = CUTOFF_SIGNALS[0]
    overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD
    skip: Tuple[str, ...] = ()  # diagnostics not to run
    cache_dir: Optional[str] = None  # where each model's pass results are kept; None: nowhere
    # probe sequences the knob grid may spend beyond the menu; None: TUNE_CANDIDATES' worth
    tune_budget: Optional[int] = None
    probes_from_card: bool = False  # a model without a probe asks the first task its card names (``tasks.card``)


@dataclass(frozen=True)
class SweepSettings(RunSettings):
    """The interpolation sweep's settings: θ(λ) = λ·B + (1 − λ)·A at ``lambdas``, refined."""

    dtype: str = "float32"  # both ends in one dtype, whatever each checkpoint's own
    lambdas: Tuple[float, ...] = LAMBDAS
    marker: str = MARKER  # a regex: answers containing it count towards the marker rate
    budget: Optional[float] = None  # tokens per answer: the sweet spot is then the best accuracy within it
    layers: Optional[FrozenSet[int]] = None  # interpolate only these layers (everything else is A's)
    modules: Optional[str] = None  # interpolate only "mlp" or only "attention" tensors
    samples: int = 1  # answers per problem: 1 is greedy, more are sampled at ``temperature``
    temperature: float = 0.7
    seed: int = 0
    refine: int = 8  # at most this many λ added where the curves change fastest
    resolution: float = 0.025  # refine until the transition is located to ± this
    tolerance: float = 0.05  # without a budget, accuracy within this of the best counts as matching it


def default(settings: type, name: str) -> Any:
    """A settings class's default for one field (the CLI shows it and falls back to it)."""
    return next(f.default for f in fields(settings) if f.name == name)


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value
