"""Every hook a mergekit-mergeability plugin can implement.

A plugin is any object or module with functions marked ``@hookimpl`` (from
``mergekit_mergeability.plugins``), published under the entry-point group
``mergekit_mergeability``. The package's own methods and diagnostics are
contributed the same way (``mergekit_mergeability.plugins.builtin``).

Each hook's docstring says what happens when a plugin's hook raises ("If it
raises"). For all of them: a plugin that fails to import is skipped with one
warning naming it, and two packages registering the same entry-point name are
refused with one line naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Mapping, Optional

import pluggy

if TYPE_CHECKING:
    from mergekit.merge_methods import MergeMethod

    from mergekit_mergeability.diagnostics import Diagnostic

PROJECT = "mergekit_mergeability"
hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def mergeability_merge_methods() -> Sequence["MergeMethod"]:
    """Contribute mergekit merge methods.

    Called once per process, right after ``mergekit.merge_methods`` is first
    imported (by the stock ``mergekit-yaml``, ``run_merge``, or user code), and by
    ``mergekit-mergeability methods``. Receives nothing. Return the methods, built
    with ``mergekit.merge_methods.merge_method`` or any ``MergeMethod``; do not
    register them yourself. All plugins' results are collected. A name mergekit
    already has is skipped with a warning. A name two plugins contribute is
    refused: importing ``mergekit.merge_methods`` raises ``UserError`` naming both
    packages (the stock ``mergekit-yaml`` prints that one line, status 2).

    If it raises: that plugin's methods are skipped with a warning naming it; the
    other plugins' methods are registered (the built-in plugin is no exception).

    Every parameter of a plugin method is resolved per model once, before mergekit
    plans or writes anything, and a bad value stops the merge with a one-line
    error naming the model. A method object may also define
    ``check_config(views)``: it receives a list of
    ``mergekit_mergeability.plugins.plan_checks.SliceView`` (resolved parameters per output
    slice, the model depth, the base model) and raises
    ``mergekit_mergeability.errors.UserError`` to reject the config.
    """


@hookspec
def mergeability_diagnostics() -> Sequence["Diagnostic"]:
    """Contribute pre-merge diagnostics (signals for ``precheck``).

    Called each time a precheck assembles its signals. Receives nothing. Return
    objects satisfying ``mergekit_mergeability.diagnostics.Diagnostic``: a
    ``name``, the inputs it ``needs`` (weights, base model, probe data) and a
    ``run(inputs)`` that returns a ``DiagnosticResult`` with values per model,
    per pair and per layer. All plugins' results are collected, in plugin order.

    ``inputs`` is a ``DiagnosticInputs``: the ``base`` and the other ``models``
    (``ModelInput``: name as written, source, probes, shots, dtype), the config's
    ``tokenizer_source`` and ``settings``, the precheck's settings typed: a
    frozen ``mergekit_mergeability.settings.PrecheckSettings`` (``device``,
    ``dtype``, ``limit``, ``batch_size``, ``layers``, ...; every default stated
    there once). Read the fields you need; a field added later leaves your
    diagnostic working. (Until schema 3.0 this was ``inputs.options``, an untyped
    mapping with the defaults restated by each reader.)
    A name two plugins contribute (a third party's ``weights``, say) refuses the
    precheck: one line naming both packages, exit 2.

    If it raises: in the built-in plugin, the precheck fails closed (exit 3, one
    line); in any other, that plugin's diagnostics are skipped with a warning
    naming it. If a diagnostic's ``run`` raises: a built-in one fails the precheck
    closed; a third party's becomes a warning finding naming the diagnostic and
    its plugin, listed in ``failed_diagnostics``, and the precheck goes on.
    """


@hookspec
def mergeability_precheck_report(report: Mapping[str, Any], config_path: str) -> Optional[str]:
    """Receive a finished precheck report, to log it or to gate a merge.

    Called once per precheck, after every diagnostic ran and the recommendation
    was made, before the report files are written. ``report`` is the
    ``precheck.json`` document (read-only); ``config_path`` the mergekit config it
    describes. Return None to let the merge go ahead, or a one-line reason to stop
    it (the opt-in pre-merge gate stops on any reason). All results are collected.

    If it raises: the report gets a warning finding naming the plugin, that
    plugin neither stops nor clears the merge, and the precheck goes on (the
    other plugins still answer, the report files are written).
    """
