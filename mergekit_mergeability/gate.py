"""The opt-in pre-merge gate: the stock ``mergekit-yaml`` (or ``run_merge``) runs the
precheck first and stops on a ``do_not_merge`` verdict, a plugin's reason to stop, or a
precheck that could not measure (it fails closed).

    MERGEKIT_MERGEABILITY_PRECHECK=1 mergekit-yaml config.yml ./merged          # 1, true, yes: terminal summary only
    MERGEKIT_MERGEABILITY_PRECHECK=./precheck mergekit-yaml config.yml ./merged   # any other value: also writes the report there

mergekit drops keys it does not know (``probe:``) while parsing, so the raw
document is kept as it is validated; relative paths resolve against the working
directory, as mergekit's do.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Optional

ENVIRONMENT = "MERGEKIT_MERGEABILITY_PRECHECK"
OFF, SUMMARY_ONLY = ("", "0", "false", "no"), ("1", "true", "yes")  # compared lower-cased
_documents: Dict[int, Any] = {}  # id(parsed MergeConfiguration) -> the raw document


def enabled() -> bool:
    """Set in the environment, and not the precheck's own dry run of the merge (``planned.plan``)."""
    from mergekit_mergeability.rehearsal.planned import dry_running

    return not dry_running() and os.environ.get(ENVIRONMENT, "").strip().lower() not in OFF


def report_folder() -> Optional[Path]:
    """Where the gate writes the precheck report: None for a terminal summary only."""
    value = os.environ.get(ENVIRONMENT, "").strip()
    return None if value.lower() in OFF + SUMMARY_ONLY else Path(value)


def keep_documents(module: ModuleType) -> None:
    """Wrap ``MergeConfiguration.model_validate`` to remember each raw document."""
    configuration = module.MergeConfiguration
    if getattr(configuration.model_validate, "_mergeability_kept", False):
        return
    validate = configuration.model_validate

    def model_validate(obj, *args, **kwargs):
        parsed = validate(obj, *args, **kwargs)
        if isinstance(obj, dict) and enabled():
            _documents[id(parsed)] = obj
        return parsed

    model_validate._mergeability_kept = True
    configuration.model_validate = model_validate


def check(mergekit_config) -> None:
    """Run the precheck on the config being planned; raise UserError to stop the merge."""
    if not enabled():
        return
    from mergekit_mergeability import api, merge_config
    from mergekit_mergeability.errors import MeasurementError, UserError
    from mergekit_mergeability.output.terminal import print_precheck

    document = _documents.get(id(mergekit_config)) or mergekit_config.model_dump(mode="json", exclude_none=True)
    out = report_folder()
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.sources import auto_device

    spec = merge_config.from_document(document, Path.cwd())
    try:
        result = api.precheck(spec, settings=PrecheckSettings(device=auto_device(), quiet=True), out=out)
    except MeasurementError as error:  # fail closed: no verdict is not a go-ahead
        raise UserError(f"{ENVIRONMENT} is set and the precheck could not measure: {error}") from None
    print_precheck(result, out)
    if result.stop:
        raise UserError(f"{ENVIRONMENT} is set and the precheck says stop: {result.stop[0]}")
