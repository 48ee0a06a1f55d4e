"""Model references and folders: damaged files, adapters and hub ids, each caught in one line."""

import json
import re
import shutil
from pathlib import Path

import pytest

from mergekit_mergeability import sources
from mergekit_mergeability.sources import TensorReader, load_causal_lm, resolve, tensor_index
from mergekit_mergeability.sources.folder import read_header, weight_files
from mergekit_mergeability.diagnostics import DiagnosticInputs, ModelInput
from mergekit_mergeability.diagnostics.compatibility import Compatibility
from mergekit_mergeability.errors import UserError

from conftest import garbled, truncated


@pytest.fixture
def damaged(llama, tmp_path):
    return {
        kind: make(llama["expert0"], tmp_path / kind) / "model.safetensors"
        for kind, make in (("truncated", truncated), ("garbled", garbled))
    }


@pytest.mark.parametrize("kind", ["truncated", "garbled"])
def test_a_damaged_safetensors_file_is_named_by_every_reader(damaged, kind):
    file = damaged[kind]
    readers = [tensor_index, TensorReader, load_causal_lm, weight_files]
    for read in readers:
        with pytest.raises(UserError) as caught:
            read(file.parent)
        message = str(caught.value)
        assert str(file) in message and "\n" not in message, (read, message)


def test_a_truncated_file_says_how_much_is_missing(damaged):
    with pytest.raises(UserError, match="truncated or corrupted .*7 bytes short"):
        tensor_index(damaged["truncated"].parent)


def test_a_model_plus_adapter_reference_without_an_adapter_is_refused(llama, tmp_path):
    reference = f"{llama['expert0']}+{tmp_path / 'adapter'}"
    with pytest.raises(UserError) as caught:
        resolve(reference)
    assert reference in str(caught.value) and "not a peft adapter folder" in str(caught.value)


def test_a_folder_whose_name_has_a_plus_is_a_folder(llama, tmp_path):
    folder = shutil.copytree(llama["expert0"], tmp_path / "model+v2")
    assert resolve(str(folder)) == folder.resolve()


class FakeHub:
    """huggingface_hub's download functions, answering from a local folder and counting calls."""

    def __init__(self, folders):
        self.folders = folders  # repo id -> local folder
        self.calls = []

    def hf_hub_download(self, repo_id, filename, **_):
        self.calls.append(("file", repo_id, filename))
        path = self.folders[repo_id] / filename
        if not path.is_file():
            from huggingface_hub.errors import RemoteEntryNotFoundError

            raise RemoteEntryNotFoundError.__new__(
                RemoteEntryNotFoundError
            )  # the hub's 404 for a file (needs no response)
        return str(path)

    def get_safetensors_metadata(self, repo_id, **_):
        from huggingface_hub.utils._safetensors import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

        self.calls.append(("headers", repo_id))
        header = read_header(self.folders[repo_id] / "model.safetensors")
        tensors = {
            n: TensorInfo(i["dtype"], i["shape"], tuple(i["data_offsets"]))
            for n, i in header.items()
            if n != "__metadata__"
        }
        return SafetensorsRepoMetadata(
            None,
            False,
            dict.fromkeys(tensors, "model.safetensors"),
            {"model.safetensors": SafetensorsFileMetadata({}, tensors)},
        )

    def snapshot_download(self, repo_id, local_files_only=False, **_):
        if local_files_only and ("snapshot", repo_id) not in self.calls:  # the cache holds what was downloaded
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("not in the cache")
        self.calls.append(("snapshot", repo_id))
        return str(self.folders[repo_id])


@pytest.fixture
def hub(llama, monkeypatch):
    import huggingface_hub

    fake = FakeHub({"org/base": llama["base"], "org/expert": llama["expert0"]})
    for name in ("hf_hub_download", "get_safetensors_metadata", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, getattr(fake, name))
    monkeypatch.setattr("mergekit_mergeability.sources.hub.reachable", lambda: True)  # the fake hub is online
    return fake


def test_hub_models_are_checked_from_headers_before_any_weight_downloads(hub, llama):
    base, expert = resolve("org/base"), resolve("org/expert")
    inputs = DiagnosticInputs(ModelInput("org/base", base), (ModelInput("org/expert", expert),))
    result = Compatibility().run(inputs)
    assert [f for f in result.findings if f.severity != "info"] == []
    assert result.per_model["org/expert"]["num_layers"] == 4
    assert not [c for c in hub.calls if c[0] == "snapshot"]
    assert ("headers", "org/expert") in hub.calls and ("file", "org/expert", "config.json") in hub.calls
    assert str(expert) == "org/expert"  # reports and recommended configs keep the hub id
    assert Path(expert) == llama["expert0"]  # used as a folder, it downloads, once
    assert TensorReader(expert).index.keys() == tensor_index(llama["expert0"]).keys()
    assert [c for c in hub.calls if c[0] == "snapshot"] == [("snapshot", "org/expert")]


def test_an_unknown_hub_id_is_one_line(hub):
    missing = resolve("org/missing")
    with pytest.raises(UserError, match="model org/missing: no such folder, and not on the hub"):
        sources.model_config(missing)


def test_an_unknown_hub_id_in_a_config_names_its_field(hub, llama, tmp_path):
    """The hub is asked only when the model is first read, after the config is parsed; the error
    still says which field of which file named the id."""
    import yaml

    from mergekit_mergeability import merge_config

    path = tmp_path / "pool.yml"
    models = [{"model": str(llama["expert0"])}, {"model": "org/missing"}]
    path.write_text(yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": "org/base", "models": models}))
    missing = merge_config.read(path).sources()["org/missing"]
    with pytest.raises(
        UserError, match=f"^{re.escape(str(path))}: models\\[1\\].model: model org/missing: no such folder"
    ):
        sources.model_config(missing)


def test_offline_a_hub_id_is_looked_up_in_the_cache_only_and_fails_at_once(hub, llama, monkeypatch):
    """No network: huggingface_hub would retry each request for ~30 s; its cache is asked instead."""
    import huggingface_hub

    asked = []

    def cached_only(repo_id, **kwargs):  # the fake hub's snapshots stand for what the cache holds
        asked.append(kwargs)
        if repo_id not in hub.folders:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")
        return str(hub.folders[repo_id])

    monkeypatch.setattr("mergekit_mergeability.sources.hub.reachable", lambda: False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", cached_only)
    unreachable = f"the hub \\({re.escape(sources.hub._host())}\\) cannot be reached to look it up"
    with pytest.raises(UserError, match=f"^model models/nope: no such folder, and {unreachable}"):
        sources.model_config(resolve("models/nope"))
    assert asked and all(kwargs.get("local_files_only") for kwargs in asked)
    # a model in the cache is indexed from its own files' headers
    assert tensor_index(resolve("org/expert")) == tensor_index(llama["expert0"])
    assert all(kwargs.get("local_files_only") for kwargs in asked)
    assert not [c for c in hub.calls if c[0] == "headers"]


def test_a_dry_run_online_downloads_no_hub_model_and_says_what_the_run_will(hub, llama, tmp_path):
    import math

    import yaml

    from mergekit_mergeability.cost import size

    from conftest import precheck_cli

    probe = tmp_path / "probe.jsonl"
    probe.write_text(
        "".join(json.dumps({"question": f"Q{i}?", "choices": ["a", "b"], "label": 0}) + "\n" for i in range(3))
    )
    models = [{"model": "org/expert", "probe": str(probe)}, {"model": str(llama["expert1"]), "probe": str(probe)}]
    config = tmp_path / "hub.yml"
    config.write_text(yaml.safe_dump({"merge_method": "ties", "base_model": "org/base", "models": models}))
    result = precheck_cli(config, tmp_path / "out", "--dry-run")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "menu: not rehearsed, a dry run downloads no hub model to plan the merge with" in said
    assert not [c for c in hub.calls if c[0] == "snapshot"]
    weights = {
        repo: sum(math.prod(i.shape) * 4 for i in tensor_index(hub.folders[repo]).values()) for repo in hub.folders
    }
    assert (
        f"downloads: org/base {size(weights['org/base'])}, org/expert {size(weights['org/expert'])}"
        f" ({size(sum(weights.values()))} of disk, into the Hugging Face cache)"
    ) in said


def test_a_bin_only_folder_has_weights_and_a_folder_without_any_is_refused(llama, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UserError, match="no weights"):
        weight_files(folder)
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    assert weight_files(folder) == [folder / "pytorch_model.bin"]


@pytest.mark.parametrize(
    "written, architectures, inferred",
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, ["LlamaForCausalLM"], None),
        ({"model_type": "qwen2"}, ["Qwen2ForCausalLM"], "Qwen2ForCausalLM"),  # transformers loads it by model_type
        ({"model_type": "gpt2", "architectures": []}, ["GPT2LMHeadModel"], "GPT2LMHeadModel"),
    ],
)
def test_a_config_without_architectures_gets_the_class_transformers_loads(tmp_path, written, architectures, inferred):
    (tmp_path / "config.json").write_text(json.dumps(written))
    assert sources.model_config(tmp_path)["architectures"] == architectures
    assert sources.inferred_architecture(tmp_path) == inferred


def test_a_config_naming_no_class_and_no_known_model_type_says_what_to_add(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_type"}))
    with pytest.raises(
        UserError,
        match=r'config.json: no "architectures" list, and model_type .no_such_type. is no causal LM transformers knows; add "architectures"',
    ):
        sources.model_config(tmp_path)


@pytest.mark.parametrize(
    "reference", ["x" * 300, "/tmp/" + "y" * 300, "~nobody-at-all/model", "org/", "a/b/c", "org/na me", ""]
)
def test_a_reference_that_is_neither_a_folder_nor_a_hub_id_is_one_line(reference):
    with pytest.raises(UserError, match="no such folder, nor a hub id"):
        resolve(reference)
