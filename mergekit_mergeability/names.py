"""Short, unique names for models in tables: the folder name, with as many parent folders
as it takes to tell two apart (``a/expert`` and ``b/expert``); the full path goes in a legend."""

from __future__ import annotations

from typing import Dict, Iterable


def short_names(paths: Iterable[str]) -> Dict[str, str]:
    paths = list(dict.fromkeys(paths))
    parts = {p: [s for s in p.replace("\\", "/").rstrip("/").split("/") if s] or [p] for p in paths}
    depth = dict.fromkeys(paths, 1)
    while True:
        names = {p: "/".join(parts[p][-depth[p] :]) for p in paths}
        clashes = {n for n in names.values() if list(names.values()).count(n) > 1}
        growing = [p for p in paths if names[p] in clashes and depth[p] < len(parts[p])]
        if not growing:
            return _numbered(names)
        for p in growing:
            depth[p] += 1


def _numbered(names: Dict[str, str]) -> Dict[str, str]:
    """Whatever still clashes (the same path written twice differently) gets #2, #3…"""
    seen: Dict[str, int] = {}
    unique = {}
    for path, name in names.items():
        seen[name] = seen.get(name, 0) + 1
        unique[path] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return unique


def shorten(text: str, names: Dict[str, str]) -> str:
    """``text`` with every path that has a short name written as that name (longest paths first)."""
    for path in sorted(names, key=len, reverse=True):
        if names[path] != path:
            text = text.replace(path, names[path])
    return text
