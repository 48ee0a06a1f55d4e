"""Predict whether fine-tuned models will merge well, and merge methods to try beside mergekit's own.

The Python API (``mergekit_mergeability.api``), re-exported here:

    import mergekit_mergeability as mm

    result = mm.precheck("merge.yml")                 # a PrecheckResult
    print(result.verdict)
    mm.evaluate, mm.mergeability, mm.sweep, mm.calibrate, mm.validate, mm.plan
    mm.PrecheckSettings, mm.RunSettings, mm.SweepSettings  # their settings
    mm.UserError, mm.MeasurementError                      # what they raise

Importing the package is cheap: it only arranges for plugin merge methods to be
registered with mergekit as soon as ``mergekit.merge_methods`` is imported. The API
and the settings load on first use.
"""

from mergekit_mergeability import gate
from mergekit_mergeability.plugins.hook import install

__version__ = "0.1.0"

install(before_planning=[gate.check], config_imported=gate.keep_documents)

_API = ("precheck", "evaluate", "mergeability", "sweep", "calibrate", "validate", "plan")
_SETTINGS = ("RunSettings", "PrecheckSettings", "SweepSettings")
_ERRORS = ("UserError", "MeasurementError")
__all__ = [*_API, *_SETTINGS, *_ERRORS]


def __getattr__(name: str):
    if name in _API:
        from mergekit_mergeability import api

        value = getattr(api, name)
    elif name in _SETTINGS:
        from mergekit_mergeability import settings

        value = getattr(settings, name)
    elif name in _ERRORS:
        from mergekit_mergeability import errors

        value = getattr(errors, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted([*globals(), *__all__])
