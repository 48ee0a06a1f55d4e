# Sourced by the README's commands: a local .venv with everything installed.
# torch==2.13.0 goes first, pinned, from the index pip is configured with: on a stock Linux pip
# that is PyPI's CUDA build (several GB). An installed 2.13.0 (the CPU build: README) is kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# hatchling + editables: the editable install is built without network isolation.
.venv/bin/python -m pip install -q hatchling editables
# EXTRAS: the package's extras to install (tests/run.sh adds ray, for the --ray tests).
.venv/bin/python -m pip install -q --no-build-isolation -e ".[${EXTRAS:-test}]"
export PATH="$PWD/.venv/bin:$PATH"
