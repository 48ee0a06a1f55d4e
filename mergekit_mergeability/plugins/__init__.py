"""Plugin glue: the hooks a plugin implements (``hookspecs``, each with its failure policy), their
discovery (``manager``), the import hook into mergekit (``hook``), the package's own plugin (``builtin``),
and plan-time checks of plugin methods and the precheck's dry run of mergekit's planning
(``plan_checks``). The opt-in pre-merge gate, which runs the precheck, is ``mergekit_mergeability.gate``.

A plugin marks its hooks with ``hookimpl``, imported from here:

    from mergekit_mergeability.plugins import hookimpl
"""

from mergekit_mergeability.plugins.manager import (
    PluginManager,
    contributions,
    hookimpl,
    load_plugins,
    plugin_diagnostics,
    plugin_manager,
    plugin_methods,
    register_merge_methods,
    results,
)

__all__ = [
    "PluginManager",
    "contributions",
    "hookimpl",
    "load_plugins",
    "plugin_diagnostics",
    "plugin_manager",
    "plugin_methods",
    "register_merge_methods",
    "results",
]
