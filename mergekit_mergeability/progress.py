"""Progress bars for long work (rich), silent when asked or when output is not a terminal."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def task(description: str, total: int, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``; shows a bar on stderr unless ``quiet``."""
    if quiet:
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        handle = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(handle, n)
