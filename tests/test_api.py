"""The Python API: typed functions the CLI is a shell over, results that are their JSON."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, ranked_probes

QUESTIONS = [f"Question {i}: which word comes next?" for i in range(8)]
CHOICES = ("red", "blue", "green", "yellow")


@pytest.fixture(scope="module")
def config(llama, tmp_path_factory):
    """A mergekit config of the tiny llama family, each expert with a probe."""
    root = tmp_path_factory.mktemp("api")
    models = [
        {
            "model": str(llama[name]),
            "probe": str(ranked_probes(root / f"{name}.jsonl", llama["base"], QUESTIONS, CHOICES, pick)),
            "parameters": {"weight": 0.5},
        }
        for name, pick in (("expert0", 0), ("expert1", 3))
    ]
    path = root / "merge.yml"
    document = {"merge_method": "task_arithmetic", "base_model": str(llama["base"]), "models": models}
    path.write_text(yaml.safe_dump({**document, "dtype": "float32"}, sort_keys=False))
    return path


def test_the_issues_check_runs_as_written(config):
    code = f"import mergekit_mergeability as mm; r = mm.precheck({str(config)!r}); print(r.verdict)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    from mergekit_mergeability.decide.verdict import VERDICTS

    assert done.stdout.strip().splitlines()[-1] in VERDICTS, done.stdout


def test_a_result_is_its_json_and_its_recommendations_are_mergekit_configs(config, tmp_path):
    from mergekit.config import MergeConfiguration

    import mergekit_mergeability as mm

    result = mm.precheck(config, settings=mm.PrecheckSettings(quiet=True, device="cpu"), out=tmp_path)
    written = json.loads((tmp_path / "precheck.json").read_text())
    assert result.to_json() == written and list(result.to_json()) == list(written)  # same keys, same order
    assert [m.to_json() for m in result.models] == written["models"]
    assert result.verdict == written["recommendation"]["verdict"]
    assert [m.path for m in result.experts] == [m["path"] for m in written["models"] if m["role"] == "expert"]
    assert all(m.predicted == m.predicted_mergeability is not None for m in result.experts)
    assert result.settings["limit"] == 64 and result.settings["device"] == "cpu"
    assert set(result.recommended) == {m["file"] for m in written["recommendation"]["models"]}
    for file, parsed in result.recommended.items():
        assert isinstance(parsed, MergeConfiguration)
        assert parsed == MergeConfiguration.model_validate(yaml.safe_load((tmp_path / file).read_text()))


def test_nothing_is_written_without_out(config, tmp_path, monkeypatch):
    import mergekit_mergeability as mm

    monkeypatch.chdir(tmp_path)
    mm.precheck(config, settings=mm.PrecheckSettings(quiet=True, skip=("representations", "selectivity")))
    assert list(tmp_path.iterdir()) == []


def test_a_bad_setting_is_one_line(config):
    import mergekit_mergeability as mm
    from mergekit_mergeability.errors import UserError

    with pytest.raises(UserError, match=r"^--skip nothing: no such diagnostic; the diagnostics are compatibility"):
        mm.precheck(config, settings=mm.PrecheckSettings(quiet=True, skip=("nothing",)))


def test_a_bad_device_limit_or_out_is_refused_before_any_work(config, tmp_path, monkeypatch):
    import mergekit_mergeability as mm
    from mergekit_mergeability import measuring

    monkeypatch.setattr(measuring, "measure", lambda *a, **k: pytest.fail("measured despite a bad argument"))
    with pytest.raises(mm.UserError, match=r"^device 'gpu': not a device torch knows; use cpu, cuda, cuda:N or mps$"):
        mm.precheck(config, settings=mm.PrecheckSettings(quiet=True, device="gpu"))
    with pytest.raises(mm.UserError, match=r"^limit 0: must be at least 1"):
        mm.precheck(config, settings=mm.PrecheckSettings(quiet=True, limit=0))
    afile = tmp_path / "afile"
    afile.write_text("kept")
    with pytest.raises(mm.UserError, match=r"afile: is a file; pass a folder"):
        mm.precheck(config, settings=mm.PrecheckSettings(quiet=True), out=afile)
    assert afile.read_text() == "kept"


def test_importing_the_package_stays_cheap_and_the_api_is_its_attributes():
    code = (
        "import sys, mergekit_mergeability as mm\n"
        "heavy = sorted({'torch', 'mergekit', 'transformers', 'mergekit_mergeability.api'} & set(sys.modules))\n"
        "import mergekit_mergeability.planner.planning, mergekit_mergeability.interpolation.sweeping\n"  # the subpackages load
        "from mergekit_mergeability import api\n"
        "print(heavy, all(getattr(mm, n) is getattr(api, n) for n in mm._API), mm.PrecheckSettings().limit)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[] True 64"


def test_every_public_function_says_what_it_does():
    import inspect

    from mergekit_mergeability import api

    for name in api.__all__:
        assert len(inspect.getdoc(getattr(api, name)) or "") > 80, name


def test_the_notebook_style_example_runs_on_the_public_api_alone(tmp_path):
    example = REPO / "examples" / "api.py"
    ours = {
        node.module
        for node in ast.walk(ast.parse(example.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mergekit_mergeability")
    }
    assert ours <= {"mergekit_mergeability.tiny"}  # besides `import mergekit_mergeability as mm`
    done = subprocess.run(
        [sys.executable, str(example), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "verdict:" in done.stdout and "mergeability" in done.stdout and "done; files in" in done.stdout
    assert (tmp_path / "out" / "precheck" / "precheck.json").is_file()


def test_recommended_configs_name_their_probes_from_anywhere(config, tmp_path, monkeypatch):
    """A probe written relative to the config is written absolute, so the recommended config is
    checked again from another folder; the config itself is left as it was."""
    import mergekit_mergeability as mm

    document = yaml.safe_load(config.read_text())
    for entry in document["models"]:
        entry["probe"] = str(Path(entry["probe"]).relative_to(config.parent))
    relative = config.parent / "relative.yml"
    relative.write_text(yaml.safe_dump(document, sort_keys=False))
    before = relative.read_text()
    monkeypatch.chdir(tmp_path)  # neither the config's folder nor the probes'
    mm.precheck(relative, settings=mm.PrecheckSettings(quiet=True), out=tmp_path / "out")
    written = yaml.safe_load((tmp_path / "out" / "recommended.yml").read_text())
    probes = [m["probe"] for m in written["models"]]
    assert probes and all(Path(p).is_absolute() and Path(p).is_file() for p in probes)
    assert relative.read_text() == before


def test_install_ships_a_calibration_read_first_and_refuses_a_broken_one(tmp_path, monkeypatch):
    import shutil

    import pytest

    from mergekit_mergeability import api
    from mergekit_mergeability.decide import calibration
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.planner import conditional_fit

    shipped = {"precheck": calibration.DEFAULT, "plan": conditional_fit.DEFAULT}
    for kind, default in shipped.items():
        target = tmp_path / kind / default.name
        target.parent.mkdir()
        shutil.copyfile(default, target)
        monkeypatch.setattr(calibration if kind == "precheck" else conditional_fit, "DEFAULT", target)
        broken = tmp_path / f"{kind}-broken.json"
        broken.write_text('{"not": "a calibration"}')
        with pytest.raises(UserError, match="broken.json"):
            api.install(broken, kind=kind)
        assert target.read_bytes() == default.read_bytes()  # the default stays
        assert api.install(default, kind=kind) == target and target.read_bytes() == default.read_bytes()
    with pytest.raises(UserError, match="kind 'sweep'"):
        api.install(calibration.DEFAULT, kind="sweep")
