#!/usr/bin/env bash
# This package against stock SGLang's own V4.1, both serving flash-slice on the lent H200
# (docs/h200_head_to_head.md). Prepare here first:
#   bash scripts/gpu_e2e/prepare.sh --kernels [--flashinfer]
# then, through the device tool, from the repository root, STEPs in order (one call can take
# several; state under /tmp stays while the machine is warm):
#   bash scripts/gpu_e2e/head_to_head.sh STEP...
# STEP:
#   setup    unpack the carried archives, check the kernel libraries load and fit their wrappers
#   ops      tests/gpu/test_sglang_ops_h200.py: SGLang's ops on the V4.1 path against torch
#   prebuild in the background, the ops test's MoE / FP8 / mHC tests: SGLang's JIT modules (the
#            Marlin MoE module is minutes of nvcc) built into the machine's caches while the
#            slice is written; `wait` waits for it (a server's first forward would build them)
#   slice    write flash-slice (tools.flash_slice) to $SLICE unless it is there already
#   correct  stock, then ours: greedy continuations, ours' teacher-forced view of stock's,
#            op census and stub calls of both (tools.agreement run)
#   oracle   the oracle (experts packed, served numerics) scores ours'; the verdicts
#   bench    benchmarks/head_to_head.py: the table, both servers in this one call
#   table    correct and bench on one start of each server (stock first: its continuations,
#            then the points; ours: continuations, teacher-forced scores, points), the census,
#            the stub count and the verdict on ours vs stock
#   warm     start one side's server (WARM_SIDE, ours) with the table's flags, two requests,
#            stop: its time to ready, its first answers, and the kernel builds (DeepGEMM,
#            Marlin JIT) cached on the machine for later starts of either side
#   dslice   write flash-slice with its DSpark head (--dspark) to $DSLICE unless it is there;
#            the plain slice is removed first when the disk would not hold both
#   dspark   tests/gpu/test_dspark_h200.py on $DSLICE: plain and --speculative-algorithm DSPARK
#            servers of each side in DSPARK_SIDES (ours), speculative greedy = plain greedy,
#            acceptance length and TPOT (dspark_<side>.json)
# Environment: PROFILE (marlin-triton; tools/head_to_head.py PROFILES), MOE_BACKEND (the ops test's
#   runner: marlin, or flashinfer_mxfp4 with the flashinfer profile), SLICE (/tmp/flash_slice),
#   DSLICE (/tmp/flash_slice_dspark), DSPARK_EXPERTS (16), DSPARK_SIDES (ours; ours,stock),
#   WORK (/tmp/h2h), OUT (what comes back: summary.txt, agreement.json, head_to_head.json /
#   .md / .png, ops.txt, dspark_*.json, logs.tar.xz).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/gpu_e2e
OUT=${OUT:-/tmp/h2h_out}
WORK=${WORK:-/tmp/h2h}
SLICE=${SLICE:-/tmp/flash_slice}
DSLICE=${DSLICE:-/tmp/flash_slice_dspark}
SITE=${SITE:-/tmp/gpu_e2e_site}
PROFILE=${PROFILE:-marlin-triton}  # DeepGEMM 0.1.4 takes no 32x32 UE8M0 blocks (docs)
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
env_ok() { [ -s "$SITE/env.sh" ] || { say "run the setup step first"; return 1; }; . "$SITE/env.sh"; }
pack_logs() {
  (cd "$WORK" && find . -maxdepth 3 \( -name '*.log' -o -name '*.txt' \) -print0 |
    tar --null -T - -cJf "$OUT/logs.tar.xz") 2>/dev/null
}

step_setup() { bash "$HERE/setup_device.sh" 2>&1 | tee -a "$OUT/summary.txt"; }

profile_env() {  # the profile's environment (as both servers get it) and the ops test's runners
  eval "$("$PY" -c "import shlex; from sglang_dsv41.tools.head_to_head import PROFILES
print(' '.join(f'export {k}={shlex.quote(v)};' for k, v in PROFILES['$PROFILE'].env.items()))")"
  export DSV41_MOE_BACKEND=${MOE_BACKEND:-marlin} DSV41_FP8_GEMM_BACKEND=auto
  [ "$PROFILE" = flashinfer ] && export DSV41_MOE_BACKEND=${MOE_BACKEND:-flashinfer_mxfp4}
  [ "$PROFILE" = marlin-triton ] && export DSV41_FP8_GEMM_BACKEND=triton
  return 0
}

step_ops() {
  env_ok || return
  cd /tmp
  profile_env
  DSV41_OP_CENSUS=$WORK/census_ops timeout "${OPS_TIMEOUT_S:-420}" \
    "$PY" -m pytest -q -p no:cacheprovider -rs "$ROOT/tests/gpu/test_sglang_ops_h200.py" 2>&1 |
    tee "$OUT/ops.txt" | tail -n 25 | tee -a "$OUT/summary.txt"
  say "census of the ops test:"
  "$PY" "$HERE/preload/op_census.py" "$WORK/census_ops" | head -n 40 | tee -a "$OUT/summary.txt"
}

step_prebuild() {  # in the background: the ops test's MoE / FP8 / mHC tests build SGLang's JIT
  env_ok || return  # modules (Marlin MoE: minutes of nvcc) into the machine's caches
  cd /tmp
  (
    profile_env
    timeout "${PREBUILD_TIMEOUT_S:-540}" "$PY" -m pytest -q -p no:cacheprovider \
      "$ROOT/tests/gpu/test_sglang_ops_h200.py" -k "moe_block or mhc or fp8_block_linear" \
      >"$WORK/prebuild.txt" 2>&1
    echo "rc=$?" >>"$WORK/prebuild.txt"
  ) &
  echo $! >"$WORK/prebuild.pid"
  say "prebuild: started (pid $(cat "$WORK/prebuild.pid")); the step wait waits for it"
}

step_wait() {
  local pid t0
  pid=$(cat "$WORK/prebuild.pid" 2>/dev/null) || { say "wait: no prebuild"; return; }
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do sleep 3; done
  say "wait: prebuild finished ($(( $(date +%s) - t0 )) s waited): $(tail -n 2 "$WORK/prebuild.txt" | tr '\n' ' ')"
  rm -f "$WORK/prebuild.pid"
}

step_slice() {
  env_ok || return
  cd /tmp
  if [ -s "$SLICE/model.safetensors.index.json" ]; then
    say "slice: $SLICE already written"
  else
    say "slice: writing to $SLICE"
    "$PY" -m sglang_dsv41.tools.flash_slice --out "$SLICE" --force 2>&1 | tail -n 12 |
      tee -a "$OUT/summary.txt"
  fi
  df -h "$SLICE" | tail -n 1 | sed 's/^/  disk: /' | tee -a "$OUT/summary.txt"
}

census() {  # SIDE: the op census and the stub count of that side's server
  local d=$WORK/agreement/census_$1
  [ -d "$d" ] || return
  say "census $1 (calls into SGLang's kernel libraries):"
  "$PY" "$HERE/preload/op_census.py" "$d" | head -n 40 | tee -a "$OUT/summary.txt"
  "$PY" "$HERE/kernel_abi.py" "$d" 2>&1 | grep -E "REACHED|differences" | tee -a "$OUT/summary.txt"
  say "stub calls $1: $(grep -rc ' CALL ' "${STUB_CALL_LOG:-/dev/null}" 2>/dev/null || echo 0)"
}

step_correct() {
  env_ok || return
  cd /tmp
  export STUB_CALL_LOG=$WORK/stub_calls.txt
  : > "$STUB_CALL_LOG"
  timeout 560 "$PY" -m sglang_dsv41.tools.agreement run --model-path "$SLICE" \
    --work "$WORK/agreement" --profile "$PROFILE" 2>&1 | tail -n 20 | tee -a "$OUT/summary.txt"
  census stock
  census ours
  grep -hE "Traceback|Error|in-tree DeepseekV4|plugin left out|max_total_num_tokens=" \
    "$WORK"/agreement/*.log | cut -c1-250 | head -n 20 | tee -a "$OUT/summary.txt"
  cp "$WORK"/agreement/*.json "$OUT/" 2>/dev/null
}

step_oracle() {
  env_ok || return
  cd /tmp
  timeout 560 "$PY" -m sglang_dsv41.tools.agreement oracle --model-path "$SLICE" \
    --work "$WORK/agreement" 2>&1 | tail -n 5 | tee -a "$OUT/summary.txt"
  "$PY" -m sglang_dsv41.tools.agreement judge --work "$WORK/agreement" 2>&1 |
    tee -a "$OUT/summary.txt"
  cp "$WORK/agreement/agreement.json" "$OUT/" 2>/dev/null
}

step_bench() {
  env_ok || return
  cd /tmp
  timeout "${TABLE_TIMEOUT_S:-580}" "$PY" "$ROOT/benchmarks/head_to_head.py" --model-path "$SLICE" \
    --profile "$PROFILE" --work "$WORK/bench" --out "$OUT" --budget-s "${BUDGET_S:-540}" 2>&1 |
    tail -n 30 |
    tee -a "$OUT/summary.txt"
}

step_table() {
  env_ok || return
  cd /tmp
  export STUB_CALL_LOG=$WORK/stub_calls.txt
  : > "$STUB_CALL_LOG"
  timeout "${TABLE_TIMEOUT_S:-580}" "$PY" "$ROOT/benchmarks/head_to_head.py" --model-path "$SLICE" \
    --profile "$PROFILE" --work "$WORK/bench" --out "$OUT" --budget-s "${BUDGET_S:-540}" \
    --agreement "$WORK/agreement" 2>&1 | tail -n 30 | tee -a "$OUT/summary.txt"
  census stock
  census ours
  grep -hE "Traceback|Error|in-tree DeepseekV4|plugin left out|max_total_num_tokens=" \
    "$WORK"/bench/*/server.log | cut -c1-250 | head -n 20 | tee -a "$OUT/summary.txt"
  "$PY" -m sglang_dsv41.tools.agreement judge --work "$WORK/agreement" 2>&1 |
    tee -a "$OUT/summary.txt"
  cp "$WORK"/agreement/agreement.json "$OUT/" 2>/dev/null
}

step_warm() {
  env_ok || return
  cd /tmp
  local side=${WARM_SIDE:-ours} t=${WARM_TIMEOUT_S:-300}
  say "warm: $side, at most $t s"
  rm -rf "$WORK/census_warm_$side"
  DSV41_OP_CENSUS=$WORK/census_warm_$side DSV41_STACK_EVERY_S=${STACK_EVERY_S:-} \
    timeout -s TERM "$t" \
    "$PY" - "$side" "$SLICE" "$WORK" "$PROFILE" "$t" <<'WARM' 2>&1 |
import signal, sys, time
from pathlib import Path
from sglang_dsv41.tools import agreement
from sglang_dsv41.tools.head_to_head import Server, Settings
side, slice_dir, work, profile, t = sys.argv[1:6]
signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))  # the server is stopped on the way out
with Server(side, slice_dir, Path(work) / f"warm_{side}.log", Settings(profile=profile)) as srv:
    try:
        print(f"warm: {side} ready in {srv.wait_ready(float(t)):.0f} s", flush=True)
        for n in (64, 4000, 4000):
            t0 = time.time()
            out = agreement.generate(srv.url, [[5 + i % 90 for i in range(n)]], 8)
            print(f"warm: {n} tokens in {time.time() - t0:.1f} s: {out}", flush=True)
    except BaseException as e:
        print(f"warm: {side} FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        print(srv.tail(60), flush=True)
        raise
WARM
    tail -n 70 | cut -c1-400 | tee -a "$OUT/summary.txt"
  grep -hE "Traceback|Error|max_total_num_tokens=" "$WORK/warm_$side.log" | cut -c1-250 |
    head -n 10 | tee -a "$OUT/summary.txt"
  say "census warm $side:"
  "$PY" "$HERE/preload/op_census.py" "$WORK/census_warm_$side" | head -n 40 | tee -a "$OUT/summary.txt"
  "$PY" "$HERE/kernel_abi.py" "$WORK/census_warm_$side" 2>&1 | grep -E "REACHED|differences|registered" |
    tee -a "$OUT/summary.txt"
}

step_dslice() {
  env_ok || return
  cd /tmp
  if [ -s "$DSLICE/model.safetensors.index.json" ]; then
    say "dslice: $DSLICE already written"
  else
    local need free
    need=$("$PY" -m sglang_dsv41.tools.flash_slice --report --json --dspark \
      --dspark-experts "${DSPARK_EXPERTS:-16}" | "$PY" -c "import json,sys
print(int(json.load(sys.stdin)['weights_gib']) + 4)")
    free=$(df -BG --output=avail /tmp | tail -n 1 | tr -dc 0-9)
    if [ "$free" -lt "$need" ] && [ -d "$SLICE" ]; then
      say "dslice: ${free} GiB free, ${need} GiB needed: removing the plain slice $SLICE"
      rm -rf "$SLICE"
    fi
    say "dslice: writing to $DSLICE (DSpark stages of ${DSPARK_EXPERTS:-16} routed experts)"
    "$PY" -m sglang_dsv41.tools.flash_slice --out "$DSLICE" --force --dspark \
      --dspark-experts "${DSPARK_EXPERTS:-16}" 2>&1 | tail -n 13 | tee -a "$OUT/summary.txt"
  fi
  df -h "$DSLICE" | tail -n 1 | sed 's/^/  disk: /' | tee -a "$OUT/summary.txt"
}

step_dspark() {
  env_ok || return
  cd /tmp
  profile_env
  DSV41_FLASH_SLICE_DSPARK=$DSLICE DSV41_DSPARK_OUT=$WORK/dspark \
    DSV41_DSPARK_SIDES=${DSPARK_SIDES:-ours} PROFILE=$PROFILE timeout 580 \
    "$PY" -m pytest -q -s -p no:cacheprovider -rs "$ROOT/tests/gpu/test_dspark_h200.py" 2>&1 |
    tee "$WORK/dspark.txt" | grep -E '^\{|passed|failed|Error|assert' | tail -n 20 |
    tee -a "$OUT/summary.txt"
  cp "$WORK"/dspark/dspark_*.json "$OUT/" 2>/dev/null
  grep -hE "Traceback|Error|DSpark draft|attention_backend=|accept" "$WORK"/dspark/*.log |
    cut -c1-250 | head -n 20 | tee -a "$OUT/summary.txt"
}

[ $# -gt 0 ] || set -- setup ops slice
for s in "$@"; do
  case $s in
    setup|ops|prebuild|wait|slice|correct|oracle|bench|table|warm|dslice|dspark) say "step $s (profile $PROFILE)"; "step_$s" ;;
    *) say "unknown step $s" ;;
  esac
done
pack_logs
say "done"
