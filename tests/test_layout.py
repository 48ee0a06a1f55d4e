"""The package's import graph, read from the source with ``ast``: no module imports itself round a
circle, no folder does, and the folders import what docs/layout.md says (the exceptions below,
each with its reason, are written there too).

Every import counts, a function's lazy one included (it runs, later); imports under
``if TYPE_CHECKING:`` do not (they never run). ``from mergekit_mergeability import x`` is an edge
to the module ``x`` where there is one, else to the package."""

import ast
from collections import deque
from pathlib import Path
from typing import Dict, List, Set

from conftest import REPO

from mergekit_mergeability.decide.features import FEATURES

PACKAGE = "mergekit_mergeability"
ROOT = REPO / PACKAGE

# What each folder may import besides itself and the leaves (modules or folders that import
# nothing of ours but ``errors`` and ``progress``: errors, files, names, progress, resources, ...).
RULES = {
    "maths": set(),
    "sources": {"maths"},
    "tasks": {"maths"},
    "diagnostics": {"sources", "tasks", "maths", "rehearsal"},
    "rehearsal": {"sources", "tasks", "maths"},  # where candidate merges are built and asked: no diagnostic in it
    "decide": {"maths"},  # it receives measurements, it never loads a model
    "output": {"results"},
}
# (folder, what it imports) -> why, where a rule does not hold yet. A rule that comes to hold
# fails the test until its exception goes, here and in docs/layout.md.
EXCEPTIONS = {
    ("diagnostics", "settings"): "a diagnostic's inputs carry the precheck's settings, typed (PrecheckSettings)",
    ("decide", "merge_config"): "advice rewrites the user's config: merge_config.model_entries walks its models",
    ("decide", "methods"): "advice recommends knowledge_weighted with its defaults and the shares it gives",
    ("output", "measuring"): "output/precheck_report.py builds precheck.json from the measurements",
    ("output", "decide"): "precheck.json and the terminal table name the decision's features, verdicts and advice",
    ("output", "diagnostics"): "precheck.json's selectivity block uses the selectivity diagnostic's collision rule",
    ("output", "merge_config"): "the recommended configs are written with absolute model paths (merge_config.absolute)",
    ("output", "settings"): "precheck.json records the settings its LAPE block was measured with",
}
# api wires measure -> decide -> write: only it runs the measurements and writes the precheck's files
WIRED_ONLY_BY_API = {"mergekit_mergeability.measuring", "mergekit_mergeability.output.precheck_report"}
ALSO_READS_MEASUREMENTS = {"mergekit_mergeability.output.precheck_report"}  # the serialiser, given them by api


def modules() -> Dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def _owner(name: str, known: Dict[str, Path]) -> str:
    while name not in known:
        name = name.rpartition(".")[0]
    return name


def imports(path: Path, known: Dict[str, Path]) -> Set[str]:
    found: Set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(_owner(a.name, known) for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else _owner(node.module, known))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def module_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def folder(module: str) -> str:
    """The top-level part of the package a module belongs to: its folder, or itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def folder_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    folders: Dict[str, Set[str]] = {folder(m): set() for m in graph}
    for module, imported in graph.items():
        folders[folder(module)].update(folder(i) for i in imported if folder(i) != folder(module))
    return folders


def a_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One circle of imports, as the path round it (empty if there is none)."""
    for start in sorted(graph):
        came_from = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
    return []


def test_no_module_imports_itself_round_a_circle():
    cycle = a_cycle(module_graph())
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_no_folder_imports_itself_round_a_circle():
    cycle = a_cycle(folder_graph(module_graph()))
    assert not cycle, "folder circle: " + " -> ".join(cycle)


def test_the_finder_names_a_circle():
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": set()}) == []


def test_each_folder_imports_what_the_layout_says():
    graph = module_graph()
    folders = folder_graph(graph)
    leaves = {f for f, imported in folders.items() if f != "__init__" and imported <= {"errors", "progress"}}
    broken = {
        (f, target): sorted(m for m in graph if folder(m) == f and any(folder(i) == target for i in graph[m]))
        for f, allowed in RULES.items()
        for target in folders.get(f, set())
        if target not in allowed | leaves
    }
    unexplained = {k: v for k, v in broken.items() if k not in EXCEPTIONS}
    assert not unexplained, f"imports the layout does not allow (docs/layout.md): {unexplained}"
    settled = sorted(set(EXCEPTIONS) - set(broken))
    assert not settled, f"these rules hold now: remove their exceptions here and in docs/layout.md: {settled}"


def test_only_the_api_wires_measure_decide_write():
    graph = module_graph()
    for wired in WIRED_ONLY_BY_API:
        users = {m for m, imported in graph.items() if wired in imported}
        assert users <= {"mergekit_mergeability.api", *ALSO_READS_MEASUREMENTS} - {wired}, (wired, users)


def test_no_module_name_repeats_across_the_folders():
    """One name, one thing: ``fit.py`` in two folders is two things a reader must tell apart."""
    seen: Dict[str, List[str]] = {}
    for name in modules():
        if name != PACKAGE and not name.endswith("__init__"):
            seen.setdefault(name.rpartition(".")[2], []).append(name)
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_no_import_renames_a_project_module():
    """A module goes by its own name wherever it is imported (``import … as`` may rename a function,
    and the package itself may be ``mm``, as users write it)."""
    known = modules()
    renamed = []
    for path in sorted(
        p for folder in (PACKAGE, "research", "benchmarks", "tests") for p in (REPO / folder).rglob("*.py")
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [(a.name, a.asname) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named = [(f"{node.module}.{a.name}", a.asname) for a in node.names]
            else:
                continue
            renamed += [
                f"{path.relative_to(REPO)}:{node.lineno} {name} as {alias}"
                for name, alias in named
                if alias and alias != name.rpartition(".")[2] and name in known and (name, alias) != (PACKAGE, "mm")
            ]
    assert not renamed, renamed


def test_each_metric_of_a_built_in_record_is_spelt_only_by_its_record():
    """A metric's name as a string (``"update_norm"``) is written in records.py and the schema
    alone: everyone else reads the record's field, so renaming a metric is one edit and the schema."""
    import dataclasses
    import re

    from mergekit_mergeability import records

    names = {
        f.name
        for record in vars(records).values()
        if isinstance(record, type) and issubclass(record, records.Record) and record is not records.Record
        for f in dataclasses.fields(record)
    }
    assert {"update_norm", "scored_mean_p_gold", "partnered_accuracy", "signature_kept"} <= names
    spelt = {
        name: {
            str(path.relative_to(ROOT))
            for path in modules().values()
            if path.name != "records.py" and re.search(rf"[\"']{name}[\"']", path.read_text())
        }
        - OTHER_THINGS.get(name, set())
        - ({"decide/features.py"} if name in FEATURES else set())  # a feature of the same name, listed there
        for name in names
    }
    assert {name: where for name, where in spelt.items() if where} == {}


# Words a record uses that name other things too, and where they do
OTHER_THINGS = {
    "fewshot": {"merge_config.py"},  # the config's fewshot: key (a file of solved examples)
    # the cut-off signal named after the metric it reads (--cutoff-signal cka)
    "cka": {"cli.py", "settings.py", "decide/__init__.py", "decide/verdict.py", "output/html.py"},
    # the interpolation sweep's accuracy per λ, in its own report (interpolation/schema.json)
    "accuracy": {
        "maths/stages.py",
        "interpolation/sweeping.py",
        "output/plots.py",
        "output/terminal.py",
        "output/html.py",
    },
}
