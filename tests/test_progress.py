"""Progress where stderr is a log: plain lines while the work runs, one at the end."""

import io
import time

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
    assert written[-1].startswith("experts: 3/3 (")


def test_a_short_task_writes_its_last_line_only():
    stream = io.StringIO()
    with lines("probes", 2, stream, every=60) as advance:
        advance(2)
    assert stream.getvalue() == "probes: 2/2 (0 s)\n"
