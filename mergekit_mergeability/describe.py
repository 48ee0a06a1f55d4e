"""What each registered merge method is, for ``mergekit-mergeability methods``."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class MethodRow:
    name: str
    origin: str  # "mergekit" or the plugin's entry-point name
    parameters: Tuple[str, ...]
    reference: Optional[str]


def _type_name(value_type) -> str:
    while typing.get_origin(value_type) is typing.Annotated:
        value_type = typing.get_args(value_type)[0]
    if typing.get_origin(value_type) is typing.Literal:
        return " | ".join(map(str, typing.get_args(value_type)))
    return getattr(value_type, "__name__", str(value_type))


def describe_parameter(parameter) -> str:
    from mergekit.merge_methods import ParameterScope

    scope = "" if parameter.scope == ParameterScope.SHARED else ", per model"
    default = "required" if parameter.required else f"= {parameter.default!r}"
    return f"{parameter.name} ({_type_name(parameter.value_type)}{scope}) {default}"


def describe_methods() -> List[MethodRow]:
    from mergekit import merge_methods

    from mergekit_mergeability.plugins import plugin_methods, register_merge_methods

    register_merge_methods()
    origins = {method.spec.name: plugin for plugin, method in plugin_methods()}
    return sorted(
        (
            MethodRow(
                name=m.spec.name,
                origin=origins.get(m.spec.name, "mergekit"),
                parameters=tuple(describe_parameter(p) for p in m.spec.parameters),
                reference=m.spec.reference_url,
            )
            for m in merge_methods.registered_methods()
        ),
        key=lambda row: (row.origin == "mergekit", row.name),
    )
