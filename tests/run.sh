#!/usr/bin/env bash
# The test command: sets up .venv (see examples/env.sh), then runs the suite.
source "$(dirname "${BASH_SOURCE[0]}")/../examples/env.sh"
python -m pytest "$@"
