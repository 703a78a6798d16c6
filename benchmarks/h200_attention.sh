#!/usr/bin/env bash
# One call on an H200: install the FlashMLA wheel (the peer and the 64-head prefill path), time
# the sparse attention against it (benchmarks/bench_attention.py, JSON under $OUT), then run its
# GPU tests. Run from a tree holding sglang_dsv41/ (with kernels/ inside it, as installed),
# benchmarks/ and tests/:
#
#   OUT=/tmp/out WHL=path/to/wheels bash benchmarks/h200_attention.sh [bench_attention options]
#
# Stage limits (seconds): BENCH_S (default 200), TEST_S (default 100); JOBS compile processes.
# INDEXER_S > 0 also runs benchmarks/bench_indexer.py for that long (JSON under $OUT).
set -uo pipefail
OUT=${OUT:?set OUT to a directory}
WHL=${WHL:-.whl}
JOBS=${JOBS:-14}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"

timeout "${BENCH_S:-200}" python3 benchmarks/bench_attention.py --jobs "$JOBS" \
    --json "$OUT/attention.json" "$@" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
timeout "${TEST_S:-100}" python3 -m pytest -q -n "$JOBS" -p no:cacheprovider \
    tests/gpu/test_sparse_attn.py tests/gpu/test_cuda_attn.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
if [ "${INDEXER_S:-0}" -gt 0 ]; then
    timeout "$INDEXER_S" python3 benchmarks/bench_indexer.py --out "$OUT" > "$OUT/indexer.log" 2>&1
    echo "indexer rc=$?"
    tail -n 22 "$OUT/indexer.log"
fi
grep -E "passed|failed|error" "$OUT/tests.log" | tail -n 3
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -n 20
tail -n 45 "$OUT/bench.log"
