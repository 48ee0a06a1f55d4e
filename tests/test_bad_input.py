"""Bad input through the real command line, every command.

Each case: exit status 2; one line of output naming the file, model, tensor or field,
no traceback; nothing left behind (no report, no recommended.yml, no half-written
folder, nothing in the working directory); every input byte-identical afterwards.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mergekit_mergeability.cli import main

from mergekit_mergeability.tiny import make_adapter

from conftest import garbled, relabelled, truncated, widened

GOOD_PROBE = [{"question": f"Item {i}: which one?", "choices": ["Paris", "water"], "label": i % 2} for i in range(3)]


class World(dict):
    """Paths of the inputs every case draws on, built once; ``config`` writes a mergekit config."""

    def config(self, name, models, base="base", probes=True, **top):
        entries = [{"model": str(self.get(m, m)), **({"probe": str(self["probe"])} if probes else {})} for m in models]
        document = {
            "merge_method": "task_arithmetic",
            "base_model": str(self[base]),
            "models": entries,
            "parameters": {"weight": 0.5},
            "dtype": "float32",
            **top,
        }
        path = self["root"] / f"{name}.yml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path


def _broken_config(source: Path, folder: Path) -> Path:
    """A copy whose config.json was cut off (a failed download, an editor's slip)."""
    shutil.copytree(source, folder)
    (folder / "config.json").write_text("{not json")
    return folder


@pytest.fixture(scope="module")
def world(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    w = World(root=root, base=llama["base"], e0=llama["expert0"], e1=llama["expert1"])
    w.update(
        truncated=truncated(llama["expert0"], root / "truncated"),
        garbled=garbled(llama["expert0"], root / "garbled"),
        wide=widened(llama["base"], root / "wide"),
        relabelled=relabelled(llama["expert0"], root / "relabelled"),
        no_config=shutil.copytree(llama["expert0"], root / "no_config", ignore=shutil.ignore_patterns("config.json")),
        broken_config=_broken_config(llama["expert0"], root / "broken_config"),
        no_weights=shutil.copytree(
            llama["expert0"], root / "no_weights", ignore=shutil.ignore_patterns("*.safetensors")
        ),
        lora=f"{llama['expert0']}+{root / 'adapter'}",
        other_base=make_adapter(
            llama["base"], root / "other_base", ["model.layers.0.mlp.up_proj.weight"], base_name=llama["expert0"]
        ),
        absent=root / "absent",
        too_long=root / ("x" * 300),  # longer than a file name may be: the OS refuses to even look
        too_long_relative="y" * 300,
        empty="",
    )
    files = {
        "probe.jsonl": "".join(json.dumps(r) + "\n" for r in GOOD_PROBE),
        "not_json.jsonl": json.dumps(GOOD_PROBE[0]) + "\n{question: 'unquoted'}\n",
        "label.jsonl": json.dumps({**GOOD_PROBE[0], "label": 5}) + "\n",
        "keys.jsonl": json.dumps({"q": "what?", "a": "this"}) + "\n",
        "not_yaml.yml": "merge_method: [task_arithmetic\nmodels: {\n",
        "list.yml": "- model: ./a\n- model: ./b\n",
        "garbage.json": "{not json at all",
        "wrong_shape.json": json.dumps([1, 2, 3]),
    }
    for name, text in files.items():
        (root / name).write_text(text)
        w[Path(name).stem] = root / name
    corrupt = {  # a probe file of each kind a user may give, broken as a failed copy or a wrong export breaks it
        "heldout.parquet": b"PAR1 not parquet",
        "rows.csv": b"prompt,completion\n\xff\xfe,cut",
        "rows.json": b"\xff\xfe\x00",
        "lines.jsonl": json.dumps(GOOD_PROBE[0]).encode() + b"\n\xff\xfe\n",
        "saved/state.json": b"{cut",
        "saved/dataset_info.json": b"{}",
    }
    for name, data in corrupt.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(data)
    expert = lambda i: {
        "path": f"./m{i}",
        "role": "expert",
        "predicted_mergeability": 0.5,
        "knowledge": None,
        "weights": None,
    }  # noqa: E731
    (root / "precheck.json").write_text(json.dumps({"models": [expert(0), expert(1)]}))
    (root / "measured.json").write_text(
        json.dumps({"models": [{"path": f"./m{i}", "mergeability": 0.5} for i in range(3)]})
    )
    w.update(precheck_json=root / "precheck.json", measured_json=root / "measured.json")
    w.update(
        pool=w.config("pool", ["e0", "e1"]),
        field=w.config("field", ["e0", "e1"], merge_method=42),
        pool_absent=w.config("pool_absent", ["e0", "absent"]),
        pool_no_config=w.config("pool_no_config", ["e0", "no_config"]),
        pool_broken_config=w.config("pool_broken_config", ["e0", "broken_config"]),
        pool_no_weights=w.config("pool_no_weights", ["e0", "no_weights"]),
        pool_truncated=w.config("pool_truncated", ["e0", "truncated"]),
        pool_garbled=w.config("pool_garbled", ["e0", "garbled"]),
        pool_wide=w.config("pool_wide", ["e0", "wide"]),
        pool_relabelled=w.config("pool_relabelled", ["e0", "relabelled"]),
        pool_lora=w.config("pool_lora", ["e1", "lora"]),
        pool_other_base=w.config("pool_other_base", ["e1", "other_base"]),
        pool_unprobed=w.config("pool_unprobed", ["e0", "e1"], probes=False),
        method_typo=w.config("method_typo", ["e0", "e1"], merge_method="task_arithmetc"),
        no_knowledge=w.config("no_knowledge", ["e0", "e1"], merge_method="knowledge_weighted"),
        cutoff_beyond=w.config(
            "cutoff_beyond", ["e0", "e1"], merge_method="layer_selective", parameters={"cutoff": 99}
        ),
        pool_too_long=w.config("pool_too_long", ["too_long", "e1"]),
        pool_too_long_relative=w.config("pool_too_long_relative", ["e0", "too_long_relative"]),
        empty_base=w.config("empty_base", ["e0", "e1"], base="empty"),
        empty_model=w.config("empty_model", ["e0", "empty"]),
    )
    document = yaml.safe_load(w["pool"].read_text())
    document["models"][1]["probe"] = True
    (root / "probe_not_a_name.yml").write_text(yaml.safe_dump(document))
    w["probe_not_a_name"] = root / "probe_not_a_name.yml"
    document = yaml.safe_load(w["pool"].read_text())
    del document["base_model"]
    (root / "no_base.yml").write_text(yaml.safe_dump(document))
    w["no_base"] = root / "no_base.yml"
    for name, misspelt in (("probe_typo", ("models", 0, "probee")), ("density_typo", ("parameters", "densty"))):
        document = yaml.safe_load(w["pool"].read_text())
        *within, key = misspelt
        place = document
        for step in within:
            place = place.setdefault(step, {}) if isinstance(step, str) else place[step]
        place[key] = "x.jsonl" if key == "probee" else 0.5
        (root / f"{name}.yml").write_text(yaml.safe_dump(document))
        w[name] = root / f"{name}.yml"
    for name, probe in (
        ("not_json", "not_json"),
        ("label", "label"),
        ("keys", "keys"),
        ("missing", "absent.jsonl"),
        *(
            (f"corrupt_{Path(p).suffix[1:] or p}", p)
            for p in ("heldout.parquet", "rows.csv", "rows.json", "lines.jsonl", "saved")
        ),
    ):
        document = yaml.safe_load(w["pool"].read_text())
        document["models"][0]["probe"] = str(w.get(probe, root / probe))
        (root / f"probe_{name}.yml").write_text(yaml.safe_dump(document))
        w[f"probe_{name}"] = root / f"probe_{name}.yml"
    return w


# command, arguments (``{name}`` = a world path), what the one line must contain
CASES = {
    **{
        f"precheck: a corrupt {kind}": (
            "precheck",
            [f"{{probe_corrupt_{name}}}"],
            [f"probe {{root}}/{file}: not a readable {kind} ("],
        )
        for name, file, kind in (
            ("parquet", "heldout.parquet", "Parquet file"),
            ("csv", "rows.csv", "CSV file"),
            ("json", "rows.json", "JSON file"),
            ("jsonl", "lines.jsonl", "JSONL file"),
            ("saved", "saved", "saved datasets folder"),
        )
    },
    "precheck: missing config file": ("precheck", ["{root}/absent.yml"], ["{root}/absent.yml", "does not exist"]),
    "precheck: config not YAML": ("precheck", ["{not_yaml}"], ["{not_yaml}: not valid YAML at line 2, column "]),
    "precheck: YAML not a mapping": ("precheck", ["{list}"], ["{list}: expected a mergekit config (a YAML mapping)"]),
    "precheck: invalid mergekit field": (
        "precheck",
        ["{field}"],
        ["{field}: not a valid mergekit config", "merge_method"],
    ),
    "precheck: a misspelt probe key": (
        "precheck",
        ["{probe_typo}"],
        ["{probe_typo}: models[0].probee: no key of a model entry (mergekit ignores it); did you mean probe?"],
    ),
    "evaluate: a misspelt parameter": (
        "evaluate",
        ["{density_typo}", "--merged", "{e1}"],
        ["{density_typo}: parameters.densty: no installed merge method has such a parameter", "did you mean density?"],
    ),
    "precheck: missing model folder": ("precheck", ["{pool_absent}"], ["model {absent}: no such folder"]),
    "precheck: a model path too long to exist": (
        "precheck",
        ["{pool_too_long}"],
        ["{pool_too_long}: models[0].model: model {too_long}: no such folder"],
    ),
    "precheck: a relative model path too long to exist": (
        "precheck",
        ["{pool_too_long_relative}"],
        ["{pool_too_long_relative}: models[1].model: model {too_long_relative}: no such folder, nor a hub id"],
    ),
    "precheck: empty base_model": (
        "precheck",
        ["{empty_base}"],
        ["{empty_base}: base_model is empty; name a model folder or hub id"],
    ),
    "precheck: empty model": ("precheck", ["{empty_model}"], ["{empty_model}: models[1].model is empty"]),
    "precheck: probe not a file or task name": (
        "precheck",
        ["{probe_not_a_name}"],
        ["{probe_not_a_name}: models[1].probe is True; name a .jsonl file"],
    ),
    "precheck: model folder without config.json": (
        "precheck",
        ["{pool_no_config}"],
        ["model {no_config}: no config.json"],
    ),
    "precheck: model folder whose config.json is not JSON": (
        "precheck",
        ["{pool_broken_config}"],
        ["config.json: not JSON (line 1, column 2); a model's config.json must be a JSON object"],
    ),
    "precheck: model folder without weights": ("precheck", ["{pool_no_weights}"], ["{no_weights}: no weights"]),
    "precheck: truncated safetensors": (
        "precheck",
        ["{pool_truncated}"],
        ["{truncated}/model.safetensors: truncated or corrupted (7 bytes short"],
    ),
    "precheck: corrupted safetensors header": (
        "precheck",
        ["{pool_garbled}"],
        ["{garbled}/model.safetensors: not a safetensors file"],
    ),
    "precheck: model+adapter, no adapter there": (
        "precheck",
        ["{pool_lora}"],
        ["model {lora}:", "{root}/adapter is not a peft adapter folder"],
    ),
    "precheck: adapter of another base": (
        "precheck",
        ["{pool_other_base}"],
        ["adapter {other_base}: trained on {e0}", "the config's base_model is {base}"],
    ),
    "precheck: missing probe file": (
        "precheck",
        ["{probe_missing}"],
        ["{probe_missing}: models[0].probe: probe {root}/absent.jsonl: no such file"],
    ),
    "precheck: probe line not JSON": ("precheck", ["{probe_not_json}"], ["{not_json}:2: not JSON"]),
    "evaluate: probe line not JSON": (
        "evaluate",
        ["{probe_not_json}", "--merged", "{e1}"],
        ["{not_json}:2: not JSON (Expecting property name enclosed in double quotes column 2)"],
    ),
    "precheck: probe label out of range": (
        "precheck",
        ["{probe_label}"],
        ["{label}:1: label must index one of at least 2 choices, got 5"],
    ),
    "precheck: probe with wrong keys": ("precheck", ["{probe_keys}"], ["{keys}: cannot read rows", "['a', 'q']"]),
    "precheck: --probe naming no model": (
        "precheck",
        ["{pool}", "--probe", "nobody={probe}"],
        ["--probe nobody=", "'nobody' matches 0 models"],
    ),
    "precheck: unknown merge_method": (
        "precheck",
        ["{method_typo}"],
        ["{method_typo}: merge_method 'task_arithmetc' is not an installed mergekit method"],
    ),
    "precheck: a method parameter the merge needs": (
        "precheck",
        ["{no_knowledge}"],
        ["{no_knowledge}: the merge would stop", "{e0} needs parameter 'knowledge'"],
    ),
    "precheck: a cut-off beyond the model": (
        "precheck",
        ["{cutoff_beyond}"],
        ["{cutoff_beyond}: the merge would stop", "cutoff 99 is beyond the model's 4 layers"],
    ),
    "precheck: a method that needs a base, without one": (
        "precheck",
        ["{no_base}"],
        ["{no_base}: mergekit would refuse this merge: Merge method requires a base input"],
    ),
    "precheck: --skip naming no diagnostic": (
        "precheck",
        ["{pool}", "--skip", "representation"],
        ["--skip representation: no such diagnostic", "representations"],
    ),
    "precheck: --layers backwards": ("precheck", ["{pool}", "--layers", "3-1"], ["--layers", "'3-1' runs backwards"]),
    "precheck: bad --layers": (
        "precheck",
        ["{pool}", "--layers", "3-x"],
        ["--layers", "'3-x' is not a layer or a range"],
    ),
    "evaluate: model+adapter, no adapter there": (
        "evaluate",
        ["{pool_lora}", "--merged", "{e1}"],
        ["model {lora}:", "{root}/adapter is not a peft adapter folder"],
    ),
    "evaluate: adapter of another base": (
        "evaluate",
        ["{pool_other_base}", "--merged", "{e1}"],
        ["adapter {other_base}: trained on {e0}", "the config's base_model is {base}"],
    ),
    "evaluate: unknown lm-eval task": (
        "evaluate",
        ["{pool}", "--merged", "{e1}", "--tasks", "no_such_task_anywhere"],
        ["lm-eval task 'no_such_task_anywhere' not found"],
    ),
    "evaluate: merged folder missing": (
        "evaluate",
        ["{pool}", "--merged", "{absent}"],
        ["--merged {absent}: no such folder"],
    ),
    "evaluate: merged folder without weights": (
        "evaluate",
        ["{pool}", "--merged", "{no_weights}"],
        ["{no_weights}: no weights"],
    ),
    "evaluate: truncated expert": (
        "evaluate",
        ["{pool_truncated}", "--merged", "{e1}"],
        ["{truncated}/model.safetensors: truncated or corrupted"],
    ),
    "mergeability: width mismatch": (
        "mergeability",
        ["{pool_wide}", "--partners", "1"],
        ["{wide} vs {base}: hidden_size is 48 vs 32 (", "tensors differ in shape; first: "],
    ),
    "mergeability: different vocabularies": (
        "mergeability",
        ["{pool_relabelled}", "--partners", "1"],
        ["{relabelled} vs {base}: vocabularies differ: 2 of 320 shared token ids"],
    ),
    "mergeability: model+adapter, no adapter there": (
        "mergeability",
        ["{pool_lora}", "--partners", "1"],
        ["model {lora}:", "{root}/adapter is not a peft adapter folder"],
    ),
    "mergeability: adapter of another base": (
        "mergeability",
        ["{pool_other_base}", "--partners", "1"],
        ["adapter {other_base}: trained on {e0}", "the config's base_model is {base}"],
    ),
    "mergeability: more partners than the pool allows": (
        "mergeability",
        ["{pool}", "--partners", "2"],
        ["--partners 2: the pool has 2 models, so at most 1 partners"],
    ),
    "mergeability: unregistered method": (
        "mergeability",
        ["{pool}", "--partners", "1", "--method", "nope"],
        ["--method nope: not a registered merge method"],
    ),
    "mergeability: pool model without probe": (
        "mergeability",
        ["{pool_unprobed}", "--partners", "1"],
        ["{pool_unprobed}: models[0] (expert0) has no probe: key (and 1 more); each pool model needs its own task"],
    ),
    "mergeability: truncated pool model": (
        "mergeability",
        ["{pool_truncated}", "--partners", "1"],
        ["{truncated}/model.safetensors: truncated or corrupted"],
    ),
    "validate: missing JSON file": (
        "validate",
        ["{root}/absent.json", "{measured_json}"],
        ["{root}/absent.json: no such file"],
    ),
    "validate: garbage JSON": ("validate", ["{garbage}", "{measured_json}"], ["{garbage}: not JSON"]),
    "validate: JSON of the wrong shape": (
        "validate",
        ["{precheck_json}", "{wrong_shape}"],
        ["{wrong_shape}: not mergeability's output"],
    ),
    "validate: fewer than 3 shared models": (
        "validate",
        ["{precheck_json}", "{measured_json}"],
        ["share 2 models", "need at least 3"],
    ),
    "merge: non-empty output folder": (
        "merge",
        ["{pool}", "{tmp}/merged"],
        ["{tmp}/merged: output folder exists and is not empty"],
    ),
    "merge: truncated safetensors": (
        "merge",
        ["{pool_truncated}", "{tmp}/merged"],
        ["{truncated}/model.safetensors: truncated or corrupted"],
    ),
    "merge: a model path too long to exist": (
        "merge",
        ["{pool_too_long}", "{tmp}/merged"],
        ["{pool_too_long}: models[0].model: model {too_long}: no such folder"],
    ),
    "merge: missing model folder": (
        "merge",
        ["{pool_absent}", "{tmp}/merged"],
        ["{pool_absent}: models[1].model: model {absent}: no such folder"],
    ),
    "merge: config not YAML": ("merge", ["{not_yaml}", "{tmp}/merged"], ["{not_yaml}: not valid YAML"]),
}

OUTPUT_OPTIONS = {
    "precheck": ["--out", "{tmp}/out", "--quiet"],
    "evaluate": ["--out", "{tmp}/out", "--no-cache", "--quiet"],
    "mergeability": ["--out", "{tmp}/out", "--no-cache", "--quiet"],
    "validate": ["--out", "{tmp}/out"],
    "merge": [],
}


def snapshot(*folders: Path) -> dict:
    return {
        p: hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_leaves_everything_as_it_was(world, tmp_path, monkeypatch, case):
    command, arguments, expected = CASES[case]
    if case == "merge: non-empty output folder":
        (tmp_path / "merged").mkdir()
        (tmp_path / "merged" / "keep.txt").write_text("the user's")
    fill = lambda text: text.format(**world, tmp=tmp_path)  # noqa: E731
    monkeypatch.chdir(tmp_path)  # anything written to the working directory shows up below
    before = snapshot(world["root"], world["base"].parent, tmp_path)
    result = CliRunner().invoke(main, [command, *map(fill, arguments), *map(fill, OUTPUT_OPTIONS[command])])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert all(fill(part) in lines[0] for part in expected), lines[0]
    assert snapshot(world["root"], world["base"].parent, tmp_path) == before


@pytest.mark.parametrize("command", ["precheck", "evaluate", "mergeability"])
def test_an_out_folder_that_cannot_be_made_or_written_is_refused_before_any_work(world, tmp_path, monkeypatch, command):
    import tempfile

    (tmp_path / "afile").write_text("the user's")
    merged = ["--merged", str(world["e1"])] if command == "evaluate" else []
    partners = ["--partners", "1"] if command == "mergeability" else []

    def run(out):
        return CliRunner().invoke(main, [command, str(world["pool"]), *merged, *partners, "--out", str(out), "-q"])

    result = run(tmp_path / "afile" / "sub")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{tmp_path / 'afile'} is a file, so the folder cannot be made" in result.output
    monkeypatch.setattr(
        tempfile, "mkdtemp", lambda **kw: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    )
    result = run(tmp_path / "new" / "out")
    assert result.exit_code == 2 and f"cannot write in {tmp_path} (Permission denied)" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_incompatible_models_in_precheck_are_one_error_line_each(world, tmp_path):
    result = CliRunner().invoke(
        main, ["precheck", str(world["pool_wide"]), "--out", str(tmp_path / "out"), "--quiet"], env={"COLUMNS": "1000"}
    )
    assert result.exit_code == 1, result.output  # a verdict, not a usage error: the report says why
    errors = [line for line in result.output.splitlines() if line.startswith("error ")]
    assert errors == [
        "error wide vs base: hidden_size is 48 vs 32 (39 tensors differ in shape; first: lm_head.weight [320, 48] vs [320, 32])"
    ], result.output
    assert f"in {world['root']}: wide" in result.output  # the short names' folders, listed once


def test_a_do_not_merge_verdict_leaves_no_runnable_config(world, tmp_path):
    result = CliRunner().invoke(
        main, ["precheck", str(world["pool_relabelled"]), "--out", str(tmp_path / "out"), "--quiet"]
    )
    assert result.exit_code == 1 and "vocabularies differ" in result.output, result.output
    assert not (tmp_path / "out" / "recommended.yml").exists()


@pytest.mark.parametrize("value", ["~", "xxxx", []])
def test_a_weight_that_is_no_number_is_one_line_naming_the_model_and_field(llama, tmp_path, value):
    document = {
        "merge_method": "task_arithmetic",
        "base_model": str(llama["base"]),
        "models": [
            {"model": str(llama["expert0"]), "parameters": {"weight": value}},
            {"model": str(llama["expert1"]), "parameters": {"weight": 0.5}},
        ],
    }
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(main, ["precheck", str(config), "--out", str(tmp_path / "out"), "--quiet"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"model {llama['expert0']}: weight is {value!r}" in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
