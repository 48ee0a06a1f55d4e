import subprocess
import sys
import textwrap
import warnings
from importlib.metadata import EntryPoint, entry_points

import pytest
import torch
from mergekit import merge_methods
from mergekit.merge_methods import TensorBatch

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.plugins.hookspecs import PROJECT
from mergekit_mergeability.plugins import contributions, hookimpl, load_plugins, plugin_methods, register_merge_methods


def _entry(name, value):
    return EntryPoint(name=name, value=value, group=PROJECT)


def test_a_plugin_that_fails_to_import_warns_once_and_the_others_load():
    with pytest.warns(RuntimeWarning, match="plugin 'broken'.*failed to load") as caught:
        manager = load_plugins(
            [_entry("broken", "no_such_module_anywhere"), _entry("builtin", "mergekit_mergeability.plugins.builtin")]
        )
    assert len(caught) == 1
    names = [method.spec.name for _, method in contributions("mergeability_merge_methods", manager)]
    assert names == ["knowledge_weighted", "layer_selective"]


def test_a_plugin_whose_hook_raises_is_skipped_with_a_warning():
    class Faulty:
        @hookimpl
        def mergeability_merge_methods(self):
            raise RuntimeError("boom")

    manager = load_plugins([_entry("builtin", "mergekit_mergeability.plugins.builtin")])
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


class _Impostor:
    """A third-party plugin whose method takes a built-in name."""

    @hookimpl
    def mergeability_merge_methods(self):
        @merge_methods.merge_method(name="knowledge_weighted")
        def impostor(batch: TensorBatch) -> torch.Tensor:
            return batch.tensors[0]

        return [impostor]


def test_a_method_name_two_plugins_contribute_is_refused_naming_both_packages():
    manager = load_plugins(entry_points(group=PROJECT))
    manager.register(_Impostor(), name="impostor")
    with pytest.raises(UserError) as caught:
        plugin_methods(manager)
    assert str(caught.value) == (
        "two plugins contribute a merge method named 'knowledge_weighted': "
        "'impostor' (test_plugins) and 'builtin' (mergekit-mergeability); uninstall one of them"
    )


def test_stock_mergekit_yaml_refuses_a_clash_in_one_line_at_import():
    """The refusal comes where mergekit first sees the methods: importing mergekit.merge_methods."""
    code = textwrap.dedent(
        """
        import sys
        sys.argv[0] = "mergekit-yaml"
        from mergekit_mergeability.plugins import hookimpl, plugin_manager

        class Impostor:
            @hookimpl
            def mergeability_merge_methods(self):
                from mergekit_mergeability.methods.layer_selective import layer_selective
                return [layer_selective]

        plugin_manager().register(Impostor(), name="impostor")
        import mergekit.merge_methods
        print("imported")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert (
        done.stderr.strip()
        == "Error: two plugins contribute a merge method named 'layer_selective': 'impostor' (__main__) and 'builtin' (mergekit-mergeability); uninstall one of them"
    )


def test_two_packages_registering_one_plugin_name_are_refused():
    same = _entry("builtin", "mergekit_mergeability.plugins.builtin")
    assert load_plugins([same, same]).has_plugin("builtin")  # one package seen twice on sys.path: loaded once
    with pytest.raises(
        UserError,
        match="two packages register the plugin 'builtin': mergekit_mergeability.plugins.builtin and test_plugins; uninstall one of them",
    ):
        load_plugins([same, _entry("builtin", "test_plugins")])
