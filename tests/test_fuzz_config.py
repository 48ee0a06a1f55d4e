"""Seeded mutations of a valid precheck config, through the real command line.

Whatever a user writes, the precheck ends in a verdict (exit 0 or 1, precheck.json written)
or in one line naming what to fix (exit 2), never in a traceback or a failed measurement.
"""

import copy
import json
import random
import traceback

import pytest
import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main

CASES = 40
PROBE = [{"question": f"Item {i}: which one?", "choices": ["Paris", "water"], "label": i % 2} for i in range(3)]


@pytest.fixture(scope="module")
def world(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    probe = root / "probe.jsonl"
    probe.write_text("".join(json.dumps(r) + "\n" for r in PROBE))
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(llama[f"expert{i}"]), "probe": str(probe), "parameters": {"weight": 0.5}} for i in range(2)
        ],
        "parameters": {"normalize": False},
        "dtype": "float32",
    }
    return {"root": root, "document": document}


def odd_values(root):
    """Values a config may hold by mistake. None of them is a namespace/name hub id: the
    tests stay offline."""
    return [
        "",
        " ",
        "\t",
        "x" * 300,
        "/tmp/" + "x" * 300,
        str(root / "absent"),
        str(root / "absent.jsonl"),
        "~nobody-here/model",
        "../../..",
        "org/",
        "a/b/c",
        "a+b+c",
        "model+",
        "日本語",
        "a\x00b",
        "-",
        ".",
        0,
        -1,
        3.5,
        True,
        None,
        [],
        ["x"],
        {},
        {"model": "x"},
        "~",
        "xxxx",
        "nan",
        "inf",
        "1e999",
        [0.5, "x"],
        {"value": 1},
    ]


def leaves(node, at=()):
    """Every (path, value) of a nested document, containers included."""
    yield at, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from leaves(value, (*at, key))


def mutate(document, rng, root):
    """One to three seeded edits: drop a key, give a field an odd value, or a targeted one
    (a model path, a probe, a dtype) where users most often go wrong."""
    document = copy.deepcopy(document)
    done = []
    for _ in range(rng.randint(1, 3)):
        paths = [p for p, _ in leaves(document) if p]
        kind = rng.choice(["drop", "odd", "model", "probe", "dtype", "parameter"])
        if kind in ("model", "probe", "parameter") and not isinstance(document.get("models"), list):
            kind = "odd"
        if kind == "drop":
            path = rng.choice(paths)
        elif kind == "odd":
            path = rng.choice(paths)
        elif kind == "model":
            path = rng.choice([("base_model",), *((("models", i, "model")) for i in range(len(document["models"])))])
        elif kind == "probe":
            path = ("models", rng.randrange(len(document["models"])), "probe")
        elif kind == "parameter":  # a merge parameter of one model or of the whole config
            name = rng.choice(["weight", "density", "lambda", "normalize", "epsilon"])
            path = rng.choice(
                [("models", rng.randrange(len(document["models"])), "parameters", name), ("parameters", name)]
            )
        else:
            path = ("dtype",)
        value = (
            rng.choice(["float33", "int8", "bfloat16", "float16", "auto", "", 16])
            if kind == "dtype"
            else rng.choice(odd_values(root))
        )
        try:
            parent = document
            for key in path[:-1]:
                parent = parent[key]
            if kind == "drop":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):  # an earlier edit removed or retyped the parent
            continue
        done.append(f"{kind} {'.'.join(map(str, path))}" + ("" if kind == "drop" else f" = {value!r:.40}"))
    return document, done


# Beside the 40 that run every signal: 200 more through everything but the model passes (the config
# read, the models loaded and checked, mergekit's plan, the update statistics, the decision and the
# report), where a wrong-typed value would surface; seconds each on the tiny models.
LIGHT = 200
HEAVY_PASSES = ("knowledge", "fluency", "dilution", "representations", "selectivity", "menu")


@pytest.mark.parametrize("seed", range(CASES))
def test_a_mutated_config_ends_in_a_verdict_or_one_line(world, tmp_path, seed):
    ends_in_a_verdict_or_one_line(world, tmp_path, seed, ("representations", "selectivity"))


@pytest.mark.parametrize("seed", range(CASES, CASES + LIGHT))
def test_200_more_mutations_end_in_a_verdict_or_one_line_before_the_model_passes(world, tmp_path, seed):
    ends_in_a_verdict_or_one_line(world, tmp_path, seed, HEAVY_PASSES)


def ends_in_a_verdict_or_one_line(world, tmp_path, seed, skip):
    document, edits = mutate(world["document"], random.Random(seed), world["root"])
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    out = tmp_path / "out"
    arguments = ["precheck", str(config), "--out", str(out), "--quiet", "--limit", "3"]
    arguments += [f"--skip={name}" for name in skip]
    result = CliRunner().invoke(main, arguments, env={"HF_HUB_OFFLINE": "1", "COLUMNS": "1000"})
    context = f"seed {seed}: {edits}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), context + "".join(
        traceback.format_exception(result.exception)
    )
    assert result.exit_code in (0, 1, 2), context
    assert "Traceback" not in result.output, context
    if result.exit_code == 2:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), context
        assert not out.exists(), context  # a usage error writes nothing
    else:
        verdict = json.loads((out / "precheck.json").read_text())["recommendation"]["verdict"]
        assert verdict in result.output, context


def test_the_mutations_reach_every_kind_of_edit(world):
    """The 240 cases are not copies of a few: each kind of edit occurs, models' paths included."""
    edits = [
        e for seed in range(CASES + LIGHT) for e in mutate(world["document"], random.Random(seed), world["root"])[1]
    ]
    assert {e.split()[0] for e in edits} == {"drop", "odd", "model", "probe", "dtype", "parameter"}
    # a model's path that is not there: too long a name, or a folder that does not exist
    assert any(e.startswith("model models.") and "/tmp/" in e for e in edits)
    assert any(e.startswith("parameter models.") for e in edits) and any(
        e.startswith("parameter parameters.") for e in edits
    )
