"""Scoring a model on tasks with lm-eval's harness, in memory.

A model is scored as an ``HFLM`` around an already-loaded module, so merges made
in memory are evaluated without writing checkpoints. Generation tasks scored
with ``bleu``/``chrf`` are re-scored at corpus level with sacrebleu, signatures
kept. Callers cache results by (model fingerprint, task fingerprint, settings): ``sources.cache``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks.lmeval import (
    Task,
    compiled_templates,
    quiet_harness,
    scores_by_running_code,
    while_open,
)

TRANSLATION_METRICS = {"bleu", "chrf"}


def runnable(tasks, run_code: bool) -> None:
    """Refuse, before any model is scored, a task that scores by running the code a model writes
    (lm-eval's ``unsafe_code``) unless the user said to run it."""
    for task in tasks:
        if not run_code and scores_by_running_code(task):
            raise UserError(
                f"lm-eval task {task.name}: scored by running the code the model writes; run it only where that"
                " is safe (a sandbox), with --confirm-run-unsafe-code (lm-eval's --confirm_run_unsafe_code)"
            )


def score(
    model,
    tokenizer,
    task: Task,
    limit: Optional[int] = None,
    batch_size: int = 16,
    device: str = "cpu",
    run_code: bool = False,
) -> Dict[str, Any]:
    """Run one task; returns {"metrics": {name: value}, "primary": name, "score": value, "samples": n}.
    A task that scores by running the code the model writes (HumanEval, MBPP) runs only with
    ``run_code`` (lm-eval's ``confirm_run_unsafe_code``)."""
    from lm_eval import evaluator, simple_evaluate
    from lm_eval.models.huggingface import HFLM

    runnable([task], run_code)
    if task.chat and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"lm-eval task {task.name}: chat: true, but the tokenizer scoring it has no chat template; remove chat: true"
        )
    manager, entry = task.load()
    for noisy in ("lm_eval", "lm-eval"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # simple_evaluate ends by describing the machine (torch's collect_env runs `pip list` and
    # more: ~2 s a call, more than scoring a probe); only the scores are kept here, so skip it
    no_machine_report = while_open(evaluator, "add_env_info", lambda storage: None)
    with quiet_harness(), compiled_templates(), no_machine_report:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=batch_size)
        out = simple_evaluate(
            model=lm,
            tasks=[entry],
            task_manager=manager,
            limit=limit,
            log_samples=True,
            verbosity="ERROR",
            apply_chat_template=task.chat,
            confirm_run_unsafe_code=run_code,
        )
    # a group (Task.check made sure it has one) is scored by lm-eval's aggregate over its tasks
    raw = (out.get("groups") or {}).get(task.name) or out["results"][task.name]
    samples = out["samples"].get(task.name, [])
    metrics = {
        k.split(",")[0]: float(v)
        for k, v in raw.items()
        if "," in k and "_stderr" not in k and isinstance(v, (int, float))
    }
    result = {
        "metrics": metrics,
        "primary": next(iter(metrics)),
        "samples": int(raw.get("sample_len", 0) or len(samples)),
    }
    if TRANSLATION_METRICS & metrics.keys() and samples:
        from mergekit_mergeability.maths.corpus_metrics import corpus_scores

        translation = corpus_scores(
            [_text(s["filtered_resps"]) for s in samples], [_text(s["target"]) for s in samples]
        )
        metrics.update({k: v for k, v in translation.items() if k in TRANSLATION_METRICS})
        result["signatures"] = {k: v for k, v in translation.items() if k.endswith("_signature")}
    result["score"] = metrics[result["primary"]]
    # the primary metric's standard error as lm-eval reports it ("acc_stderr,none"; "N/A" where it has none)
    stderr = next((v for k, v in raw.items() if k.split(",")[0] == f"{result['primary']}_stderr"), None)
    result["stderr"] = float(stderr) if isinstance(stderr, (int, float)) else None
    return result


def _text(value) -> str:
    while isinstance(value, (list, tuple)):
        value = value[0] if value else ""
    return str(value)
