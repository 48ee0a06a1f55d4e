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


def _refused(error_name: str):
    """A stand-in for huggingface_hub's functions that refuse as the hub does (the error's
    response left out: only its type is read)."""
    import huggingface_hub.errors as errors

    def refuse(*args, **kwargs):
        kind = getattr(errors, error_name)
        raise kind.__new__(kind)

    return refuse


@pytest.mark.parametrize(
    "error, said",
    [
        ("GatedRepoError", "gated on the hub: accept its terms on its page, then huggingface-cli login"),
        ("RepositoryNotFoundError", "not on the hub, or private (huggingface-cli login, if it is yours)"),
        ("RevisionNotFoundError", "the hub has no such revision of it"),
        ("NotASafetensorsRepoError", "its weights on the hub are .bin files only; the precheck reads safetensors"),
    ],
)
def test_what_the_hub_refuses_is_one_line_naming_the_id_and_what_to_do(monkeypatch, tmp_path, error, said):
    import huggingface_hub

    for name in ("hf_hub_download", "get_safetensors_metadata", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, _refused(error))
    monkeypatch.setattr("mergekit_mergeability.sources.hub.reachable", lambda: True)
    config = tmp_path / "config.yml"
    models = [{"model": "tinyorg/math@v2"}, {"model": "tinyorg/facts"}]
    config.write_text(yaml.safe_dump({"merge_method": "ties", "base_model": "tinyorg/base", "models": models}))
    result = CliRunner().invoke(main, ["precheck", str(config), "--out", str(tmp_path / "out"), "--dry-run"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "model tinyorg/" in lines[0] and said in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_revision_is_read_from_the_cache_as_the_hub_names_it_and_a_missing_one_says_how_to_get_it(cut_off):
    from mergekit_mergeability.errors import UserError
    from mergekit_mergeability.sources import resolve, tensor_index

    entry = cut_off["cache"] / "models--tinyorg--math"
    (entry / "refs" / "v1").write_text(REVISION)  # a branch the cache has: the same snapshot
    pinned = resolve("tinyorg/math@v1")
    assert str(pinned) == "tinyorg/math@v1" and tensor_index(pinned) == tensor_index(resolve("tinyorg/math"))
    with pytest.raises(UserError, match="huggingface-cli download tinyorg/math --revision v9, where the hub"):
        tensor_index(resolve("tinyorg/math@v9"))


def test_adapters_trained_on_a_hub_base_are_rehearsed_offline_as_on_its_folder(cut_off, llama, tmp_path):
    """LoRA adapters whose adapter_config.json names the base by hub id, as peft writes it."""
    from mergekit_mergeability.tiny import make_adapter

    targets = [f"model.layers.{i}.mlp.up_proj.weight" for i in (2, 3)]
    base = cut_off["cache"] / "models--tinyorg--base" / "snapshots" / REVISION
    reports = {}
    for side, named in (("hub", "tinyorg/base"), ("folder", str(base))):
        adapters = [
            make_adapter(base, tmp_path / side / f"a{i}", targets, seed=i, scale=0.5, base_name=named) for i in (0, 1)
        ]
        probes = [
            ranked_probes(tmp_path / side / f"p{i}.jsonl", llama["base"], QUESTIONS, ["q", "x"], i) for i in (0, 1)
        ]
        models = [{"model": str(a), "probe": str(p), "parameters": {"weight": 0.5}} for a, p in zip(adapters, probes)]
        config = tmp_path / side / "config.yml"
        config.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": named, "models": models}))
        result = _precheck(config, tmp_path / side / "out")
        assert result.exit_code == 0, result.output
        reports[side] = json.loads((tmp_path / side / "out" / "precheck.json").read_text())
    assert len(reports["hub"]["recommendation"]["method_choice"]["kept"]) > 2
    assert _numbers(reports["hub"]) == _numbers(reports["folder"])


def test_a_hub_adapter_on_a_hub_base_is_rehearsed_offline_and_written_as_named(cut_off, llama, tmp_path):
    """``org/base+org/adapter``, as mergekit takes it: the adapter repo's snapshot, from the cache."""
    from mergekit_mergeability.tiny import make_adapter

    targets = [f"model.layers.{i}.mlp.up_proj.weight" for i in (2, 3)]
    base = cut_off["cache"] / "models--tinyorg--base" / "snapshots" / REVISION
    adapters = [make_adapter(base, tmp_path / f"a{i}", targets, seed=i, scale=0.5) for i in (0, 1)]
    for i, adapter in enumerate(adapters):
        _cached(cut_off["cache"], f"tinyorg/lora{i}", adapter)
    probes = [ranked_probes(tmp_path / f"p{i}.jsonl", llama["base"], QUESTIONS, ["q", "x"], i) for i in (0, 1)]
    reports = {}
    for side, refer in (
        ("hub", lambda i: f"tinyorg/base+tinyorg/lora{i}"),
        ("folder", lambda i: f"{base}+{adapters[i]}"),
    ):
        models = [{"model": refer(i), "probe": str(probes[i]), "parameters": {"weight": 0.5}} for i in (0, 1)]
        base_model = "tinyorg/base" if side == "hub" else str(base)
        config = tmp_path / f"{side}.yml"
        config.write_text(
            yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": base_model, "models": models})
        )
        result = _precheck(config, tmp_path / side)
        assert result.exit_code == 0, result.output
        reports[side] = json.loads((tmp_path / side / "precheck.json").read_text())
    assert len(reports["hub"]["recommendation"]["method_choice"]["kept"]) > 2
    assert _numbers(reports["hub"]) == _numbers(reports["folder"])
    written = yaml.safe_load((tmp_path / "hub" / "recommended.yml").read_text())
    assert [m["model"] for m in written["models"]] == ["tinyorg/base+tinyorg/lora0", "tinyorg/base+tinyorg/lora1"]
