"""A probe is asked exactly as its model is scored: a fewshot: file is the shots, in order, for every
item; a line may carry its prompt verbatim; chat: true asks through the chat template; and the
rehearsed merge, asked that way, reads as the merge mergekit writes, item by item."""

import json

import pytest
import torch
import yaml

from mergekit_mergeability import tasks
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks import probes
from mergekit_mergeability.tiny import derive, state_dict

from conftest import noise

SHOTS = [
    {"question": "Which is a fruit?", "choices": ["apple", "stone", "car"], "label": 0},
    {"question": "Which is wet?", "choices": ["sand", "water", "dust"], "label": 1},
    {"question": "Which barks?", "choices": ["cat", "cow", "dog"], "label": 2},
    {"question": "Which flies?", "choices": ["bird", "fish", "worm"], "label": 0},
]
ITEMS = [
    {"question": f"Which animal is number {i}?", "choices": ["cow", "cat", "duck", "dog"], "label": i % 4}
    for i in range(8)
]


def _lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _by_hand(row, k):
    """A user's own k-shot prompt, written out: the fewshot file's first k examples, solved, in order."""

    def block(r):
        options = "".join(f"\n{'ABCD'[i]}. {c}" for i, c in enumerate(r["choices"]))
        return f"Question: {r['question']}{options}\nAnswer:"

    solved = [f"{block(s)} {s['choices'][s['label']]}" for s in SHOTS[:k]]
    return "\n\n".join([*solved, block(row)])


def test_a_fewshot_file_is_the_shots_in_its_order_for_every_item(tmp_path):
    rows = [{**r, "format": "options", "shots": 3} for r in ITEMS]
    probe, shots = _lines(tmp_path / "probe.jsonl", rows), _lines(tmp_path / "shots.jsonl", SHOTS)
    asked = tasks.load(str(probe), fewshot=str(shots))
    assert [i.prompt for i in asked] == [_by_hand(r, 3) for r in ITEMS]
    assert all(i.continuations == tuple(f" {c}" for c in r["choices"]) for i, r in zip(asked, ITEMS))
    # without the file, the shots are drawn from the probe's other lines (the fallback)
    drawn = tasks.load(str(probe))
    assert all("Which is a fruit?" not in i.prompt for i in drawn) and drawn[0].prompt != asked[0].prompt
    # the paper's lettered view (--fewshot K) takes the file's first K too, the same for every item
    lettered = probes.with_shots(asked, 2, probes.shots_from(None), fixed=probes.shots_from(str(shots)))
    assert [i.prompt for i in lettered] == [_by_hand(r, 2) for r in ITEMS]


def test_a_fewshot_file_too_short_for_the_shots_asked_is_one_line(tmp_path):
    probe = _lines(tmp_path / "probe.jsonl", [{**r, "format": "options", "shots": 3} for r in ITEMS])
    shots = _lines(tmp_path / "shots.jsonl", SHOTS[:2])
    with pytest.raises(UserError, match=r"2 solved examples, but probe .* asks for 3 shots"):
        tasks.load(str(probe), fewshot=str(shots))


def test_the_lm_eval_route_scores_the_same_prompts_with_the_fewshot_file(tmp_path, llama):
    """evaluate and mergeability (the probe as an lm-eval task) ask what the precheck asks."""
    from mergekit_mergeability.diagnostics.activations import choice_logprobs
    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.tasks import harness, lmeval

    probe = _lines(tmp_path / "probe.jsonl", [{**r, "format": "options", "shots": 2} for r in ITEMS])
    shots = str(_lines(tmp_path / "shots.jsonl", SHOTS))
    task = lmeval.resolve(str(probe), fewshot=shots)
    assert task.fingerprint != lmeval.resolve(str(probe)).fingerprint  # a cached score of other shots is not reused
    asked = tasks.load(str(probe), fewshot=shots)
    docs = lmeval._scored_docs(str(probe), shots, False, None)
    assert [d["prompt"] for d in docs] == [i.prompt for i in asked] == [_by_hand(r, 2) for r in ITEMS]
    model, tokenizer = load_causal_lm(llama["base"])
    right = [int(torch.argmax(s)) == i.label for (s, _), i in zip(choice_logprobs(model, tokenizer, asked), asked)]
    assert harness.score(model, tokenizer, task)["score"] == pytest.approx(sum(right) / len(right))


def test_a_line_with_its_own_prompt_is_asked_as_written(tmp_path, llama):
    from mergekit_mergeability.diagnostics.activations import choice_logprobs
    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.tasks import harness, lmeval

    rows = [
        {"prompt": "Q: which says moo?\nA:", "choices": ["cow", "cat"], "label": 0},
        {"prompt": "Q: which says meow?\nA: ", "choices": ["cow", "cat"], "label": "cat"},
    ]
    probe = _lines(tmp_path / "verbatim.jsonl", rows)
    first, second = tasks.load(str(probe))
    assert (first.prompt, first.continuations, first.label) == (rows[0]["prompt"], (" cow", " cat"), 0)
    assert (second.prompt, second.continuations, second.label) == (rows[1]["prompt"], ("cow", "cat"), 1)
    assert first.letters == () and first.shots == 0
    assert probes.with_shots([first], 3, probes.shots_from(None)) == [first]  # no lettering, no shots added
    # through lm-eval, the same requests
    model, tokenizer = load_causal_lm(llama["base"])
    asked = [first, second]
    right = [int(torch.argmax(s)) == i.label for (s, _), i in zip(choice_logprobs(model, tokenizer, asked), asked)]
    assert harness.score(model, tokenizer, lmeval.resolve(str(probe)))["score"] == pytest.approx(sum(right) / 2)
    with pytest.raises(UserError, match='its own "prompt" is asked as written'):
        tasks.load(str(_lines(tmp_path / "bad.jsonl", [{**rows[0], "shots": 2}])))


TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_chat_asks_through_the_models_chat_template_as_lm_eval_does(tmp_path, llama):
    """The prompt is the user turn, the continuation scored right after the generation prompt (no
    delimiter), as lm-eval's --apply_chat_template; a tokenizer without a template is one line."""
    import transformers

    from mergekit_mergeability.diagnostics.activations import choice_logprobs
    from mergekit_mergeability.sources import load_causal_lm
    from mergekit_mergeability.tasks import harness, lmeval

    probe = _lines(tmp_path / "probe.jsonl", ITEMS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama["base"])
    with pytest.raises(UserError, match="has no chat template"):
        probes.chatted(tasks.load(str(probe)), tokenizer, "m")
    tokenizer.chat_template = TEMPLATE
    asked = probes.chatted(tasks.load(str(probe)), tokenizer, "m")
    row = ITEMS[0]
    assert asked[0].prompt == f"<|user|>{row['question']}\nAnswer:<|end|><|assistant|>"
    assert asked[0].continuations == tuple(row["choices"])
    # lm-eval's own chat route scores the same requests (the template on the model's tokenizer)
    model, _ = load_causal_lm(llama["base"])
    right = [int(torch.argmax(s)) == i.label for (s, _), i in zip(choice_logprobs(model, tokenizer, asked), asked)]
    task = lmeval.resolve(str(probe), chat=True)
    assert task.chat and task.fingerprint != lmeval.resolve(str(probe)).fingerprint
    assert harness.score(model, tokenizer, task)["score"] == pytest.approx(sum(right) / len(right))
    plain = transformers.AutoTokenizer.from_pretrained(llama["base"])
    with pytest.raises(UserError, match="the tokenizer scoring it has no chat template"):
        harness.score(model, plain, task)


def test_chat_true_in_the_config_asks_through_the_template_and_must_be_a_bool(tmp_path, llama):
    import transformers

    from mergekit_mergeability import api, measuring

    expert = tmp_path / "expert"
    derive(llama["base"], expert, noise(3, 0.01))
    tokenizer = transformers.AutoTokenizer.from_pretrained(expert)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(expert)
    probe = _lines(tmp_path / "probe.jsonl", ITEMS)
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(expert), "probe": str(probe), "chat": True, "parameters": {"weight": 1.0}},
            {"model": str(llama["expert1"]), "probe": str(probe), "parameters": {"weight": 1.0}},
        ],
    }
    spec = api._spec(document)
    _, (chatted, plain) = measuring.load_inputs(spec, spec.probes, None)
    assert chatted.probes[0].prompt.startswith("<|user|>") and not plain.probes[0].prompt.startswith("<|user|>")
    document["models"][1]["chat"] = True  # a tokenizer without a template: one line naming the entry
    spec = api._spec(document)
    with pytest.raises(UserError, match=r"models\[1\]\.chat: .*has no chat template"):
        measuring.load_inputs(spec, spec.probes, None)
    document["models"][1]["chat"] = "yes"
    with pytest.raises(UserError, match=r"models\[1\]\.chat is 'yes'; say true or false"):
        api._spec(document)


def test_a_model_no_better_than_the_base_on_its_own_probe_is_a_finding(llama, tmp_path):
    from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
    from mergekit_mergeability.diagnostics.dilution import Dilution

    probe = tasks.load(str(_lines(tmp_path / "probe.jsonl", ITEMS)))
    same = derive(llama["base"], tmp_path / "same", lambda name, t: torch.zeros_like(t))  # learnt nothing
    inputs = DiagnosticInputs(ModelInput("base", llama["base"]), (ModelInput("same", same, probe),))
    result = Dilution().run(inputs)
    assert result.per_model["same"]["alone_accuracy"] is not None
    (finding,) = [f for f in result.findings if "may not be asked the way this model was trained" in f.message]
    assert finding.severity == "warning" and finding.message.startswith(
        "same: on its own probe it scores the share of items right"
    )


def test_with_the_users_shots_the_rehearsal_reads_as_the_written_merge_item_by_item(llama, tmp_path):
    """Known answer: a config of two experts, each probe in the options format behind the user's own
    3 fixed shots (fewshot: file). The precheck's rehearsed score of each model, item by item, equals
    the user's own read of the merge mergekit writes, asked with the same prompt built by hand."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.settings import PrecheckSettings
    from mergekit_mergeability.sources import load_causal_lm

    experts = [derive(llama["base"], tmp_path / f"e{i}", noise(10 + i, 0.05)) for i in range(2)]
    shots = _lines(tmp_path / "shots.jsonl", SHOTS)
    probes_of = [
        _lines(tmp_path / f"probe{i}.jsonl", [{**r, "format": "options", "shots": 3} for r in ITEMS[4 * i : 4 * i + 4]])
        for i in range(2)
    ]
    document = {
        "merge_method": "ties",
        "base_model": str(llama["base"]),
        "dtype": "float32",
        "models": [
            {"model": str(e), "probe": str(p), "fewshot": str(shots), "parameters": {"weight": 1.0, "density": 0.5}}
            for e, p in zip(experts, probes_of)
        ],
    }
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(document))
    settings = PrecheckSettings(quiet=True, skip=("representations", "selectivity", "fluency", "menu"))
    measured = measuring.measure(api._spec(config), {}, settings)
    rehearsed = measured.results["dilution"]
    run_merge(MergeConfiguration.model_validate(document), str(tmp_path / "out"), MergeOptions(write_model_card=False))
    written = derive(llama["base"], tmp_path / "written", lambda name, t: state_dict(tmp_path / "out")[name] - t)
    model, tokenizer = load_causal_lm(written)
    for expert, i in zip(experts, range(2)):
        assert rehearsed.per_model[str(expert)]["rehearsed"] == "written"
        rows = ITEMS[4 * i : 4 * i + 4]
        read = [_users_read(model, tokenizer, _by_hand(r, 3), r) for r in rows]
        mine = [item["partnered_p_gold"] for item in rehearsed.per_instance[str(expert)]]
        assert len(mine) == len(read) == 4
        assert max(abs(a - b) for a, b in zip(mine, read)) <= 1e-3
        assert rehearsed.per_model[str(expert)]["partnered_mean_p_gold"] == pytest.approx(sum(read) / 4, abs=1e-3)


def _users_read(model, tokenizer, prompt, row):
    """p(gold) as a user's own harness reads it: each option's summed log-prob after the prompt, one
    plain forward pass per option, softmax over the options."""
    totals = []
    for choice in row["choices"]:
        context = tokenizer(prompt)["input_ids"]
        ids = tokenizer(prompt + " " + choice)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double().log_softmax(-1)
        totals.append(sum(logits[t - 1, ids[t]] for t in range(len(context), len(ids))))
    return float(torch.softmax(torch.stack(totals), 0)[row["label"]])


def test_a_fewshot_file_beside_an_lm_eval_task_is_refused_naming_where_its_shots_come_from(tmp_path):
    from mergekit_mergeability.tasks import lmeval

    shots = str(_lines(tmp_path / "shots.jsonl", SHOTS))
    with pytest.raises(UserError, match=r"the lm-eval task arc_easy takes its own from num_fewshot and fewshot_config"):
        lmeval.resolve("arc_easy", fewshot=shots)
    with pytest.raises(UserError, match=r"line 1 is not a \{\"question\", \"choices\", \"label\"\} line"):
        probes.shots_from(str(_lines(tmp_path / "generation.jsonl", [{"prompt": "2+2=", "answer": "4"}])))


def test_evaluate_and_mergeability_resolve_each_probe_with_its_models_fewshot_file_and_chat(tmp_path, llama):
    """``resolve_all`` with the config's ``asked()``: the lm-eval task a probe becomes renders the
    model's shots (what ``evaluate``, ``mergeability`` and ``plan --measured`` score)."""
    from mergekit_mergeability import api
    from mergekit_mergeability.tasks import lmeval

    probe = _lines(tmp_path / "probe.jsonl", [{**r, "format": "options", "shots": 2} for r in ITEMS])
    shots = _lines(tmp_path / "shots.jsonl", SHOTS)
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(llama["expert0"]), "probe": str(probe), "fewshot": str(shots), "chat": True},
            {"model": str(llama["expert1"])},
        ],
    }
    spec = api._spec(document)
    assert spec.asked() == {str(probe): (str(shots), True)}
    (task,) = lmeval.resolve_all([str(probe)], spec).values()
    assert task.chat and task.entry["process_docs"].args == (str(probe), str(shots), True)
    docs = task.entry["process_docs"](None)
    assert [d["prompt"] for d in docs] == [_by_hand(r, 2) for r in ITEMS]
    assert docs[0]["choices"] == ITEMS[0]["choices"]  # under chat, no delimiter before a choice
