"""The merge methods this package contributes, one file each.

``mergekit.merge_methods`` is imported before the method modules: its import
fires the registration hook, which imports them (``builtin.py``), and they must
not be half-initialised at that moment.
"""

import mergekit.merge_methods  # noqa: F401  (see above)

from mergekit_mergeability.methods.knowledge_weighted import knowledge_weighted, knowledge_weights
from mergekit_mergeability.methods.layer_selective import layer_selective

__all__ = ["knowledge_weighted", "knowledge_weights", "layer_selective"]
