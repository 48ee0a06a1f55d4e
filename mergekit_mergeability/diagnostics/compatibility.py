"""Can these models be merged at all? From config.json and safetensors headers only.

Runs before anything heavy: no tensor is read, so a mismatch in architecture,
depth, vocabulary or any tensor's shape is reported in well under a second.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Tuple

from mergekit_mergeability.checkpoints import model_config, tensor_index
from mergekit_mergeability.diagnostics import DiagnosticInputs, DiagnosticResult, Finding, ModelInput, Need

Shapes = Dict[str, Tuple[int, ...]]


def tensor_shapes(folder: Path) -> Shapes:
    """Every tensor's shape from the safetensors headers in ``folder`` (no data read)."""
    return {name: info.shape for name, info in tensor_index(folder).items()}


class Compatibility:
    name = "compatibility"
    needs = frozenset({Need.WEIGHTS})

    def run(self, inputs: DiagnosticInputs) -> DiagnosticResult:
        result = DiagnosticResult()
        reference, *others = [m for m in (inputs.base, *inputs.models) if m is not None]
        ref_config, ref_shapes = model_config(reference.path), tensor_shapes(reference.path)
        result.per_model[reference.name] = _summary(ref_config, ref_shapes)
        for model in others:
            config, shapes = model_config(model.path), tensor_shapes(model.path)
            result.per_model[model.name] = _summary(config, shapes)
            result.findings.extend(_compare(reference, ref_config, ref_shapes, model, config, shapes))
        return result


def _summary(config: dict, shapes: Shapes) -> Dict[str, float]:
    parameters = sum(math.prod(shape) for shape in shapes.values())
    return {"num_layers": config.get("num_hidden_layers", config.get("n_layer", 0)), "parameters": parameters}


def _compare(reference: ModelInput, ref_config: dict, ref_shapes: Shapes, model: ModelInput, config: dict, shapes: Shapes):
    against = f"{model.name} vs {reference.name}"
    for key in ("architectures", "num_hidden_layers", "hidden_size", "vocab_size"):
        if key in ref_config and ref_config.get(key) != config.get(key):
            severity = "warning" if key == "vocab_size" else "error"
            hint = " (align with a tokenizer: source in the config)" if key == "vocab_size" else ""
            yield Finding(severity, f"{against}: {key} is {config.get(key)} vs {ref_config[key]}{hint}")
    vocab_sizes = {ref_config.get("vocab_size"), config.get("vocab_size")} - {None}
    for name, shape in ref_shapes.items():
        if name not in shapes:
            yield Finding("error", f"{against}: tensor {name} is missing from {model.name}")
        elif shapes[name] != shape and not (len(vocab_sizes) > 1 and vocab_sizes & {*shape, *shapes[name]}):
            yield Finding("error", f"{against}: tensor {name} has shape {list(shapes[name])} vs {list(shape)}")
