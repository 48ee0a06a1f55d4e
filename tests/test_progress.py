"""Progress where stderr is a log: plain lines while the work runs, one at the end."""

import io
import time
import types

from mergekit_mergeability import progress
from mergekit_mergeability.progress import lines


def test_a_log_gets_lines_while_one_long_step_runs_and_one_at_the_end():
    stream = io.StringIO()
    with lines("experts", 3, stream, every=0.05) as advance:
        advance(1)
        time.sleep(0.3)  # one long step: the lines go on without an advance
        advance(2)
    written = stream.getvalue().splitlines()
    assert len(written) >= 4
    assert written[0].startswith("experts: 1/3 (")
    assert written[-1].startswith("experts: 3/3 (") and "left" not in written[-1]


def test_a_log_line_says_the_time_left_at_the_pace_so_far(monkeypatch):
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    stream = io.StringIO()
    with lines("merges", 4, stream, every=0.02) as advance:
        time.sleep(0.1)  # nothing done yet: no estimate
        advance(1)
        clock.now = 130.0  # one of four took 30 s: three more take 90
        time.sleep(0.1)
        advance(3)
    written = stream.getvalue().splitlines()
    assert "merges: 0/4 (0 s)" in written
    assert "merges: 1/4 (30 s, about 90 s left)" in written
    assert written[-1] == "merges: 4/4 (30 s)"


def test_a_short_task_writes_its_last_line_only():
    stream = io.StringIO()
    with lines("probes", 2, stream, every=60) as advance:
        advance(2)
    assert stream.getvalue() == "probes: 2/2 (0 s)\n"


def test_a_long_description_is_cut_so_that_the_line_fits_80_columns_with_its_counts():
    stream = io.StringIO()
    with lines(
        "menu: as written, 14 other merges and the layer patch and " + "more " * 10, 1200, stream, every=60
    ) as advance:
        advance(1200)
    (line,) = stream.getvalue().splitlines()
    assert len(line) == 80 and line.startswith("menu: as written, 14 other") and line.endswith("…: 1200/1200 (0 s)")
