"""The probe rows two signals read teacher-forced, every model through them: the representations
(hidden states, CKA) and the selectivity (MLP neurons active per probe group, LAPE).

A row is a probe instance's prompt and gold continuation. The representations read every row of
every model's probe; the selectivity counts each probe set once, each row in its group: the
line's ``group`` field, else the probe set's (models with the same probe set share it). Where
both run, in this process, the representations' pass counts the selectivity's neurons as it
goes (``counted_together``): one forward pass over the rows per model serves the two.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from mergekit_mergeability import distributed
from mergekit_mergeability.names import short_names

MIN_ROWS = 4  # the representations' unbiased CKA's minimum; fewer rows say little anyway
REPRESENTATIONS, SELECTIVITY = "representations", "selectivity"


def probe_rows(models) -> List[Tuple[str, str]]:
    """Every model's probe rows, (prompt, gold), model by model: the representations' rows."""
    return [(i.prompt, i.gold) for m in models for i in (m.probes or ())]


def row_groups(models) -> Tuple[List[Optional[int]], List[str]]:
    """Each of ``probe_rows``' rows' group index (None: its model's probe set came before, so it is
    counted there), and the group names, first seen first."""
    names = short_names([m.name for m in models])
    labels: List[Optional[int]] = []
    groups: dict = {}
    seen = set()
    for model in models:
        if not model.probes:
            continue
        repeated = tuple(model.probes) in seen
        seen.add(tuple(model.probes))
        for instance in model.probes:
            labels.append(None if repeated else groups.setdefault(instance.group or names[model.name], len(groups)))
    return labels, list(groups)


def probe_groups(models: Sequence) -> Tuple[List[Tuple[str, str]], List[int], List[str]]:
    """The selectivity's rows (each probe set's once), each row's group index, and the group names."""
    labels, groups = row_groups(models)
    counted = [(row, label) for row, label in zip(probe_rows(models), labels) if label is not None]
    return [row for row, _ in counted], [label for _, label in counted], groups


def counted_together(inputs) -> bool:
    """Whether the representations' pass counts the selectivity's active neurons: both run (neither
    skipped, enough rows and groups for each), in this process (Ray runs each model's pass apart)."""
    labels, groups = row_groups(inputs.models)
    return (
        not distributed.active()
        and not {REPRESENTATIONS, SELECTIVITY} & set(inputs.settings.skip)
        and len(labels) >= MIN_ROWS
        and len(groups) >= 2
    )
