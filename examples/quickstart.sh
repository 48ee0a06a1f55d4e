#!/usr/bin/env bash
# The main job: sets up .venv, then merges tiny local models with the plugin's methods
# through the stock mergekit-yaml and shows what each merge kept. Offline.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python examples/quickstart.py "$@"
