"""docs/cli.md, written from the command line itself: every command, argument and option of
``mergekit-mergeability`` (``cli.main``), its help and its default, as ``--help`` states them.

    python -m mergekit_mergeability.cli_reference            # rewrites docs/cli.md
    python -m mergekit_mergeability.cli_reference OUT.md     # or writes it elsewhere

tests/test_docs.py fails when docs/cli.md differs from what this writes, so an option added to
``cli.py`` is documented by running the command above.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import click

DOCS = Path(__file__).resolve().parents[1] / "docs"  # a checkout's docs/
WIDTH = 100  # the help texts are wrapped at this width whatever the terminal's
PROG = "mergekit-mergeability"
UNSET = getattr(click.core, "UNSET", object())  # click ≥ 8.3: an option given no default
HEADER = f"""# Command-line reference

Every command of `{PROG}`, with each argument and option, its default and its help, as
`{PROG} COMMAND --help` prints them. This page is generated from the command line itself
(`python -m mergekit_mergeability.cli_reference`), and the tests fail when it is out of date.
What to run for your case: [the guide](guide.md).
"""


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _names(param: click.Parameter) -> str:
    names = ", ".join(f"`{name}`" for name in param.opts)
    if getattr(param, "secondary_opts", None):
        names += " / " + ", ".join(f"`{name}`" for name in param.secondary_opts)
    return names


def _value(param: click.Parameter, ctx: click.Context) -> str:
    if getattr(param, "is_flag", False):
        return ""
    if isinstance(param.type, click.Choice):
        return " or ".join(f"`{choice}`" for choice in param.type.choices)
    return f"`{param.make_metavar(ctx)}`"


def _default(param: click.Option, ctx: click.Context) -> str:
    """The default as ``--help`` would state it; where ``--help`` states none, the value itself."""
    if isinstance(param.show_default, str):
        return f"`{param.show_default}`"
    if getattr(param, "is_flag", False):
        return "on" if param.get_default(ctx, call=False) else "off"
    value = param.get_default(ctx, call=False)
    if callable(value):
        return "computed when run"
    if value is None or value is UNSET or value == () or value == []:
        return ""
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    return f"`{value}`"


def _description(command: click.Command, ctx: click.Context) -> str:
    formatter = ctx.make_formatter()
    command.format_help_text(ctx, formatter)
    text = "\n".join(line[2:] if line.startswith("  ") else line for line in formatter.getvalue().splitlines())
    return text.strip("\n")


def _command(name: str, command: click.Command, parent: click.Context) -> List[str]:
    ctx = click.Context(command, parent=parent, info_name=name, terminal_width=WIDTH, max_content_width=WIDTH)
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"## {name}", "", f"{_cell(command.get_short_help_str(limit=WIDTH))}", ""]
    lines += ["```text", f"{PROG} {name} {usage}".rstrip(), "", _description(command, ctx), "```", ""]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    if arguments:
        lines += ["| argument | required |", "|---|---|"]
        lines += [f"| `{p.make_metavar(ctx)}` | {'yes' if p.required else 'no'} |" for p in arguments]
        lines.append("")
    lines += ["| option | value | default | what it does |", "|---|---|---|---|"]
    for option in options:
        lines.append(
            f"| {_names(option)} | {_value(option, ctx)} | {_default(option, ctx)} | {_cell(option.help or '')} |"
        )
    lines += ["| `-h`, `--help` | | | Show the command's help and exit. |", ""]
    return lines


def render() -> str:
    """docs/cli.md's text, from ``cli.main`` as it is now."""
    from mergekit_mergeability.cli import main

    root = click.Context(main, info_name=PROG, terminal_width=WIDTH, max_content_width=WIDTH)
    lines = [HEADER]
    lines += [f"{PROG} {' '.join(main.collect_usage_pieces(root))}: `--version` prints the version.", ""]
    lines += ["| command | what it does |", "|---|---|"]
    commands = main.list_commands(root)
    for name in commands:
        command = main.get_command(root, name)
        lines.append(f"| [`{name}`](#{name}) | {_cell(command.get_short_help_str(limit=WIDTH))} |")
    lines.append("")
    for name in commands:
        lines += _command(name, main.get_command(root, name), root)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: List[str]) -> None:
    out = Path(argv[0]) if argv else DOCS / "cli.md"
    out.write_text(render(), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
