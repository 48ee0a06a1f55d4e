"""Short model names for tables and reports: known answers."""

from mergekit_mergeability.names import short_names, shorten


def test_the_folder_name_then_as_many_parents_as_it_takes():
    names = short_names(["/runs/a/expert", "/runs/b/expert", "/runs/c/math"])
    assert names == {"/runs/a/expert": "a/expert", "/runs/b/expert": "b/expert", "/runs/c/math": "math"}


def test_the_same_path_written_twice_is_numbered():
    assert short_names(["m/x", "m/x/"]) == {"m/x": "m/x", "m/x/": "m/x#2"}  # whole path, still equal: numbered


def test_shorten_replaces_longest_paths_first():
    names = {"/p/base": "base", "/p/base2": "base2", "hub/id": "hub/id"}
    assert shorten("/p/base2 vs /p/base: width 48 vs 32 (hub/id)", names) == "base2 vs base: width 48 vs 32 (hub/id)"
