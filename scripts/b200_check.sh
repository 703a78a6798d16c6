#!/usr/bin/env bash
# Check the SM100 kernel paths (DeepGEMM indexer, FlashMLA attention) against the torch
# references on one B200 / B300 (SM100 / SM103) GPU, kernel level, no server: prints one verdict
# line. Needs sgl-deep-gemm and sgl-flash-mla (SGLang's GPU dependencies). Uses $PYTHON, or the
# project environment (scripts/setup_env.sh). Written without SM100 hardware; never run here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$("$here/scripts/setup_env.sh" | tail -n 1)}"
cd "$here"
exec "$py" -m sglang_dsv41.kernels.sm100_check "$@"
