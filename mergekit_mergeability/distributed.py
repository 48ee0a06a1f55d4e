"""The heavy passes on a Ray cluster (``--ray [ADDRESS]``), when one machine is not enough.

What runs where, with ``--ray``:

- precheck's weight pass (``diagnostics.weights``): the tensor names are cut into contiguous
  shards of about equal size, one task per shard. A task opens the models itself, from their
  paths (shared storage or the hub), and returns one partial sum per tensor; the driver adds
  them in tensor order, as the single process does, so every number is the same bit for bit.
- precheck's activation passes: ``representations`` and ``selectivity`` run one task per
  model (the base included) and compare the results on the driver; ``knowledge`` reads the
  base model alone: one task.
- ``sweep``: one task per uncached λ point of each round (the grid, then each refinement
  point); a worker builds A and B once and keeps them for its next λ.
- ``mergeability``: one task per merge+evaluate trial; the driver appends each finished trial
  to ``trials.jsonl`` as it arrives, so a killed run resumes where it stopped, and Ray reruns
  the task of a lost worker.

Only paths, probe instances and results travel through the object store, never a model's
tensors. Ray is an optional extra: without it, ``--ray`` says how to install it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any, Callable, Iterator, List, Optional, Sequence, TypeVar

from mergekit_mergeability.errors import UserError

INSTALL = 'pip install ".[ray]" in a checkout of mergekit-mergeability'

T = TypeVar("T")

_active = False  # inside ``cluster``: ``each`` submits Ray tasks


def require_ray():
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray needs the ray package, which is not installed: {INSTALL}") from None
    return ray


@contextlib.contextmanager
def cluster(address: Optional[str]) -> Iterator[None]:
    """Run the passes inside as Ray tasks: on the cluster at ``address`` ("auto": the one this
    machine belongs to), or with no address ``$RAY_ADDRESS``'s, else a local cluster started
    here and shut down after. A Ray already initialised in this process is used as it is."""
    global _active
    ray = require_ray()
    started = not ray.is_initialized()
    if started and address and not reachable(address):  # ray.init would retry for minutes
        raise UserError(
            f"--ray {address}: nothing answers there; start the cluster's head (ray start --head) or check the address"
        )
    if started:
        try:
            ray.init(
                address=address or None, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
            )
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise UserError(
                f"--ray {address or ''}: could not start or reach a Ray cluster: {(str(error).splitlines() or [''])[0]}"
            ) from None
    _active = True
    try:
        yield
    finally:
        _active = False
        if started:
            ray.shutdown()


def reachable(address: str, timeout: float = 5.0) -> bool:
    """Whether a HOST:PORT address accepts a connection; other forms ("auto", "ray://…") are Ray's to judge."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError:
        return False
    return True


def active() -> bool:
    return _active


def each(
    function: Callable[..., T],
    items: Sequence[Any],
    *shared: Any,
    done: Optional[Callable[[int, T], None]] = None,
    gpus: int = 0,
) -> List[T]:
    """``[function(item, *shared) for item in items]``: one Ray task per item inside ``cluster``
    (``shared`` put in the object store once; each task given one CPU and ``gpus`` GPUs), else
    in this process, in order. ``done(index, result)`` runs on the driver as each result arrives."""
    if not _active:
        results = []
        for index, item in enumerate(items):
            results.append(function(item, *shared))
            if done is not None:
                done(index, results[-1])
        return results
    ray = require_ray()
    remote = ray.remote(num_cpus=1, num_gpus=gpus)(function)
    refs = [ray.put(value) for value in shared]
    pending = {remote.remote(item, *refs): index for index, item in enumerate(items)}
    results: List[Any] = [None] * len(items)
    while pending:
        finished, _ = ray.wait(list(pending), num_returns=1)
        index = pending.pop(finished[0])
        try:
            results[index] = ray.get(finished[0])
        except ray.exceptions.RayTaskError as error:  # the task's own exception, so a UserError stays one line
            raise (error.cause if isinstance(error.cause, Exception) else error) from error
        if done is not None:
            done(index, results[index])
    return results


def shards(sizes: Sequence[int], count: int) -> List[range]:
    """Cut positions ``0..len(sizes)`` into at most ``count`` contiguous runs of about equal total size."""
    total = sum(sizes) or 1
    cuts, running, runs, start = 1, 0, [], 0
    for position, size in enumerate(sizes):
        running += size
        if running >= total * cuts / count and position + 1 < len(sizes):
            runs.append(range(start, position + 1))
            start, cuts = position + 1, cuts + 1
    runs.append(range(start, len(sizes)))
    return [r for r in runs if len(r)]


def device(device: str) -> str:
    """``--device`` inside a cluster: ``auto`` is ``cuda`` where the cluster has GPUs, whatever the driver has."""
    if device != "auto":
        return device
    return "cuda" if require_ray().cluster_resources().get("GPU", 0) else "cpu"


def gpus(settings) -> int:
    """GPUs a task running models asks for: one on a CUDA device (Ray then shows it the one it was given)."""
    return 1 if str(settings.device).startswith("cuda") else 0


def workers() -> int:
    """CPUs of the cluster (1 outside one): how many shards a pass is cut into."""
    if not _active:
        return 1
    return max(1, int(require_ray().cluster_resources().get("CPU", 1)))
