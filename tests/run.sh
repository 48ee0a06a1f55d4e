#!/usr/bin/env bash
# The test command: sets up .venv (see examples/env.sh) with ray too, so the --ray tests run, then the suite.
EXTRAS=test,ray
source "$(dirname "${BASH_SOURCE[0]}")/../examples/env.sh"
python -m pytest "$@"
