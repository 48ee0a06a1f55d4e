"""The knob grid and the cross-fitted chooser on a merge whose best update scale is known: two
experts carrying the same update τ, built so that each probe item is answered right only between
two known scales of τ. Written as task_arithmetic with weight 1 each (2τ, an overshoot), the best
merge is their mean (τ); the search must find it, and each half of the probes must agree."""

import json

import pytest
import torch
import yaml

from mergekit_mergeability.decide.tuning import candidates
from mergekit_mergeability.decide.verdict import AS_WRITTEN, METHOD_BY_REHEARSAL, halves
from mergekit_mergeability.tiny import CORPUS, derive

from conftest import precheck_cli

CHOICES = ("q", "x")
ITEMS = 8  # per probe: of each half, two items right only above 0.9·τ and two only below 1.25·τ
ABOVE, BELOW = 0.9, 1.25


@pytest.fixture(scope="module")
def overshooting(llama, tmp_path_factory):
    """A base, two experts equal to it plus τ on the head's rows for q and x, and their probes."""
    from mergekit_mergeability import tasks
    from mergekit_mergeability.sources import load_causal_lm

    root = tmp_path_factory.mktemp("tuning")
    base = llama["base"]
    model, tokenizer = load_causal_lm(base)
    questions = [f"{sentence} Item {i}?" for i in range(2 * ITEMS) for sentence in CORPUS][: 2 * ITEMS]
    draft = root / "draft.jsonl"
    draft.write_text(
        "".join(json.dumps({"question": q, "choices": list(CHOICES), "label": 0}) + "\n" for q in questions)
    )
    asked = tasks.load(str(draft))
    ids = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(f" {c}"))[-1] for c in CHOICES]
    with torch.no_grad():  # the state the head reads q or x from: the prompt and what " q" and " x" share
        hidden = torch.stack(
            [model.model(input_ids=torch.tensor([_shared(tokenizer, i)])).last_hidden_state[0, -1] for i in asked]
        )
        head = model.lm_head.weight
        margin = hidden @ (head[ids[0]] - head[ids[1]])  # logit q − logit x on the base
    # item i flips at scale θ_i: margin·(1 − s/θ_i), so u·h_i = −margin_i/θ_i with u = τ_q − τ_x
    below = {i for probe in range(2) for half in halves(ITEMS) for i in [probe * ITEMS + j for j in half][2:]}
    theta = torch.tensor([BELOW if i in below else ABOVE for i in range(2 * ITEMS)])
    u = torch.linalg.lstsq(hidden, (-margin / theta)[:, None]).solution[:, 0]
    preferred = (margin > 0).long()  # 1 where the base prefers q
    # right only below 1.25·τ: the base's own choice; right only above 0.9·τ: the other one
    labels = [int(1 - p) if i in below else int(p) for i, p in enumerate(preferred.tolist())]

    def update(name, tensor):
        change = torch.zeros_like(tensor)
        if name == "lm_head.weight":
            change[ids[0]], change[ids[1]] = u / 2, -u / 2
        return change

    experts = [derive(base, root / f"e{k}", update) for k in range(2)]
    probes = []
    for k in range(2):
        path = root / f"p{k}.jsonl"
        rows = [
            {"question": questions[i], "choices": list(CHOICES), "label": labels[i]}
            for i in range(k * ITEMS, (k + 1) * ITEMS)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        probes.append(path)
    return base, experts, probes


def _shared(tokenizer, instance):
    from mergekit_mergeability.diagnostics.activations import encode

    context, continuation = encode(tokenizer, instance.prompt, instance.continuations[0])
    return context + continuation[:-1]


def test_the_search_finds_the_scale_an_overshooting_config_should_be_written_at(overshooting, tmp_path):
    base, experts, probes = overshooting
    models = [{"model": str(e), "probe": str(p), "parameters": {"weight": 1.0}} for e, p in zip(experts, probes)]
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": str(base), "models": models}))
    out = tmp_path / "out"
    result = precheck_cli(config, out, "--skip", "representations", "--skip", "selectivity", "--skip", "fluency")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "precheck.json").read_text())
    choice, search = report["recommendation"]["method_choice"], report["recommendation"]["search"]
    kept = {c["name"]: c["kept"] for c in search}
    # as written, the sum (2τ: "mean x2" is the same merge, not rehearsed twice) keeps the items right
    # above 0.9·τ only; 0.75·τ and 1.5·τ half of them; τ, the mean merge, all
    assert "mean x2" not in kept and kept[AS_WRITTEN] == kept["mean x0.75"] == kept["mean x1.5"] == 0.5
    assert kept["mean"] == 1.0
    assert choice["best"] == choice["chosen"] == "mean" and choice["picked"] == ["mean", "mean"]
    assert choice["gain"] == pytest.approx(0.5) and choice["gain_interval"][0] > 0
    assert report["recommendation"]["verdict"] == METHOD_BY_REHEARSAL
    written = yaml.safe_load((out / "recommended.yml").read_text())
    assert written["merge_method"] == "task_arithmetic"
    assert [m["parameters"]["weight"] for m in written["models"]] == [0.5, 0.5]


def test_the_grid_is_fixed_in_its_order_and_lists_each_merge_once():
    document = {
        "merge_method": "task_arithmetic",
        "base_model": "b",
        "models": [{"model": m, "parameters": {"weight": 0.5}} for m in ("e1", "e2")],
    }
    found = candidates(document, {"e1": 0.4, "e2": 0.8})
    # written as the mean merge (weights 1/2, lambda 1 by default): "mean" is that merge, and its lambda
    # at 0.75 and 1.5 are "mean x0.75" and "mean x1.5" (each update at 0.375, at 0.75): none listed again
    assert list(found) == [
        "ties", "dare_ties", "knowledge_weighted", "mean x1.5", "mean x2", "ties d0.7", "ties d0.3", "mean x0.75",
        "ties lambda x1.5", "dare_ties d0.7", "mean, expert 1 x2", "mean, expert 2 x2",
    ]  # fmt: skip
    assert found["mean x1.5"].advice.config["models"][0]["parameters"]["weight"] == 0.75
    assert found["ties d0.3"].advice.config["parameters"]["density"] == 0.3
    assert found["mean, expert 2 x2"].knobs()["weights"] == {"e1": 0.5, "e2": 1.0}
    summed = {**document, "models": [{**m, "parameters": {"weight": 1.0}} for m in document["models"]]}
    assert candidates(summed, {})["as written, lambda x1.5"].advice.config["parameters"]["lambda"] == 1.5
    assert "knowledge_weighted" not in candidates(document, {})  # no knowledge, no knowledge_weighted
    assert "mean" in candidates(summed, {})
