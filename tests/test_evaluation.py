"""evaluate / mergeability / validate on tiny models and tasks whose answers the test controls.

Expected scores are computed independently of lm-eval: with this package's own
teacher-forced scorer on models merged by mergekit's ``merge_state_dicts``.
"""

import json
import platform
import subprocess
import sys

import pytest
import torch
import yaml
from click.testing import CliRunner

from mergekit_mergeability.sources import load_causal_lm
from mergekit_mergeability.cli import main
from mergekit_mergeability.diagnostics.activations import choice_logprobs
from mergekit_mergeability.evaluation.protocol import partners
from mergekit_mergeability.maths.corpus_metrics import corpus_scores
from mergekit_mergeability.maths.retention import normalised_gain, retention
from mergekit_mergeability.tasks import load as load_probes
from mergekit_mergeability.tiny import derive, state_dict

from conftest import noise, ranked_probes

CHOICES = ["fox", "the", "a", "of"]  # two tokens each: no choice wins by length alone
QUESTIONS = [f"Item {i}: which one?" for i in range(8)]


def _noise(seed, scale=0.5):
    return noise(seed, scale, lambda name: ".mlp." in name)


def _accuracy(model_and_tokenizer, probe_file):
    model, tok = model_and_tokenizer
    instances = load_probes(str(probe_file))
    scores = choice_logprobs(model, tok, instances)
    return sum(int(torch.argmax(s)) == i.label for (s, _), i in zip(scores, instances)) / len(instances)


def _favourites(model_dir, path):
    """A task whose gold answers are the model's own favourites: it scores 1 on it."""
    return ranked_probes(path, model_dir, QUESTIONS, CHOICES, pick=0)


def _merged(base, members, weight):
    """The task-arithmetic merge, by mergekit's in-memory API, as a loaded model."""
    from mergekit.merge_methods import merge_state_dicts

    model, tok = load_causal_lm(base)
    states = {"base": state_dict(base), **{str(m): state_dict(m) for m in members}}
    merged = merge_state_dicts(states, "task_arithmetic", base="base", parameters={"weight": weight})
    model.load_state_dict(merged, strict=False)
    return model, tok


@pytest.fixture(scope="module")
def pool(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("evalpool")
    experts = {f"e{i}": derive(llama["base"], root / f"e{i}", _noise(10 + i)) for i in range(3)}
    probes = {name: _favourites(path, root / f"{name}.jsonl") for name, path in experts.items()}
    config = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [{"model": str(p), "probe": str(probes[n])} for n, p in experts.items()],
        "parameters": {"weight": 0.5},
        "dtype": "float32",
    }
    (root / "pool.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return {"root": root, "base": llama["base"], "experts": experts, "probes": probes, "config": root / "pool.yml"}


def test_retention_arithmetic():
    assert retention(0.3, 0.6) == pytest.approx(0.5)
    assert normalised_gain(0.45, 0.6, 0.3) == pytest.approx(0.5)
    assert retention(0.3, 0.0) is None and normalised_gain(0.3, 0.5, 0.5) is None
    assert normalised_gain(0.0, 0.0, 0.12) is None  # an expert below its base has no gain to keep


def test_sacrebleu_corpus_scores_and_signatures():
    same = corpus_scores(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert same["bleu"] == pytest.approx(100) and same["chrf"] == pytest.approx(100)
    assert "tok:13a" in same["bleu_signature"] and "nc:6|nw:0" in same["chrf_signature"]  # sacrebleu defaults
    assert corpus_scores(["a b"], ["c d"])["bleu"] == 0


def test_evaluate_matches_independent_scoring(pool, tmp_path):
    merged_dir = tmp_path / "merged"
    merged_model = _merged(pool["base"], list(pool["experts"].values()), 0.5)
    merged_model[0].save_pretrained(merged_dir)
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        main,
        [
            "evaluate",
            str(pool["config"]),
            "--merged",
            str(merged_dir),
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "evaluation.json").read_text())
    base_model = load_causal_lm(pool["base"])
    assert sorted(row["task"] for row in report["tasks"]) == sorted(map(str, pool["probes"].values()))
    assert any(row["base"] < 1 for row in report["tasks"])  # a gain to normalise
    for row in report["tasks"]:
        name = next(n for n, p in pool["probes"].items() if str(p) == row["task"])
        assert row["metric"] == "acc" and row["expert"] == 1.0  # gold = the expert's own favourites
        assert row["base"] == pytest.approx(_accuracy(base_model, pool["probes"][name]))
        assert row["merged"] == pytest.approx(_accuracy(merged_model, pool["probes"][name]))
        assert row["retention"] == pytest.approx(row["merged"])
        if row["base"] == 1:  # the base already scores what the expert does: nothing to gain
            assert row["normalised_gain"] is None
        else:
            assert row["normalised_gain"] == pytest.approx((row["merged"] - row["base"]) / (1 - row["base"]))
    assert (out / "evaluation.png").read_bytes()[:4] == b"\x89PNG"


def test_mergeability_protocol_arithmetic_and_resume(pool, tmp_path):
    out, cache = tmp_path / "mg", tmp_path / "cache"
    args = [
        "mergeability",
        str(pool["config"]),
        "--partners",
        "1",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--quiet",
        "--seed",
        "3",
    ]
    first = CliRunner().invoke(main, [*args, "--trials", "1"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(main, [*args, "--trials", "2"])
    assert second.exit_code == 0, second.output
    assert len((out / "trials.jsonl").read_text().splitlines()) == 2 * 3  # trial 0 was reused, not redone
    report = json.loads((out / "mergeability.json").read_text())
    names = [str(p) for p in pool["experts"].values()]
    model = names[0]
    row = next(r for r in report["models"] if r["path"] == model)
    drawn = [partners(names, model, 1, trial, seed=3) for trial in range(2)]
    assert [t["partners"] for t in row["trials"]] == drawn
    expected = [_accuracy(_merged(pool["base"], [model, *d], 0.5), row["task"]) for d in drawn]
    assert [t["score"] for t in row["trials"]] == pytest.approx(expected)
    assert row["mergeability"] == pytest.approx(sum(expected) / 2)
    assert row["expert_score"] == 1.0


def test_validate_reports_correlation_with_null_and_interval(tmp_path):
    names = [f"./m{i}" for i in range(6)]
    precheck = {
        "models": [
            {
                "path": n,
                "role": "expert",
                "predicted_mergeability": i / 10,
                "knowledge": {"accuracy": i / 5, "mean_gap": 1 - i / 5},
                "weights": {"update_norm": 6 - i},
            }
            for i, n in enumerate(names)
        ]
    }
    measured = {
        "method": "task_arithmetic",
        "models": [{"path": n, "mergeability": i * 0.1 + 0.05} for i, n in enumerate(names)],
    }
    (tmp_path / "p.json").write_text(json.dumps(precheck))
    (tmp_path / "m.json").write_text(json.dumps(measured))
    result = CliRunner().invoke(
        main,
        [
            "validate",
            str(tmp_path / "p.json"),
            str(tmp_path / "m.json"),
            "--out",
            str(tmp_path),
            "--permutations",
            "2000",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "validation.json").read_text())
    first = report["correlations"][0]
    assert first["predictor"] == "precheck prediction" and first["spearman"] == pytest.approx(1)
    assert first["p_permutation"] == pytest.approx(2 / 720, abs=0.003)  # 2 of 6! orderings reach |ρ| = 1
    assert {r["predictor"] for r in report["correlations"]} >= {"−relative_norm alone", "accuracy alone", "−gap alone"}
    versus = report["versus_best_single"]  # every input here ranks perfectly: no room to beat them
    assert versus["difference"] == pytest.approx(0) and not versus["beats"]


def test_validate_compares_a_rehearsed_prediction_with_the_inputs_it_is_not(tmp_path):
    """The prediction is the rehearsal (partnered accuracy, a cloze probe): the best single input
    it is measured against is another one, and the report says which inputs it is."""
    from mergekit_mergeability.evaluation.validate import validate

    names = [f"./m{i}" for i in range(8)]
    rehearsed, known = [0.1, 0.3, 0.2, 0.5, 0.4, 0.7, 0.6, 0.9], [0.4, 0.1, 0.3, 0.2, 0.6, 0.5, 0.8, 0.7]
    models = [
        {
            "path": n,
            "role": "expert",
            "predicted_mergeability": rehearsed[i],
            "knowledge": {"scored_accuracy": known[i], "scored_format": "cloze"},
            "weights": None,
            "dilution": {"partnered_accuracy": rehearsed[i]},
        }
        for i, n in enumerate(names)
    ]
    measured = {
        "method": "task_arithmetic",
        "models": [{"path": n, "mergeability": i / 10} for i, n in enumerate(names)],
    }
    (tmp_path / "p.json").write_text(json.dumps({"models": models}))
    (tmp_path / "m.json").write_text(json.dumps(measured))
    versus = validate(tmp_path / "p.json", tmp_path / "m.json", permutations=100)["versus_best_single"]
    assert set(versus["same_as"]) == {"partnered_accuracy alone", "rehearsal alone"}
    assert versus["best_single"] == "scored_accuracy alone" and versus["difference"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["mergeability", "{config}", "--partners", "3"], "--partners 3: the pool has 3 models, so at most 2 partners"),
        (
            ["mergeability", "{config}", "--partners", "1", "--method", "nope"],
            "--method nope: not a registered merge method",
        ),
        (["evaluate", "{config}", "--merged", "{root}/absent"], "no such folder; run the merge first"),
        (
            ["evaluate", "{config}", "--merged", "{root}/e0", "--tasks", "no_such_task_anywhere"],
            "lm-eval task 'no_such_task_anywhere' not found",
        ),
        (
            ["evaluate", "{config}", "--merged", "{root}/e0", "--tasks", "arc_easyy"],
            "lm-eval task 'arc_easyy' not found; did you mean 'arc_easy'?",
        ),
    ],
)
def test_bad_input_fails_before_work(pool, tmp_path, args, message):
    filled = [a.format(config=pool["config"], root=pool["root"]) for a in args]
    result = CliRunner().invoke(main, [*filled, "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_tasks_sharing_a_folder_are_cached_apart():
    from mergekit_mergeability.tasks.lmeval import resolve

    fingerprints = {resolve(f"demo_translate_{e}").fingerprint for e in ("zorbish_a", "zorbish_b", "kelvic_a")}
    assert len(fingerprints) == 3


def test_shipped_translation_task_scores_chrf_with_signatures(llama):
    from mergekit_mergeability.tasks.harness import score
    from mergekit_mergeability.tasks.lmeval import resolve

    model, tok = load_causal_lm(llama["base"])
    result = score(model, tok, resolve("demo_translate_kelvic_a"), limit=2)
    assert result["primary"] == "chrf" and result["samples"] == 2
    assert {"bleu", "chrf"} <= result["metrics"].keys()
    assert "tok:13a" in result["signatures"]["bleu_signature"]


def test_fingerprints_cover_every_weight_format_and_refuse_a_folder_without_weights(tmp_path):
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.sources.cache import fingerprint

    def folder(name, files):
        path = tmp_path / name
        path.mkdir()
        for file, data in files.items():
            (path / file).write_bytes(data)
        return path

    bins = [folder(f"bin{i}", {"config.json": b"{}", "pytorch_model.bin": bytes([i]) * 64}) for i in range(2)]
    sharded = folder(
        "sharded", {"config.json": b"{}", "pytorch_model.bin": bytes(64), "pytorch_model.bin.index.json": b"{}"}
    )
    pt = folder("pt", {"config.json": b"{}", "model.pt": bytes(64)})
    assert len({fingerprint(f) for f in [*bins, sharded, pt]}) == 4
    with pytest.raises(UserError, match="no weights"):
        fingerprint(folder("empty", {"config.json": b"{}"}))


def _own_pool(pool, root):
    """The pool with its own copies of the probe files, free to edit."""
    probes = {n: root / p.name for n, p in pool["probes"].items()}
    for name, path in probes.items():
        path.write_bytes(pool["probes"][name].read_bytes())
    config = yaml.safe_load(pool["config"].read_text())
    for entry, probe in zip(config["models"], probes.values()):
        entry["probe"] = str(probe)
    (root / "pool.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root / "pool.yml", probes


def test_a_resumed_run_redoes_trials_whose_score_would_change_and_survives_a_torn_line(pool, tmp_path):
    config, probes = _own_pool(pool, tmp_path)
    out = tmp_path / "mg"
    log = out / "trials.jsonl"

    def run(*extra):
        args = [
            "mergeability",
            str(config),
            "--partners",
            "1",
            "--trials",
            "1",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--quiet",
        ]
        result = CliRunner().invoke(main, [*args, *extra])
        assert result.exit_code == 0, result.output
        return len(log.read_text().splitlines())

    assert run("--limit", "4") == 3
    assert run("--limit", "2") == 6  # another limit: every trial again
    assert run("--limit", "2", "--dtype", "bfloat16") == 9
    assert run("--limit", "2", "--dtype", "bfloat16") == 9  # same settings: resumed
    with open(log, "a") as handle:
        handle.write('{"model": "killed mid-wri')
    rows = [json.loads(line) for line in probes["e0"].read_text().splitlines()]
    probes["e0"].write_text("".join(json.dumps({**r, "label": (r["label"] + 1) % len(CHOICES)}) + "\n" for r in rows))
    assert run("--limit", "2", "--dtype", "bfloat16") == 11  # the torn line, then e0's trial redone for its new probe
    lines = log.read_text().splitlines()
    assert lines[9] == '{"model": "killed mid-wri' and json.loads(lines[10])["model"] == str(pool["experts"]["e0"])


def _group(root, pool, aggregate=True):
    """A local lm-eval group of two local tasks (the pool's first two probe sets)."""
    for name, probe in list(pool["probes"].items())[:2]:
        task = {
            "task": f"mm_part_{name}",
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(probe)}},
            "test_split": "test",
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}\nAnswer:",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
        (root / f"part_{name}.yaml").write_text(yaml.safe_dump(task))
    group = {"group": "mm_group", "task": ["mm_part_e0", "mm_part_e1"]}
    if aggregate:
        group["aggregate_metric_list"] = [{"metric": "acc", "aggregation": "mean", "weight_by_size": True}]
    (root / "group.yaml").write_text(yaml.safe_dump(group))
    return root / "group.yaml"


def test_a_group_task_is_scored_by_its_aggregate(pool, tmp_path):
    group = _group(tmp_path, pool)
    out = tmp_path / "eval"
    args = [
        "evaluate",
        str(pool["config"]),
        "--merged",
        str(pool["experts"]["e2"]),
        "--tasks",
        str(group),
        "--out",
        str(out),
        "--no-cache",
        "--quiet",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    [row] = json.loads((out / "evaluation.json").read_text())["tasks"]
    base_model = load_causal_lm(pool["base"])
    parts = [_accuracy(base_model, pool["probes"][name]) for name in ("e0", "e1")]
    assert row["lm_eval_task"] == "mm_group" and row["base"] == pytest.approx(sum(parts) / 2)  # equal sizes


def test_a_bad_task_among_good_ones_fails_before_any_model_is_scored(pool, tmp_path):
    group = _group(tmp_path, pool, aggregate=False)
    cache = tmp_path / "cache"
    args = [
        "evaluate",
        str(pool["config"]),
        "--merged",
        str(pool["experts"]["e2"]),
        "--tasks",
        f"{pool['probes']['e0']},{group}",
        "--out",
        str(tmp_path / "eval"),
        "--cache-dir",
        str(cache),
        "--quiet",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "lm-eval group 'mm_group' has no aggregate_metric_list" in result.output, (
        result.output
    )
    assert not cache.exists() and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("option", [["--no-cache"], ["--cache-dir", ""]])
def test_the_cache_can_be_turned_off(pool, tmp_path, monkeypatch, option):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    args = [
        "evaluate",
        str(pool["config"]),
        "--merged",
        str(pool["experts"]["e2"]),
        "--tasks",
        str(pool["probes"]["e0"]),
        "--out",
        str(tmp_path / "eval"),
        "--limit",
        "2",
        "--quiet",
    ]
    result = CliRunner().invoke(main, [*args, *option])
    assert result.exit_code == 0, result.output
    assert list(work.iterdir()) == [] and not (tmp_path / "xdg").exists()


ANONYMOUS = """
def anonymous():
    status = open("/proc/self/status").read().splitlines()
    return int(next(l for l in status if l.startswith("RssAnon")).split()[1]) // 1024
"""  # the interpreter's anonymous memory in MiB, for the scripts below


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_heap_a_merge_freed_goes_back_to_the_system():
    # In a fresh interpreter (this one's allocator has been tuned by what the suite imported): a
    # merge's formed tensors, SmolLM2's MLP width. After the first round glibc raises its mmap
    # threshold, so later rounds come from the heap and stay held when freed, until released.
    script = (
        ANONYMOUS
        + """
import torch
from mergekit_mergeability.sources.heap import release_freed_memory
for _ in range(3):
    tensors = [torch.ones(576, 1536) for _ in range(60)]  # 200 MiB
    del tensors
    held = anonymous()
    release_freed_memory()
    print(held, anonymous())
"""
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    held, left = map(int, done.stdout.split()[-2:])  # the last round
    assert held - left > 100, done.stdout


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_blocks_mapped_on_their_own_go_back_when_freed():
    # In a fresh interpreter: rounds of 1M-value float32 blocks (the passes' unit), each round
    # freed. By default glibc serves the later rounds from its heap, between small tensors that
    # stay, and keeps them; with map_large_allocations each block is unmapped when freed.
    script = (
        ANONYMOUS
        + """
import sys, torch
from mergekit_mergeability.sources.heap import map_large_allocations
if sys.argv[1] == "mapped":
    map_large_allocations(4 << 20)
start, kept = anonymous(), []
for _ in range(3):
    blocks = []
    for _ in range(50):  # 200 MiB, each block followed by a small tensor that stays, as a pass's results do
        blocks.append(torch.ones(1 << 20))
        kept.append(torch.ones(1 << 12))
    del blocks
print(anonymous() - start)
"""
    )
    held = {
        way: int(subprocess.run([sys.executable, "-c", script, way], capture_output=True, text=True, check=True).stdout)
        for way in ("default", "mapped")
    }
    assert held["default"] > 100 and held["mapped"] < 20, held


def test_the_evaluation_table_names_tasks_short_says_the_items_and_fits_80_columns(capsys, monkeypatch):
    from mergekit_mergeability.output.terminal import print_evaluation

    monkeypatch.setenv("COLUMNS", "80")
    task = "/home/someone/a/long/folder/of/probes/translate_zorbish_a.jsonl"
    row = {"task": task, "metric": "acc", "base": 0.12, "expert": 0.0, "merged": 0.0}
    row |= {"retention": None, "normalised_gain": normalised_gain(0.0, 0.0, 0.12)}
    print_evaluation({"tasks": [row], "scores": {"merged": {task: {"samples": 8}}}})
    printed = capsys.readouterr().out
    assert max(map(len, printed.splitlines())) <= 80
    assert "translate_zorbish_a.jsonl │ acc, 8" in printed and "/home/someone" not in printed
    assert printed.count("–") >= 2  # below its base, the expert has no gain to keep: no ratio, not 1.00
