"""The cost line's arithmetic, with known answers (what it is measured against: benchmarks/cost_line.py)."""

import pytest

from mergekit_mergeability.cost import FULL, LINE, PROMPT, TIMED, WINDOW, Cost, Pace


def test_a_call_between_timed_sizes_is_read_on_the_line_between_them_and_the_blocks_times_the_layers():
    rising = [float(n) for n in TIMED]  # a second a token, in a block and outside it
    pace = Pace(block={PROMPT: rising, FULL: rising}, outside={PROMPT: [1.0] * len(TIMED), FULL: rising}, layers=30)
    assert pace.call(FULL, 20) == pytest.approx((30 * 20.0, 20.0))  # between 8 and 32
    assert pace.call(PROMPT, 20) == pytest.approx((30 * 20.0, 1.0))
    assert pace.call(FULL, 10**6) == pytest.approx((30 * TIMED[-1], TIMED[-1]))  # held beyond the last size


def test_the_menus_share_of_blocks_discounts_its_time_in_the_blocks_only():
    cost = Cost(
        passes={"knowledge": 4, "menu": 10, "fluency": 2},
        units={"knowledge": LINE, "menu": LINE, "fluency": WINDOW},
        seconds={"knowledge": (2.0, 1.0), "menu": (2.0, 1.0), "fluency": (5.0, 0.5)},
        shares={"menu": 0.25},
    )
    assert cost.phases == pytest.approx({"knowledge": 12.0, "menu": 15.0, "fluency": 11.0})
    assert cost.estimate == pytest.approx(38.0)
    assert [line.split(",")[0] for line in cost.by_phase()] == [
        "  knowledge: 4 passes",
        "  menu: 10 passes",
        "  fluency: 2 passes",
    ]
    assert "roughly 38 s on cpu" in cost.line()
