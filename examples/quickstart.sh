#!/usr/bin/env bash
# A small first example (the main job is examples/demo.sh): sets up .venv, then merges tiny local models with the plugin's methods
# through the stock mergekit-yaml and shows what each merge kept. Offline.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python examples/quickstart.py "$@"
