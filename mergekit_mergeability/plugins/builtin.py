"""The package's own plugin: built-in methods and diagnostics, through the public hooks."""

from mergekit_mergeability.plugins.manager import hookimpl


@hookimpl
def mergeability_merge_methods():
    from mergekit_mergeability.methods.knowledge_weighted import knowledge_weighted
    from mergekit_mergeability.methods.layer_selective import layer_selective

    return [knowledge_weighted, layer_selective]


@hookimpl
def mergeability_diagnostics():
    from mergekit_mergeability.diagnostics.compatibility import Compatibility
    from mergekit_mergeability.diagnostics.dilution import Dilution
    from mergekit_mergeability.diagnostics.fluency import Fluency
    from mergekit_mergeability.diagnostics.knowledge import Knowledge
    from mergekit_mergeability.diagnostics.representations import Representations
    from mergekit_mergeability.diagnostics.selectivity import Selectivity
    from mergekit_mergeability.diagnostics.weights import WeightStatistics

    # cheapest first: a precheck stops at the first error, before the heavy passes
    return [Compatibility(), WeightStatistics(), Knowledge(), Fluency(), Dilution(), Representations(), Selectivity()]
