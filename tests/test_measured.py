"""The archive of measured pools (research/pools.py --pack, --unpack): what a fresh clone reruns
the prediction's tables from, without measuring."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))
import pools  # noqa: E402


def test_a_packed_pool_unpacks_to_the_same_reports_and_packs_to_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(pools, "MEASURED", tmp_path / "measured")
    measured = tmp_path / "pools-out" / "fit"
    reports = {
        "precheck/precheck.json": {"models": [{"path": "a"}]},
        "precheck_k3/precheck.json": {"models": []},
        "mergeability/mean/mergeability.json": {"models": [{"path": "a", "mergeability": 0.5}]},
    }
    for name, report in reports.items():
        (measured / name).parent.mkdir(parents=True)
        (measured / name).write_text(json.dumps(report))
    (measured / "mergeability" / "mean" / "trials.jsonl").write_text("{}\n")  # not archived: trials are large
    archive = pools.pack(measured, "fit")
    first = archive.read_bytes()

    restored = tmp_path / "fresh"
    written = pools.unpack(restored, "fit")
    assert sorted(str(p.relative_to(restored)) for p in written) == sorted(reports)
    for name, report in reports.items():
        assert json.loads((restored / name).read_text()) == report
    assert pools.pack(restored, "fit").read_bytes() == first  # no timestamps inside


def test_unpacking_a_pool_never_measured_says_how_to_measure_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pools, "MEASURED", tmp_path)
    with pytest.raises(SystemExit, match="python research/pools.py lora --pack"):
        pools.unpack(tmp_path / "out", "lora")


def test_reliability_of_s_is_the_spearman_brown_step_up_of_its_split_halves():
    import prediction

    # two trials: every split compares trial 0 with trial 1, whose Spearman is 1 - 6·2/(4·15) = 0.8
    r, whole = prediction.reliability_of([[1, 1], [2, 3], [3, 2], [4, 4]], splits=10)
    assert r == pytest.approx(0.8)
    assert whole == pytest.approx(2 * 0.8 / 1.8)
    # trials that agree exactly reproduce S exactly, whatever the split
    assert prediction.reliability_of([[0.1] * 4, [0.5] * 4, [0.9] * 4], splits=10) == pytest.approx((1.0, 1.0))


def test_every_rule_is_read_off_a_family_that_kept_every_items_read():
    """research/tuning.py picks: the rules on one record whose reads and truths are known."""
    import tuning

    w, one = "as_written", [0.5] * 8
    reads = {w: {"t": one}, "mean": {"t": [0.9] * 8}, "ties": {"t": one}, "mean x0.75": {"t": [0.95] * 8}}
    truth = {w: 0.40, "mean": 0.60, "ties": 0.70, "mean x0.75": 0.55}
    record = {
        "members": ["t"],
        "reads": reads,
        "lines": {"mean": "mean", "ties": "ties", "mean x0.75": "mean"},
        "measured": {c: {"t": v} for c, v in truth.items()},
    }
    picked = tuning.picks(record)
    # on the probes: the mean merge over as written, then its knob over it (no spread: any margin clears)
    assert picked["stepped"] == "mean x0.75" and picked["stepped, budget 0"] == "mean"
    assert picked["lower bound"] == "mean x0.75" and picked["lower bound, budget 0"] == "mean"
    assert picked["ungated"] == "mean x0.75" and picked["ungated, budget 0"] == "mean"
    # the ceilings read the truth: TIES, which the probes rank level with as written
    assert picked["ceiling: best of the menu"] == picked["ceiling: best of every candidate"] == "ties"
    # a candidate no truth was measured for (a family measuring the picks only): no ceiling over every one
    record["reads"]["knob"], record["lines"]["knob"] = {"t": [0.1] * 8}, "mean"
    assert "ceiling: best of every candidate" not in tuning.picks(record)
