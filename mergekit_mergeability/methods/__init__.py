"""The merge methods this package contributes, one file each."""

from mergekit_mergeability.methods.knowledge_weighted import knowledge_weighted, knowledge_weights
from mergekit_mergeability.methods.layer_selective import layer_selective

METHODS = (knowledge_weighted, layer_selective)

__all__ = ["METHODS", "knowledge_weighted", "knowledge_weights", "layer_selective"]
