"""Run code right after a mergekit module is imported, without importing it first.

mergekit 0.1.5 has no plugin discovery, so the package registers its plugins'
methods the moment ``mergekit.merge_methods`` is imported, wherever that happens:
in the stock ``mergekit-yaml`` (through the ``.pth`` file the wheel installs), or
in user code after ``import mergekit_mergeability`` (``install``). It also checks
plugin methods' configs before mergekit plans them (``plan_checks``), then calls what
``install`` was given (the opt-in pre-merge gate). Installing the hook imports neither
torch nor mergekit.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence

Callback = Callable[[ModuleType], None]


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, callback: Callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):  # resource readers, get_source, ...
        return getattr(self._loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.callbacks: Dict[str, Callback] = {}

    def find_spec(self, fullname, path, target=None):
        callback = self.callbacks.pop(fullname, None)
        if callback is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenLoader(spec.loader, callback)
        return spec


_finder = _AfterImportFinder()


def after_import(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (now, if it is)."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _finder.callbacks[module_name] = callback
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _stop(error: Exception) -> None:
    """A refused config or plugin set: in the stock mergekit CLI one line and status 2, as in ours;
    for run_merge in someone's program, the error is theirs to catch."""
    program = os.path.basename(sys.argv[0])
    if program.startswith("mergekit-") and program != "mergekit-mergeability":
        print(f"Error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    raise error


def _register_methods(_module: ModuleType) -> None:
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.plugins.manager import register_merge_methods

    try:
        register_merge_methods()
    except UserError as error:  # two plugins claim one name
        _stop(error)


_before_planning: List[Callable[[Any], None]] = []  # called with each MergeConfiguration about to be planned


def _check_configs_before_planning(module: ModuleType) -> None:
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.plugins.plan_checks import check_before_planning

    planner = module.MergePlanner
    if getattr(planner.normalize_config, "_mergeability_checked", False):
        return
    normalize = planner.normalize_config

    def normalize_config(self):
        normalize(self)
        try:
            check_before_planning(self)
            for check in _before_planning:
                check(self.config)
        except UserError as error:
            _stop(error)

    normalize_config._mergeability_checked = True
    planner.normalize_config = normalize_config


def install(before_planning: Sequence[Callable[[Any], None]] = (), config_imported: Optional[Callback] = None) -> None:
    """Register plugins' methods when ``mergekit.merge_methods`` is imported, and check plugin
    methods' configs, then call each of ``before_planning`` with the config (raising ``UserError``
    stops the merge in one line), before mergekit plans a merge; ``config_imported`` gets
    ``mergekit.config`` once it is imported. (The package's ``__init__`` passes the pre-merge gate's,
    which runs the precheck: the gate imports the API, which imports this folder.)"""
    _before_planning.extend(c for c in before_planning if c not in _before_planning)
    after_import("mergekit.merge_methods", _register_methods)
    after_import("mergekit.plan", _check_configs_before_planning)
    if config_imported is not None:
        after_import("mergekit.config", config_imported)
