"""Checks a plugin method's config once, after mergekit normalises it and before it plans.

mergekit resolves parameters tensor by tensor while planning and reports a bad
value as a multi-line pydantic error. Here every parameter of a plugin method is
resolved once per model and slice, turned into one-line errors that name the
model and parameter, and handed to the method's ``check_config(views)`` so it can
compare values across models or against the model depth, before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from pydantic import ValidationError

from mergekit_mergeability.errors import UserError


@dataclass(frozen=True)
class SliceView:
    """One output slice's parameters, resolved for its first tensor."""

    where: str
    depth: int  # decoder layers of the whole output module
    base_model: Optional[Any]
    shared: Dict[str, Any]
    per_model: Dict[Any, Dict[str, Any]]  # ModelReference -> name -> value


def _depth(module) -> int:
    return sum(s.sources[0].layer_range[1] - s.sources[0].layer_range[0] for s in module.slices)


def _resolve(method_name: str, parameter, settings, tensor_name: str, model=None) -> Any:
    from mergekit.parameter_resolver import resolve_parameter

    try:
        return resolve_parameter(parameter, settings, tensor_name=tensor_name, model=model)
    except ValidationError as error:
        problem = error.errors()[0]
        owner = f" of model {model.model.path}" if model is not None else ""
        raise UserError(
            f"{method_name}: parameter {parameter.name!r}{owner} is {problem.get('input')!r}: {problem['msg'].lower()}"
        ) from None
    except RuntimeError as error:  # mergekit: "Missing required parameter ..."
        owner = f"model {model.model.path}" if model is not None else "the config's top-level parameters"
        raise UserError(f"{method_name}: {owner} needs parameter {parameter.name!r} ({error})") from None


def slice_views(planner) -> List[SliceView]:
    from mergekit.config import ConfigReader
    from mergekit.merge_methods import ParameterScope

    spec = planner._method.spec
    views = []
    for module_name, module in planner.config.modules.items():
        depth = _depth(module)
        tensor = planner._out_module_arch(module_name).pre_weights()[0].name
        for index, output_slice in enumerate(module.slices):
            reader = ConfigReader(config=planner.config, t=0, module=module).for_out_slice(output_slice)
            base = reader.base_model
            shared_settings = tuple(reader.parameter_sources(None))
            shared = {p.name: _resolve(spec.name, p, shared_settings, tensor) for p in spec.shared_parameters}
            per_model = {}
            for source in output_slice.sources:
                settings = tuple(reader.parameter_sources(source.model))
                per_model[source.model] = {
                    p.name: _resolve(spec.name, p, settings, tensor, source.model)
                    for p in spec.input_parameters
                    if source.model != base or p.scope == ParameterScope.INPUT
                }
            views.append(SliceView(f"{module_name}.slices[{index}]", depth, base, shared, per_model))
    return views


def fill_num_layers(planner) -> None:
    """Tell a method that declares ``num_layers`` the depth of each output module."""
    for module in planner.config.modules.values():
        module.parameters = {**(module.parameters or {}), "num_layers": _depth(module)}


def check_before_planning(planner) -> None:
    from mergekit_mergeability.plugins.manager import plugin_methods

    _check_plugin_method(planner, plugin_methods())


def _check_plugin_method(planner, plugin_methods) -> None:
    method = planner._method
    if not any(method is ours for _, ours in plugin_methods):
        return
    if any(p.name == "num_layers" for p in method.spec.parameters):
        fill_num_layers(planner)
    views = slice_views(planner)
    check = getattr(method, "check_config", None)
    if check is not None:
        check(views)
