"""Every answer to an lm-eval generation task, each scored on its own.

lm-eval generates (``repeats`` answers per problem, sampled through the task's
``generation_kwargs``) and scores only the first answer of each problem. Pass@k and
Vote@k need every answer scored: each one is passed through the task's first filter
pipeline (the answer extraction lm-eval reports first) and its ``process_results``,
exactly as lm-eval scores a single answer.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Dict, List, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks.lmeval import Task, quiet_harness


class GenerationTask:
    """One lm-eval ``generate_until`` task, loaded once, set to ``samples`` answers per problem."""

    def __init__(self, task: Task, samples: int, temperature: float):
        manager, entry = task.load()
        with quiet_harness():
            self.loaded = manager.load(entry)
        tasks = self.loaded["tasks"]
        if self.loaded["groups"] or len(tasks) != 1:
            raise UserError(
                f"task {task.name}: a group or tag of {len(tasks)} tasks; the sweep scores one generation task"
            )
        self.name, self.task = next(iter(tasks.items()))
        if self.task.OUTPUT_TYPE != "generate_until":
            raise UserError(
                f"task {task.name}: output_type {self.task.OUTPUT_TYPE}; the sweep needs generated answers (output_type: generate_until)"
            )
        if samples > 1:
            self.task.config.repeats = samples
            self.task.set_config("generation_kwargs", {"do_sample": True, "temperature": temperature}, update=True)
        # lm-eval 0.4 keeps a task's filter pipelines in ``_filters`` (no public accessor); the first is what it reports first
        self.extraction = getattr(self.task, "_filters", [None])[0]

    def answer(self, lm, limit: Optional[int], seed: int) -> Dict[str, Any]:
        """{"metric", "lm_eval": lm-eval's own aggregate, "problems": [{target, responses, answers, scores}]}."""
        import numpy
        import torch
        from lm_eval.evaluator import evaluate

        for noisy in ("lm_eval", "lm-eval"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        # every λ point starts from the same seed: a point's answers do not depend on the order points are run in
        random.seed(seed)
        numpy.random.seed(seed)
        torch.manual_seed(seed)
        self.task.set_fewshot_seed(seed=seed)
        with quiet_harness():
            out = evaluate(lm, self.loaded, limit=limit, log_samples=True, verbosity="ERROR")
        problems: List[Dict[str, Any]] = []
        metric = None
        for sample in out["samples"][self.name]:
            responses = [str(r) for r in sample["resps"][0]]
            answers = [self._extract(r, sample["doc"]) for r in responses]
            results = [self.task.process_results(sample["doc"], [a]) for a in answers]
            metric = metric or next(iter(results[0]))
            problems.append(
                {
                    "target": str(sample["target"]),
                    "responses": responses,
                    "answers": answers,
                    "scores": [float(r[metric]) for r in results],
                }
            )
        aggregate = {
            k: float(v)
            for k, v in out["results"][self.name].items()
            if "," in k and "_stderr" not in k and isinstance(v, (int, float))
        }
        return {"metric": metric, "lm_eval": aggregate, "problems": problems}

    def _extract(self, response: str, doc: dict) -> str:
        if self.extraction is None:
            return response
        values: Any = [[response]]
        for make in self.extraction.filters:
            values = make().apply(values, [doc])
        value = list(values)[0]
        return str(value[0] if isinstance(value, (list, tuple)) else value)
