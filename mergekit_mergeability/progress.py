"""Progress of long work: a bar (rich) on a terminal; where stderr is a file or a pipe (a log,
``tee``), a plain line every ``EVERY`` seconds and one when the work ends; silent when asked."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

EVERY = 10.0  # seconds between a log's progress lines
WIDTH = 80  # a log line's columns: a long description is cut (…) so that its counts always show


def note(message: str, quiet: bool = False) -> None:
    """A line on stderr about the work ahead (its cost), unless ``quiet``."""
    if not quiet:
        from rich.console import Console

        Console(stderr=True, highlight=False).print(message, markup=False)


@contextmanager
def quiet_config_warnings() -> Iterator[None]:
    """A config.json written with ``torch_dtype`` (mergekit writes it) makes transformers 5 warn that
    it is deprecated: a line on the user's screen about another tool's file, not theirs."""
    import logging

    logger = logging.getLogger("transformers.configuration_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def task(description: str, total: int, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``; shows progress on stderr unless ``quiet``."""
    if quiet:
        yield lambda n=1: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        with lines(description, total, sys.stderr) as advance:
            yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        handle = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(handle, n)


@contextmanager
def lines(description: str, total: int, stream: TextIO, every: float = EVERY) -> Iterator[Callable[[int], None]]:
    """``advance(n)``, while a thread writes ``description: done/total (elapsed)`` to ``stream``
    every ``every`` seconds (long single steps included), with the time left at the pace so far once
    a step is done, and a last line at the end; each line within ``WIDTH`` columns."""
    started, done, stop = time.monotonic(), [0], threading.Event()

    def say() -> None:
        elapsed = time.monotonic() - started
        left = f", about {elapsed / done[0] * (total - done[0]):.0f} s left" if 0 < done[0] < total else ""
        counts = f": {done[0]}/{total} ({elapsed:.0f} s{left})"
        room = WIDTH - len(counts)
        stream.write((description if len(description) <= room else description[: room - 1] + "…") + counts + "\n")
        stream.flush()

    def tick() -> None:
        while not stop.wait(every):
            say()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield lambda n=1: done.__setitem__(0, done[0] + n)
    finally:
        stop.set()
        ticker.join()
    say()
