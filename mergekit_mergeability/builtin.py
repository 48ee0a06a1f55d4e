"""The package's own plugin: built-in methods and diagnostics, through the public hooks."""

from mergekit_mergeability.plugins import hookimpl


@hookimpl
def mergeability_merge_methods():
    from mergekit_mergeability.methods import METHODS

    return METHODS
