"""Can these models be merged at all? From config.json, safetensors headers and tokenizer files.

Runs before anything heavy: no tensor is read (for a hub model, not even downloaded),
so a mismatch in architecture, depth, width or any tensor's shape, or vocabularies
whose token ids mean different words, is reported in well under a second. Each
problem is one line naming both models, with a count and the first example.

Severities as mergekit's own pre-merge checker sets them (mergekit-check-compat): shapes and
depth an error; ``model_type``, RoPE settings, vocabularies, special and FIM tokens a warning; chat
templates an info line.

Reads ``inputs.tokenizer_source``: what the config's ``tokenizer_source:`` (or
``tokenizer:``) key says, if anything (``config.tokenizer_source``). When
set, mergekit builds one vocabulary and differing ones are fine.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Dict, Iterator, List, Optional, Tuple

from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources import Source, inferred_architecture, model_config, tensor_index, vocabulary

Shapes = Dict[str, Tuple[int, ...]]

# config keys, in Hugging Face's and GPT-2's spellings, whose change reshapes tensors
WIDTH = (
    "hidden_size",
    "n_embd",
    "intermediate_size",
    "n_inner",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
)
DEPTH = ("num_hidden_layers", "n_layer")
FIM = re.compile(
    r"fim|<(PRE|SUF|MID)>", re.IGNORECASE
)  # fill-in-the-middle tokens (StarCoder, Qwen, DeepSeek, CodeLlama)


def tensor_shapes(model: Source) -> Shapes:
    """Every tensor's shape from the safetensors headers (no data read, nothing downloaded)."""
    return {name: info.shape for name, info in tensor_index(model).items()}


class Compatibility:
    name = "compatibility"
    needs = frozenset({Need.WEIGHTS})
    align = "set tokenizer_source: union (or base) in the config so mergekit aligns them"  # what fixes different vocabularies

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        source = inputs.tokenizer_source
        reference, *others = [m for m in (inputs.base, *inputs.models) if m is not None]
        ref = _Facts(reference)
        result.per_model[reference.name] = ref.summary()
        result.findings.extend(_unnamed_architecture(ref))
        for model in others:
            facts = _Facts(model)
            result.per_model[model.name] = facts.summary()
            result.findings.extend(_unnamed_architecture(facts))
            result.findings.extend(_compare(ref, facts))
            result.findings.extend(_compare_vocabularies(ref, facts, source, self.align))
        return result


def require_compatible(base: ModelInput, models: List[ModelInput]) -> None:
    """Raise the first incompatibility as a UserError: for commands that merge in memory,
    where no tokenizer is rebuilt and a shape mismatch would end in a traceback."""
    check = Compatibility()
    check.align = "merges in memory align no vocabularies, so use models that share one tokenizer"
    result = check.run(DiagnosticInputs(base, tuple(models)))
    errors = [f.message for f in result.findings if f.severity == "error"]
    if errors:
        raise UserError(errors[0])


class _Facts:
    """One model's config, tensor shapes and vocabulary (read once, on first use)."""

    def __init__(self, model: ModelInput):
        self.name = model.name
        self.config = model_config(model.path)
        self.shapes = tensor_shapes(model.path)
        self.source = model.path

    @functools.cached_property
    def vocabulary(self) -> Optional[vocabulary.Vocabulary]:
        return vocabulary.read(self.source)

    def summary(self) -> Dict[str, float]:
        parameters = sum(math.prod(shape) for shape in self.shapes.values())
        return {
            "num_layers": self.config.get("num_hidden_layers", self.config.get("n_layer", 0)),
            "parameters": parameters,
        }


def _unnamed_architecture(facts: _Facts) -> Iterator[Finding]:
    inferred = inferred_architecture(facts.source)  # None for an adapter: its base's is checked as the base
    if inferred:
        yield Finding(
            "warning",
            f'{facts.name}: its config.json has no "architectures" list; measured as {inferred} (its model_type), and '
            f'recommended.yml names it so (override_architecture); add "architectures": ["{inferred}"] to the file for mergekit-yaml to take your own config',
        )


def _compare(ref: _Facts, model: _Facts) -> Iterator[Finding]:
    against = f"{model.name} vs {ref.name}"

    def changed(keys) -> List[str]:
        return [
            f"{k} is {model.config.get(k)} vs {ref.config[k]}"
            for k in keys
            if k in ref.config and ref.config[k] != model.config.get(k)
        ]

    architecture = changed(["architectures"])
    if architecture:  # every tensor differs then: one line says it all
        yield Finding("error", f"{against}: {architecture[0]}; only models of one architecture merge")
        return
    vocab_sizes = {ref.config.get("vocab_size"), model.config.get("vocab_size")} - {None}
    reshaped = [
        (name, shape, model.shapes[name])
        for name, shape in ref.shapes.items()
        if name in model.shapes
        and model.shapes[name] != shape
        and not (
            len(vocab_sizes) > 1 and vocab_sizes & {*shape, *model.shapes[name]}
        )  # the vocabulary line covers these
    ]
    missing = [name for name in ref.shapes if name not in model.shapes]
    extra = [name for name in model.shapes if name not in ref.shapes]
    shapes = [f"{len(reshaped)} tensors differ in shape; first: {n} {list(b)} vs {list(a)}" for n, a, b in reshaped[:1]]
    names = [f"{len(missing)} tensors of {ref.name} missing from {model.name}; first: {n}" for n in missing[:1]]
    names += [f"{len(extra)} tensors of {model.name} not in {ref.name}; first: {n}" for n in extra[:1]]
    for keys, evidence in ((changed(WIDTH), shapes), (changed(DEPTH), names)):
        if keys or evidence:
            details = f" ({'; '.join(evidence)})" if keys and evidence else "; ".join(evidence)
            yield Finding("error", f"{against}: {', '.join(keys)}{details}")
    for size in changed(["vocab_size"]):
        yield Finding("warning", f"{against}: {size} (align with a tokenizer: source in the config)")
    for kind in changed(["model_type"]):
        yield Finding(
            "warning",
            f"{against}: {kind}; the shapes agree, but activations, attention or norms may not mean the same: merge models of one model_type",
        )
    theirs, mine = rope_settings(ref.config), rope_settings(model.config)
    rope = [f"{k} is {v} vs {theirs.get(k)}" for k, v in _differing(theirs, mine)]
    if rope:
        yield Finding(
            "warning",
            f"{against}: RoPE differs ({'; '.join(rope)}); the merge keeps one config's, so the other's positions are read otherwise "
            "(a long-context fine-tune loses coherence): merge models that share one RoPE setting",
        )


def rope_settings(config: dict) -> Dict[str, object]:
    """A config's rotary position settings, wherever its transformers version wrote them
    (``rope_theta`` and ``rope_scaling`` at the top, or ``rope_parameters``)."""
    found = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
    if "rope_theta" in config:
        found["rope_theta"] = config["rope_theta"]
    if "type" in found and "rope_type" in found:  # the old spelling beside the new
        del found["type"]
    return found


def _differing(a: Dict[str, object], b: Dict[str, object]) -> List[Tuple[str, object]]:
    """(key, b's value) where ``b`` says otherwise than ``a`` (a "default" rope_type equals none)."""
    plain = lambda d, k: None if k == "rope_type" and d.get(k) in (None, "default") else d.get(k)  # noqa: E731
    return [(k, b.get(k)) for k in sorted(a.keys() | b.keys()) if plain(a, k) != plain(b, k)]


def _compare_vocabularies(ref: _Facts, model: _Facts, source: Optional[str], align: str) -> Iterator[Finding]:
    against = f"{model.name} vs {ref.name}"
    lacking = [f.name for f in (model, ref) if f.vocabulary is None]
    if lacking:
        yield Finding("info", f"{against}: tokenizers not compared, {lacking[0]} has no tokenizer files")
        return
    a, b = ref.vocabulary, model.vocabulary
    if a.tokens != b.tokens:
        ref_ids, ids = a.ids(), b.ids()
        clashes = sorted(i for i in ref_ids.keys() & ids.keys() if ref_ids[i] != ids[i])
        if clashes:
            first = clashes[0]
            what = f"vocabularies differ: {len(clashes)} of {len(ref_ids.keys() & ids.keys())} shared token ids mean different tokens (first: id {first} is {ids[first]!r} vs {ref_ids[first]!r})"
            if source:
                yield Finding("info", f"{against}: {what}; tokenizer_source: {source} aligns them")
            else:
                yield Finding("error", f"{against}: {what}, so a merge garbles text; {align}")
        elif (added := sorted(ref_ids.keys() ^ ids.keys())) and ref.config.get("vocab_size") == model.config.get(
            "vocab_size"
        ):  # else the vocab_size line says it
            token = ids.get(added[0], ref_ids.get(added[0]))
            yield Finding(
                "info" if source else "warning",
                f"{against}: vocabularies differ by {len(added)} added tokens (first: id {added[0]} {token!r}); set tokenizer_source: union in the config to keep them",
            )
    special = [
        f"{k} {b.special[k]!r} vs {a.special[k]!r}" for k in vocabulary.SPECIAL_TOKENS if a.special[k] != b.special[k]
    ]
    if special:
        yield Finding(
            "warning",
            f"{against}: special tokens differ ({', '.join(special)}); the merge keeps one tokenizer's, so the other model's may stop or pad wrongly",
        )
    fim = {f.name: sorted(t for t in f.vocabulary.tokens if FIM.search(t)) for f in (ref, model)}
    if bool(fim[ref.name]) != bool(fim[model.name]):
        having, lacking = (ref, model) if fim[ref.name] else (model, ref)
        yield Finding(
            "warning",
            f"{against}: {having.name} has fill-in-the-middle tokens ({', '.join(fim[having.name][:3])}), {lacking.name} none; "
            "a merge with the other's tokenizer cannot infill code: set tokenizer_source: union in the config to keep them",
        )
    if a.chat_template != b.chat_template:
        yield Finding(
            "info",
            f"{against}: chat templates differ; the merge keeps one tokenizer's, so prompts in the other's format may not work",
        )
