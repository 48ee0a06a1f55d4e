"""The package's own plugin: built-in methods and diagnostics, through the public hooks."""

from mergekit_mergeability.plugins import hookimpl


@hookimpl
def mergeability_merge_methods():
    from mergekit_mergeability.methods import METHODS

    return METHODS


@hookimpl
def mergeability_diagnostics():
    from mergekit_mergeability.diagnostics.compatibility import Compatibility

    return [Compatibility()]
