"""Probes from fine-tuning data (``tasks.sft``): every layout, in every file type, gives the prompt
and answer written out here by hand, and a tiny model's score on them is the reference answer's
per-token probability, as a plain forward pass computes it."""

import csv
import json
import math

import pytest
import torch

from mergekit_mergeability import tasks
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.tasks import sft
from mergekit_mergeability.tasks.probes import GENERATION

PAIRS = [
    ("What is the capital of France?", "Paris."),
    ("At what does water boil?", "One hundred degrees."),
    ("Who jumps over the lazy dog?", "The quick brown fox."),
    ("What keeps what each fine-tune learned?", "Merging, sometimes."),
    ("Where is Paris?", "In France."),
    ("What is quick and brown?", "The fox."),
]

ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{}\n\n### Response:\n"
)
ALPACA_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{}\n\n### Input:\n{}\n\n### Response:\n"
)

# layout -> (its row for a question and answer, the prompt and continuation it must give)
LAYOUTS = {
    "messages": (
        lambda q, a: {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
            ]
        },
        lambda q, a: (f"System: Answer briefly.\n\nUser: {q}\n\nAssistant:", f" {a}"),
    ),
    "conversations": (
        lambda q, a: {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]},
        lambda q, a: (f"User: {q}\n\nAssistant:", f" {a}"),
    ),
    "prompt_completion": (
        lambda q, a: {"prompt": f"Q: {q}\nA:", "completion": f" {a}"},
        lambda q, a: (f"Q: {q}\nA:", f" {a}"),
    ),
    "alpaca": (
        lambda q, a: {"instruction": q, "input": "", "output": a},
        lambda q, a: (ALPACA_NO_INPUT.format(q), a),
    ),
    "alpaca_input": (
        lambda q, a: {"instruction": "Answer the question.", "input": q, "output": a},
        lambda q, a: (ALPACA_INPUT.format("Answer the question.", q), a),
    ),
    "text": (
        lambda q, a: {"text": f"Q: {q}\nA: {a}"},
        lambda q, a: (f"Q: {q}\nA:", f" {a}"),
    ),
}
FLAT = ("prompt_completion", "alpaca", "alpaca_input", "text")  # what a CSV file can hold
MARKER = "\nA:"


def _rows(layout):
    return [LAYOUTS[layout][0](q, a) for q, a in PAIRS]


def _expected(layout):
    return [LAYOUTS[layout][1](q, a) for q, a in PAIRS]


def _write(folder, kind, rows):
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        path = folder / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = folder / "train.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "train.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "csv":
        path = folder / "train.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        from datasets import Dataset

        path = folder / "saved"
        Dataset.from_list(rows).save_to_disk(str(path))
    return path


KINDS = ("jsonl", "json", "parquet", "csv", "datasets")
CASES = [(layout, kind) for layout in LAYOUTS for kind in KINDS if kind != "csv" or layout in FLAT]


@pytest.mark.parametrize("layout, kind", CASES)
def test_every_layout_in_every_file_type_gives_the_prompt_and_answer(tmp_path, layout, kind):
    path = _write(tmp_path, kind, _rows(layout))
    asked = tasks.load(str(path), answer_after=MARKER if layout == "text" else None)
    assert [(i.prompt, i.continuations) for i in asked] == [(p, (c,)) for p, c in _expected(layout)]
    assert {(i.kind, i.format, i.label) for i in asked} == {(GENERATION, GENERATION, 0)}
    assert tasks.scoring_task(str(path)) is None  # read by the precheck itself, no lm-eval task


def test_a_relative_spec_resolves_against_the_config_folder(tmp_path):
    _write(tmp_path / "data", "parquet", _rows("alpaca"))
    _write(tmp_path / "data", "datasets", _rows("alpaca"))
    assert len(tasks.load("data/train.parquet", relative_to=tmp_path)) == len(PAIRS)
    assert len(tasks.load("data/saved", relative_to=tmp_path)) == len(PAIRS)


def test_multi_turn_chat_answers_the_last_assistant_turn(tmp_path):
    row = {
        "messages": [
            {"role": "user", "content": "Boil?"},
            {"role": "assistant", "content": "At 100 C."},
            {"role": "user", "content": "Freeze?"},
            {"role": "assistant", "content": "At 0 C."},
            {"role": "user", "content": "Thanks."},
        ]
    }
    (asked,) = tasks.load(str(_write(tmp_path, "jsonl", [row])))
    assert asked.prompt == "User: Boil?\n\nAssistant: At 100 C.\n\nUser: Freeze?\n\nAssistant:"
    assert asked.gold == " At 0 C."


def test_trl_conversational_prompt_completion(tmp_path):
    row = {
        "prompt": [{"role": "user", "content": "Capital of France?"}],
        "completion": [{"role": "assistant", "content": "Paris."}],
    }
    (asked,) = tasks.load(str(_write(tmp_path, "jsonl", [row])))
    assert (asked.prompt, asked.gold) == ("User: Capital of France?\n\nAssistant:", " Paris.")


def test_the_text_split_is_at_the_last_marker(tmp_path):
    row = {"text": "### Human: hi\n### Assistant: hello\n### Human: bye\n### Assistant: goodbye"}
    (asked,) = tasks.load(str(_write(tmp_path, "jsonl", [row])), answer_after="### Assistant:")
    assert asked.prompt.endswith("### Human: bye\n### Assistant:") and asked.gold == " goodbye"


def test_a_limit_draws_rows_with_a_fixed_seed_in_file_order(tmp_path):
    rows = [{"prompt": f"Q{i}:", "completion": f" a{i}"} for i in range(50)]
    path = _write(tmp_path, "jsonl", rows)
    drawn = [i.prompt for i in tasks.load(str(path), limit=8)]
    assert drawn == [i.prompt for i in tasks.load(str(path), limit=8)]  # the same draw every time
    numbers = [int(p[1:-1]) for p in drawn]
    assert len(set(numbers)) == 8 and numbers == sorted(numbers) and numbers != list(range(8))  # drawn, not the first
    for kind in ("parquet", "json", "datasets"):  # every file type draws the same rows
        assert [i.prompt for i in tasks.load(str(_write(tmp_path / kind, kind, rows)), limit=8)] == drawn
    assert len(tasks.load(str(path), limit=500)) == 50


def test_a_jsonl_file_of_probe_lines_is_still_read_as_probe_lines(tmp_path):
    path = _write(tmp_path, "jsonl", [{"prompt": "Water boils at", "answer": "100 C"}])
    assert sft.located(str(path)) is None
    (asked,) = tasks.load(str(path))
    assert asked.gold == " 100 C"


def test_an_unreadable_layout_is_one_line_naming_the_file_and_its_keys(tmp_path):
    for kind in ("jsonl", "parquet", "datasets"):
        path = _write(tmp_path / kind, kind, [{"question": "q", "reply": "r"}])
        with pytest.raises(
            UserError, match=rf"probe {path}: cannot read rows with keys \['question', 'reply'\]"
        ) as error:
            tasks.load(str(path))
        assert "\n" not in str(error.value) and "messages" in str(error.value)


@pytest.mark.parametrize(
    "rows, answer_after, message",
    [
        ([{"text": "Q: a\nA: b"}], None, 'rows of "text" need the marker that ends each prompt: add answer_after:'),
        ([{"text": "Q: a\nA: b"}, {"text": "no marker"}], MARKER, r"row 2: no '\\nA:' \(answer_after\) in its text"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], None, "row 1: no assistant turn"),
        ([{"instruction": "i", "output": ""}], None, "row 1: the answer is empty"),
        ([{"messages": [{"speaker": "user"}]}], None, r"row 1: a turn without role and content: keys \['speaker'\]"),
    ],
)
def test_a_bad_row_is_one_line_naming_the_file_and_row(tmp_path, rows, answer_after, message):
    path = _write(tmp_path, "jsonl", rows)
    with pytest.raises(UserError, match=rf"probe {path}: {message}"):
        tasks.load(str(path), answer_after=answer_after)


def test_a_dataset_of_several_splits_names_them(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = _rows("alpaca")
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:2])}).save_to_disk(
        str(tmp_path / "d")
    )
    with pytest.raises(UserError, match="a dataset of 2 splits; name one of their folders: .*d/train"):
        tasks.load(str(tmp_path / "d"))
    assert len(tasks.load(str(tmp_path / "d" / "test"))) == 2


def test_fine_tuning_data_is_refused_where_an_lm_eval_task_must_score_it(tmp_path):
    from mergekit_mergeability.tasks import lmeval

    path = _write(tmp_path, "parquet", _rows("alpaca"))
    with pytest.raises(UserError, match="fine-tuning data is a precheck probe only"):
        lmeval.resolve(str(path))


def _by_hand(model, tokenizer, prompt, continuation):
    """p(gold) and greedy match of ``continuation`` after ``prompt``, from one plain forward pass."""
    context = tokenizer(prompt)["input_ids"]
    ids = tokenizer(prompt + continuation)["input_ids"]
    assert ids[: len(context)] == context
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double().log_softmax(-1)
    steps = range(len(context), len(ids))
    mean = sum(float(logits[t - 1, ids[t]]) for t in steps) / len(steps)
    return math.exp(mean), all(int(logits[t - 1].argmax()) == ids[t] for t in steps)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_tiny_models_score_is_the_references_per_token_probability(tmp_path, llama, layout):
    from mergekit_mergeability.diagnostics.knowledge import scores
    from mergekit_mergeability.sources import load_causal_lm

    path = _write(tmp_path, "parquet", _rows(layout))
    asked = tasks.load(str(path), answer_after=MARKER if layout == "text" else None)
    model, tokenizer = load_causal_lm(llama["base"])
    scored = scores(model, tokenizer, asked, lambda n: None)
    for (prompt, continuation), got in zip(_expected(layout), scored):
        p_gold, greedy = _by_hand(model, tokenizer, prompt, continuation)
        assert got.p_gold == pytest.approx(p_gold, rel=1e-4) and got.correct == greedy


TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_chat_true_writes_each_rows_own_turns_through_the_template(tmp_path, llama):
    """A chat row's turns go to the template as turns (not one user message of "User: …"), ShareGPT's
    roles as templates name them; another layout's prompt is the user's turn; the answer follows
    the generation prompt with no delimiter, as lm-eval's --apply_chat_template scores it."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(llama["base"])
    tokenizer.chat_template = TEMPLATE
    q, a = PAIRS[0]
    for layout, prompt in (
        ("messages", f"<|system|>Answer briefly.<|end|><|user|>{q}<|end|><|assistant|>"),
        ("conversations", f"<|user|>{q}<|end|><|assistant|>"),
        ("prompt_completion", f"<|user|>Q: {q}\nA:<|end|><|assistant|>"),
    ):
        path = _write(tmp_path / layout, "jsonl", _rows(layout))
        asked = tasks.chatted(str(path), tasks.load(str(path)), tokenizer)
        assert (asked[0].prompt, asked[0].continuations) == (prompt, (a if layout != "prompt_completion" else f" {a}",))
    refusing = transformers.AutoTokenizer.from_pretrained(llama["base"])
    refusing.chat_template = "{{ raise_exception('no system turns') if messages[0]['role'] == 'system' else '' }}"
    path = tmp_path / "messages" / "train.jsonl"
    with pytest.raises(UserError, match=r"row 1: the model's chat template refused the row \(no system turns\)"):
        tasks.chatted(str(path), tasks.load(str(path)), refusing)


def test_chat_true_in_the_config_reads_fine_tuning_turns_through_the_models_template(tmp_path, llama):
    import transformers

    from mergekit_mergeability import api, measuring
    from mergekit_mergeability.tiny import derive

    from conftest import noise

    expert = derive(llama["base"], tmp_path / "expert", noise(3, 0.01))
    tokenizer = transformers.AutoTokenizer.from_pretrained(expert)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(expert)
    data = _write(tmp_path / "data", "parquet", _rows("messages"))
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(expert), "probe": str(data), "chat": True},
            {"model": str(llama["expert1"]), "probe": str(data)},
        ],
    }
    spec = api._spec(document)
    _, (chatted, plain) = measuring.load_inputs(spec, spec.probes, 3)
    assert len(chatted.probes) == len(plain.probes) == 3  # the same rows drawn, asked two ways
    for chat, text in zip(chatted.probes, plain.probes):
        question = text.prompt.removeprefix("System: Answer briefly.\n\nUser: ").removesuffix("\n\nAssistant:")
        assert chat.prompt == f"<|system|>Answer briefly.<|end|><|user|>{question}<|end|><|assistant|>"
        assert question in dict(PAIRS) and chat.gold == text.gold.lstrip() == dict(PAIRS)[question]


def test_a_written_config_names_a_saved_dataset_by_its_absolute_folder(tmp_path):
    """recommended.yml is checked from anywhere: its probe: folders are absolute, as its files are."""
    from mergekit_mergeability.merge_config import absolute

    saved = _write(tmp_path / "data", "datasets", _rows("alpaca"))
    config = {"merge_method": "linear", "models": [{"model": "a", "probe": "data/saved"}, {"model": "b"}]}
    written = absolute(config, {}, tmp_path)
    assert written["models"][0]["probe"] == str(saved.resolve()) and config["models"][0]["probe"] == "data/saved"
