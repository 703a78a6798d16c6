#!/usr/bin/env bash
# The one command that checks this package on a stock SGLang GPU node (SGLang 0.5.23 with its
# CUDA kernels and flashinfer installed, this package pip-installed):
#   bash scripts/gpu_node_check.sh [--tp 1,2] [--new 12] [--server-args "..."] [--work DIR]
# It writes the released-format flash-mini checkpoint (hidden and expert widths 256, which
# SGLang's SM90 FP4 MoE runner needs), computes the CPU oracle's greedy outputs
# with the activation-quantization switch (FP8 linears' inputs quantized as SGLang does), serves
# it with `python -m sglang.launch_server --model-path DIR --tp N` for N in 1 and 2 (when
# the node has the GPUs), compares, and prints one verdict line:
#   gpu_node_check: PASS tp=1 6/6 (...), tp=2 6/6 (...) (tolerance 0.25 nats)
# Exit status: 0 PASS, 1 FAIL, 2 nothing served. Server logs stay in the work directory.
set -euo pipefail
PY=${PYTHON:-python3}
"$PY" -c "import sglang, sglang_dsv41" || {
  echo "gpu_node_check: FAIL (sglang and sglang_dsv41 must both be importable by $PY)"
  exit 2
}
exec "$PY" -m sglang_dsv41.tools.node_check "$@"
