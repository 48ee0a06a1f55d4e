"""The precheck's measurements: the config's models with their probes, every plugin's diagnostic
run on them, and the decision taken on what they measured.

load (``load_inputs``) → measure (``measure``: every diagnostic from the plugins) → decide
(``decision``: predict per model, recommend per merge, in ``decide``). ``api.precheck`` wires these
to the report (``output.precheck``: ``build`` writes the decision down, ``write`` the files).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from mergekit_mergeability import tasks
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need
from mergekit_mergeability.diagnostics.knowledge import LETTERED
from mergekit_mergeability.errors import MeasurementError, UserError
from mergekit_mergeability.merge_config import MergeSpec
from mergekit_mergeability.cost import Cost, estimate
from mergekit_mergeability.progress import note
from mergekit_mergeability.records import (
    DilutionStats,
    FluencyStats,
    KnowledgeStats,
    PairLayers,
    PairWeights,
    Record,
    WeightStats,
)
from mergekit_mergeability.settings import PrecheckSettings
from mergekit_mergeability.tasks import card, probes

if TYPE_CHECKING:
    from mergekit_mergeability.decide import Decision
    from mergekit_mergeability.decide.verdict import Cut, MethodChoice

BUILTIN = "builtin"  # the package's own plugin: if its signals cannot be measured, nothing is judged
REPORT_HOOK = "mergeability_precheck_report"
COMPATIBILITY = "compatibility"  # the header-only diagnostic that runs before mergekit plans the config
PARTS = ("menu", LETTERED)  # what --skip names beside the diagnostics: the method menu, the base's lettered view


@dataclass
class Measurements:
    spec: MergeSpec
    base: Optional[ModelInput]
    models: Tuple[ModelInput, ...]
    probe_specs: Dict[str, str] = field(default_factory=dict)  # model -> probe spec, as given
    results: Dict[str, DiagnosticResult] = field(default_factory=dict)
    skipped: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)  # third-party diagnostics that raised (warnings)
    cost: Optional[Cost] = None  # what the heavy passes were to cost, said before they ran

    def findings(self) -> List[Tuple[str, Finding]]:
        return [(name, f) for name, result in self.results.items() for f in result.findings]

    def errors(self) -> List[str]:
        return [f.message for _, f in self.findings() if f.severity == "error"]


def probe_specs(spec: MergeSpec, overrides: Mapping[str, str]) -> Dict[str, str]:
    """The config's ``probe:`` keys, then ``--probe MODEL=SPEC`` (MODEL as written, or its folder name)."""
    chosen = dict(spec.probes)
    for key, value in overrides.items():
        matches = [
            m for m in spec.models if key in (m, Path(m).name, Path(m.split("+")[-1]).name)
        ]  # BASE+ADAPTER: the adapter's name
        if len(matches) != 1:
            names = [Path(m.split("+")[-1]).name for m in spec.models]
            usable = names if len(set(names)) == len(names) and not matches else spec.models  # short where unique
            raise UserError(
                f"--probe {key}={value}: {key!r} matches {len(matches)} models of the config; name one of:"
                f" {', '.join(usable)}"
            )
        chosen[matches[0]] = value
    return chosen


def card_probes(spec: MergeSpec, chosen: Mapping[str, str], settings: PrecheckSettings) -> Dict[str, str]:
    """``chosen`` with, under ``--probes-from-card``, the first task the card of each local model
    folder without a probe proposes (``tasks.card``); each such card's probe line printed."""
    from mergekit_mergeability.sources.folder import local_folder

    folders = {m: local_folder(m.split("+")[-1], spec.folder) for m in spec.models if m not in chosen}
    proposals = card.card_probes(folders)
    for model, proposed in proposals.items():
        note(card.said(model, proposed, settings.probes_from_card), settings.quiet)
    return {**chosen, **({m: p[0] for m, p in proposals.items()} if settings.probes_from_card else {})}


def load_inputs(
    spec: MergeSpec, specs: Mapping[str, str], limit: Optional[int], dtype: str = "auto"
) -> Tuple[Optional[ModelInput], Tuple[ModelInput, ...]]:
    """The config's models with their probes, few-shot examples and the dtype each is loaded
    in (``--dtype auto``: the config's ``dtype:``, else each checkpoint's own; ``load_dtype``)."""
    from mergekit_mergeability.decide.advice import configured_shares, configured_weights
    from mergekit_mergeability.sources import load_dtype

    folder = spec.folder
    sources = spec.sources()
    dtypes = {name: load_dtype(dtype, source, spec.dtype) for name, source in sources.items()}
    base = (
        ModelInput(spec.base_model, sources[spec.base_model], dtype=dtypes[spec.base_model])
        if spec.base_model
        else None
    )
    shares, weights = configured_shares(spec.document), configured_weights(spec.document)
    models = []
    for name in spec.models:
        probe, shots, task = None, None, None
        fewshot, chat = spec.fewshot.get(name), spec.chat.get(name, False)
        if fewshot is not None:  # the model's shots, in order, for every item (``probes``)
            with spec.naming(f"{spec.entries[name]}.fewshot"):
                shots = probes.shots_from(fewshot, folder)
        if name in specs:
            with (
                spec.naming(f"{spec.entries[name]}.probe") if specs[name] == spec.probes.get(name) else nullcontext()
            ):  # --probe names itself
                probe = tasks.load(specs[name], limit, folder, fewshot, spec.answer_after.get(name))
                task = tasks.scoring_task(specs[name], folder, fewshot, chat)
                if all(i.format == probes.CODE for i in probe):  # its metric runs code: the precheck never does
                    task = None
            if chat:
                with spec.naming(f"{spec.entries[name]}.chat"):
                    tokenizer, marker = chat_tokenizer(sources[name]), spec.answer_after.get(name)
                    probe = tasks.chatted(specs[name], probe, tokenizer, folder, limit, marker, Path(name).name)
        models.append(
            ModelInput(name, sources[name], probe, shots, dtypes[name], shares.get(name), weights.get(name, 1.0), task)
        )
    return base, tuple(models)


def chat_tokenizer(source):
    """The tokenizer whose chat template asks a ``chat: true`` probe: the model's own (an adapter's
    folder, else its base's)."""
    import transformers

    from mergekit_mergeability.sources import base_of

    for candidate in (getattr(source, "folder", source), base_of(source)):  # an adapter's folder, then its base
        try:
            return transformers.AutoTokenizer.from_pretrained(candidate)
        except (OSError, ValueError):
            continue
    raise UserError(f"model {source}: no tokenizer to take a chat template from")


def measure(
    spec: MergeSpec,
    overrides: Mapping[str, str] = {},
    settings: PrecheckSettings = PrecheckSettings(),
    dry_run: bool = False,
) -> Measurements:
    """Run every plugin's diagnostic in plugin order; stop at the first error finding. Once the
    models are found to fit and the merge is planned, say what the heavy passes will cost
    (``measured.cost``); ``dry_run`` stops there.

    Fails closed: when the built-in plugin or one of its diagnostics cannot run, raise
    ``MeasurementError`` rather than judge a merge on no evidence.
    """
    from mergekit_mergeability.plugins import plugin_diagnostics, plugin_manager

    if not plugin_manager().has_plugin(BUILTIN):
        raise MeasurementError(
            "the built-in diagnostics did not load (see the warning above); reinstall mergekit-mergeability"
        )
    from mergekit_mergeability.merge_config import tokenizer_source
    from mergekit_mergeability.decide.advice import update_size

    specs = card_probes(spec, probe_specs(spec, overrides), settings)
    base, models = load_inputs(spec, specs, settings.limit, settings.dtype)
    measured = Measurements(spec, base, models, specs)
    inputs = DiagnosticInputs(base, models, settings, tokenizer_source(spec.document), update_size(spec.document))
    skip = set(settings.skip)
    diagnostics = plugin_diagnostics(strict=(BUILTIN,))
    unknown = skip - {d.name for _, d in diagnostics} - set(PARTS)
    if unknown:
        raise UserError(
            f"--skip {', '.join(sorted(unknown))}: no such diagnostic; the diagnostics are {', '.join(d.name for _, d in diagnostics)}"
            f" (and the parts {', '.join(PARTS)})"
        )
    planned = False
    for plugin, diagnostic in diagnostics:
        if measured.errors():
            measured.skipped.append(diagnostic.name)
            continue
        if diagnostic.name != COMPATIBILITY and not planned:  # the models fit together: would mergekit take the config?
            inputs = replace(inputs, merge=plan(measured, dry_run))
            planned = True
            # a dry run reads headers and config.json alone: a whole model is taken to touch every tensor
            said = replace(inputs, read_weights=False) if dry_run else inputs
            measured.cost = costs(measured, said, [d for _, d in diagnostics if runs(d, said, skip)], skip)
            note(measured.cost.line(), settings.quiet)
            if dry_run:
                return measured
        if diagnostic.name in skip:
            measured.skipped.append(diagnostic.name)
            continue
        if Need.BASE_MODEL in diagnostic.needs and base is None:
            measured.results[diagnostic.name] = DiagnosticResult(
                findings=[Finding("info", f"{diagnostic.name}: skipped, the config has no base_model")]
            )
            continue
        if Need.PROBES in diagnostic.needs and not any(m.probes for m in models):
            measured.results[diagnostic.name] = DiagnosticResult(
                findings=[
                    Finding("info", f"{diagnostic.name}: skipped, no model declares a probe (probe: key or --probe)")
                ]
            )
            continue
        try:
            measured.results[diagnostic.name] = diagnostic.run(inputs)
        except (UserError, MeasurementError):
            raise
        except Exception as error:
            message = f"diagnostic {diagnostic.name!r} from plugin {plugin!r} failed: {type(error).__name__}: {_first_line(error)}"
            if plugin == BUILTIN:
                raise MeasurementError(message) from error
            # a third party's bug must not cost the user the built-in signals: a warning, listed
            measured.failed.append(diagnostic.name)
            measured.results[diagnostic.name] = DiagnosticResult(findings=[Finding("warning", message)])
    from mergekit_mergeability import menu

    if planned and menu.NAME not in skip:
        rehearsed = menu.rehearse(measured, inputs, layer_cut(measured, settings).acting)
        if rehearsed is not None:
            measured.results[menu.NAME] = rehearsed
    return measured


def runs(diagnostic, inputs: DiagnosticInputs, skip) -> bool:
    """Whether a diagnostic will run after the compatibility check (not skipped, its needs met)."""
    return not (
        diagnostic.name in skip
        or diagnostic.name == COMPATIBILITY
        or (Need.BASE_MODEL in diagnostic.needs and inputs.base is None)
        or (Need.PROBES in diagnostic.needs and not any(m.probes for m in inputs.models))
    )


def costs(measured, inputs: DiagnosticInputs, diagnostics, skip) -> Cost:
    """What the phases will cost (``cost.estimate``). The menu's count holds the layer patch at most
    (``menu.passes``), so its merges are timed too: one a member, each taken to cost what the config
    as written costs (which blocks each keeps is known only once the representations are read)."""
    from mergekit_mergeability import menu
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, PATCH

    rehearsed = 0 if menu.NAME in skip else menu.passes(inputs)
    built = menu.merges(measured, inputs, {m.name: None for m in inputs.models}) if rehearsed else {}
    if AS_WRITTEN in built:
        built.update({f"{PATCH}, {m.name}": built[AS_WRITTEN] for m in inputs.models})
    why = "--skip menu" if menu.NAME in skip else menu.unrehearsed(inputs)
    said = [menu.said(inputs)] if rehearsed else [f"menu: not rehearsed, {why}"] if why else []
    return estimate(inputs, diagnostics, rehearsed, said + downloads(inputs), built)


def downloads(inputs: DiagnosticInputs) -> List[str]:
    """A line naming each hub model the run will download and its size, and the disk they need
    (none where every one is in the Hugging Face cache)."""
    from mergekit_mergeability.cost import size
    from mergekit_mergeability.sources import base_of
    from mergekit_mergeability.sources.hub import HubModel

    models = {str(base_of(m.path)): base_of(m.path) for m in (inputs.base, *inputs.models) if m is not None}
    coming = {name: model.download() for name, model in models.items() if isinstance(model, HubModel)}
    coming = {name: found for name, found in coming.items() if found}
    if not coming:
        return []
    each = ", ".join(f"{name} {size(found)}" for name, found in coming.items())
    return [f"downloads: {each} ({size(sum(coming.values()))} of disk, into the Hugging Face cache)"]


def plan(measured: Measurements, dry_run: bool = False) -> Optional[Dict[str, Any]]:
    """The merge as mergekit plans it (``planned.plan``), before the heavy passes: a config the
    merge would refuse is one line now, not a recommendation that fails later; the rehearsal
    merges its tensors in memory. A hub model is planned as mergekit plans it, from its snapshot
    (downloaded once into the Hugging Face cache, or found there offline); None in a dry run that
    would have to download one."""
    from mergekit_mergeability.merge_config import absolute
    from mergekit_mergeability.rehearsal.planned import plan as planned
    from mergekit_mergeability.sources import on_hub
    from mergekit_mergeability.sources.hub import offline

    sources = {m.name: m.path for m in ([measured.base] if measured.base else []) + list(measured.models)}
    if dry_run and any(map(on_hub, sources.values())) and not offline():
        return None
    return planned(absolute(measured.spec.document, sources), measured.spec.source)


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [""])[0]


def metrics(results: Mapping[str, DiagnosticResult], diagnostic: str, model: str) -> Optional[Dict[str, float]]:
    """A diagnostic's values for one model; None when the diagnostic did not run."""
    return results[diagnostic].per_model.get(model) if diagnostic in results else None


def per_layer(results: Mapping[str, DiagnosticResult], diagnostic: str, pairs: bool = True) -> Dict:
    """A diagnostic's per-layer values keyed by pair (``pairs``) or by model."""
    if diagnostic not in results:
        return {}
    return {k: v for k, v in results[diagnostic].per_layer.items() if isinstance(k, tuple) == pairs}


RECORDS = {"knowledge": KnowledgeStats, "weights": WeightStats, "dilution": DilutionStats, "fluency": FluencyStats}


def blocks(results: Mapping[str, DiagnosticResult], model: str) -> Dict[str, Optional[Record]]:
    """A model's measurements, one record per built-in diagnostic (``RECORDS``; None where it did
    not run), as precheck.json's ``models`` hold them: the weights with their layers."""
    found = {
        name: None if v is None else record.of(v)
        for name, record in RECORDS.items()
        for v in [metrics(results, name, model)]
    }
    if found["weights"] is not None:
        found["weights"] = WeightStats.measured(
            metrics(results, "weights", model), per_layer(results, "weights", False).get(model)
        )
    return found


def experts(measured: Measurements) -> List[Dict[str, Any]]:
    """Each expert as ``decide`` reads it (and precheck.json's ``models``): its path, role and records."""
    return [{"path": m.name, "role": "expert", **blocks(measured.results, m.name)} for m in measured.models]


def curves(results: Mapping[str, DiagnosticResult]) -> Tuple[Dict, Dict]:
    """Per pair, per layer: the unbiased CKA (``representations``) and the group-specific neurons'
    overlap (``selectivity``); empty where the diagnostic did not run."""
    return (
        {pair: PairLayers.of(layers).cka_unbiased for pair, layers in per_layer(results, "representations").items()},
        {pair: PairLayers.of(layers).specific_overlap for pair, layers in per_layer(results, "selectivity").items()},
    )


def layer_cut(measured: Measurements, settings: PrecheckSettings) -> "Cut":
    """Where the decision will find the fine-tunes part (``verdict.layer_cut``), from what was measured."""
    from mergekit_mergeability.decide.verdict import layer_cut as cut

    cka, overlaps = curves(measured.results)
    base = measured.spec.base_model
    return cut(
        experts(measured),
        cka,
        overlaps,
        base,
        settings.cka_threshold,
        settings.overlap_threshold,
        settings.cutoff_signal,
    )


def decision(
    measured: Measurements,
    settings: PrecheckSettings = PrecheckSettings(),
    against_ties: Optional[Callable[[Dict[str, Any]], Optional[Tuple[float, float]]]] = None,
) -> "Decision":
    """The decision on the measurements (``decide.decide``), with the calibration of ``settings``
    (None: the shipped one) and the cut-off's thresholds and signal. ``against_ties``: given the
    experts as precheck.json holds them (``models``, ``pairs``), knowledge_weighted's and TIES's
    predicted mean score (``planner.decide.knowledge_weighted_against_ties``, which api passes)."""
    from mergekit_mergeability import menu
    from mergekit_mergeability.decide import decide
    from mergekit_mergeability.decide.advice import configured_weights
    from mergekit_mergeability.decide.tuning import methods
    from mergekit_mergeability.decide.calibration import Calibration
    from mergekit_mergeability.names import short_names

    spec, results = measured.spec, measured.results
    names = short_names([m.name for m in ([measured.base] if measured.base else []) + list(measured.models)])
    members = experts(measured)
    weights = {
        pair: PairWeights.of(values)
        for pair, values in (results["weights"].per_pair if "weights" in results else {}).items()
    }
    knowledge = {e["path"]: KnowledgeStats.of(e["knowledge"]).scored_mean_p_gold for e in members}
    pairs = [{"a": a, "b": b, **values.json()} for (a, b), values in weights.items()]
    return decide(
        members,
        Calibration.load(settings.calibration),
        configured_weights(spec.document),
        {pair: values.cosine for pair, values in weights.items()},
        *curves(results),
        base=spec.base_model,
        method=spec.merge_method,
        errors=measured.errors(),
        threshold=settings.cka_threshold,
        overlap_threshold=settings.overlap_threshold,
        signal=settings.cutoff_signal,
        label=names.get,
        against_ties=against_ties({"models": members, "pairs": pairs}) if against_ties else None,
        choice=rehearsed_choice(results[menu.NAME], knowledge, methods(spec.document, knowledge))
        if menu.NAME in results
        else None,
    )


def rehearsed_choice(result: DiagnosticResult, knowledge, methods: Mapping[str, str]) -> "MethodChoice":
    """The choice among the rehearsed candidates (``verdict.choose_method``): against the config as
    written, or against the layer patch where it was rehearsed (research/pools/prereg/patch.txt,
    amendment 1: the cut-off's patch stands unless a merge beats it on items it was not picked on)."""
    from mergekit_mergeability import menu
    from mergekit_mergeability.decide.verdict import AS_WRITTEN, PATCH, choose_method

    scores = menu.scored(result)
    baseline = PATCH if PATCH in scores else AS_WRITTEN
    return choose_method(scores, knowledge, {**methods, PATCH: "layer_selective"}, baseline=baseline)
