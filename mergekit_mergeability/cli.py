"""The ``mergekit-mergeability`` command line."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Callable

import click

from mergekit_mergeability.errors import UserError


class _UserErrorExit(click.ClickException):
    exit_code = 2  # 1 is kept for "the precheck says stop"


def user_errors(command: Callable) -> Callable:
    """Report user errors as one line on stderr (exit 2) instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as error:
            raise _UserErrorExit(str(error)) from None

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


def _layer_set(text: str | None):
    """'0-4,10' → {0, 1, 2, 3, 4, 10}."""
    if not text:
        return None
    chosen = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise click.BadParameter(f"{part!r} is not a layer or a range like 0-12", param_hint="--layers")
        chosen.update(range(int(low), int(high or low) + 1))
    return chosen


def _probe_pairs(values) -> dict:
    pairs = {}
    for value in values:
        model, sep, spec = value.partition("=")
        if not sep or not model or not spec:
            raise click.BadParameter(f"{value!r}: expected MODEL=SPEC", param_hint="--probe")
        pairs[model] = spec
    return pairs


@main.command()
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path("precheck"), show_default=True, help="Folder for precheck.json, recommended.yml and report.html.")
@click.option("--probe", "probes", multiple=True, metavar="MODEL=SPEC", help="Probe data for a model (path as written in the config, or its folder name): a .jsonl file, an lm-eval task YAML or task name. Repeatable; overrides the config's probe: key.")
@click.option("--limit", type=click.IntRange(min=1), default=64, show_default=True, help="Probe instances per model.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, mps… (auto: cuda if available).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--layers", help="Only compare these representation layers, e.g. 0-12,20 (0 = embedding output).")
@click.option("--cka-threshold", type=click.FloatRange(0, 1), default=0.9, show_default=True, help="CKA below this, from some layer on, marks where representations stop being shared.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@user_errors
def precheck(config_file: Path, out: Path, probes, limit, device, dtype, layers, cka_threshold, batch_size, quiet):
    """Predict, before merging, how well each model of CONFIG_FILE will survive the merge.

    \b
    CONFIG_FILE is the mergekit config you would pass to mergekit-yaml. Say what
    each model was fine-tuned to do with a probe: key next to model: (mergekit
    ignores it) or --probe:
        models:
          - model: ./math-expert
            probe: probes/math.jsonl     # {"question", "choices", "label"} or {"prompt", "answer"} lines
    \b
    Signals: the base model's knowledge of each probe set, layer-wise CKA
    between the models' hidden states, and task-vector statistics streamed from
    the safetensors files. Writes OUT/precheck.json, OUT/recommended.yml (runs
    as is with mergekit-yaml) and OUT/report.html. Exits with status 1 when the
    verdict is do_not_merge or a plugin asks to stop.
    """
    from mergekit_mergeability.precheck import config as merge_config, run
    from mergekit_mergeability.summary import print_precheck

    from mergekit_mergeability.checkpoints import auto_device

    options = {
        "limit": limit,
        "device": auto_device(device),
        "dtype": dtype,
        "layers": _layer_set(layers),
        "cka_threshold": cka_threshold,
        "batch_size": batch_size,
        "quiet": quiet,
    }
    report = run(merge_config.read(config_file), _probe_pairs(probes), options, out)
    print_precheck(report, out)
    if report["stop"]:
        raise SystemExit(1)
