"""The demo's rule-made languages: known translations, and held-out sentences that are held out."""

from mergekit_mergeability.demo import languages
from mergekit_mergeability.demo.translation import rows as shipped_rows

THE_BIG_DOGS_WATCHED_A_CAT = (("the", "big", "dog", True), "watch", True, ("a", "", "cat", False))


def test_each_language_applies_its_own_order_lexicon_and_inflections():
    sentence = THE_BIG_DOGS_WATCHED_A_CAT
    assert languages.english(sentence) == "the big dogs watched a cat"
    assert languages.ZORBISH.translate(sentence) == "lo bakumen grav mirel vedot"  # SOV, adjective after, -en, -ot
    assert languages.KELVIC.translate(sentence) == "su vedra ha stor tahund un kat"  # VSO, adjective first, ta-, su
    present = (("", "", "farmer", False), "push", False, ("the", "old", "king", True))
    assert languages.english(present) == "farmer pushes the old kings"
    assert languages.ZORBISH.translate(present) == "dorin lo kazoren olt pusa"
    assert languages.KELVIC.translate(present) == "skub bur ha gam takonge"


def test_the_shipped_data_is_the_generators_and_no_test_sentence_is_trained_on():
    data = languages.rows()
    assert shipped_rows() == data
    english = {
        r["expert"]: {
            s: {
                r2["prompt"].split(": ", 1)[1].split("\n")[0]
                for r2 in data
                if r2["expert"] == r["expert"] and r2["split"] == s
            }
            for s in ("train", "test")
        }
        for r in data
    }
    trained = set().union(*(e["train"] for e in english.values()))
    assert all(len(e["train"]) == 320 and len(e["test"]) == 40 for e in english.values())
    assert not trained & set().union(*(e["test"] for e in english.values()))
    assert english["zorbish_a"] == english["kelvic_a"]  # the same English into two languages
    assert not english["zorbish_a"]["train"] & english["zorbish_b"]["train"]  # other English into the same one


def _pair(task_arithmetic, patch, recommended):
    merges = [
        {"merge": label, "expert": e, "kept": k}
        for label, kept in (("task_arithmetic", task_arithmetic), ("layer patch", patch), ("recommended", recommended))
        for e, k in kept.items()
    ]
    return {"merges": merges, "advice": "recommended"}


def _signals(final_cka):
    blocks = 6
    return {
        "cka_experts": [1.0] * blocks + [final_cka],
        "cka_lowest": [1.0] * (blocks + 1),
        "overlap_experts": [1.0] * blocks,
        "overlap_base": [1.0, 1.0, 1.0, 0.1, 0.1, 0.1],
    }


def test_paper_3s_findings_are_judged_on_what_was_measured():
    from mergekit_mergeability.demo.translation import findings, lost_by_advice

    as_paper = {
        "different_targets": _pair({"a": 0.2, "b": 0.3}, {"a": 0.8, "b": 0.7}, {"a": 0.6, "b": 0.5}),
        "shared_target": _pair({"a": 0.9, "c": 0.8}, {"a": 0.95, "c": 0.9}, {"a": 0.9, "c": 0.8}),
    }
    signals = {"different_targets": _signals(0.6), "shared_target": _signals(0.9)}
    counts = [300, 10, 10, 50, 60, 70]  # block 0 and the upper third crowded, as paper 3 found
    found = findings(as_paper, signals, counts, updated=[3, 4, 5])
    assert [f["reproduces"] for f in found] == [True] * 6

    against = {  # shared targets suffer more, and the patch loses to plain task arithmetic
        "different_targets": _pair({"a": 0.9, "b": 0.9}, {"a": 0.5, "b": 0.5}, {"a": 0.4, "b": 0.3}),
        "shared_target": _pair({"a": 0.2, "c": 0.2}, {"a": 0.95, "c": 0.9}, {"a": 0.9, "c": 0.8}),
    }
    flat = [10, 50, 50, 50, 20, 20]
    found = {
        f["finding"].split(" (")[0]: f["reproduces"]
        for f in findings(
            against, {"different_targets": _signals(0.95), "shared_target": _signals(0.9)}, flat, [3, 4, 5]
        )
    }
    assert not any(v for k, v in found.items() if not k.startswith(("lower blocks", "fine-tuning")))
    assert lost_by_advice(against) == ["different_targets"] and lost_by_advice(as_paper) == []
