"""``sweep`` end to end on tiny models: λ-models built in memory, answers scored one by one,
outputs, cache, chosen.yml through the stock mergekit-yaml, and bad input refused before work.

Known answers come from outside the sweep: a task whose targets are A's own greedy answers
to half its prompts (so A scores exactly 0.5), tensors computed by hand from A and B, and
lm-eval's own aggregate for the first answer of each problem.
"""

import json

import jsonschema
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.cli import main
from mergekit_mergeability.tasks import lmeval
from mergekit_mergeability.sources.cache import Cache
from mergekit_mergeability.interpolation import models
from mergekit_mergeability.interpolation.answers import GenerationTask
from mergekit_mergeability.interpolation.outputs import SCHEMA
from mergekit_mergeability.tiny import state_dict

from conftest import widened

PROMPTS = [f"The capital of France is {word}" for word in ("the", "a", "water", "fox", "dog", "lazy")]


@pytest.fixture(scope="module")
def world(llama, tmp_path_factory):
    """A task whose targets are A's (the base's) greedy answers for the even prompts."""
    root = tmp_path_factory.mktemp("sweep")
    draft = root / "draft.jsonl"
    draft.write_text("".join(json.dumps({"prompt": p, "answer": "?"}) + "\n" for p in PROMPTS))
    from lm_eval.models.huggingface import HFLM

    module, tokenizer = load_causal_lm(llama["base"])
    problems = GenerationTask(lmeval.resolve(str(draft)), 1, 1.0).answer(
        HFLM(pretrained=module, tokenizer=tokenizer, device="cpu"), None, 0
    )["problems"]
    task = root / "own.jsonl"
    rows = [
        {"prompt": p, "answer": problem["answers"][0] if i % 2 == 0 else "never said"}
        for i, (p, problem) in enumerate(zip(PROMPTS, problems))
    ]
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "task": task, "a": llama["base"], "b": llama["expert0"]}


def _sweep(world, out, *extra, lambdas="0,0.5,1", cache=None):
    cache = cache or world["root"] / "cache"
    args = [
        "sweep",
        str(world["a"]),
        str(world["b"]),
        "--tasks",
        str(world["task"]),
        "--lambdas",
        lambdas,
        "--marker",
        "e",
        "--cache-dir",
        str(cache),
        "--out",
        str(out),
        "-q",
        *extra,
    ]
    return CliRunner().invoke(main, args)


def test_a_tiny_sweep_end_to_end_and_its_rerun_from_the_cache(world, tmp_path):
    result = _sweep(world, tmp_path / "out", "--samples", "3", "--refine", "2")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    end = report["sweet_spot"]["lambda"] in (0, 1)  # that model itself: nothing to merge, no chosen.yml
    written = {"sweep.json", "sweep.png", "report.html", *([] if end else ["chosen.yml"])}
    assert {p.name for p in (tmp_path / "out").iterdir()} == written
    assert end == ("there is no merge to write" in " ".join(result.output.split()))
    points = report["points"]
    assert [p["lambda"] for p in points if not p["refined"]] == [0, 0.5, 1] and len(report["refinement"]["added"]) <= 2
    for point in points:
        assert set(point["pass_at"]) == {"1", "2", "3"} and point["pass_at"]["1"] == pytest.approx(point["accuracy"])
        assert (
            point["pass_at"]["1"] <= point["pass_at"]["2"] <= point["pass_at"]["3"] and 0 <= point["marker_rate"] <= 1
        )
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "Mean@3" in result.output and "Pass@3" in result.output and "Sweet spot" in result.output
    assert '<table class="sortable">' in (tmp_path / "out" / "report.html").read_text()
    cached = sorted((world["root"] / "cache").iterdir())
    again = _sweep(world, tmp_path / "again", "--samples", "3", "--refine", "2", "--marker", "x")
    assert again.exit_code == 0, again.output
    # another marker refines elsewhere (or nowhere), but every point it needs is in the cache
    assert sorted((world["root"] / "cache").iterdir()) == cached
    first = {p["lambda"]: p["accuracy"] for p in points}
    rerun = {p["lambda"]: p["accuracy"] for p in json.loads((tmp_path / "again" / "sweep.json").read_text())["points"]}
    assert {0, 0.5, 1} <= rerun.keys() and rerun == {lam: first[lam] for lam in rerun}


def test_greedy_scores_are_the_known_answers_and_lm_evals_own(world, tmp_path):
    result = _sweep(world, tmp_path / "out", "--refine", "0", cache=tmp_path / "cache")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert report["points"][0]["accuracy"] == 0.5  # A gives its own answer to half the prompts
    assert report["points"][0]["pass_at"] is None and report["points"][0]["vote"] is None
    accuracy = {p["lambda"]: p["accuracy"] for p in report["points"]}
    records = [json.loads(p.read_text()) for p in (tmp_path / "cache").iterdir()]
    assert sorted(r["lambda"] for r in records) == [0, 0.5, 1]
    for record in records:  # greedy: lm-eval scored the same single answer
        assert [len(p["responses"]) for p in record["problems"]] == [1] * len(PROMPTS)
        ours = sum(p["scores"][0] for p in record["problems"]) / len(record["problems"])
        assert ours == pytest.approx(record["lm_eval"]["exact_match,strip"]) == accuracy[record["lambda"]]


def test_layers_and_modules_restrict_which_tensors_are_interpolated(world):
    ends = models.endpoints(str(world["a"]), str(world["b"]))
    a, b = state_dict(world["a"]), state_dict(world["b"])
    expected = {
        ((1, 2), "mlp"): {f"model.layers.{i}.mlp.{p}_proj.weight" for i in (1, 2) for p in ("gate", "up", "down")},
        ((3,), "attention"): {f"model.layers.3.self_attn.{p}_proj.weight" for p in "qkvo"},
        ((0,), None): {n for n in a if n.startswith("model.layers.0.")},
    }
    for (layers, modules), names in expected.items():
        interpolated, differing = models.plan(ends, models.Selection(frozenset(layers), modules))
        assert set(interpolated) == names and differing == len(a)
        patch = models.interpolate(ends, interpolated, 0.3)
        assert set(patch) == names
        for name in names:
            assert torch.allclose(patch[name], 0.7 * a[name] + 0.3 * b[name], atol=1e-7)
    everything, _ = models.plan(ends, models.Selection())
    assert set(everything) == set(a)  # embeddings and norms too
    with pytest.raises(Exception, match="beyond the model's 4 layers"):
        models.plan(ends, models.Selection(frozenset({9})))


def test_task_vectors_of_a_base(world, tmp_path):
    base = state_dict(world["a"])
    up, q = "model.layers.1.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight"
    (tmp_path / "ta").mkdir(), (tmp_path / "tb").mkdir()
    save_file({up: torch.ones_like(base[up]), q: torch.full_like(base[q], 2.0)}, tmp_path / "ta" / "model.safetensors")
    save_file({up: torch.full_like(base[up], 3.0)}, tmp_path / "tb" / "model.safetensors")
    ends = models.endpoints(str(tmp_path / "ta"), str(tmp_path / "tb"), str(world["a"]))
    interpolated, _ = models.plan(ends, models.Selection(frozenset({1})))
    patch = models.interpolate(ends, interpolated, 0.25)
    assert interpolated == [up]
    assert torch.allclose(patch[up], base[up] + 0.75 * 1 + 0.25 * 3)
    assert torch.equal(patch[q], base[q] + 2)  # not interpolated: A's, which the loaded base lacks
    with pytest.raises(Exception, match="a model, but with --base"):
        models.endpoints(str(world["b"]), str(tmp_path / "tb"), str(world["a"]))
    args = [
        "sweep",
        str(tmp_path / "ta"),
        str(tmp_path / "tb"),
        "--base",
        str(world["a"]),
        "--tasks",
        str(world["task"]),
        "--lambdas",
        "0,1",
        "--no-cache",
        "--out",
        str(tmp_path / "out"),
        "-q",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert report["task_vectors"] and report["chosen_config"] is None and not (tmp_path / "out" / "chosen.yml").exists()
    assert "mergekit builds models from models, not from task vectors" in (tmp_path / "out" / "report.html").read_text()


def test_chosen_yml_runs_with_the_stock_mergekit_yaml_and_builds_the_swept_model(world, tmp_path):
    from mergekit.scripts.run_yaml import main as mergekit_yaml

    # λ = 0 would be A itself, which no mistake in the interpolation could change: the grid leaves it out
    result = _sweep(
        world,
        tmp_path / "out",
        "--layers",
        "1-2",
        "--modules",
        "mlp",
        "--budget",
        "1000",
        "--refine",
        "0",
        "--save-chosen",
        lambdas="0.5,1",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    lam = report["sweet_spot"]["lambda"]
    merged = CliRunner().invoke(
        mergekit_yaml,
        [str(tmp_path / "out" / "chosen.yml"), str(tmp_path / "merged"), "--no-copy-tokenizer", "--quiet"],
    )
    assert merged.exit_code == 0, merged.output
    a, out = state_dict(world["a"]), state_dict(tmp_path / "merged")
    ends = models.endpoints(str(world["a"]), str(world["b"]))
    interpolated, _ = models.plan(ends, models.Selection(frozenset({1, 2}), "mlp"))
    swept = models.interpolate(ends, interpolated, lam)
    assert report["tensors"]["interpolated"] == len(swept) == 6
    saved = state_dict(tmp_path / "out" / "chosen")  # --save-chosen: the same model, written from memory
    assert report["chosen_model"] == str(tmp_path / "out" / "chosen") and saved.keys() == out.keys()
    for name, tensor in out.items():
        assert torch.allclose(tensor, swept.get(name, a[name]), atol=1e-6), name
        assert torch.allclose(saved[name], tensor, atol=1e-6), name
    assert lam in (0.5, 1) and all(not torch.allclose(swept[n], a[n]) for n in swept)


def test_the_demo_sweep_step_on_tiny_models(tmp_path):
    args = [
        "demo",
        "--quick",
        "--sweep",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "sweep" / "sweep.json").read_text())
    assert report["lm_eval_task"] == "demo_arithmetic" and report["points"][0]["problems"] == 8
    assert (tmp_path / "cache" / "tiny" / "sweep" / "thinking" / "config.json").is_file()
    assert "Sweet spot" in result.output


def test_the_thinking_trace():
    from mergekit_mergeability.demo.reasoning import trace

    assert trace(47, 38) == " <think>7+8=15, 4+3+1=8</think> 85"
    assert trace(12, 30) == " <think>2+0=2, 1+3=4</think> 42"
    assert trace(99, 99) == " <think>9+9=18, 9+9+1=19</think> 198"


def _nothing_written(world, out):
    assert not out.exists()
    assert not (world["root"] / "refused_cache").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda w, r: {"b": widened(w["a"], r / "wide")}, "hidden_size"),
        (lambda w, r: {"lambdas": "1:0:0.1"}, "--lambdas 1:0:0.1"),
        (lambda w, r: {"marker": "(unclosed"}, "--marker '(unclosed': not a regular expression"),
        (lambda w, r: {"layers": "7"}, "--layers: layer 7 is beyond the model's 4 layers"),
        (lambda w, r: {"b": w["a"]}, "identical: there is nothing to interpolate"),
        (lambda w, r: {"task": r / "choice.jsonl"}, "output_type multiple_choice; the sweep needs generated answers"),
        (lambda w, r: {"base": w["a"]}, "a model, but with --base A and B are task vectors"),
    ],
)
def test_bad_input_is_one_line_before_any_work(world, tmp_path, monkeypatch, change, message):
    (tmp_path / "choice.jsonl").write_text(json.dumps({"question": "which?", "choices": ["a", "b"], "label": 0}) + "\n")
    monkeypatch.setattr(
        "mergekit_mergeability.sources.load_causal_lm", lambda *a, **k: pytest.fail("a model was loaded")
    )
    values = {
        "a": world["a"],
        "b": world["b"],
        "task": world["task"],
        "lambdas": "0:1:0.5",
        "marker": "e",
        **change(world, tmp_path),
    }
    args = [
        "sweep",
        str(values["a"]),
        str(values["b"]),
        "--tasks",
        str(values["task"]),
        "--lambdas",
        values["lambdas"],
        "--marker",
        values["marker"],
    ]
    args += [f"--{k}={values[k]}" for k in ("layers", "base") if k in values]
    result = CliRunner().invoke(
        main, [*args, "--cache-dir", str(world["root"] / "refused_cache"), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    _nothing_written(world, tmp_path / "out")


def test_the_cache_key_covers_what_changes_a_score(world):
    from mergekit_mergeability.settings import SweepSettings
    from mergekit_mergeability.interpolation.sweeping import Sweep, grid

    def key(**changes):
        settings = SweepSettings(lambdas=grid("0,1"), **changes)
        return Sweep(str(world["a"]), str(world["b"]), None, str(world["task"]), settings, Cache(None)).key(0.5)

    plain = key()
    assert key(marker="x") == plain and key(budget=3) == plain  # applied to cached answers
    assert len({plain, key(samples=2), key(seed=1), key(layers=frozenset({1}))}) == 4


def test_a_sweet_spot_at_either_end_is_that_model_itself_unless_only_some_tensors_move():
    from mergekit_mergeability.output.terminal import an_end

    def report(lam, interpolated=16, vectors=False):
        tensors = {"differing": 16, "interpolated": interpolated}
        return {"sweet_spot": {"lambda": lam}, "tensors": tensors, "task_vectors": vectors}

    assert [an_end(report(lam)) for lam in (0, 0.5, 1, None)] == ["a", None, "b", None]
    assert an_end(report(1, interpolated=4)) is None and an_end(report(1, vectors=True)) is None
