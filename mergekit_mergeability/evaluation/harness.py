"""Scoring a model on tasks with lm-eval's harness, in memory, with a result cache.

A model is scored as an ``HFLM`` around an already-loaded module, so merges made
in memory are evaluated without writing checkpoints. Generation tasks scored
with ``bleu``/``chrf`` are re-scored at corpus level with sacrebleu, signatures
kept. Results are cached by (model fingerprint, task fingerprint, settings).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from mergekit_mergeability.checkpoints import model_files
from mergekit_mergeability.evaluation.tasks import Task
from mergekit_mergeability.files import write_atomic

TRANSLATION_METRICS = {"bleu", "chrf"}


class Cache:
    """One JSON file per result under ``folder``; ``None`` folder caches nothing."""

    def __init__(self, folder: Optional[Path]):
        self.folder = Path(folder) if folder else None

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, key: str) -> Optional[dict]:
        if self.folder is None:
            return None
        path = self.folder / f"{key}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def put(self, key: str, value: dict) -> dict:
        if self.folder is not None:
            write_atomic(self.folder / f"{key}.json", json.dumps(value))
        return value


def fingerprint(folder: Path) -> str:
    """A model folder's content hash: its config.json and every weight file, whatever the
    format (``checkpoints.model_files``; a folder without weights is refused);
    memoised by size and mtime. An adapter's: its base's and its own files'."""
    digest = hashlib.sha256()
    for file in model_files(folder):
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}".encode())
        digest.update(_file_digest(file, stat.st_size, stat.st_mtime_ns).encode())
    return digest.hexdigest()


_digests: Dict[tuple, str] = {}


def _file_digest(file: Path, size: int, mtime: int) -> str:
    key = (str(file.resolve()), size, mtime)
    if key not in _digests:
        with open(file, "rb") as handle:
            _digests[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _digests[key]


def score(
    model, tokenizer, task: Task, limit: Optional[int] = None, batch_size: int = 16, device: str = "cpu"
) -> Dict[str, Any]:
    """Run one task; returns {"metrics": {name: value}, "primary": name, "score": value, "samples": n}."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager, entry = task.load()
    for noisy in ("lm_eval", "lm-eval"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with quiet_harness(), compiled_templates():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=batch_size)
        out = simple_evaluate(
            model=lm, tasks=[entry], task_manager=manager, limit=limit, log_samples=True, verbosity="ERROR"
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
        from mergekit_mergeability.evaluation.translation import corpus_scores

        translation = corpus_scores(
            [_text(s["filtered_resps"]) for s in samples], [_text(s["target"]) for s in samples]
        )
        metrics.update({k: v for k, v in translation.items() if k in TRANSLATION_METRICS})
        result["signatures"] = {k: v for k, v in translation.items() if k.endswith("_signature")}
    result["score"] = metrics[result["primary"]]
    return result


@contextlib.contextmanager
def quiet_harness():
    """Silence lm-eval's per-request progress bars, prints and `git` probe (file descriptor 2
    itself, and sys.stderr where something has replaced it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def compiled_templates():
    """Compile each of a task's Jinja templates once: lm-eval compiles its template again for every
    document it formats (``lm_eval.utils.apply_template``), most of the time a probe takes to build.
    The same Environment renders it, so the text is the same."""
    from lm_eval import utils

    original, compiled = utils.apply_template, {}

    def apply_template(template: str, doc: dict) -> str:
        if template not in compiled:
            compiled[template] = utils.env.from_string(template)
        return compiled[template].render(**doc)

    utils.apply_template = apply_template
    try:
        yield
    finally:
        utils.apply_template = original


def _text(value) -> str:
    while isinstance(value, (list, tuple)):
        value = value[0] if value else ""
    return str(value)
