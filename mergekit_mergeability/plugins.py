"""Plugin discovery (pluggy + entry points) and registration into mergekit."""

from __future__ import annotations

import functools
import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Collection, Iterable, List, Tuple

import pluggy

from mergekit_mergeability import hookspecs
from mergekit_mergeability.hookspecs import PROJECT

hookimpl = pluggy.HookimplMarker(PROJECT)


def _warn(message: str) -> None:
    warnings.warn(f"mergekit-mergeability: {message}", RuntimeWarning, stacklevel=3)


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every installed plugin loaded."""
    return load_plugins(entry_points(group=PROJECT))


def load_plugins(found: Iterable[EntryPoint]) -> pluggy.PluginManager:
    """A plugin manager with these entry points' plugins; one that fails to import is
    skipped with one warning naming it."""
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(hookspecs)
    for entry_point in found:
        if manager.has_plugin(entry_point.name):
            continue
        try:
            manager.register(entry_point.load(), name=entry_point.name)
        except Exception as error:  # any failure in third-party code
            _warn(f"plugin {entry_point.name!r} ({entry_point.value}) failed to load and is skipped: {error}")
    return manager


def contributions(
    hook_name: str, manager: pluggy.PluginManager | None = None, strict: Collection[str] = (), **kwargs: Any
) -> List[Tuple[str, Any]]:
    """Call one hook on every plugin; return (plugin name, item) pairs in plugin order.

    A plugin whose hook raises is skipped with a warning naming it, except the
    ``strict`` ones: their failure raises ``MeasurementError`` (nothing may be judged
    without them).
    """
    from mergekit_mergeability.errors import MeasurementError

    manager = manager or plugin_manager()
    found = []
    for impl in reversed(getattr(manager.hook, hook_name).get_hookimpls()):
        try:
            items = impl.function(**kwargs)
        except Exception as error:
            if impl.plugin_name in strict:
                raise MeasurementError(f"plugin {impl.plugin_name!r} failed in {hook_name}: {type(error).__name__}: {error}") from error
            _warn(f"plugin {impl.plugin_name!r} failed in {hook_name} and is skipped: {error}")
            continue
        found.extend((impl.plugin_name, item) for item in items or ())
    return found


@functools.cache
def plugin_methods() -> Tuple[Tuple[str, Any], ...]:
    """(plugin name, merge method) for every plugin's methods, collected once."""
    return tuple(contributions("mergeability_merge_methods"))


def register_merge_methods(found: Iterable[Tuple[str, Any]] | None = None) -> List[str]:
    """Make plugins' methods (default: every installed plugin's) known to mergekit by
    name; safe to call again. Returns the names this call registered."""
    from mergekit import merge_methods

    registered = {method.spec.name: method for method in merge_methods.registered_methods()}
    added = []
    for plugin, method in plugin_methods() if found is None else found:
        name = method.spec.name
        if registered.get(name) is method:
            continue
        if name in registered:
            _warn(f"merge method {name!r} from plugin {plugin!r} is skipped: the name is already taken")
            continue
        merge_methods.register(method)
        registered[name] = method
        added.append(name)
    return added
