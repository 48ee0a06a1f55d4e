"""The user's mergekit config, as every command reads it.

mergekit ignores keys it does not know, so a model entry may carry ``probe:``
(a probe spec, see ``mergekit_mergeability.probes``) next to ``model:``; the same
file still runs with the stock ``mergekit-yaml``.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, List, Optional, Tuple

from mergekit_mergeability.errors import UserError, not_yaml

PROBE_KEY = "probe"
DTYPE_KEY = "dtype"
FEWSHOT_KEY = "fewshot"  # solved examples: the probe's shots, in order, for every item (a JSONL file)
CHAT_KEY = "chat"  # true: the probe is asked through the model's chat template


@dataclass
class MergeSpec:
    document: Dict[str, Any]  # the YAML as written (never modified)
    source: Path  # the config file, or the working directory for an in-memory document
    merge_method: str
    base_model: Optional[str]
    models: List[str]  # the non-base models, as written, in config order
    probes: Dict[str, str] = field(default_factory=dict)  # model -> probe spec
    fewshot: Dict[str, str] = field(default_factory=dict)  # model -> few-shot examples file
    fields: Dict[str, str] = field(default_factory=dict)  # model -> the first field naming it (models[0].model)
    entries: Dict[str, str] = field(
        default_factory=dict
    )  # model -> the entry holding its probe: or fewshot: key (models[0])
    chat: Dict[str, bool] = field(default_factory=dict)  # model -> its chat: key, where true
    answer_after: Dict[str, str] = field(default_factory=dict)  # model -> its answer_after: marker

    def asked(self) -> Dict[str, Tuple[Optional[str], bool]]:
        """Each probe spec -> how its model asks it: (its ``fewshot:`` file, ``chat:``)."""
        return {probe: (self.fewshot.get(m), self.chat.get(m, False)) for m, probe in self.probes.items()}

    def require_probes(self, asked: Collection[str], why: str, option: bool = True) -> None:
        """A one-line error naming the first model not in ``asked`` (its field and short name) and
        ``why`` the command needs it; ``option``: the command takes ``--probe``."""
        missing = [m for m in self.models if m not in asked]
        if missing:
            where, name = (
                self.fields.get(missing[0], "model").removesuffix(".model"),
                Path(missing[0].split("+")[-1]).name,
            )
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            fix = f"give it one, or --probe {name}=SPEC" if option else "give it one"
            raise UserError(f"{self.source}: {where} ({name}) has no probe: key{more}; {why}: {fix}")

    @property
    def folder(self) -> Path:
        return self.source.parent if self.source.is_file() else self.source

    @property
    def dtype(self) -> Optional[str]:
        """The config's ``dtype:``, what mergekit computes the merge in; None if it names none."""
        return self.document.get(DTYPE_KEY)

    def sources(self) -> Dict[str, Any]:
        """Each model as written -> its folder, hub model or adapter (``sources.resolve``), the
        base first; an adapter must be one of the base (an adapter cannot be the base)."""
        base = self._resolve(self.base_model, adapters=False) if self.base_model else None
        found = {self.base_model: base} if base is not None else {}
        found.update({name: self._resolve(name, base=base) for name in self.models})
        return found

    def _resolve(self, name: str, **options) -> Any:
        from mergekit_mergeability.sources import HubModel, resolve

        where = self.fields.get(name, "model")
        with self.naming(where):
            source = resolve(name, self.folder, **options)
        if isinstance(source, HubModel):  # looked up later: its errors say where it was named
            source.where = self._where(where)
        return source

    @contextmanager
    def naming(self, where: str) -> Iterator[None]:
        """A UserError raised inside also says where in the config the bad value sits."""
        try:
            yield
        except UserError as error:
            raise UserError(f"{self._where(where)}{error}") from None

    def _where(self, field: str) -> str:
        return f"{self.source}: {field}: " if self.source.is_file() else f"{field}: "


def read(path: Path) -> MergeSpec:
    return from_document(load(path), Path(path))


def load(path: Path) -> Dict[str, Any]:
    """The YAML of a mergekit config, checked to be a config mergekit accepts."""
    import yaml

    try:
        document = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such config file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise not_yaml(path, error) from None
    validate(document, Path(path))
    return document


def validate(document: Any, source: Path) -> None:
    from mergekit.config import MergeConfiguration
    from pydantic import ValidationError

    if not isinstance(document, dict):
        raise UserError(f"{source}: expected a mergekit config (a YAML mapping)")
    try:
        MergeConfiguration.model_validate(document)
    except (ValidationError, RuntimeError) as error:
        raise UserError(f"{source}: not a valid mergekit config ({_first_line(error)})") from None
    from mergekit import merge_methods

    try:
        merge_methods.get(document["merge_method"])
    except RuntimeError:
        raise UserError(
            f"{source}: merge_method {document['merge_method']!r} is not an installed mergekit method; `mergekit-mergeability methods` lists them"
        ) from None
    _typos(document, source)
    from mergekit.common import dtype_from_name

    for key in ("dtype", "out_dtype"):
        try:
            dtype_from_name(document.get(key))
        except RuntimeError:  # mergekit would stop there, after planning
            raise UserError(
                f"{source}: {key}: {document[key]!r} is not a dtype mergekit knows; use bfloat16, float16 or float32"
            ) from None


def _typos(document: Dict[str, Any], source: Path) -> None:
    """mergekit ignores a key it does not know, so a misspelt ``probe:`` or ``density:`` would
    silently go unread: a model entry's key, or a parameter no installed method declares, that is
    a letter or two from a known one is refused with the likely name."""
    from difflib import get_close_matches

    import mergekit.merge_methods as methods
    from mergekit.config import InputModelDefinition, InputSliceDefinition

    from mergekit_mergeability.tasks.sft import ANSWER_AFTER_KEY

    entry_keys = {*InputModelDefinition.model_fields, *InputSliceDefinition.model_fields}
    entry_keys |= {PROBE_KEY, FEWSHOT_KEY, CHAT_KEY, ANSWER_AFTER_KEY}
    anywhere = {p.name for method in methods.registered_methods() for p in method.spec.parameters}

    def check(where: str, keys, known, what: str) -> None:
        for key in keys or ():
            close = get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
            if key not in known and close:
                raise UserError(f"{source}: {where}{key}: {what} (mergekit ignores it); did you mean {close[0]}?")

    unread = "no installed merge method has such a parameter"
    check("parameters.", document.get("parameters"), anywhere, unread)
    for where, entry in model_fields(document):
        check(f"{where}.", entry, entry_keys, "no key of a model entry")
        parameters = entry.get("parameters") if isinstance(entry, dict) else None
        check(f"{where}.parameters.", parameters, anywhere, unread)


def from_document(document: Any, source: Path) -> MergeSpec:
    validate(document, source)
    fields = reference_fields(document, source)
    base = None if document.get("base_model") is None else reference(document["base_model"])
    names: List[str] = []
    probes: Dict[str, str] = {}
    fewshot: Dict[str, str] = {}
    entries: Dict[str, str] = {}
    chat: Dict[str, bool] = {}
    answer_after: Dict[str, str] = {}
    from mergekit_mergeability.tasks.sft import ANSWER_AFTER_KEY

    for where, entry in model_fields(document):
        name = reference(entry["model"])
        if name not in names and name != base:
            names.append(name)
        for key, found, what in (
            (PROBE_KEY, probes, "a .jsonl file, an lm-eval task YAML or task name, or fine-tuning data"),
            (FEWSHOT_KEY, fewshot, "a .jsonl file"),
        ):
            if key in entry:
                if not isinstance(entry[key], str) or not entry[key].strip():
                    raise UserError(f"{source}: {where}.{key} is {entry[key]!r}; name {what}")
                found[name] = entry[key]
                entries[name] = where
        if ANSWER_AFTER_KEY in entry:  # any text, whitespace included ("\n\n")
            if not isinstance(entry[ANSWER_AFTER_KEY], str) or not entry[ANSWER_AFTER_KEY]:
                raise UserError(
                    f"{source}: {where}.{ANSWER_AFTER_KEY} is {entry[ANSWER_AFTER_KEY]!r}; name the text that ends each prompt"
                )
            answer_after[name] = entry[ANSWER_AFTER_KEY]
        if CHAT_KEY in entry:
            if not isinstance(entry[CHAT_KEY], bool):
                raise UserError(f"{source}: {where}.{CHAT_KEY} is {entry[CHAT_KEY]!r}; say true or false")
            if entry[CHAT_KEY]:
                chat[name] = True
    if not names:
        raise UserError(f"{source}: no models to merge besides the base")
    return MergeSpec(
        document,
        source,
        str(document["merge_method"]),
        base,
        names,
        probes,
        fewshot,
        fields,
        entries,
        chat,
        answer_after,
    )


def reference_fields(document: Dict[str, Any], source: Path) -> Dict[str, str]:
    """Every model reference of a (valid) config -> the first field naming it (``base_model``,
    ``models[0].model``...); an empty one is refused, naming its field."""
    named = [("base_model", document["base_model"])] if document.get("base_model") is not None else []
    named += [(f"{where}.model", entry["model"]) for where, entry in model_fields(document)]
    fields: Dict[str, str] = {}
    for where, value in named:
        name = reference(value)
        if not name.strip():  # mergekit would look for a hub repo named ''
            raise UserError(f"{source}: {where} is empty; name a model folder or hub id (namespace/name)")
        fields.setdefault(name, where)
    return fields


def reference(value: Any) -> str:
    """A model reference as written (``path``, ``path+adapter``, or mergekit's mapping form
    ``{model: ..., lora: ..., override_architecture: ...}``) as one string: ``path[+adapter]``."""
    if isinstance(value, str):
        return value
    from mergekit.common import ModelReference

    return str(ModelReference.model_validate(value))


PROBE_SUFFIXES = (".jsonl", ".yaml", ".yml")  # a pool folder's probes: PROBES/<member><suffix>


def from_pool(
    folder: Path,
    base: Optional[Path] = None,
    probes: Optional[Path] = None,
    given: Collection[str] = (),
    need_probes: bool = False,
) -> MergeSpec:
    """A folder of peft adapter folders or model folders (``base``: their base model, which adapters
    may name themselves), as the config that merges them all: task_arithmetic with equal weights
    (their mean update). Each member's probe is ``probes/<name>.jsonl`` (or .yaml, .yml) where
    that file exists; ``need_probes``: every member must have one there or be named in ``given``
    (``--probe NAME=SPEC``, applied later)."""
    from mergekit_mergeability.sources.adapter import CONFIG, is_adapter, read_config

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"--pool {folder}: no such folder")
    if is_adapter(folder) or (folder / "config.json").is_file():
        raise UserError(
            f"--pool {folder}: a model or adapter folder itself; name the folder that holds the pool's members"
        )
    base_path = Path(base).resolve() if base else None
    members = sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and (is_adapter(p) or (p / "config.json").is_file()) and p.resolve() != base_path
    )
    if not members:
        raise UserError(
            f"--pool {folder}: no adapter or model folders in it (an adapter folder holds {CONFIG}, a model folder"
            " config.json)"
        )
    if need_probes and probes is None and not given:
        raise UserError(
            f"--pool {folder}: name --probes DIR, a probe file per member (DIR/<member>.jsonl), or --probe MEMBER=SPEC"
        )
    entries = []
    for member in members:
        found = (Path(probes) / f"{member.name}{s}" for s in PROBE_SUFFIXES) if probes else ()
        probe = next((p for p in found if p.is_file()), None)
        if probe is None and need_probes and member.name not in given:
            name = member.name
            raise UserError(
                f"--probes {probes}: no probe for {name} ({name}.jsonl, .yaml or .yml); add one, or give --probe {name}=SPEC"
                if probes
                else f"--pool {folder}: no probe for {name}; name --probes DIR, or give --probe {name}=SPEC"
            )
        if is_adapter(member):
            if base_path:
                _same_base(folder, member, base_path)
            reference = f"{base_path}+{member.resolve()}" if base_path else str(member.resolve())
        elif base_path is None:
            raise UserError(f"--pool {folder}: {member.name} is a model folder; name the base model with --base")
        else:
            reference = str(member.resolve())
        entries.append(
            {"model": reference, "parameters": {"weight": round(1 / len(members), 6)}}
            | ({"probe": str(probe.resolve())} if probe else {})
        )
    if base_path is None:
        bases = {str(read_config(m).get("base_model_name_or_path") or "") for m in members}
        if len(bases) != 1 or "" in bases:
            named = ", ".join(sorted(b or "(none)" for b in bases))
            raise UserError(
                f"--pool {folder}: its adapters name {len(bases)} bases in base_model_name_or_path ({named}); a pool"
                " shares one base: name it with --base"
            )
        base_reference = bases.pop()
    else:
        base_reference = str(base_path)
    if probes:
        _probes_named(Path(probes), [m.name for m in members], any("probe" in e for e in entries) or bool(given))
    document = {"merge_method": "task_arithmetic", "base_model": base_reference, "models": entries}
    spec = from_document(document, folder.resolve())
    # an error names the member, not a field of a config the user never wrote (models[1].probe)
    named = {model: f"--pool member {member.name}" for model, member in zip(spec.models, members)}
    return replace(spec, fields=named, entries={m: named[m] for m in spec.entries})


def _same_base(folder: Path, member: Path, base: Path) -> None:
    """An adapter of a --pool folder whose own config names another local base than --base is
    refused (a hub id, or a folder not here, may be the one --base is a copy of)."""
    from mergekit_mergeability.sources.adapter import read_config

    named = read_config(member).get("base_model_name_or_path")
    if named and Path(named).is_dir() and Path(named).resolve() != base:
        raise UserError(
            f"--pool {folder}: adapter {member.name} was trained on {named}, not --base {base}; a pool shares one"
            " base: leave that adapter out"
        )


def _probes_named(probes: Path, members: List[str], probed: bool) -> None:
    """--probes DIR where no member has a probe (``probed``: from DIR or --probe) is refused; files
    named after no member are said."""
    from mergekit_mergeability.progress import note

    named = {f"{m}{s}" for m in members for s in PROBE_SUFFIXES}
    stray = sorted(p.name for p in probes.iterdir() if p.is_file() and p.name not in named)
    if not probed:
        raise UserError(
            f"--probes {probes}: no file is named after a member (<member>.jsonl, .yaml or .yml;"
            f" members: {', '.join(members)})"
        )
    if stray:
        note(f"--probes {probes}: {', '.join(stray)} named after no member (members: {', '.join(members)}): not read")


def tokenizer_source(document: Dict[str, Any]) -> Optional[str]:
    """Where the config tells mergekit to take the merged vocabulary from (``tokenizer_source:``,
    or ``tokenizer: {source: ...}``, whose default is ``union``); None when it does not say."""
    if document.get("tokenizer_source"):
        return str(document["tokenizer_source"])
    tokenizer = document.get("tokenizer")
    return str(tokenizer.get("source", "union")) if isinstance(tokenizer, dict) else None


def check_local_weights(path: Path) -> None:
    """Before mergekit reads a tensor: name any damaged weight file of the config's local
    models in one line (mergekit's own error is a traceback from deep inside safetensors)."""
    from mergekit_mergeability.sources.folder import local_folder, weight_files

    for name, where in reference_fields(load(path), path).items():
        for model in (name, name.split("+")[0]):  # mergekit applies model+adapter itself
            folder = local_folder(model, None)
            if folder is not None:
                weight_files(folder)
                break
        else:
            if name.startswith(("/", ".", "~")):  # a path, never a hub id: transformers' error would be a traceback
                raise UserError(f"{path}: {where}: model {name}: no such folder")


def model_entries(document: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """Every ``{model: ...}`` mapping of a config: ``models:``, ``slices:`` sources and ``modules:``."""
    return (entry for _, entry in model_fields(document))


def model_fields(document: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """``model_entries`` with where each sits: ``models[0]``, ``slices[1].sources[0]``, ``modules.text.models[0]``."""
    scopes = [
        ("", document),
        *((f"modules.{name}.", module) for name, module in (document.get("modules") or {}).items()),
    ]
    for prefix, scope in scopes:
        for i, entry in enumerate(scope.get("models") or ()):
            yield f"{prefix}models[{i}]", entry
        for i, output_slice in enumerate(scope.get("slices") or ()):
            for j, entry in enumerate(output_slice.get("sources") or ()):
                yield f"{prefix}slices[{i}].sources[{j}]", entry


def _first_line(error: Exception) -> str:
    if hasattr(error, "errors"):
        problem = error.errors()[0]
        return f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}"
    return str(error).splitlines()[0]


def absolute(config: Dict[str, Any], resolved: Dict[str, Path], folder: Optional[Path] = None) -> Dict[str, Any]:
    """A config with every model reference written as a string replaced by its absolute folder;
    a model whose config.json names no architecture is written in mergekit's mapping form with
    the class transformers loads it as (``override_architecture``), which mergekit needs. A
    ``probe:`` or ``fewshot:`` that is a file (as written, or against ``folder``, the config's)
    becomes its absolute path, so the written config is checked from anywhere; a task name stays."""
    from mergekit_mergeability.tasks.probes import existing_file
    from mergekit_mergeability.tasks.sft import located  # a saved datasets folder too

    config = copy.deepcopy(config)
    for entry in model_entries(config):
        entry["model"] = _written(entry["model"], resolved)
        probe, shots = entry.get(PROBE_KEY), entry.get(FEWSHOT_KEY)
        found = (located(probe, folder) or existing_file(probe, folder)) if isinstance(probe, str) else None
        if found is not None:
            entry[PROBE_KEY] = str(found)
        found = existing_file(shots, folder) if isinstance(shots, str) else None
        if found is not None:
            entry[FEWSHOT_KEY] = str(found)
    if "base_model" in config:
        config["base_model"] = _written(config["base_model"], resolved)
    return config


def _written(value: Any, resolved: Dict[str, Any]) -> Any:
    from mergekit_mergeability.sources import inferred_architecture, source_of, update_of

    if not isinstance(value, str) or value not in resolved:  # the mapping form: the user's, as written
        return value
    source = resolved[value]
    base = update_of(source)  # an adapter's: mergekit reads the architecture from it
    architecture = inferred_architecture(source if base is None else base)
    if not architecture:
        return str(source)
    written = {"model": str(source)} if base is None else {"model": str(base), "lora": str(source_of(source).folder)}
    return {**written, "override_architecture": architecture}
