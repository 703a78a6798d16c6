#!/usr/bin/env bash
# Set up (or reuse) the environment, then serve a V4.1 checkpoint with stock SGLang on CPU.
# With no --model-path, the embedded retrieval model (sglang_dsv41/data/retrieval) is served;
# `--model-path tiny` serves the random tiny model, created under ~/.cache/sglang-dsv41/models.
# Extra arguments go to `python -m sglang.launch_server`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$here/scripts/setup_env.sh" | tail -n 1)"
exec "$py" -m sglang_dsv41.tools.serve "$@"
