#!/usr/bin/env bash
# The GPU end-to-end check, on the lent GPU machine: stock SGLang 0.5.23 + this plugin through
# `python -m sglang.launch_server`, held to the CPU oracle by client.py. Prepare first, here:
# bash scripts/gpu_e2e/prepare.sh. Then through the device tool, from the repository root:
#   run(command="bash scripts/gpu_e2e/run_on_device.sh [MODE ...]", carry=[".gpu_e2e/carry"])
# MODE (default: twin triton ref full):
#   twin    no server: the serving path (toy scheduler, torch references) in float64 on the GPU
#           against the fp64 oracle's answers (tools/twin_check.py, chunks of 64, 8 in flight);
#           then the fp32 oracle on the GPU, whose answers the later modes' client takes as a
#           variant for the rounding horizon (run twin first)
#   triton  SGLang's defaults (decode CUDA graphs on), the plugin's Triton kernels, replay on
#   ref     DSV41_FORCE_REF=1 (the kernels' torch references on CUDA), graphs on, replay on
#   full    --no-enable-decoder-swa-bounded-replay (the exact full forward), Triton
#   eager   as triton with --disable-cuda-graph
#   sync    as triton with --disable-overlap-schedule (forwards and scheduling in one stream)
# Every mode: --chunked-prefill-size 64 (prompts of up to 400 tokens prefill in chunks),
# --sampling-backend pytorch --grammar-backend none (flashinfer / xgrammar kernels are not on the
# machine), SGLang's Python radix tree core (its Rust one is built against another torch).
# sgl_kernel is a stub (stubs/): a call to it is logged and counted in the summary.
# Output in $OUT: summary.txt (one VERDICT line per mode), MODE.log, MODE.json, stub_calls.txt.
set -u
OUT=${OUT:-/tmp/gpu_e2e_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
HERE=$ROOT/scripts/gpu_e2e
PY=${PY:-python3}
T0=$(date +%s)
LIMIT=${LIMIT_S:-560}
MODES=("$@")
[ ${#MODES[@]} -eq 0 ] && MODES=(twin triton ref full)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
export PYTHONUNBUFFERED=1

SITE=/tmp/gpu_e2e_site
rm -rf "$SITE" && mkdir -p "$SITE"
for a in .gpu_e2e/carry/site-sglang.tar.xz .gpu_e2e/carry/site-deps.tar.xz; do
  tar -C "$SITE" -xJf "$a" || { say "unpacking $a failed"; exit 1; }
done
# the checkout's package (its data included: prepare.sh leaves it out of the carried wheel)
cp -r sglang_dsv41/. "$SITE/sglang_dsv41/" && cp -r kernels/. "$SITE/sglang_dsv41/kernels/"
export PYTHONPATH=$SITE:$HERE/stubs
export STUB_CALL_LOG=$OUT/stub_calls.txt SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
: > "$STUB_CALL_LOG"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name(0))" 2>&1 | tee -a "$OUT/summary.txt"

# Everything below runs from $OUT: from the checkout's root, `python -m` would import the source
# tree (whose kernels/ sit beside the package) instead of the installed wheel users run.
cd "$OUT"
TINY=/tmp/gpu_e2e_tiny
"$PY" -m sglang_dsv41.tools.make_checkpoint --preset tiny --force --out "$TINY" >/dev/null 2>&1 ||
  { say "make_checkpoint failed"; exit 1; }
REF=$ROOT/.gpu_e2e/carry/reference.json
want=$("$PY" -c "import json; print(json.load(open('$REF'))['checkpoint_sha256'])")
[ "$want" = "$(sha256sum "$TINY/model.safetensors" | cut -d' ' -f1)" ] ||
  say "WARNING: the rebuilt checkpoint differs from the reference's"

run_mode() {  # NAME REPLAY PORT ENV -- FLAGS
  local name=$1 replay=$2 port=$3 envv=$4; shift 5
  local left=$(( LIMIT - ($(date +%s) - T0) ))
  [ "$left" -gt 90 ] || { say "$name: skipped (${left}s left)"; return; }
  say "$name: start, env=[$envv] flags=[$*]"
  setsid env "$envv" "$PY" -m sglang.launch_server --model-path "$TINY" --host 127.0.0.1 \
    --port "$port" --sampling-backend pytorch --grammar-backend none \
    --disable-custom-all-reduce --skip-server-warmup --chunked-prefill-size 64 \
    --mem-fraction-static 0.05 "$@" \
    > "$OUT/$name.log" 2>&1 &
  local pid=$!
  local variants=()
  [ -s "$OUT/oracle32_cuda.json" ] && variants=(--variants "$OUT/oracle32_cuda.json")
  timeout $(( left - 20 )) "$PY" "$HERE/client.py" "http://127.0.0.1:$port" "$REF" \
    "$OUT/$name.json" --mode "$replay" --pid "$pid" --start-timeout $(( left - 80 )) \
    "${variants[@]}" 2>&1 |
    tee -a "$OUT/$name.client.txt" | grep -E "VERDICT|FAIL|server_info" | tee -a "$OUT/summary.txt"
  grep -E "Traceback|Error|CUDA graph|dsv41 KV pool|dsv41 pool sizing" "$OUT/$name.log" |
    grep -v "Ignore import error" | head -n 8 | cut -c1-300 | sed "s/^/  $name.log: /" |
    tee -a "$OUT/summary.txt"
  kill -TERM -- -"$pid" 2>/dev/null
  sleep 3
  kill -KILL -- -"$pid" 2>/dev/null
}

run_twin() {
  say "twin: start"
  timeout $(( LIMIT - ($(date +%s) - T0) - 30 )) "$PY" -m sglang_dsv41.tools.twin_check "$TINY" \
    --answers "$REF" --device cuda --json "$OUT/twin.json" \
    --oracle32-json "$OUT/oracle32_cuda.json" > "$OUT/twin.txt" 2>&1
  grep -E "^twin|VERDICT|len |Error" "$OUT/twin.txt" | head -n 20 | tee -a "$OUT/summary.txt"
}

for m in "${MODES[@]}"; do
  case $m in
    twin)   run_twin ;;
    triton) run_mode triton replay 30001 X=1 -- ;;
    ref)    run_mode ref replay 30002 DSV41_FORCE_REF=1 -- ;;
    full)   run_mode full full 30003 X=1 -- --no-enable-decoder-swa-bounded-replay ;;
    eager)  run_mode eager replay 30004 X=1 -- --disable-cuda-graph ;;
    sync)   run_mode sync replay 30005 X=1 -- --disable-overlap-schedule ;;
    *) say "unknown mode $m" ;;
  esac
done
say "stub calls: $(grep -c ' CALL ' "$STUB_CALL_LOG")"
grep " CALL " "$STUB_CALL_LOG" | sed 's/ pid=.*//' | sort | uniq -c | tee -a "$OUT/summary.txt"
