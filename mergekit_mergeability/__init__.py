"""Predict whether fine-tuned models will merge well, and merge methods that lose less.

Importing the package is cheap: it only arranges for plugin merge methods to be
registered with mergekit as soon as ``mergekit.merge_methods`` is imported.
"""

from mergekit_mergeability import _hook

__version__ = "0.1.0"

_hook.install()
