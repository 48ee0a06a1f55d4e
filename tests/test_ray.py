"""--ray: precheck and mergeability on a local Ray cluster give the in-process run's files."""

import json
import sys

import pytest
import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main
from mergekit_mergeability.tiny import derive, make_adapter

from conftest import noise, ranked_probes

try:
    import ray
except ImportError:  # the tests that need a cluster skip; the one about a missing ray still runs
    ray = None

CHOICES = ["Paris", "water", "fox", "dog"]
QUESTIONS = [f"Item {i}: which one?" for i in range(6)]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module: --ray uses a Ray already initialised in the process."""
    if ray is None:
        pytest.skip('ray is not installed: pip install ".[ray]" (tests/run.sh installs it)')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("raypool")
    base = llama["base"]
    experts = {
        f"e{i}": derive(base, root / f"e{i}", noise(20 + i, 0.3, lambda name: ".mlp." in name)) for i in range(3)
    }
    probes = {
        name: ranked_probes(root / f"{name}.jsonl", path, QUESTIONS, CHOICES, pick=0) for name, path in experts.items()
    }
    models = [{"model": str(p), "probe": str(probes[n]), "parameters": {"weight": 0.5}} for n, p in experts.items()]
    document = {"merge_method": "task_arithmetic", "base_model": str(base), "models": models, "dtype": "float32"}
    (root / "pool.yml").write_text(yaml.safe_dump(document, sort_keys=False))
    adapters = [
        make_adapter(
            base,
            root / f"a{i}",
            ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"],
            seed=i,
        )
        for i in range(3)
    ]
    lora = {
        **document,
        "models": [
            {"model": f"{base}+{a}", "probe": str(probes[f"e{i}"]), "parameters": {"weight": 0.5}}
            for i, a in enumerate(adapters)
        ],
    }
    (root / "lora.yml").write_text(yaml.safe_dump(lora, sort_keys=False))
    return {"root": root, "config": root / "pool.yml", "lora": root / "lora.yml"}


def _run(*args):
    result = CliRunner().invoke(main, [*map(str, args), "--quiet"])
    assert result.exit_code in (0, 1), result.output
    return result


def _close(a, b, path="$"):
    """Equal, floats to 1e-6 relative: forward passes in float32 round differently with another
    thread count (Ray gives a task one thread; the test process may have more)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9, nan_ok=True), path
    else:
        assert a == b, path


@pytest.mark.parametrize("config", ["config", "lora"])
def test_precheck_on_ray_writes_the_in_process_report(cluster, pool, tmp_path, config):
    _run("precheck", pool[config], "--out", tmp_path / "here")
    _run("precheck", pool[config], "--out", tmp_path / "ray", "--ray")
    here = json.loads((tmp_path / "here" / "precheck.json").read_text())
    there = json.loads((tmp_path / "ray" / "precheck.json").read_text())
    _close(here, there)
    # the weight pass reads no model's forward pass: its partial sums, added in tensor order, are the same bits
    assert here["diagnostics"]["weights"] == there["diagnostics"]["weights"]
    assert (tmp_path / "here" / "recommended.yml").read_text() == (tmp_path / "ray" / "recommended.yml").read_text()


def test_weight_pass_splits_into_shards_and_reduces_exactly(cluster, pool):
    from mergekit_mergeability import distributed
    from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
    from mergekit_mergeability.diagnostics.weights import WeightStatistics
    from mergekit_mergeability.settings import PrecheckSettings

    spec = yaml.safe_load(pool["config"].read_text())
    inputs = DiagnosticInputs(
        ModelInput("base", spec["base_model"]),
        tuple(ModelInput(m["model"], m["model"]) for m in spec["models"]),
        PrecheckSettings(quiet=True),
    )
    here = WeightStatistics().run(inputs)
    with distributed.cluster(None):
        assert distributed.workers() == 2
        there = WeightStatistics().run(inputs)
    assert there.per_model == here.per_model and there.per_pair == here.per_pair and there.per_layer == here.per_layer


def test_shards_are_contiguous_and_balanced():
    from mergekit_mergeability.distributed import shards

    assert shards([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert shards([10, 1, 1, 1], 2) == [range(0, 1), range(1, 4)]
    assert shards([1, 1, 1], 5) == [range(0, 1), range(1, 2), range(2, 3)]
    assert shards([5], 3) == [range(0, 1)]


def test_without_ray_the_option_says_how_to_install_it(pool, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = CliRunner().invoke(
        main, ["precheck", str(pool["config"]), "--out", str(tmp_path / "out"), "--quiet", "--ray"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        'Error: --ray needs the ray package, which is not installed: pip install ".[ray]" in a checkout of mergekit-mergeability'
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config", ["config", "lora"])
def test_mergeability_on_ray_scores_every_trial_as_in_process_and_resumes(cluster, pool, tmp_path, config):
    common = ["mergeability", pool[config], "--partners", "1", "--seed", "3"]
    _run(*common, "--trials", "2", "--out", tmp_path / "here", "--cache-dir", tmp_path / "cache_here")
    _run(*common, "--trials", "1", "--out", tmp_path / "ray", "--cache-dir", tmp_path / "cache_ray", "--ray")
    log = tmp_path / "ray" / "trials.jsonl"
    assert len(log.read_text().splitlines()) == 3
    _run(*common, "--trials", "2", "--out", tmp_path / "ray", "--cache-dir", tmp_path / "cache_ray", "--ray")
    assert len(log.read_text().splitlines()) == 6  # the first run's trials were reused, not redone
    here = json.loads((tmp_path / "here" / "mergeability.json").read_text())
    there = json.loads((tmp_path / "ray" / "mergeability.json").read_text())
    assert here == there


def test_inside_a_cluster_auto_is_the_cluster_device_and_model_tasks_ask_for_it(cluster):
    from mergekit_mergeability import distributed
    from mergekit_mergeability.settings import RunSettings

    with distributed.cluster(None):
        assert (
            distributed.device("auto") == "cpu" and distributed.device("cuda") == "cuda"
        )  # the local cluster has no GPU
    assert (
        distributed.gpus(RunSettings(device="cuda:0")) == 1
        and distributed.gpus(RunSettings(device="cpu")) == 0
        and distributed.gpus(RunSettings()) == 0  # auto, unresolved: no GPU asked for
    )


def test_an_error_in_a_task_reaches_the_driver_as_itself(cluster):
    from mergekit_mergeability import distributed
    from mergekit_mergeability.errors import UserError

    def refuse(item):
        raise UserError(f"model {item}: refused")

    with distributed.cluster(None), pytest.raises(UserError) as caught:
        distributed.each(refuse, ["m"])
    assert str(caught.value) == "model m: refused"


def test_an_address_where_nothing_answers_is_one_line_at_once(cluster, monkeypatch):
    from mergekit_mergeability import distributed
    from mergekit_mergeability.errors import UserError

    assert distributed.reachable("auto") and distributed.reachable("ray://head:10001")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    with pytest.raises(UserError, match=r"^--ray 127\.0\.0\.1:1: nothing answers there"):
        with distributed.cluster("127.0.0.1:1"):
            pass
    assert not distributed.active()


def test_sweep_on_ray_scores_every_lambda_as_in_process_and_fills_the_cache(cluster, llama, tmp_path):
    task = tmp_path / "task.jsonl"
    task.write_text(
        "".join(
            json.dumps({"prompt": f"The capital of France is {w}", "answer": w}) + "\n"
            for w in ("the", "a", "water", "fox")
        )
    )
    args = [
        "sweep",
        llama["base"],
        llama["expert0"],
        "--tasks",
        task,
        "--lambdas",
        "0,0.5,1",
        "--refine",
        "1",
        "--marker",
        "e",
        "-k",
        "2",
    ]
    here = _run(*args, "--cache-dir", tmp_path / "here", "--out", tmp_path / "here_out")
    there = _run(*args, "--cache-dir", tmp_path / "there", "--out", tmp_path / "there_out", "--ray")
    assert here.exit_code == there.exit_code == 0, there.output
    points = [json.loads((tmp_path / out / "sweep.json").read_text())["points"] for out in ("here_out", "there_out")]
    assert [p["lambda"] for p in points[0]] == [p["lambda"] for p in points[1]] and len(points[0]) >= 3
    for a, b in zip(*points):
        _close(
            {k: a[k] for k in ("accuracy", "tokens", "marker_rate", "pass_at")},
            {k: b[k] for k in ("accuracy", "tokens", "marker_rate", "pass_at")},
        )
    assert sorted(p.name for p in (tmp_path / "there").iterdir()) == sorted(
        p.name for p in (tmp_path / "here").iterdir()
    )  # the workers' answers cached by the same keys
