"""Hub ids rehearsed like folders: a config naming its models by hub id, offline, from a Hugging
Face cache laid out from tiny local models (no network)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main

from mergekit_mergeability.tiny import derive

from conftest import noise, ranked_probes

REVISION = "0" * 40
QUESTIONS = [f"Question {i}: which is it?" for i in range(16)]
SKIP = ["--skip", "representations", "--skip", "selectivity"]  # tiny random models part at once: no menu


def _cached(cache: Path, repo: str, folder: Path) -> None:
    """``folder`` laid out as huggingface_hub keeps a downloaded snapshot of ``repo``."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(REVISION)
    shutil.copytree(folder, entry / "snapshots" / REVISION)


@pytest.fixture(scope="module")
def offline(llama, tmp_path_factory):
    """The tiny family in a Hugging Face cache, and one config naming them by hub id and one by folder."""
    root = tmp_path_factory.mktemp("hub")
    folders = {"base": llama["base"]}
    for i in (0, 1):  # fine-tunes of the base's MLPs, each probed on what it ranks first
        folders[f"expert{i}"] = derive(llama["base"], root / f"e{i}", noise(30 + i, 1.0, lambda n: ".mlp." in n))
    ids = {"base": "tinyorg/base", "expert0": "tinyorg/math", "expert1": "tinyorg/facts"}
    for name, repo in ids.items():
        _cached(root / "cache", repo, folders[name])
    probes = [
        ranked_probes(root / f"probe{i}.jsonl", folders[f"expert{i}"], QUESTIONS, ["q", "x", "z", "k"], 0)
        for i in (0, 1)
    ]

    def config(name, refer):
        document = {
            "merge_method": "ties",
            "base_model": refer("base"),
            "parameters": {"normalize": True},
            "dtype": "float32",
            "models": [
                {"model": refer(f"expert{i}"), "parameters": {"weight": 0.5, "density": 0.5}, "probe": str(probes[i])}
                for i in (0, 1)
            ],
        }
        (root / name).write_text(yaml.safe_dump(document, sort_keys=False))
        return root / name

    return dict(
        root=root,
        cache=root / "cache",
        hub=config("hub.yml", lambda n: ids[n]),
        folders=config("folders.yml", lambda n: str(folders[n])),
        absent=config("absent.yml", lambda n: "tinyorg/absent" if n == "expert1" else ids[n]),
    )


@pytest.fixture
def cut_off(offline, monkeypatch):
    """HF_HUB_OFFLINE, with the cache above: nothing can come from the hub."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(offline["cache"]))
    return offline


def _precheck(config: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["precheck", str(config), "--out", str(out), "--quiet", *SKIP, *extra])


def _numbers(report: dict):
    """What a precheck found, with every model named by its place, not its path or id."""
    choice = report["recommendation"]["method_choice"]
    return (
        report["recommendation"]["verdict"],
        report["recommendation"]["method"],
        {name: list(kept.values()) for name, kept in choice["per_model"].items()},
        choice["kept"],
        [(m["predicted_mergeability"], m["fluency"], m["knowledge"], m["dilution"]) for m in report["models"]],
    )


def test_a_config_of_hub_ids_offline_gets_the_verdict_menu_and_numbers_of_the_same_folders(cut_off, tmp_path):
    by_id, by_folder = _precheck(cut_off["hub"], tmp_path / "hub"), _precheck(cut_off["folders"], tmp_path / "folders")
    assert by_id.exit_code == by_folder.exit_code == 0, by_id.output + by_folder.output
    hub, folders = (json.loads((tmp_path / side / "precheck.json").read_text()) for side in ("hub", "folders"))
    assert (
        len(hub["recommendation"]["method_choice"]["kept"]) > 2
    )  # the menu was rehearsed, not only the merge as written
    assert _numbers(hub) == _numbers(folders)
    written = yaml.safe_load((tmp_path / "hub" / "recommended.yml").read_text())
    assert written["base_model"] == "tinyorg/base" and [m["model"] for m in written["models"]] == [
        "tinyorg/math",
        "tinyorg/facts",
    ]


def test_a_dry_run_of_hub_ids_offline_plans_the_menu_and_reads_no_tensor(cut_off, tmp_path, monkeypatch):
    from mergekit_mergeability.sources.folder import TensorReader

    read = []
    monkeypatch.setattr(TensorReader, "__getitem__", lambda self, name: read.append(name))
    monkeypatch.setattr(TensorReader, "rows", lambda self, name, *rows: read.append(name))
    result = _precheck(cut_off["hub"], tmp_path / "out", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "menu: " in result.output and "not rehearsed" not in result.output and read == []
    assert not (tmp_path / "out").exists()


def test_a_hub_id_missing_from_the_cache_offline_is_one_line_naming_it_and_what_to_do(cut_off, tmp_path):
    result = _precheck(cut_off["absent"], tmp_path / "out")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "models[1].model: model tinyorg/absent" in lines[0] and "huggingface-cli download tinyorg/absent" in lines[0]
    assert not (tmp_path / "out").exists()
