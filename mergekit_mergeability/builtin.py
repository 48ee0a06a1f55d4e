"""The built-in plugin's old entry point, ``mergekit_mergeability.builtin``: an environment installed
before the plugin glue moved to ``plugins/`` still names it in its metadata. New installs name
``mergekit_mergeability.plugins.builtin`` (pyproject.toml); this goes once none names it."""

from mergekit_mergeability.plugins.builtin import mergeability_diagnostics, mergeability_merge_methods

__all__ = ["mergeability_diagnostics", "mergeability_merge_methods"]
