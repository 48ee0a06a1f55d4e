"""The plan's outputs, written together into ``--out`` (a reader never sees half of them):

- ``plan.json`` (schema ``schema.json`` beside this file, versioned by ``schema_version``): the
  objective and its references, the planned models, every expert's predicted score in the plan,
  alone and in the merge of everything, the calibration used and how well it did out of sample;
- ``models/model<k>.yml``: one config per planned model, runnable as is with the stock
  ``mergekit-yaml`` (absolute paths; adapters as mergekit's ``base+adapter``);
- ``precheck.json``: the measurements it planned from (``plan --precheck`` reuses them);
- ``report.html``: the pool as a graph (an edge's colour: the two experts' predicted mean score
  when merged as a pair), the planned groups, the objective against its references;
- a terminal table.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import SCHEMA_VERSION, atomic_folder, write_atomic
from mergekit_mergeability.names import short_names
from mergekit_mergeability.planner import conditional
from mergekit_mergeability.planner.deciding import REFERENCE, Decision, mergekit_parameters

SCHEMA = Path(__file__).with_name("schema.json")
MODELS = "models"
OBJECTIVE = (
    "expected number of the pool's tasks kept: the sum over experts of its predicted own-task score "
    "in the merged model it is planned into (its own score when that model is itself alone), or "
    "the base's own score on its task when it is in no model"
)
GRAPH_EDGES = 3  # strongest edges drawn per expert
COLOURS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#c62828", "#5d4037", "#ad1457")


def check_out(out: Path) -> None:
    """--out must be new, empty, or an earlier plan's folder (it is replaced as a whole)."""
    from mergekit_mergeability.files import writable_folder

    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "plan.json").is_file())):
        raise UserError(f"--out {out}: exists and is not an earlier plan's folder; choose a new or empty folder")
    writable_folder(out)


def document(
    decision: Decision,
    spec,
    report: Mapping[str, Any],
    calibration: conditional.ConditionalCalibration,
    settings: Mapping[str, Any],
    checked: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """plan.json."""
    from importlib.metadata import version

    pool = decision.pool
    names = short_names(pool.names)
    model_of: Dict[int, int] = {}
    models = []
    for k, planned in enumerate(decision.planned):
        for i in planned.members:
            model_of[i] = k
        members = [pool.names[i] for i in planned.members]
        models.append(
            {
                "file": f"{MODELS}/model{k + 1}.yml",
                "method": "alone" if len(members) == 1 else planned.merge.label(),
                "merge": _merge(planned.merge) if len(members) > 1 else None,
                "members": members,
                "predicted": {n: float(v) for n, v in zip(members, planned.values)},
                "expected_tasks": float(np.sum(planned.values)),
                "predicted_by": planned.rule,
                "fallback": planned.fallback,
            }
        )
    references = decision.references
    experts = []
    for i, name in enumerate(pool.names):
        k = model_of.get(i)
        outside = []
        if k is not None:
            planned = decision.planned[k]
            outside = planned.outside[list(planned.members).index(i)]
        experts.append(
            {
                "path": name,
                "name": names[name],
                "model": None if k is None else k + 1,
                "planned": float(decision.values[i]),
                "in_plan": "left out"
                if k is None
                else ("alone" if len(decision.planned[k].members) == 1 else "merged"),
                "alone": float(pool.expert_score[i]),
                "base": _number(pool.base_score[i]),
                "everything_configured": _number(references["configured"].values[i])
                if "configured" in references
                else None,
                "everything_ties": _number(references["ties"].values[i]),
                "outside_domain": outside,
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mergekit-mergeability", "version": version("mergekit-mergeability")},
        "config": str(spec.source),
        "base_model": spec.base_model,
        "settings": dict(settings),
        "objective": {
            "definition": OBJECTIVE,
            "planned": decision.objective,
            "tasks": len(pool),
            "references": {
                key: {
                    "label": r.label,
                    "value": None if np.isnan(r.values).all() else r.total,
                    "method": r.merge.label() if r.merge else None,
                    "predicted_by": r.rule,
                    "fallback": r.fallback,
                    "note": r.note,
                }
                for key, r in references.items()
            },
            "best_with_one_method": {m: r.objective for m, r in decision.per_method.items()},
        },
        "models": models,
        "experts": experts,
        "compatibility": compatibility(decision),
        "calibration": _calibration(calibration),
        "search": {
            "candidates": [m.label() for m in decision.merges],
            "evaluations": decision.search.evaluations,
            "seconds": decision.search.seconds,
            "starts": decision.search.starts,
            "notes": decision.notes,
        },
        "checked": _checked(checked, pool) if checked else None,
    }


def _merge(merge: conditional.Merge) -> Dict[str, Any]:
    return {
        "method": merge.method,
        "density": merge.density if merge.trims else None,
        "temperature": merge.temperature,
        "ties": merge.ties if merge.method == conditional.KNOWLEDGE_WEIGHTED else None,
        "cutoff": merge.cutoff,
        "scale": merge.scale,
    }


def _number(value) -> Optional[float]:
    return None if value is None or not np.isfinite(value) else float(value)


def compatibility(decision: Decision, limit: int = 60) -> List[Dict[str, Any]]:
    """Every pair's predicted mean own-task score when the two are merged alone (task_arithmetic,
    the measured rule): the report's graph edges. Pools above ``limit`` experts keep each
    expert's strongest GRAPH_EDGES pairs only."""
    pool, pairs = decision.pool, []
    n = len(pool)
    mean = conditional.Merge(conditional.TASK_ARITHMETIC)
    table = np.full((n, n), np.nan)
    for i in range(n):
        for j in range(i + 1, n):
            values = decision.calibration.predict(pool, [i, j], mean).values
            table[i, j] = table[j, i] = float(values.mean())
    keep = np.ones((n, n), dtype=bool)
    if n > limit:
        keep[:] = False
        for i in range(n):
            for j in np.argsort(-np.nan_to_num(table[i], nan=-1))[:GRAPH_EDGES]:
                keep[i, j] = keep[j, i] = True
    for i in range(n):
        for j in range(i + 1, n):
            if keep[i, j]:
                pairs.append({"a": pool.names[i], "b": pool.names[j], "predicted": table[i, j]})
    return pairs


def _calibration(calibration: conditional.ConditionalCalibration) -> Dict[str, Any]:
    document = calibration.document
    judged = {}
    for rule, held in (document.get("out_of_sample") or {}).items():
        judged[rule] = {
            how: {
                size: {k: cell.get(k) for k in ("experts", "trials", "spearman", "interval")}
                for size, cell in v["by_size"].items()
            }
            for how, v in held.items()
        }
    return {
        "path": document.get("path"),
        "rules": {r: {"sizes": f.sizes, "trials": f.trials} for r, f in calibration.fitted.items()},
        "out_of_sample": judged,
        "provenance": document.get("provenance"),
    }


def _checked(checked: Mapping[str, Any], pool: conditional.Pool) -> Dict[str, Any]:
    chosen = checked.get("chosen")
    return {
        "budget": checked["budget"],
        "spent": checked["spent"],
        "candidates": [
            {
                "label": c["label"],
                "predicted": c["predicted"],
                "measured": c["measured"],
                "models": [
                    {"members": [pool.names[i] for i in m], "method": merge.label()} for m, merge in c["assignment"]
                ],
            }
            for c in checked["candidates"]
        ],
        "chosen": chosen["label"] if chosen else None,
        "difference": (chosen["measured"] - chosen["predicted"]) if chosen else None,
        "choice": _choice(checked["choice"], len(pool)),
        "seconds": round(checked["seconds"], 1),
    }


def _choice(choice, tasks: int) -> Dict[str, Any]:
    """How the rehearsal chose (``verdict.choose_method``), in tasks kept (a per-task mean × ``tasks``)."""
    return {
        "baseline": choice.baseline,
        "best": choice.best,
        "picked_on_halves": list(choice.picked),
        "gain": choice.gain * tasks,
        "gain_interval": [v * tasks for v in choice.gain_interval],
        "items": choice.items,
        "runner_up": choice.runner_up,
        "items_to_separate": choice.items_to_separate,
    }


def configs(decision: Decision, spec, document: Mapping[str, Any]) -> Dict[str, str]:
    """file → YAML text: one mergekit config per planned model."""
    import yaml

    from mergekit_mergeability.merge_config import absolute

    resolved = spec.sources()
    written = {}
    for k, (planned, entry) in enumerate(zip(decision.planned, document["models"])):
        method, shared, per_model = mergekit_parameters(decision.pool, planned.members, planned.merge)
        config: Dict[str, Any] = {"merge_method": method, "base_model": spec.base_model}
        config["models"] = [
            {"model": name, **asked(spec, name), "parameters": per_model[name]} for name in entry["members"]
        ]
        if shared:
            config["parameters"] = shared
        if spec.dtype:
            config["dtype"] = spec.dtype
        header = [
            f"Written by mergekit-mergeability plan from {spec.source}: planned model {k + 1} of {len(decision.planned)}",
            f"method: {entry['method']}; experts: {len(entry['members'])}; predicted tasks kept here: {entry['expected_tasks']:.2f}",
            f"predicted by the conditional model of {entry['predicted_by']}"
            + (" (a fallback: no trials of this method measured)" if entry["fallback"] else ""),
            "run: mergekit-yaml THIS_FILE ./merged; then mergekit-mergeability evaluate THIS_FILE --merged ./merged",
        ]
        if len(entry["members"]) == 1:  # nothing to merge: the config rebuilds the fine-tune itself
            header[1:3] = [f"one fine-tune alone: serve {entry['members'][0]} as it is (this config rebuilds it)"]
        written[entry["file"]] = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(
            absolute(config, resolved, spec.folder), sort_keys=False
        )
    return written


def asked(spec, name: str) -> Dict[str, Any]:
    """A member's ``probe:``, ``fewshot:`` and ``chat:`` keys as the plan asked them (mergekit ignores
    them; ``evaluate`` and ``precheck`` read the planned config with them)."""
    from mergekit_mergeability.merge_config import CHAT_KEY, FEWSHOT_KEY, PROBE_KEY

    keys = {PROBE_KEY: spec.probes.get(name), FEWSHOT_KEY: spec.fewshot.get(name), CHAT_KEY: spec.chat.get(name)}
    return {key: value for key, value in keys.items() if value}


def write(out: Path, document: Mapping[str, Any], decision: Decision, spec, report: Mapping[str, Any]) -> Path:
    """Every output into ``out`` at once: a temporary folder beside it, renamed when complete."""
    files = configs(decision, spec, document)
    page = render(document)
    with atomic_folder(Path(out)) as partial:
        write_atomic(partial / "plan.json", json.dumps(document, indent=2) + "\n")
        write_atomic(partial / "precheck.json", json.dumps(report, indent=2) + "\n")
        for name, text in files.items():
            write_atomic(partial / name, text)
        write_atomic(partial / "report.html", page)
    return Path(out)


def print_plan(document: Mapping[str, Any], out: Optional[Path] = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    references = document["objective"]["references"]
    table = Table(
        "expert",
        "model",
        "predicted",
        _alone(document),
        "all merged\n"
        + (
            _short(references["configured"]["method"]).replace("_", " ")
            if "configured" in references
            else "as configured"
        ),
        "all merged\nTIES",
        title="plan: which experts share a merged model",
    )
    for column in (table.columns[0], *table.columns[3:]):  # names and numbers' headers fold, never cut
        column.overflow = "fold"
    for expert in document["experts"]:
        flag = "*" if expert["outside_domain"] else ""
        where = (
            "—"
            if expert["model"] is None
            else f"model{expert['model']}" + (" (alone)" if expert["in_plan"] == "alone" else "")
        )
        table.add_row(
            expert["name"],
            where,
            f"{expert['planned']:.2f}{flag}" + (" (base)" if expert["model"] is None else ""),
            f"{expert['alone']:.2f}",
            _cell(expert["everything_configured"]),
            _cell(expert["everything_ties"]),
        )
    for column in table.columns[1:]:  # as wide as its longest word: cells and headers break between words
        column.min_width = column.max_width = max(
            len(w) for c in (column.header, *column.cells) for w in str(c).split()
        )
    room = console.width - 3 * len(table.columns) - 1 - sum(c.min_width for c in table.columns[1:])
    table.columns[0].min_width = max(8, min(room, max(len(e["name"]) for e in document["experts"])))  # folds beyond
    console.print(table)
    if any(e["outside_domain"] for e in document["experts"]):
        console.print("[dim]* the merge's features lie outside what the prediction was fitted on: a rough guide[/dim]")
    objective = document["objective"]
    console.print(f"[bold]objective[/bold]: {objective['definition']}")
    console.print(f"  planned: [bold]{objective['planned']:.2f}[/bold] of {objective['tasks']} tasks (predicted)")
    for key in ("configured", "ties", "alone", "base"):
        if key in references:
            r = references[key]
            value = "not predicted" if r["value"] is None else f"{r['value']:.2f}"
            console.print(f"  {r['label']}: {value}" + (f" [dim]({r['note']})[/dim]" if r["note"] else ""))
    for model in document["models"]:
        fallback = (
            " [yellow](fallback prediction: this method's merges were never measured)[/yellow]"
            if model["fallback"]
            else ""
        )
        console.print(
            f"  {model['file']}: {model['method']}, {_experts(model)}, {model['expected_tasks']:.2f} tasks{fallback}"
        )
    for note in [_fitted(document), *document["search"]["notes"]]:
        if note:
            console.print(f"[dim]{note}[/dim]")
    checked = document.get("checked")
    if checked and checked["chosen"]:
        rows = Table("plan", "tasks predicted", "measured", title=_checked_title(checked))
        rows.columns[0].overflow = "fold"
        for c in checked["candidates"]:
            mark = " ◀ chosen" if c["label"] == checked["chosen"] else ""
            rows.add_row(c["label"] + mark, f"{c['predicted']:.2f}", f"{c['measured']:.2f}")
        console.print(rows)
        console.print(_choice_said(checked))
    if out is not None:
        console.print(
            f"wrote {out}/plan.json, {out}/report.html and {len(document['models'])} config{'' if len(document['models']) == 1 else 's'} under {out}/{MODELS}/"
        )
        console.print("next:\n" + _next_steps(document, f"{out}/"), highlight=False, soft_wrap=True)  # copyable whole


def _experts(model: Mapping[str, Any]) -> str:
    return f"{len(model['members'])} expert" + ("s" if len(model["members"]) != 1 else "")


def _next_steps(document: Mapping[str, Any], folder: str = "") -> str:
    """The commands that build each planned model and score it on its members' tasks."""
    return "\n".join(
        f"  mergekit-yaml {folder}{m['file']} ./merged{k}\n"
        f"  mergekit-mergeability evaluate {folder}{m['file']} --merged ./merged{k}"
        for k, m in enumerate(document["models"], 1)
    )


def _alone(document: Mapping[str, Any]) -> str:
    """The 'alone' column's header: each fine-tune's own score, measured (``--measured``) or assumed 1."""
    return "alone" if (document.get("settings") or {}).get("measured") else "alone\n(assumed)"


def _headline(objective: Mapping[str, Any], checked: Mapping[str, Any]) -> str:
    """What the plan keeps: measured on the probes where the rehearsal chose it (that decided),
    else predicted."""
    tasks = objective["tasks"]
    chosen = next((c for c in checked.get("candidates", []) if c["label"] == checked.get("chosen")), None)
    if chosen is None:
        return f"plan: {objective['planned']:.2f} of {tasks} tasks kept (predicted)"
    label = chosen["label"].removeprefix(REFERENCE)
    return (
        f"plan: {label}: {chosen['measured']:.2f} of {tasks} tasks kept on the probes, measured"
        f" ({objective['planned']:.2f} predicted)"
    )


def _checked_title(checked: Mapping[str, Any]) -> str:
    return (
        f"checked by rehearsal: {len(checked['candidates'])} plans, {checked['spent']} merged"
        f" model{'' if checked['spent'] == 1 else 's'} of the budget's {checked['budget']},"
        f" {checked.get('seconds', 0):.0f} s"
    )


def _fitted(document: Mapping[str, Any]) -> str:
    """The merge sizes the prediction was fitted on, by method: beyond them it extrapolates."""
    rules = document["calibration"].get("rules") or {}
    sizes = ", ".join(f"{rule} {max(r['sizes'])}" for rule, r in rules.items() if r.get("sizes"))
    return (
        f"The prediction was fitted on merges of up to {sizes} fine-tunes; of more, it extrapolates." if sizes else ""
    )


def _choice_said(checked: Mapping[str, Any]) -> str:
    """How the rehearsal chose, in a sentence or two (terminal and report)."""
    choice = checked.get("choice")
    if not choice:
        return ""
    low, high = choice["gain_interval"]
    baseline = _quoted(choice["baseline"])
    crossed = (
        f"picked on one half of every probe and read on the other, it keeps {choice['gain']:+.2f} tasks"
        f" (95% interval {low:+.2f} to {high:+.2f}) against {baseline}"
    )
    separate = choice.get("items_to_separate")
    if checked["chosen"] != choice["baseline"]:
        said = f"{_quoted(checked['chosen'])} chosen: {crossed}."
    elif choice["best"] != choice["baseline"]:
        why = (
            f"it keeps less there, so {baseline} is written"
            if high < 0
            else f"the interval includes zero: these probes cannot tell the two apart, so {baseline} is written"
        )
        said = (
            f"{_quoted(choice['best'])} ({_contents(checked, choice['best'])}) measured best but is not chosen:"
            f" {crossed}; {why}."
        )
        if separate and choice.get("runner_up") == choice["baseline"]:
            return said + f" About {separate} items per probe would."
    else:
        top = {c["label"]: c["measured"] for c in checked.get("candidates", ()) if c.get("measured") is not None}
        level = [label for label, v in top.items() if label != choice["baseline"] and v == top.get(choice["baseline"])]
        tie = f" (level with {'; '.join(map(_quoted, level))}: a tie keeps the merge of everything)" if level else ""
        said = f"{baseline} measured best{tie} and is written."
    if separate:
        said += (
            f" The probes cannot tell {_quoted(choice['best'])} from {_quoted(choice['runner_up'])};"
            f" about {separate} items per probe would."
        )
    return said


def _quoted(label: str) -> str:
    """A candidate's label inside a sentence: its names hold commas."""
    return f"“{label.removeprefix(REFERENCE)}”"


def _contents(checked: Mapping[str, Any], label: str, most: int = 6) -> str:
    """What a measured candidate merges, by its members' short names (the rest left out)."""
    found = next(c for c in checked["candidates"] if c["label"] == label)
    every = {m for c in checked["candidates"] for model in c["models"] for m in model["members"]}
    named = lambda members: (  # noqa: E731
        ", ".join(Path(m).name for m in members) if len(members) <= most else f"{len(members)} fine-tunes"
    )
    parts = [
        f"{model['method'].split(' (')[0]} of {named(model['members'])}"
        if len(model["members"]) > 1
        else f"{named(model['members'])} alone"
        for model in found["models"]
    ]
    out = sorted(every - {m for model in found["models"] for m in model["members"]})
    return "; ".join(parts) + (f"; {named(out)} left out" if out else "")


def _short(label: Optional[str]) -> str:
    return (label or "as configured").split(" (")[0]


def _cell(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f}"


def render(document: Mapping[str, Any]) -> str:
    """report.html: one self-contained page."""
    esc = html.escape
    objective = document["objective"]
    figures = [f for f in (_graph(document), _objective_plot(document)) if f]
    images = "".join(
        f"<img alt='{esc(t)}' src='data:image/png;base64,{base64.b64encode(p).decode()}'>" for t, p in figures
    )
    alike = _alike(document)
    if alike is not None:
        said = (
            f"The two experts are predicted to keep {alike:.2f} merged together"
            if len(document["experts"]) == 2
            else f"Every pair of experts is predicted to keep {alike:.2f} merged alone: the prediction does not"
            " tell them apart"
        )
        images = f"<p>{esc(said)}, so no graph of the pool is drawn.</p>{images}"
    footnote = (
        "<p><small>Each score is the expert's own task, read as its probe is scored (0 to 1: p(gold) where"
        " the options are listed, accuracy where cloze, the task's metric for an lm-eval task). "
        + (
            "(base): in no merged model, the base's own score on its task. "
            if any(e["model"] is None for e in document["experts"])
            else ""
        )
        + (
            "* outside the range the prediction was fitted on."
            if any(e["outside_domain"] for e in document["experts"])
            else ""
        )
        + "</small></p>"
    )
    rows = "".join(
        "<tr>"
        f"<td title='{esc(e['path'])}'>{esc(e['name'])}</td>"
        f"<td>{'—' if e['model'] is None else 'model' + str(e['model'])}</td>"
        f"<td>{e['planned']:.2f}{' (base)' if e['model'] is None else ''}{' *' if e['outside_domain'] else ''}</td>"
        f"<td>{e['alone']:.2f}</td><td>{_cell(e['everything_configured'])}</td><td>{_cell(e['everything_ties'])}</td>"
        "</tr>"
        for e in document["experts"]
    )
    models = "".join(
        f"<li><code>{esc(m['file'])}</code>: {esc(m['method'])}, {_experts(m)}, "
        f"{m['expected_tasks']:.2f} tasks{' (fallback prediction)' if m['fallback'] else ''}</li>"
        for m in document["models"]
    )
    references = "".join(
        f"<li>{esc(r['label'])}: {'not predicted' if r['value'] is None else format(r['value'], '.2f')}</li>"
        for r in objective["references"].values()
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in document["search"]["notes"])
    checked = document.get("checked") or {}
    tried = "".join(
        f"<tr><td>{esc(c['label'])}{' <b>(chosen)</b>' if c['label'] == checked['chosen'] else ''}</td>"
        f"<td>{c['predicted']:.2f}</td><td>{c['measured']:.2f}</td></tr>"
        for c in checked.get("candidates", [])
    )
    rehearsed = (
        f"<h2>{esc(_checked_title(checked))}</h2><table><thead><tr><th>plan</th><th>tasks predicted</th>"
        f"<th>measured</th></tr></thead><tbody>{tried}</tbody></table><p>{esc(_choice_said(checked))}</p>"
        if tried
        else ""
    )
    judged = []
    for rule, held in document["calibration"]["out_of_sample"].items():
        for how, sizes in held.items():
            for size, cell in sizes.items():
                interval = cell.get("interval") or [float("nan")] * 2
                judged.append(
                    f"<li>{esc(rule)}, {size} merged, {esc(how.replace('_', ' '))}: Spearman {cell['spearman']:+.2f} "
                    f"[{interval[0]:+.2f}, {interval[1]:+.2f}] over {cell['experts']} experts</li>"
                )
    return f"""<!doctype html><html><head><meta charset='utf-8'><title>mergekit-mergeability plan</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px}}img{{max-width:100%}}</style></head><body>
<h1>{esc(_headline(objective, checked))}</h1>{rehearsed}
<h2>Predicted</h2><p>Objective: {esc(objective["definition"])}. {esc(_fitted(document))}</p><ul>{references}</ul>
<h2>Planned models</h2><ul>{models}</ul>
<p>Build each with the stock mergekit, then score it on its members' tasks, from this folder:</p>
<pre>{esc(_next_steps(document))}</pre>{images}
<h2>Experts</h2><table><thead><tr><th>expert</th><th>planned model</th><th>predicted there</th><th>{esc(_alone(document))}</th>
<th>everything, as configured</th><th>everything, TIES</th></tr></thead><tbody>{rows}</tbody></table>
{footnote}
<h2>How good the prediction is (out of sample, on measured merges)</h2><ul>{"".join(judged) or "<li>no out-of-sample numbers in this calibration</li>"}</ul>
<h2>Notes</h2><ul>{notes or "<li>none</li>"}</ul></body></html>
"""


def _alike(document: Mapping[str, Any]) -> Optional[float]:
    """The score every pair is predicted merged alone, where all are within 0.005 of one another (a
    graph of the pool would then show nothing); None otherwise."""
    values = [p["predicted"] for p in document["compatibility"] if _number(p["predicted"]) is not None]
    return values[0] if values and max(values) - min(values) < 0.005 else None


def _graph(document: Mapping[str, Any]):
    """The pool on a circle, grouped by planned model (left-out experts last), each group in the
    order classical MDS on 1 − pairwise compatibility gives it; edges are each expert's strongest
    pairs, names outside the circle."""
    from mergekit_mergeability.output.plots import png

    experts = document["experts"]
    n = len(experts)
    if n < 2 or _alike(document) is not None:
        return None
    index = {e["path"]: i for i, e in enumerate(experts)}
    table = np.full((n, n), np.nan)
    for pair in document["compatibility"]:
        table[index[pair["a"]], index[pair["b"]]] = table[index[pair["b"]], index[pair["a"]]] = pair["predicted"]
    filled = np.where(np.isnan(table), np.nanmean(table) if np.isfinite(table).any() else 0.5, table)
    np.fill_diagonal(filled, 1.0)
    centre = np.eye(n) - 1 / n
    _, vectors = np.linalg.eigh(-0.5 * centre @ (np.clip(1 - filled, 0, None) ** 2) @ centre)
    along = np.arctan2(vectors[:, -2], vectors[:, -1])  # where MDS puts each expert, as an angle
    groups = [float("inf") if e["model"] is None else e["model"] for e in experts]
    order = sorted(range(n), key=lambda i: (groups[i], along[i]))
    angle = np.empty(n)
    angle[order] = np.pi / 2 - 2 * np.pi * np.arange(n) / n  # clockwise from the top
    position = np.stack([np.cos(angle), np.sin(angle)], axis=1)

    def colour(expert) -> str:
        return "#9e9e9e" if expert["model"] is None else COLOURS[(expert["model"] - 1) % len(COLOURS)]

    def draw(fig, ax):
        import matplotlib.cm as cm
        from matplotlib.colors import Normalize

        shown = np.isfinite(table)
        low, high = (np.nanmin(table), np.nanmax(table)) if shown.any() else (0, 1)
        for i in range(n):
            for j in np.argsort(-np.nan_to_num(table[i], nan=-1))[:GRAPH_EDGES]:
                if np.isfinite(table[i, j]):
                    shade = (table[i, j] - low) / (high - low) if high > low else 0.5
                    ax.plot(
                        *position[[i, j]].T, color=cm.viridis(shade), alpha=0.6, linewidth=0.5 + 2 * shade, zorder=1
                    )
        for i, expert in enumerate(experts):
            ax.scatter(*position[i], s=60, color=colour(expert), edgecolor="black", zorder=2)
            if n <= 60:
                degrees = np.degrees(angle[i]) % 360
                left = 90 < degrees < 270
                ax.text(
                    *(1.07 * position[i]),
                    expert["name"],
                    fontsize=10 if n <= 12 else 7 if n <= 30 else 5,
                    rotation=degrees - 180 if left else degrees,
                    rotation_mode="anchor",
                    ha="right" if left else "left",
                    va="center",
                )
        for model in sorted({e["model"] for e in experts}, key=lambda m: float("inf") if m is None else m):
            example = next(e for e in experts if e["model"] == model)
            label = "left out" if model is None else f"model{model}"
            ax.scatter([], [], s=60, color=colour(example), edgecolor="black", label=label)
        ax.legend(loc="upper left", fontsize=8, frameon=False)
        room = 1.6 if n <= 12 else 2.0  # around the circle: the names, longer in a larger pool
        ax.set_xlim(-room, room)
        ax.set_ylim(-room, room)
        ax.set_aspect("equal")
        ax.axis("off")
        if high > low:
            mappable = cm.ScalarMappable(norm=Normalize(low, high), cmap="viridis")
            fig.colorbar(mappable, ax=ax, label="predicted mean score of the pair merged", shrink=0.6)

    title = "the pool: each expert's strongest pairs, grouped by planned model"
    return title, png(draw, title, *((8, 6.5) if n <= 12 else (10, 8)))


def _objective_plot(document: Mapping[str, Any]):
    from mergekit_mergeability.output.plots import png

    objective = document["objective"]
    bars = [("planned", objective["planned"])] + [
        (r["label"].replace("every expert merged ", "everything ").replace(" (one model per task)", ""), r["value"])
        for r in objective["references"].values()
        if r["value"] is not None
    ]

    def draw(fig, ax):
        labels, values = zip(*bars)
        ax.barh(range(len(bars)), values, color=["#1565c0"] + ["#9e9e9e"] * (len(bars) - 1))
        ax.set_yticks(range(len(bars)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"expected tasks kept (of {objective['tasks']})")

    title = "objective: the plan against its references (predicted)"
    return title, png(draw, title, 8, 3)
