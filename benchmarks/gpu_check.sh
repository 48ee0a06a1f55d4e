#!/usr/bin/env bash
# The precheck on a lent GPU, measured once (issue 52): benchmarks/gpu_check.py's docstring says what.
#
# Measures, on random-weight Llama-shaped models written here in bf16 (a 1.1B and a 7B shape, each
# the base of three rank-8 LoRA adapters with a 16-item probe each): the whole precheck on the GPU,
# its wall time, GPU memory peak and the cost line's estimate beside the measured time, phase by
# phase; and the 1.1B config in float32 on the CPU against the GPU, every per-item read to 1e-3
# (PASS/FAIL). Results: $OUT/gpu_check.json, $OUT/gpu_check.txt, $OUT/gpu_check.log (OUT defaults to
# ./gpu-check-out). docs/scale.md records its results once run.
#
# On one H100 (16 cores) it should take about 6-8 min (estimates: nothing of it has run on a GPU
# yet): the environment 20-40 s, the 1.1B base 10-20 s, its precheck 1-2.5 min, the CPU comparison
# 1-1.5 min and the GPU's 20-40 s, the 7B precheck 2-5 min (its base written in the background
# meanwhile). Nothing runs past 8 min (--deadline 480, counted from this script's start): a part
# that fails or is stopped is recorded, with the phase it was in, and the rest goes on.
#
# From a session with the device tool (the wheels first, here, where pip reaches its index):
#   bash benchmarks/gpu_check.sh --fetch-wheels        # writes build/gpu-wheels (8 MB, git-ignored)
#   run(command="bash benchmarks/gpu_check.sh", carry=["build/gpu-wheels"], timeout_s=570), then give_back
# Options (or GPU_CHECK_* variables) are gpu_check.py's: python benchmarks/gpu_check.py --help.
#   bash benchmarks/gpu_check.sh --tiny                # the same code path on tiny shapes, CPU only (here)
#
# The environment, in this order: ./.venv where it already holds the package (the README's set-up);
# else, where python3 already holds torch and the wheels of --fetch-wheels are here (the lent GPU
# machine: its image has a CUDA torch, transformers and most of the rest, and no package index is
# reachable from it), those wheels and this checkout (editable) installed into that python3 with no
# index; else the README's set-up, `source examples/env.sh`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)
export OUT="${OUT:-$PWD/gpu-check-out}"
WHEELS="${GPU_CHECK_WHEELS:-build/gpu-wheels}"
log() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - START))s] $*"; }

if [ "${1:-}" = "--fetch-wheels" ]; then
    # What the GPU image lacks for the precheck (its torch, transformers, peft, tokenizers and the
    # like stay as they are), at the versions of this checkout's .venv, for Python 3.11 to 3.13
    # (the image's python3 was 3.12); requirements.txt names them for the install.
    set -e
    mkdir -p "$WHEELS"
    .venv/bin/python - >"$WHEELS/requirements.txt" <<'EOF'
import importlib.metadata as m
names = ["mergekit", "pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions",
         "immutables", "dill", "hatchling", "editables", "trove-classifiers", "tomlkit"]
print("\n".join(f"{n}=={m.version(n)}" for n in names))
EOF
    for py in ${GPU_CHECK_PYTHONS:-3.11 3.12 3.13}; do
        .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$WHEELS" -r "$WHEELS/requirements.txt"
    done
    ls "$WHEELS"
    du -sh "$WHEELS"
    exit 0
fi

mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
log "gpu_check.sh $*: OUT=$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

PY=""
if [ -x .venv/bin/python ] && .venv/bin/python -c "import mergekit_mergeability, torch" 2>/dev/null; then
    log "environment: ./.venv"
    PY=.venv/bin/python
elif [ -f "$WHEELS/requirements.txt" ] && python3 -c "import torch, transformers" 2>/dev/null; then
    log "environment: $(command -v python3) (torch $(python3 -c 'import torch; print(torch.__version__)')) with the wheels of $WHEELS, no index"
    if python3 -m pip install -q --no-index --no-deps --no-compile --find-links "$WHEELS" -r "$WHEELS/requirements.txt" \
        && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .; then
        PY=python3
    else
        log "installing into python3 failed"
    fi
else
    python3 -c "import torch" 2>/dev/null && log "python3 has torch but $WHEELS has no wheels: carry them (--fetch-wheels)"
    log "environment: the README's set-up (source examples/env.sh)"
    if (export PIP_RETRIES="${PIP_RETRIES:-1}" PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-20}"; source examples/env.sh); then
        PY=.venv/bin/python
    else
        log "examples/env.sh failed"
    fi
fi
if [ -n "$PY" ] && ! "$PY" -c "import torch, transformers, mergekit.merge, mergekit.architecture
import mergekit_mergeability.api, mergekit_mergeability.measuring, mergekit_mergeability.planned
import mergekit_mergeability.plugins.builtin"; then
    log "the environment cannot import the package (above: what is missing)"
    PY=""
fi
if [ -z "$PY" ]; then
    printf '{"started": "%s", "steps": [{"label": "environment", "ok": false, "error": "no environment (see gpu_check.log)"}]}\n' \
        "$(date -d "@$START" '+%Y-%m-%d %H:%M:%S')" >"$OUT/gpu_check.json"
    echo "failures: environment: no environment (see gpu_check.log)" >"$OUT/gpu_check.txt"
    exit 1
fi
log "environment ready"
"$PY" benchmarks/gpu_check.py --started "$START" "$@"
rc=$?
log "gpu_check.py exit status $rc"
exit $rc
