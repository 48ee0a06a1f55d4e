"""Which layer cut-off keeps the demo's translators: chrF kept at every cut-off, against the ones
the precheck's signals pick (CKA, LAPE overlap) and paper 3's fixed patch.

Run after the demo (it reads the demo's translators, configs and scores from the demo's cache
and output, and merges with mergekit into the same cache):

    mergekit-mergeability demo
    python research/translation_cutoffs.py [--pair different_targets] [--cutoffs 16,17,...]

For each cut-off c and each expert of the pair: layer_selective with blocks < c merged
(task_arithmetic) and blocks >= c from that expert, scored on its held-out sentences. Then
the precheck is run with ``--cutoff-signal cka`` and ``selectivity`` to show which c each
signal picks. Prints a table and writes OUT/translation/cutoffs_PAIR.json. About 15 s per
cut-off and expert on 2 cores (4–5 min for the default cut-offs).
"""

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mergekit_mergeability.files import default_cache_dir
from mergekit_mergeability.demo import translation
from mergekit_mergeability.demo.steps import FULL, Demo
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.files import write_atomic
from mergekit_mergeability import api, merge_config
from mergekit_mergeability.settings import PrecheckSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir() / "demo",
        help="the demo's --cache-dir (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("mergeability-demo"), help="the demo's --out (default: %(default)s)"
    )
    parser.add_argument(
        "--pair",
        default="different_targets",
        choices=sorted(translation.PAIRS),
        help="which translator pair (default: %(default)s)",
    )
    parser.add_argument(
        "--cutoffs",
        default="16,17,18,19,20,21,23,26,30",
        help="comma-separated blocks: blocks below are merged, blocks from it on are the expert's (default: %(default)s)",
    )
    args = parser.parse_args()
    console = Console()
    demo = Demo(FULL, args.cache_dir, args.out, console, quiet=True)
    name = f"translation_{args.pair}"
    config = demo.out / "configs" / f"{name}.yml"
    if not config.is_file():
        raise SystemExit(
            f"{config}: no such file; point --out (and --cache-dir) at a finished demo run, or run `mergekit-mergeability demo --out {args.out} --cache-dir {args.cache_dir}` first (~17 min)"
        )
    try:
        spec = merge_config.read(config)
    except UserError as error:
        raise SystemExit(f"error: {error}") from None
    document = spec.document
    picks = {}
    for signal in ("cka", "selectivity"):
        settings = PrecheckSettings(device="cpu", dtype="float32", quiet=True, cutoff_signal=signal)
        precheck = api.precheck(spec, settings=settings, out=demo.out / "cutoffs" / signal).to_json()
        picks[signal] = precheck["recommendation"]["cutoff"]
    picks["paper 3's patch"] = translation.patch_cutoff(precheck)
    kept = {}
    for cutoff in [int(c) for c in args.cutoffs.split(",")]:
        for expert in [m["model"] for m in document["models"]]:
            path = demo.write_config(
                f"{name}_cut{cutoff}_{Path(expert).name}", translation.patched(document, expert, cutoff)
            )
            (result,) = translation.score(demo, name, f"cut-off {cutoff}", path, expert)
            kept.setdefault(cutoff, {})[result["expert"]] = result
            console.print(f"cut-off {cutoff}, {result['expert']}: chrF {result['chrf']:.1f}, kept {result['kept']:.2f}")
    table = Table(
        "cut-off",
        *(f"{e} kept" for e in next(iter(kept.values()))),
        "picked by",
        title=f"{args.pair}: chrF kept by the cut-off",
    )
    for cutoff, results in kept.items():
        by = [s for s, c in picks.items() if c == cutoff]
        table.add_row(str(cutoff), *(f"{r['kept']:.2f}" for r in results.values()), ", ".join(by))
    console.print(table)
    console.print(f"picked: {picks}")
    write_atomic(
        demo.out / "translation" / f"cutoffs_{args.pair}.json",
        json.dumps({"picks": picks, "kept": kept}, indent=2) + "\n",
    )


if __name__ == "__main__":
    main()
