"""Many merges of one base, each asked its probes, in one walk up the model's blocks.

Each candidate merge is a way to build the tensors the updates touch (``Candidate.build``, for a
config mergekit's own task: ``planned``); each job is one reading of the module under one
candidate (a probe's items asked). Every job runs in a thread of its own, and only one runs at a
time: it stops on entering each block some update touches. The walk then goes up the blocks:
at each block where jobs wait, it reads the block's tensors of every model once, builds each
candidate's block from them in turn, swaps it into the module and lets that candidate's jobs
through, up to the next block they stop at. Each model's tensor is read once a walk, however many
candidates merge it.

A job's forward passes run one after another (an options pass reads its prompt pass's keys and
values), so a job whose next pass starts below the block the walk has reached waits for the next
walk: the walks are as many as a job's passes. Candidates go in waves whose built blocks fit in
``kept`` bytes (half the loaded base's size, within half the memory available: ``keepable``), each
block built once a wave and kept for its later walks; where even one candidate's blocks do not fit,
all go in one wave and each block is built anew each walk: no candidate's merge is held whole, one
block of one candidate at a time. The tensors outside the blocks (embedding, final norm, head),
which only full fine-tunes touch, are swapped in where a pass uses them: at its start (the
embedding) and at the last block (the norm and head after it, and the embedding of the next pass).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set

import torch

from mergekit_mergeability.rehearsal.shared_layers import blocks_of, forwards_wrapped
from mergekit_mergeability.sources import Source, patched, tensors
from mergekit_mergeability.sources.architecture import UnknownTensorError, tensor_position

Read = Callable[[str, str], Optional[torch.Tensor]]  # (model reference, tensor name) -> its tensor, None: it has none
START, DONE = -1, -2  # where a job is: not started, finished (else the block it waits to enter)


@dataclass(frozen=True)
class Candidate:
    """A merge to rehearse: ``build(tensor name, read)`` gives its tensor of that name."""

    name: str
    build: Callable[[str, Read], torch.Tensor]


def as_planned(name: str, plan: Mapping[str, Any]) -> Candidate:
    """The candidate mergekit's plan (``planned.plan``) builds, tensor by tensor, as ``mergekit-yaml`` would."""
    from mergekit_mergeability.rehearsal.planned import merged

    return Candidate(name, lambda tensor, read: merged(plan[tensor], read))


@dataclass(frozen=True)
class Job:
    """``ask()`` reads the module under ``candidate``; its return is the job's result."""

    candidate: str
    ask: Callable[[], Any]


class _Stopped(BaseException):
    """Raised in a job left waiting when the walk itself failed."""


_here = threading.local()  # the job whose thread this is


class _Running:
    """One job's thread, and the two signals that hand the one turn between it and the walk."""

    def __init__(self, job: Job) -> None:
        self.job, self.at, self.result, self.error, self.stopped = job, START, None, None, False
        self._go, self._paused = threading.Semaphore(0), threading.Semaphore(0)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"rehearsal {job.candidate}")

    def _run(self) -> None:
        _here.running = self
        self._go.acquire()
        try:
            if not self.stopped:
                self.result = self.job.ask()
        except BaseException as error:  # handed to the walk, which raises it
            self.error = error
        self.at = DONE
        self._paused.release()

    def until_next_stop(self) -> None:
        """The walk's side: let the job run until it waits at a block or ends."""
        self._go.release()
        self._paused.acquire()

    def wait_at(self, block: int) -> None:
        """The job's side: wait on entering ``block`` until the walk lets it in."""
        self.at = block
        self._paused.release()
        self._go.acquire()
        if self.stopped:
            raise _Stopped()


def block_of(name: str, blocks: int) -> Optional[int]:
    """The decoder block tensor ``name`` sits in; None outside the blocks (or where no architecture knows it)."""
    try:
        position = tensor_position(name)
    except UnknownTensorError:
        return None
    return position.layer if position.part == "layer" and position.layer < blocks else None


def _reads(readers: Mapping[str, Any]) -> Read:
    """A ``Read`` that reads each model's tensor once, however many candidates ask for it."""
    kept: Dict[tuple, Optional[torch.Tensor]] = {}

    def read(model: str, name: str) -> Optional[torch.Tensor]:
        if (model, name) not in kept:
            reader = readers[model]
            kept[model, name] = reader[name] if name in reader.index else None
        found = kept[model, name]  # a copy each time: a method may write into its inputs
        return None if found is None else found.clone()

    return read


def walk(
    module: torch.nn.Module,
    candidates: Sequence[Candidate],
    jobs: Sequence[Job],
    models: Iterable[Source],
    names: Set[str],
    kept: Optional[int] = None,
) -> List[Any]:
    """Each job's result, in order: ``module`` (the loaded base) read under its candidate, whose
    tensors ``names`` (those the updates touch; every other is the base's) are built from the
    tensors of ``models`` (the base among them). ``kept``: the bytes of built blocks kept between
    walks (default: half the loaded base's, within half the memory available: ``keepable``)."""
    blocks = blocks_of(module)
    depth = len(blocks) if blocks is not None else 0
    by_block: Dict[Optional[int], List[str]] = {}
    for name in sorted(names):
        by_block.setdefault(block_of(name, depth), []).append(name)
    around = by_block.pop(None, [])
    readers = {str(model): tensors(model) for model in models}
    state = module.state_dict()
    size = sum(state[n].numel() * state[n].element_size() for n in names if n in state)  # one candidate's
    loaded = sum(t.numel() * t.element_size() for t in state.values())
    kept = min(keepable(), loaded // 2) if kept is None else kept
    wave = max(1, kept // max(size, 1)) if size <= kept else len(candidates)
    parts = {**by_block, None: around}  # None: the tensors outside the blocks
    dtypes = {n: state[n].dtype for n in names if n in state}
    found: Dict[int, Any] = {}
    for start in range(0, len(candidates), wave):
        mine = {c.name: c for c in candidates[start : start + wave]}
        asked = [(i, job) for i, job in enumerate(jobs) if job.candidate in mine]
        done = _walks(module, blocks, parts, dtypes, readers, mine, [job for _, job in asked], size <= kept)
        found.update(zip((i for i, _ in asked), done))
    return [found[i] for i in range(len(jobs))]


def keepable() -> int:
    """Half the memory available now: Linux's MemAvailable (free, and the page cache it can drop),
    else the free pages, else 2 GiB where the system does not say."""
    try:
        with open("/proc/meminfo") as info:
            found = {line.split(":")[0]: line.split()[1] for line in info}
        return int(found["MemAvailable"]) * 1024 // 2
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (AttributeError, ValueError, OSError):
        return 2 << 30


def _walks(module, blocks, parts, dtypes, readers, candidates, jobs: Sequence[Job], keep: bool) -> List[Any]:
    """``jobs``' results, the walks repeated until every job has ended; each candidate's part (a
    block, or None: the tensors outside the blocks) built once and kept where ``keep``, else anew
    each time it is swapped in."""
    running = [_Running(job) for job in jobs]
    built: Dict[tuple, Dict[str, torch.Tensor]] = {}
    indices = sorted(i for i in parts if i is not None)

    def builder(read: Read, *at: Optional[int]) -> Callable[[Candidate], Dict[str, torch.Tensor]]:
        def build(candidate: Candidate) -> Dict[str, torch.Tensor]:
            tensors = {}
            for index in at:
                found = built.get((candidate.name, index))
                if found is None:  # in the module's dtype, as it is swapped in
                    found = {n: _in(dtypes, n, candidate.build(n, read)) for n in parts[index]}
                    if keep:
                        built[candidate.name, index] = found
                tensors.update(found)
            return tensors

        return build

    try:
        with forwards_wrapped(blocks, indices, _stopping):
            for job in running:
                job.thread.start()
            _let_through(module, running, START, candidates, builder(_reads(readers), None))
            while any(job.at != DONE for job in running):
                for index in indices:  # the last block's jobs run on through the head, and into their next pass
                    at = (index, None) if index == indices[-1] else (index,)
                    _let_through(module, running, index, candidates, builder(_reads(readers), *at))
    finally:
        for job in running:
            if job.at != DONE:
                job.stopped = True
                job.until_next_stop()
            job.thread.join()
    for job in running:
        if job.error is not None:
            raise job.error
    return [job.result for job in running]


def _in(dtypes: Mapping[str, torch.dtype], name: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(dtypes[name]) if name in dtypes else tensor  # a name the module lacks: ``patched`` says so


def _let_through(module, running, at: int, candidates, build) -> None:
    """Each candidate's jobs waiting ``at`` a block (or not started) let through it, with the
    candidate's tensors ``build`` gives there swapped in, one candidate at a time."""
    waiting = [job for job in running if job.at == at]
    for name, candidate in candidates.items():
        mine = [job for job in waiting if job.job.candidate == name]
        if not mine:
            continue
        with torch.no_grad(), patched(module, build(candidate)):
            for job in mine:
                job.until_next_stop()
        for job in mine:
            if job.error is not None:
                raise job.error


def _stopping(index: int, run: Callable) -> Callable:
    def forward(*args, **kwargs):
        job = getattr(_here, "running", None)
        if job is not None:
            job.wait_at(index)
        return run(*args, **kwargs)

    return forward
