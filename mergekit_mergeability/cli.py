"""The ``mergekit-mergeability`` command line."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Callable

import click

from mergekit_mergeability.errors import UserError


def user_errors(command: Callable) -> Callable:
    """Report user errors as one line on stderr (exit 2) instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as error:
            raise click.ClickException(str(error)) from None

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mergekit-mergeability")
def main():
    """Will these fine-tunes merge well? Find out before the merge, and merge so less is lost.

    Works on the mergekit configs you already have. Plugin merge methods
    (knowledge_weighted, layer_selective, and any installed plugin's) also work
    in the stock `mergekit-yaml`.
    """


@main.command()
@click.option("--plugins-only", is_flag=True, help="Only methods contributed by plugins.")
def methods(plugins_only: bool):
    """List the merge methods mergekit knows, where each comes from, and its parameters.

    \b
    Parameters marked "per model" go under a model's `parameters:` in the
    config; the others under the top-level (or slice) `parameters:`.
    """
    from rich.console import Console
    from rich.table import Table

    from mergekit_mergeability.describe import describe_methods

    table = Table("method", "from", "parameters", show_lines=True)
    table.columns[0].overflow = "fold"
    for row in describe_methods():
        if plugins_only and row.origin == "mergekit":
            continue
        reference = f"\n[dim]{row.reference}[/dim]" if row.reference else ""
        table.add_row(f"[bold]{row.name}[/bold]{reference}", row.origin, "\n".join(row.parameters))
    Console().print(table)


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out_path", type=click.Path(file_okay=False, path_type=Path))
@click.argument("mergekit_options", nargs=-1, type=click.UNPROCESSED)
@user_errors
def merge(config_file: Path, out_path: Path, mergekit_options: tuple):
    """Run `mergekit-yaml CONFIG_FILE OUT_PATH [OPTIONS]` with every plugin method registered.

    \b
    A drop-in for environments that skip the start-up hook the package installs
    (for example `python -S`, or a mergekit in another environment). Every
    `mergekit-yaml` option works, after the two paths:
        mergekit-mergeability merge config.yml ./merged --cuda --out-shard-size 1B
    The model is written to a temporary folder beside OUT_PATH and renamed when
    complete, so a failed merge leaves nothing behind. See `mergekit-yaml --help`.
    """
    if out_path.exists() and any(out_path.iterdir()):
        raise UserError(f"{out_path}: output folder exists and is not empty; remove it or choose another")
    # Importing mergekit registers the plugins' methods: this package's import installed the hook.
    from mergekit.scripts import run_yaml

    partial = out_path.with_name(f".{out_path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        code = run_yaml.main.main(
            [str(config_file), str(partial), *mergekit_options],
            prog_name="mergekit-mergeability merge",
            standalone_mode=False,
        )
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, (RuntimeError, ValueError)):
            raise UserError(f"{config_file}: {str(error).splitlines()[0]}") from None
        raise
    if out_path.exists():
        out_path.rmdir()
    partial.rename(out_path)
    return code
