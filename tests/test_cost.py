"""The cost line's arithmetic, with known answers (what it is measured against: benchmarks/cost_line.py)."""

import json

import pytest

from mergekit_mergeability.cost import FULL, LINE, PROMPT, TIMED, WINDOW, Cost, Pace


def test_a_call_between_timed_sizes_is_read_on_the_line_between_them_and_the_blocks_times_the_layers():
    rising = [float(n) for n in TIMED]  # a second a token, in a block and outside it
    pace = Pace(block={PROMPT: rising, FULL: rising}, outside={PROMPT: [1.0] * len(TIMED), FULL: rising}, layers=30)
    assert pace.call(FULL, 20) == pytest.approx((30 * 20.0, 20.0))  # between 16 and 32
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


def test_a_pace_is_timed_once_per_shape_and_again_where_the_kept_one_lacks_a_kind_or_a_size(tmp_path, monkeypatch):
    from mergekit_mergeability import cost

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed = []
    flat = {kind: [0.5] * len(TIMED) for kind in cost.KINDS}
    monkeypatch.setattr(cost, "_timed", lambda *args: timed.append(args) or Pace(flat, flat))
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3}
    assert cost.pace(config, "cpu", "float32").call(PROMPT, 8) == pytest.approx((1.5, 0.5))
    cost.pace(config, "cpu", "float32")
    assert len(timed) == 1  # kept
    kept = tmp_path / "mergekit-mergeability" / "pace.json"
    older = {
        k: {"block": {PROMPT: [1.0] * 6, FULL: [1.0] * 6}, "outside": {PROMPT: [1.0] * 6}}
        for k in json.loads(kept.read_text())
    }
    kept.write_text(json.dumps(older))  # two kinds at six sizes, as an older version kept it
    assert cost.pace(config, "cpu", "float32").call(FULL, 8) == pytest.approx((1.5, 0.5))
    assert len(timed) == 2


def test_the_timed_pace_of_a_tiny_shape_has_every_kind_at_every_size():
    import transformers

    from mergekit_mergeability import cost

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
    ).to_dict()
    at = cost._timed(config, "cpu", "float32")
    assert cost._usable({"block": at.block, "outside": at.outside})
    assert all(t > 0 for kind in cost.KINDS for t in at.outside[kind])


def _characters(text, **_):
    """A tokenizer of one token a character, with no special tokens."""
    return {"input_ids": [ord(c) for c in text]}


def test_a_probes_items_are_timed_as_run_together_and_lm_evals_whole_requests_are_added_to_its_lines():
    from types import SimpleNamespace as Item

    from mergekit_mergeability.cost import OPTIONS, _seconds
    from mergekit_mergeability.tasks.probes import Instance

    items = [
        Instance(prompt="Q1:", continuations=(" ab", " ac"), label=0),  # " a" runs with the prompt: no options call
        Instance(prompt="Q22:", continuations=(" xyz", " q"), label=0),  # " " with the prompt; "xy" of " xyz" runs
    ]
    rising = [float(n) for n in TIMED]  # a second a token, in the one block
    pace = Pace(
        block={k: rising for k in (PROMPT, OPTIONS, FULL)},
        outside={k: [0.0] * len(TIMED) for k in (PROMPT, OPTIONS, FULL)},
        layers=1,
    )
    inputs = Item(settings=Item(batch_size=2), models=[Item(probes=items)])
    lines = Item(name="knowledge")
    scored = Item(name="dilution", whole=lambda inputs: items)
    found = _seconds(inputs, [lines, scored], {"knowledge": 4, "dilution": 8}, _characters, pace)
    # one group: prompts padded to 5 tokens (3 + " a", 4 + " "), 2 x 5 = 10; options: one row of 2 tokens
    assert found["knowledge"] == pytest.approx((12 / 4, 0.0))
    # and once, lm-eval's 4 rows of 6, 6, 8 and 6 tokens, 2 at a time: 2 calls of 13 tokens, over its 8 passes
    assert found["dilution"] == pytest.approx((12 / 4 + 26 / 8, 0.0))


def test_the_menus_merges_are_timed_as_it_builds_them_each_update_sorted_once_in_every_turn(monkeypatch):
    """The cost line times the menu's merges in turn, as the menu builds them: TIES sorts each update
    once for its masks at every density the menu prunes at, and the candidates after it reuse them.
    Every timed turn draws fresh values, so each pays those sorts; a turn that found the masks of
    the turn before would leave them out of the estimate."""
    from types import SimpleNamespace

    import mergekit.sparsify as sparsify

    from mergekit_mergeability import cost, sources
    from mergekit_mergeability.rehearsal import planned
    from mergekit_mergeability.decide.tuning import PRUNED_AT
    from mergekit_mergeability.rehearsal.planned import Planned

    class Prunes:  # a merge that prunes each input by magnitude, as TIES does
        def __init__(self, density):
            self.density = density

        def execute(self, tensors):
            return sum(sparsify.magnitude(t, self.density) for t in tensors.values())

    sort, sorts = planned._kept_bits, []
    monkeypatch.setattr(
        planned, "_kept_bits", lambda tensor, densities: sorts.append(tuple(densities)) or sort(tensor, densities)
    )
    header = SimpleNamespace(shape=(16, 8))
    monkeypatch.setattr(sources, "TensorReader", lambda path: SimpleNamespace(index={"w": header}))
    inputs = SimpleNamespace(base=SimpleNamespace(path="base"), touched={"a": frozenset({"w"}), "b": frozenset({"w"})})
    reads = tuple((model, ("w",), False) for model in ("a", "b"))
    plans = {d: {"w": Planned("w", reads, Prunes(d), None, None, True)} for d in PRUNED_AT}
    assert cost._building(plans, inputs, "float32") > 0
    assert len(sorts) == 2 * 2 and all(sorted(s) == sorted(PRUNED_AT) for s in sorts), sorts  # 2 turns × 2 updates
