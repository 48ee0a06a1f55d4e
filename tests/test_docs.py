"""The user pages stay guide and reference, and the command-line reference stays the command line's.

The research narrative (measured families by their names, issue numbers, amendments, pre-registered
rules, dated entries) belongs in docs/prediction.md and docs/changelog.md; the pages a user acts on
link there. docs/cli.md is generated from ``cli.main`` and must be regenerated when an option changes.
"""

import re

from conftest import REPO

from mergekit_mergeability.cli_reference import render

USER_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/guide.md",
    "docs/precheck.md",
    "docs/methods.md",
    "docs/plan.md",
    "docs/scale.md",
]
# the measured families of research/pools.py and research/configs.py, as the evidence names them
FAMILIES = "fit heldout lora options options10 attention tasks wide middle deep down low vq configs".split()
NOTEBOOK = {
    "a family's name": re.compile(r"`(?:%s)`" % "|".join(FAMILIES)),
    "a family named in words": re.compile(r"\b(?:small-config family|check pool|fit pool)\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "an amendment": re.compile(r"\bamendments?\b", re.IGNORECASE),
    "a pre-registered rule": re.compile(r"\brules? \d+\b|\bprereg", re.IGNORECASE),
    "a research constant or config": re.compile(r"\bTOLERANCE\b|`n\d+_\d+(?:_[a-z_]+)?`"),
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a diary entry": re.compile(
        r"\bload average|\bearlier (?:demo )?runs?\b|\bfor the record\b|\bthe first fit\b", re.IGNORECASE
    ),
}
LINK_TARGET = re.compile(r"\]\([^)]*\)")  # a link's target may name a dated changelog entry


def test_user_pages_are_not_a_lab_notebook():
    found = []
    for page in USER_PAGES:
        for number, line in enumerate((REPO / page).read_text(encoding="utf-8").splitlines(), 1):
            text = LINK_TARGET.sub("]()", line)
            for what, pattern in NOTEBOOK.items():
                for match in pattern.finditer(text):
                    found.append(f"{page}:{number}: {what}: {match.group(0)!r}")
    assert not found, (
        "move research narrative to docs/prediction.md (the evidence) or docs/changelog.md, and say it "
        "in user terms here:\n" + "\n".join(found)
    )


def test_cli_reference_is_current():
    page = REPO / "docs" / "cli.md"
    assert page.exists() and page.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is not what the command line says now; regenerate it: "
        "python -m mergekit_mergeability.cli_reference"
    )


def test_cli_reference_is_in_the_site():
    assert re.search(r"^\s*- .*: cli\.md$", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), re.MULTILINE)


def test_nested_lists_are_indented_as_mkdocs_reads_them():
    """Python-Markdown nests a list only under four spaces: a bullet indented one to three spaces, or a
    fenced block inside a list item, comes out flat (an item of the outer list, a line of inline code)."""
    found = []
    for page in [*USER_PAGES, "docs/evaluation.md", "docs/prediction.md"]:
        fenced = False
        for number, line in enumerate((REPO / page).read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                if line.startswith(" ") and not fenced:
                    found.append(f"{page}:{number}: a fenced block indented inside a list item")
                fenced = not fenced
            elif not fenced and re.match(r" {1,3}[-*] ", line):
                found.append(f"{page}:{number}: {line.strip()[:40]!r}")
    assert not found, "indent nested bullets by four spaces; put code blocks outside lists:\n" + "\n".join(found)


FIGURE = re.compile(r"<!--fig:([\w.-]+)-->")


def test_every_quoted_figure_is_the_one_in_figures_yml():
    """A figure a user acts on is stated once (docs/figures.yml); every page that quotes it writes
    its value followed by <!--fig:KEY-->, so a figure retyped differently fails here."""
    import yaml

    figures = yaml.safe_load((REPO / "docs" / "figures.yml").read_text(encoding="utf-8"))
    quoted, wrong = set(), []
    for page in ["README.md", *(p.relative_to(REPO).as_posix() for p in sorted((REPO / "docs").glob("*.md")))]:
        text = (REPO / page).read_text(encoding="utf-8")
        for match in FIGURE.finditer(text):
            key = match.group(1)
            quoted.add(key)
            if key not in figures:
                wrong.append(f"{page}: <!--fig:{key}--> is not in docs/figures.yml")
            elif not text[: match.start()].endswith(figures[key]["value"]):
                before = text[max(0, match.start() - 30) : match.start()]
                wrong.append(f"{page}: {key} is {figures[key]['value']!r} in docs/figures.yml, here {before!r}")
    assert not wrong, "\n".join(wrong)
    readme = set(FIGURE.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert set(figures) <= readme, f"figures the README's first screen does not give: {sorted(set(figures) - readme)}"
    assert all(f["label"] in ("measured", "extrapolated", "estimated") for f in figures.values())
