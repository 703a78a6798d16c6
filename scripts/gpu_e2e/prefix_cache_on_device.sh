#!/usr/bin/env bash
# benchmarks/bench_prefix_cache.py on the lent GPU machine: the retrieval model served by stock
# SGLang 0.5.23 with this plugin (the pure-torch model, Triton / CUDA kernels, decode CUDA graphs
# on), prefix replay on and off. Prepare first, here: bash scripts/gpu_e2e/prepare.sh. Then
# through the device tool, from the repository root:
#   run(command="bash scripts/gpu_e2e/prefix_cache_on_device.sh", carry=[".gpu_e2e/carry"])
# Environment: LENGTHS (default 1024,4096,16384), PARTS (default bytes,ttft,hits), PEER (default
# --peer; empty for prefix replay on only). Server flags as retrieval_on_device.sh (sampling
# pytorch, grammar none, SGLang's Python radix tree core, sgl_kernel stubbed).
# Output in $OUT: prefix_cache.json, prefix_cache.md, the servers' logs, summary.txt.
set -u
OUT=${OUT:-/tmp/gpu_e2e_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
HERE=$ROOT/scripts/gpu_e2e
PY=${PY:-python3}
SITE=${SITE:-/tmp/gpu_e2e_site}
mkdir -p "$SITE"
for a in .gpu_e2e/carry/site-sglang.tar.xz .gpu_e2e/carry/site-deps.tar.xz; do
  tar -C "$SITE" -xJf "$a" || { echo "unpacking $a failed" | tee -a "$OUT/summary.txt"; exit 1; }
done
cp -r sglang_dsv41/. "$SITE/sglang_dsv41/" && cp -r kernels/. "$SITE/sglang_dsv41/kernels/"
export PYTHONPATH=$SITE:$HERE/stubs PYTHONUNBUFFERED=1
export STUB_CALL_LOG=$OUT/stub_calls.txt SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
: > "$STUB_CALL_LOG"
cp benchmarks/bench_prefix_cache.py "$OUT/" && cd "$OUT"  # not the checkout (python -m)
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" \
  2>&1 | tee -a "$OUT/summary.txt"
FLAGS="--sampling-backend pytorch --grammar-backend none --disable-custom-all-reduce"
FLAGS="$FLAGS --skip-server-warmup --mem-fraction-static 0.1"
# shellcheck disable=SC2086
timeout 560 "$PY" "$OUT/bench_prefix_cache.py" --model-path "$SITE/sglang_dsv41/data/retrieval" \
  --lengths "${LENGTHS:-1024,4096,16384}" --parts "${PARTS:-bytes,ttft,hits}" ${PEER---peer} \
  --server-flags "$FLAGS" --out "$OUT" --label "GPU, retrieval model" 2>&1 |
  tail -n 40 | tee -a "$OUT/summary.txt"
echo "stub calls: $(grep -c ' CALL ' "$STUB_CALL_LOG")" | tee -a "$OUT/summary.txt"
