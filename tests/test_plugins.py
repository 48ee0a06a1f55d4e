import warnings
from importlib.metadata import EntryPoint

import pytest
import torch
from mergekit import merge_methods
from mergekit.merge_methods import TensorBatch

from mergekit_mergeability.hookspecs import PROJECT
from mergekit_mergeability.plugins import contributions, hookimpl, load_plugins, register_merge_methods


def _entry(name, value):
    return EntryPoint(name=name, value=value, group=PROJECT)


def test_a_plugin_that_fails_to_import_warns_once_and_the_others_load():
    with pytest.warns(RuntimeWarning, match="plugin 'broken'.*failed to load") as caught:
        manager = load_plugins([_entry("broken", "no_such_module_anywhere"), _entry("builtin", "mergekit_mergeability.builtin")])
    assert len(caught) == 1
    names = [method.spec.name for _, method in contributions("mergeability_merge_methods", manager)]
    assert names == ["knowledge_weighted", "layer_selective"]


def test_a_plugin_whose_hook_raises_is_skipped_with_a_warning():
    class Faulty:
        @hookimpl
        def mergeability_merge_methods(self):
            raise RuntimeError("boom")

    manager = load_plugins([_entry("builtin", "mergekit_mergeability.builtin")])
    manager.register(Faulty(), name="faulty")
    with pytest.warns(RuntimeWarning, match="plugin 'faulty' failed in mergeability_merge_methods"):
        found = contributions("mergeability_merge_methods", manager)
    assert [plugin for plugin, _ in found] == ["builtin", "builtin"]


def test_registration_is_idempotent():
    register_merge_methods()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert register_merge_methods() == []
    assert merge_methods.get("knowledge_weighted").spec.name == "knowledge_weighted"


@merge_methods.merge_method(name="linear")
def fake_linear(batch: TensorBatch) -> torch.Tensor:
    return batch.tensors[0]


def test_a_taken_name_is_skipped_with_a_warning():
    with pytest.warns(RuntimeWarning, match="'linear' from plugin 'impostor' is skipped"):
        assert register_merge_methods([("impostor", fake_linear)]) == []
    assert merge_methods.get("linear") is not fake_linear
