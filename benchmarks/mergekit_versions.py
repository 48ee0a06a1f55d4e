"""Which mergekit 0.1.x releases the plugin's merge methods work with, through the stock CLI.

For each mergekit version, the release is installed on its own in a temporary folder
(``pip install --no-deps --target``) and put first on PYTHONPATH, so this venv stays as it is
and its site-packages, the plugin and its ``.pth`` start-up hook still load. The venv's own
``mergekit-yaml`` then merges the shipped ``knowledge_weighted`` and ``layer_selective`` configs
over tiny local llama models. One line per (version, config): the exit status, the seconds, and
whether the merged tensors equal those the pinned version (0.1.5) writes, to 1e-6 (or the first
difference, or the error). Last, the versions where every config passed. Exits non-zero if the
pinned version fails.

    python benchmarks/mergekit_versions.py [--versions 0.1.4 0.1.5] [--work DIR]

Without --versions: every 0.1.x release >= 0.1.4 that ``pip index versions mergekit`` lists.
Only pip reaches the network (the package registry).
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from packaging.version import Version

from _models import workdir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from conftest import shipped_config  # noqa: E402
from mergekit_mergeability.tiny import make_family, state_dict  # noqa: E402

PINNED = "0.1.5"
FALLBACK = ["0.1.4", PINNED]
CONFIGS = ("knowledge_weighted.yml", "layer_selective.yml")
MERGEKIT_YAML = Path(sys.executable).parent / "mergekit-yaml"
OFFLINE = ["--no-write-model-card", "--lazy-unpickle"]
ERROR = re.compile(r"[A-Za-z_][\w.]*(Error|Exception)\b.*:")  # a traceback's last line, or our "Error: ..."
WHICH = "import mergekit, importlib.metadata as m; print(m.version('mergekit'), mergekit.__file__)"


def released() -> list:
    """The 0.1.x releases >= 0.1.4 the registry lists; ``FALLBACK`` when pip cannot say."""
    pip = [sys.executable, "-m", "pip", "index", "versions", "mergekit"]
    listed = re.search(r"Available versions: (.+)", subprocess.run(pip, capture_output=True, text=True).stdout)
    if listed is None:
        return FALLBACK
    versions = [Version(v.strip()) for v in listed.group(1).split(",")]
    return [str(v) for v in sorted(v for v in versions if Version("0.1.4") <= v < Version("0.2"))]


def environment(version: str, root: Path) -> dict:
    """Process environment in which ``import mergekit`` gets ``version``, installed alone under ``root``."""
    target = root / f"mergekit-{version}"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, f"mergekit=={version}"], check=True)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    found, where = subprocess.run([sys.executable, "-c", WHICH], env=env, capture_output=True, text=True).stdout.split()
    if found != version or not Path(where).is_relative_to(target):
        raise SystemExit(f"asked for mergekit {version} from {target}, imported {found} from {where}")
    return env


def merge(config: Path, out: Path, env: dict):
    """(exit status, seconds, the error's line in stderr) of the stock ``mergekit-yaml CONFIG OUT``."""
    started = time.perf_counter()
    done = subprocess.run([MERGEKIT_YAML, config, out, *OFFLINE], env=env, capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if ERROR.match(line)), lines[-1] if lines else "")
    return done.returncode, time.perf_counter() - started, error


def first_difference(merged: dict, reference: dict):
    """Where two merged state dicts first differ by more than 1e-6, or None."""
    if merged.keys() != reference.keys():
        return f"tensors in one only: {sorted(merged.keys() ^ reference.keys())[:3]}"
    for name, tensor in reference.items():
        if merged[name].shape != tensor.shape:
            return f"{name}: shape {tuple(merged[name].shape)} against {tuple(tensor.shape)}"
        gap = (merged[name].float() - tensor.float()).abs().max().item()
        if not gap <= 1e-6:
            return f"{name}: differs by {gap:.3g}"
    return None


def check(version: str, configs: dict, root: Path, reference: dict) -> bool:
    """Merge every config under ``version``, print a line each, and keep the pinned version's tensors."""
    env, passed = environment(version, root), True
    for name, config in configs.items():
        out = root / "out" / version / name
        status, seconds, last = merge(config, out, env)
        if status != 0 or not (out / "model.safetensors").exists():
            verdict = last or "no model.safetensors"
        elif name not in reference and version != PINNED:
            verdict = f"merged, but {PINNED} did not: nothing to compare with"
        else:
            merged = state_dict(out)
            reference.setdefault(name, merged)
            verdict = first_difference(merged, reference[name]) or f"equal to {PINNED}"
        passed &= verdict == f"equal to {PINNED}"
        print(f"{version:8} {name.removesuffix('.yml'):20} exit {status:<3} {seconds:6.1f} s  {verdict}", flush=True)
    return passed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", help="default: the registry's 0.1.x >= 0.1.4")
    parser.add_argument("--work", type=Path, help="keep the models, installs and merges here")
    args = parser.parse_args()
    versions = sorted(set(args.versions or released()) | {PINNED}, key=Version)
    with workdir(args.work, "mergekit-versions-") as root:
        family = make_family(root / "models", "llama")
        configs = {name: shipped_config(name, family, root) for name in CONFIGS}
        reference = {}  # the pinned version's merges, merged first, are what the others must equal
        passed = {v: check(v, configs, root, reference) for v in [PINNED, *(v for v in versions if v != PINNED)]}
    supported = [v for v in versions if passed[v]]
    contiguous = supported and supported == versions[versions.index(supported[0]) :]
    print(f"supported: {', '.join(supported) or 'none'}" + (f"  (mergekit>={supported[0]},<0.2)" if contiguous else ""))
    sys.exit(0 if passed[PINNED] else 1)


if __name__ == "__main__":
    main()
