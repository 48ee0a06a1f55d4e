"""Install the wheel into a fresh environment: the stock mergekit-yaml then knows our
methods and a third-party plugin's; after uninstalling, it does not.

The fresh environment is a venv without pip that sees this environment's
dependencies (torch, mergekit, ...) through a path file, but none of its start-up
hooks, so only what is installed into it can change mergekit's behaviour.
"""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, shipped_config

BIN = Path(sys.executable).parent


def _run(*args, check=True, **kwargs):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    if check and done.returncode:
        raise AssertionError(f"{args}: {done.stdout[-1500:]}{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    for project in (REPO, REPO / "examples" / "third_party_plugin"):
        _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, project)
    return {path.name.split("-")[0]: path for path in out.glob("*.whl")}


@pytest.fixture()
def fresh_env(tmp_path):
    env = tmp_path / "env"
    _run(sys.executable, "-m", "venv", "--without-pip", env)
    python = env / "bin" / "python"
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip(python, *args):
    _run(sys.executable, "-m", "pip", "--python", python, "-q", *args)


def _mergekit_yaml(python, config, out):
    return _run(python, BIN / "mergekit-yaml", config, out, "--no-write-model-card", check=False)


def test_install_makes_stock_mergekit_yaml_know_plugin_methods_and_uninstall_undoes_it(
    wheels, fresh_env, llama, tmp_path
):
    ours = shipped_config("knowledge_weighted.yml", llama, tmp_path)
    median = tmp_path / "median.yml"
    median.write_text(ours.read_text().replace("knowledge_weighted", "median").replace("base_model:", "# base_model:"))

    before = _mergekit_yaml(fresh_env, ours, tmp_path / "before")
    assert before.returncode != 0 and "Unimplemented merge method knowledge_weighted" in before.stderr

    _pip(
        fresh_env, "install", "--no-deps", "--no-index", wheels["mergekit_mergeability"], wheels["mergeability_median"]
    )
    assert _mergekit_yaml(fresh_env, ours, tmp_path / "ours").returncode == 0
    assert (tmp_path / "ours" / "model.safetensors").exists()
    assert _mergekit_yaml(fresh_env, median, tmp_path / "median").returncode == 0
    listing = _run(fresh_env.parent / "mergekit-mergeability", "methods", "--plugins-only").stdout
    assert "median" in listing and "knowledge_weighted" in listing
    off = _run(fresh_env, BIN / "mergekit-yaml", ours, tmp_path / "off", check=False, env=_hook_off())
    assert off.returncode != 0 and "Unimplemented merge method knowledge_weighted" in off.stderr

    _pip(fresh_env, "uninstall", "-y", "mergekit-mergeability", "mergeability-median")
    after = _mergekit_yaml(fresh_env, ours, tmp_path / "after")
    assert after.returncode != 0 and "Unimplemented merge method knowledge_weighted" in after.stderr


def _hook_off():
    """This environment with the start-up hook switched off, as the README says to."""
    import os

    return {**os.environ, "MERGEKIT_MERGEABILITY_HOOK": "0"}


def test_import_installs_no_heavy_modules():
    code = "import sys, mergekit_mergeability; print(sorted({'torch', 'mergekit', 'transformers'} & set(sys.modules)))"
    assert _run(sys.executable, "-c", code).stdout.strip() == "[]"
