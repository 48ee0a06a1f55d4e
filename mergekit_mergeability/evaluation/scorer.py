"""Scores models on tasks, from folders or as patches of one loaded base, through the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Mapping

import torch

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
        key = self.cache.key("patch", self.base_fingerprint, recipe, *self.settings(task))
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        module, tokenizer = self.base_module()
        with patched(module, make()):
            result = self._run(module, tokenizer, task)
        release_freed_memory()  # the patched-in tensors are freed now: their pages go back to the system
        return self.cache.put(key, result)

    def base_module(self):
        if self._module is None:
            self._module, self._tokenizer = load_causal_lm(self.base, self.run_settings.device, self.run_settings.dtype)
        return self._module, self._tokenizer
