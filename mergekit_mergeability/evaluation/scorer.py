"""Scores models on tasks, from folders or as patches of one loaded base, through the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Sequence

import torch

from mergekit_mergeability.diagnostics.shared_layers import Shared, shared_below
from mergekit_mergeability.sources.heap import release_freed_memory
from mergekit_mergeability.settings import RunSettings
from mergekit_mergeability.sources import Source, auto_device, load_causal_lm, merged, patched, same_model, update_of
from mergekit_mergeability.sources.cache import Cache, fingerprint
from mergekit_mergeability.tasks import harness
from mergekit_mergeability.tasks.lmeval import Task


class Scorer:
    def __init__(self, base: Path, settings: RunSettings, cache: Cache):
        self.base = Path(base)
        self.base_fingerprint = fingerprint(self.base)
        self.run_settings = settings
        self.cache = cache
        self._module = None
        self._tokenizer = None
        self._shared = Shared()

    def settings(self, task: Task):
        """Everything besides the model that changes a score on ``task`` (cache and resume keys)."""
        return task.fingerprint, self.run_settings.limit, self.run_settings.dtype

    def _run(self, module, tokenizer, task: Task) -> Dict[str, Any]:
        return harness.score(
            module,
            tokenizer,
            task,
            self.run_settings.limit,
            self.run_settings.batch_size,
            auto_device(self.run_settings.device),
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
            module, tokenizer = load_causal_lm(path, self.run_settings.device, self.run_settings.dtype, self.base)
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
        found = [self.cache.get(key) for key in keys]
        if any(result is None for result in found):
            module, tokenizer = self.base_module()
            tensors = make()
            # each merge asks the same tasks: the layers below those it patches run once per input
            with patched(module, tensors), shared_below(module, tensors, self._shared):
                found = [
                    self.cache.put(key, self._run(module, tokenizer, task)) if result is None else result
                    for result, key, task in zip(found, keys, tasks)
                ]
            release_freed_memory()  # the patched-in tensors are freed now: their pages go back to the system
        return found

    def base_module(self):
        if self._module is None:
            self._module, self._tokenizer = load_causal_lm(self.base, self.run_settings.device, self.run_settings.dtype)
        return self._module, self._tokenizer
