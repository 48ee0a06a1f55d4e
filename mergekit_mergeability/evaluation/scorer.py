"""Scores models on tasks, from folders or as patches of one loaded base, through the cache; the
multiple-choice tasks ``lmeval.plain`` accepts are read without lm-eval's run
(``diagnostics.task_scores.score_all``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from mergekit_mergeability.diagnostics.knowledge import as_read
from mergekit_mergeability.rehearsal.shared_layers import Shared, shared_below
from mergekit_mergeability.diagnostics.task_scores import score_all
from mergekit_mergeability.sources.heap import release_freed_memory
from mergekit_mergeability.settings import RunSettings
from mergekit_mergeability.sources import (
    Source,
    auto_device,
    load_causal_lm,
    load_dtype,
    merged,
    patched,
    same_model,
    update_of,
)
from mergekit_mergeability.sources.cache import Cache, fingerprint
from mergekit_mergeability.tasks.lmeval import Task
from mergekit_mergeability.tasks.probes import Instance


class Scorer:
    def __init__(self, base: Path, settings: RunSettings, cache: Cache):
        self.base = Path(base)
        self.base_fingerprint = fingerprint(self.base)
        self.run_settings = settings
        self.cache = cache
        self._module = None
        self._tokenizer = None
        self._shared = Shared()
        self.dtype = load_dtype(settings.dtype, self.base)  # auto: the base checkpoint's own

    def settings(self, task: Task):
        """Everything besides the model that changes a score on ``task`` (cache and resume keys)."""
        return task.fingerprint, self.run_settings.limit, self.dtype

    def _run(self, module, tokenizer, task: Task) -> Dict[str, Any]:
        return self._run_all(module, tokenizer, [task])[0]

    def _run_all(self, module, tokenizer, tasks: Sequence[Task]) -> List[Dict[str, Any]]:
        settings = self.run_settings
        device = auto_device(settings.device)
        return score_all(
            module, tokenizer, tasks, settings.limit, settings.batch_size, device, settings.confirm_run_unsafe_code
        )

    def folder(self, path: Source, task: Task) -> Dict[str, Any]:
        """A model's score on ``task``; an adapter of the base is scored as a patch of the loaded base."""
        key = self.cache.key("folder", fingerprint(path), *self.settings(task))
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        if update_of(path) is not None and same_model(update_of(path), self.base):
            module, tokenizer = self.base_module()
            with patched(module, merged(path, module.state_dict())):
                return self.cache.put(key, self._run(module, tokenizer, task))
        if same_model(path, self.base):
            module, tokenizer = self.base_module()
        else:
            dtype = load_dtype(self.run_settings.dtype, path)
            module, tokenizer = load_causal_lm(path, self.run_settings.device, dtype, self.base)
        return self.cache.put(key, self._run(module, tokenizer, task))

    def patch(self, recipe: Any, task: Task, make: Callable[[], Mapping[str, torch.Tensor]]) -> Dict[str, Any]:
        """The base with ``make()``'s tensors patched in; ``make`` runs only on a cache miss,
        so ``recipe`` must identify what it returns."""
        return self.patch_many(recipe, [task], make)[0]

    def patch_many(
        self, recipe: Any, tasks: Sequence[Task], make: Callable[[], Mapping[str, torch.Tensor]]
    ) -> List[Dict[str, Any]]:
        """``patch`` for several tasks on one patched model: ``make`` runs once, if any task misses."""
        keys = [self.cache.key("patch", self.base_fingerprint, recipe, *self.settings(task)) for task in tasks]
        return self._on_misses(
            keys, make, lambda module, tokenizer, missing: self._run_all(module, tokenizer, [tasks[i] for i in missing])
        )

    def read_many(
        self,
        recipe: Any,
        probe_sets: Sequence[Sequence[Instance]],
        make: Optional[Callable[[], Mapping[str, torch.Tensor]]],
    ) -> List[List[float]]:
        """Each probe set's items, one number each as a rehearsal reads them (``knowledge.as_read``),
        on the base with ``make()``'s tensors patched in (``make`` None: the base itself); asked
        together, each set cached by ``recipe`` and its items."""
        keys = [
            self.cache.key("read", self.base_fingerprint, recipe, list(map(str, found)), self.dtype)
            for found in probe_sets
        ]

        def read(module, tokenizer, missing):
            values = iter(as_read(module, tokenizer, [i for k in missing for i in probe_sets[k]]))
            return [{"items": [next(values) for _ in probe_sets[k]]} for k in missing]

        return [found["items"] for found in self._on_misses(keys, make, read)]

    def _on_misses(self, keys: Sequence[str], make, run) -> List[Dict[str, Any]]:
        """The cached results of ``keys``; the missing ones from ``run(module, tokenizer, missing)``
        on the base patched with ``make()``'s tensors (``make`` runs only on a miss; None: unpatched)."""
        found = [self.cache.get(key) for key in keys]
        missing = [i for i, result in enumerate(found) if result is None]
        if missing:
            module, tokenizer = self.base_module()
            if make is None:
                results = run(module, tokenizer, missing)
            else:
                tensors = make()
                # each merge asks the same tasks: the layers below those it patches run once per input
                with patched(module, tensors), shared_below(module, tensors, self._shared):
                    results = run(module, tokenizer, missing)
            for i, result in zip(missing, results):
                found[i] = self.cache.put(keys[i], result)
            release_freed_memory()  # the patched-in tensors are freed now: their pages go back to the system
        return found

    def base_module(self):
        if self._module is None:
            self._module, self._tokenizer = load_causal_lm(self.base, self.run_settings.device, self.dtype)
        return self._module, self._tokenizer
