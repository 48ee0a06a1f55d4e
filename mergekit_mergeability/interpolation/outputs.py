"""A sweep's files: ``sweep.json`` (schema: ``schema.json`` beside this file), ``sweep.png``,
``chosen.yml`` (the sweet spot as a config for the stock ``mergekit-yaml``) and ``report.html``;
the plot, the page and the terminal tables are drawn in ``output/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from mergekit_mergeability.files import write_atomic
from mergekit_mergeability.output.html import sweep_page
from mergekit_mergeability.output.terminal import an_end
from mergekit_mergeability.output.plots import sweep_plot

SCHEMA = Path(__file__).with_name("schema.json")


def chosen_config(report: Dict[str, Any], sweep) -> Optional[Dict[str, Any]]:
    """The sweet spot's λ-model as a mergekit ``linear`` config; None where mergekit cannot
    build it (task vectors are not models it reads; no sweet spot) or need not (``an_end``). With --layers/--modules,
    each interpolated tensor gets its own weight through mergekit's substring ``filter:``,
    written as the full tensor name and checked to match no other tensor."""
    from mergekit_mergeability.interpolation.models import weights

    lam = report["sweet_spot"]["lambda"]
    if lam is None or sweep.ends.vectors or an_end(report):
        return None
    chosen = weights(lam)
    restricted = len(sweep.interpolated) < report["tensors"]["differing"]
    if restricted:
        others = [n for n in sweep.ends.names_of() if n not in set(sweep.interpolated)]
        if any(name in other for other in others for name in sweep.interpolated):
            return None

    def weight(role: str):
        if not restricted:
            return chosen[role]
        return [
            *({"filter": name, "value": chosen[role]} for name in sweep.interpolated),
            {"value": 1.0 if role == "a" else 0.0},
        ]

    models = [{"model": report["models"][role]["path"], "parameters": {"weight": weight(role)}} for role in ("a", "b")]
    return {"merge_method": "linear", "models": models, "dtype": report["settings"]["dtype"] or "float32"}


def write(report: Dict[str, Any], sweep, out: Path) -> List[Path]:
    import yaml

    out = Path(out)
    config = chosen_config(report, sweep)
    report["chosen_config"] = "chosen.yml" if config else None
    image = sweep_plot(report)
    written = [
        write_atomic(out / "sweep.json", json.dumps(report, indent=2) + "\n"),
        write_atomic(out / "sweep.png", image),
    ]
    if config:
        spot = report["sweet_spot"]
        header = f"# λ = {spot['lambda']:g}: {spot['reason']} (mergekit-mergeability sweep)\n# mergekit-yaml chosen.yml ./merged\n"
        written.append(write_atomic(out / "chosen.yml", header + yaml.safe_dump(config, sort_keys=False)))
    written.append(
        write_atomic(out / "report.html", sweep_page(report, image, config and yaml.safe_dump(config, sort_keys=False)))
    )
    return written
