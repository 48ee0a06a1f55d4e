"""A code task (HumanEval, MBPP: its metric runs the code a model writes) as a probe: the precheck
reads its reference solutions and never runs code; evaluate runs it only with lm-eval's opt-in.

The task here is HumanEval's shape on local data, and running any of its code (the solution, the
tests, a model's answer) writes a marker file: the marker is the proof that code ran."""

import json

import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main
from mergekit_mergeability.tasks import load
from mergekit_mergeability.tasks.probes import CODE

from conftest import precheck_cli


def _code_task(folder, marker):
    ran = f"open({str(marker)!r}, 'w').write('ran')"
    docs = [
        {
            "prompt": f'def add_{i}(a, b):\n    """a + b + {i}"""\n',
            "canonical_solution": f"    {ran}\n    return a + b + {i}\n",
            "test": f"{ran}\nassert add_{i}(1, 2) == {3 + i}",
        }
        for i in range(4)
    ]
    data = folder / "adds.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "runs.py").write_text(  # as HumanEval's metric does: the answer run, then its tests
        "def pass_at_1(references, predictions):\n"
        "    scope, passed = {}, 1.0\n"
        "    for code in (*predictions, *references):\n"
        "        try:\n"
        "            exec(code, scope)\n"
        "        except Exception:\n"
        "            passed = 0.0\n"
        "    return passed\n"
    )
    task = folder / "adds.yaml"
    task.write_text(
        f"task: adds_code_test\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\nunsafe_code: true\noutput_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{test}}"\n'
        "metric_list:\n  - metric: !function runs.pass_at_1\n    aggregation: mean\n    higher_is_better: true\n"
        "generation_kwargs:\n  until: ['\\ndef']\n  max_gen_toks: 4\n  do_sample: false\n"
    )
    return task


def _config(llama, folder, task):
    config = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(llama[e]), "probe": str(task), "parameters": {"weight": 0.5}} for e in ("expert0", "expert1")
        ],
        "dtype": "float32",
    }
    path = folder / "code.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_code_task_is_read_as_its_reference_solutions(tmp_path):
    marker = tmp_path / "ran"
    instances = load(str(_code_task(tmp_path, marker)))
    assert [i.format for i in instances] == [CODE] * 4
    assert instances[2].prompt == 'def add_2(a, b):\n    """a + b + 2"""\n'
    assert instances[2].continuations == (f"    open({str(marker)!r}, 'w').write('ran')\n    return a + b + 2\n",)
    assert not marker.exists()


def test_the_precheck_predicts_a_code_probe_and_runs_no_code(llama, tmp_path):
    marker = tmp_path / "ran"
    config = _config(llama, tmp_path, _code_task(tmp_path, marker))
    result = precheck_cli(config, tmp_path / "out", "--tune-budget", "0")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "precheck.json").read_text())
    for model in ("expert0", "expert1"):
        knowledge = report["diagnostics"]["knowledge"]["per_model"][str(llama[model])]
        assert knowledge["scored_format"] == CODE and 0 < knowledge["scored_mean_p_gold"] < 1
    findings = [f["message"] for f in report["findings"] if f["diagnostic"] == "knowledge"]
    assert any("runs no code" in f and "reference solution" in f for f in findings), findings
    assert not marker.exists()


def test_evaluate_runs_a_code_task_only_when_told_to(llama, tmp_path):
    marker = tmp_path / "ran"
    config = _config(llama, tmp_path, _code_task(tmp_path, marker))
    args = ["evaluate", str(config), "--merged", str(llama["expert0"]), "--out", str(tmp_path / "eval"), "--quiet"]
    refused = CliRunner().invoke(main, [*args, "--no-cache"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    (line,) = refused.output.strip().splitlines()
    assert "adds_code_test" in line and "--confirm-run-unsafe-code" in line
    assert not marker.exists() and not (tmp_path / "eval").exists()
    told = CliRunner().invoke(main, [*args, "--no-cache", "--confirm-run-unsafe-code"])
    assert told.exit_code == 0, told.output
    assert marker.exists()  # lm-eval ran the task's own metric, which runs the code
