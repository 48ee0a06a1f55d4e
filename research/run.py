"""The research pipeline's one entry point: ``python research/run.py STEP [ARGUMENTS...]``.

    pools        build and measure a family of pools (experts, precheck, mergeability)
    configs      the small-config family: configs of 2, 3 and 5 experts as users write them
    tuning       the merge users should write: the chooser on a fresh family of configs
    prediction   the prediction against measured families: families, check, calibrate [--install]
    plan         plan's conditional calibration (fit [--install]), its speed, a plan checked
    calibration_variants, translation_cutoffs   one-off comparisons behind docs/prediction.md

Each step is the script of that name beside this one (``--help`` on any of them); what a step
installs into the package goes through ``mergekit_mergeability.api.install``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = ("pools", "configs", "tuning", "prediction", "plan", "calibration_variants", "translation_cutoffs")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in STEPS:
        raise SystemExit(f"usage: python research/run.py {{{','.join(STEPS)}}} [ARGUMENTS...]\n\n{__doc__}")
    step = HERE / f"{sys.argv[1]}.py"
    sys.argv = [str(step), *sys.argv[2:]]
    sys.path.insert(0, str(HERE))
    runpy.run_path(str(step), run_name="__main__")


if __name__ == "__main__":
    main()
