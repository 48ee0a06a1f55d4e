"""Plugin discovery (pluggy + entry points), each hook called with its failure policy, and the
registration of plugins' merge methods into mergekit (``register_merge_methods``; ``hook`` calls
it when mergekit is imported)."""

from __future__ import annotations

import functools
import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Collection, Dict, Iterable, List, Tuple

import pluggy

from mergekit_mergeability.plugins import hookspecs
from mergekit_mergeability.plugins.hookspecs import PROJECT

hookimpl = pluggy.HookimplMarker(PROJECT)


def _warn(message: str) -> None:
    warnings.warn(f"mergekit-mergeability: {message}", RuntimeWarning, stacklevel=3)


class PluginManager(pluggy.PluginManager):
    """pluggy's plugin manager with this project's hooks, knowing which package each plugin came from."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(hookspecs)
        self.packages: Dict[str, str] = {}  # plugin name -> the distribution of its entry point

    def origin(self, name: str) -> str:
        """A plugin and where it comes from: its package, or the module of one registered in code."""
        plugin = self.get_plugin(name)
        source = self.packages.get(name) or getattr(plugin, "__name__", None) or type(plugin).__module__
        return f"{name!r} ({source})"


@functools.cache
def plugin_manager() -> PluginManager:
    """The process-wide plugin manager, with every installed plugin loaded."""
    return load_plugins(entry_points(group=PROJECT))


def load_plugins(found: Iterable[EntryPoint]) -> PluginManager:
    """A plugin manager with these entry points' plugins; one that fails to import is
    skipped with one warning naming it. Two packages claiming one plugin name are refused."""
    from mergekit_mergeability.errors import UserError

    manager = PluginManager()
    for entry_point in found:
        package = entry_point.dist.name if entry_point.dist else entry_point.value
        if manager.has_plugin(entry_point.name):
            if manager.packages.get(entry_point.name) == package:
                continue  # the same package seen twice on sys.path
            raise UserError(
                f"two packages register the plugin {entry_point.name!r}: {manager.packages.get(entry_point.name)} and {package}; uninstall one of them"
            )
        try:
            manager.register(entry_point.load(), name=entry_point.name)
        except Exception as error:  # any failure in third-party code
            _warn(f"plugin {entry_point.name!r} ({entry_point.value}) failed to load and is skipped: {error}")
            continue
        manager.packages[entry_point.name] = package
    return manager


def results(
    hook_name: str,
    manager: PluginManager | None = None,
    strict: Collection[str] = (),
    failed: Callable[[str], None] = _warn,
    **kwargs: Any,
) -> List[Tuple[str, Any]]:
    """Call one hook on every plugin; return (plugin name, what it returned) in plugin order.

    A plugin whose hook raises is left out and ``failed`` (default: a warning) gets one
    line naming it, except the ``strict`` ones: their failure raises ``MeasurementError``
    (nothing may be judged without them).
    """
    from mergekit_mergeability.errors import MeasurementError

    manager = manager or plugin_manager()
    found = []
    for impl in reversed(getattr(manager.hook, hook_name).get_hookimpls()):
        try:
            found.append((impl.plugin_name, impl.function(**kwargs)))
        except Exception as error:
            why = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            if impl.plugin_name in strict:
                raise MeasurementError(f"plugin {impl.plugin_name!r} failed in {hook_name}: {why}") from error
            failed(f"plugin {impl.plugin_name!r} failed in {hook_name} and is skipped: {why}")
    return found


def contributions(
    hook_name: str, manager: PluginManager | None = None, strict: Collection[str] = (), **kwargs: Any
) -> List[Tuple[str, Any]]:
    """``results`` of a hook that returns a list: (plugin name, item) pairs in plugin order."""
    return [(plugin, item) for plugin, items in results(hook_name, manager, strict, **kwargs) for item in items or ()]


def _refuse_duplicates(
    kind: str, found: List[Tuple[str, Any]], name_of: Callable[[Any], str], manager: PluginManager | None
) -> None:
    """One name, one thing: a name two plugins contribute would make one silently replace the other."""
    from mergekit_mergeability.errors import UserError

    manager = manager or plugin_manager()
    first: Dict[str, str] = {}
    for plugin, item in found:
        name = name_of(item)
        if name in first:
            raise UserError(
                f"two plugins contribute a {kind} named {name!r}: {manager.origin(first[name])} and {manager.origin(plugin)}; uninstall one of them"
            )
        first[name] = plugin


def plugin_diagnostics(manager: PluginManager | None = None, strict: Collection[str] = ()) -> List[Tuple[str, Any]]:
    """(plugin name, diagnostic) for every plugin's diagnostics, each name once."""
    found = contributions("mergeability_diagnostics", manager, strict)
    _refuse_duplicates("diagnostic", found, lambda diagnostic: diagnostic.name, manager)
    return found


@functools.cache
def plugin_methods(manager: PluginManager | None = None) -> Tuple[Tuple[str, Any], ...]:
    """(plugin name, merge method) for every plugin's methods, each name once; collected once."""
    found = contributions("mergeability_merge_methods", manager)
    _refuse_duplicates("merge method", found, lambda method: method.spec.name, manager)
    return tuple(found)


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
