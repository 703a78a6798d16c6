#!/usr/bin/env bash
# The trained retrieval model (sglang_dsv41/data/retrieval) served by stock SGLang 0.5.23 on the
# lent GPU machine (the pure-torch model with the plugin's Triton / CUDA kernels, decode CUDA
# graphs on) and asked retrieval_eval's questions, replay on and off. Prepare first, here:
# bash scripts/gpu_e2e/prepare.sh. Then through the device tool, from the repository root:
#   run(command="bash scripts/gpu_e2e/retrieval_on_device.sh", carry=[".gpu_e2e/carry"])
# Environment: SPEC (default "1024:20 4096:20 16384:8": prompt tokens : questions per depth),
# REPLAY (default "on off"), MODEL (default the shipped checkpoint), LIMIT_S (default 560),
# PORT (default 31000: the servers take the ports after it);
# SITE=- and EXTRA_FLAGS="--device cpu" run the same steps in this machine's environment (the
# script's own check on CPU: SPEC="1024:1" REPLAY=on PY=.venv/bin/python).
# Server flags as run_on_device.sh's triton mode (--sampling-backend pytorch --grammar-backend
# none, SGLang's Python radix tree core, sgl_kernel stubbed and its calls counted).
# Output in $OUT: summary.txt (the accuracy tables, and each one's comparison with the CPU
# server's records in benchmarks/records/retrieval: tools.retrieval_compare, within 2 points),
# replay_on-LEN.json, replay_off-LEN.json, compare_*.json, server_*.log.
set -u
OUT=${OUT:-/tmp/gpu_e2e_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
HERE=$ROOT/scripts/gpu_e2e
PY=${PY:-python3}
T0=$(date +%s)
LIMIT=${LIMIT_S:-560}
SPEC=${SPEC:-"1024:20 4096:20 16384:8"}
REPLAY=${REPLAY:-"on off"}
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1

SITE=${SITE:-/tmp/gpu_e2e_site}
read -r -a EXTRA <<< "${EXTRA_FLAGS:-}"
if [ "$SITE" != - ]; then
  mkdir -p "$SITE"
  for a in .gpu_e2e/carry/site-sglang.tar.xz .gpu_e2e/carry/site-deps.tar.xz; do
    tar -C "$SITE" -xJf "$a" || { say "unpacking $a failed"; exit 1; }
  done
  # this checkout's package over the wheel's copy (kernels/ is installed as sglang_dsv41.kernels)
  cp -r sglang_dsv41/. "$SITE/sglang_dsv41/" && cp -r kernels/. "$SITE/sglang_dsv41/kernels/"
  export PYTHONPATH=$SITE:$HERE/stubs
fi
MODEL=${MODEL:-/tmp/retrieval_model}
[ "$MODEL" = /tmp/retrieval_model ] && rm -rf "$MODEL" && cp -r sglang_dsv41/data/retrieval "$MODEL"
export STUB_CALL_LOG=$OUT/stub_calls.txt SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
: > "$STUB_CALL_LOG"
cd "$OUT"  # not the checkout: `python -m` would import the source tree
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name(0))" 2>&1 | tee -a "$OUT/summary.txt"
say "model $MODEL: $(sha256sum "$MODEL/model.safetensors" | cut -c1-16)"

serve() {  # NAME PORT FLAGS...
  local name=$1 port=$2; shift 2
  setsid "$PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$port" \
    --sampling-backend pytorch --grammar-backend none --disable-custom-all-reduce \
    --skip-server-warmup --mem-fraction-static 0.1 "${EXTRA[@]}" "$@" > "$OUT/server_$name.log" 2>&1 &
  SP=$!
  for _ in $(seq 1 150); do
    curl -sf "127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$SP" 2>/dev/null || break
    sleep 2
  done
  say "$name: server did not come up"
  grep -E "Traceback|Error" "$OUT/server_$name.log" | head -n 8 | cut -c1-300 | tee -a "$OUT/summary.txt"
  return 1
}
stop() { kill -TERM -- -"$SP" 2>/dev/null; sleep 3; kill -KILL -- -"$SP" 2>/dev/null; }

port=${PORT:-31000}
VERDICTS=()
for r in $REPLAY; do
  port=$((port + 1))
  flags=()
  [ "$r" = off ] && flags=(--no-enable-decoder-swa-bounded-replay)
  [ "$(left)" -gt 120 ] || { say "replay $r: skipped ($(left) s left)"; continue; }
  serve "replay_$r" "$port" "${flags[@]}" || { stop; continue; }
  say "replay $r: server up"
  for s in $SPEC; do
    n=${s%%:*}; k=${s#*:}
    [ "$(left)" -gt 60 ] || { say "replay $r $n: skipped ($(left) s left)"; continue; }
    t=$(date +%s)
    timeout $(( $(left) - 30 )) "$PY" -m sglang_dsv41.tools.retrieval_eval \
      --url "http://127.0.0.1:$port" --lengths "$n" --per-cell "$k" \
      --label "GPU, replay $r" --json "$OUT/replay_$r-$n.json" \
      > "$OUT/replay_$r-$n.txt" 2> "$OUT/replay_$r-$n.progress"
    say "replay $r, $n tokens x $k per depth ($(( $(date +%s) - t )) s):"
    tee -a "$OUT/summary.txt" < "$OUT/replay_$r-$n.txt"
    cpu=$ROOT/benchmarks/records/retrieval/cpu-replay_$r-$n.json
    if [ -f "$cpu" ] && [ -f "$OUT/replay_$r-$n.json" ]; then
      say "against the CPU server's records (base: CPU, new: this GPU):"
      "$PY" -m sglang_dsv41.tools.retrieval_compare --base "$cpu" --new "$OUT/replay_$r-$n.json" \
        --json "$OUT/compare_replay_$r-$n.json" 2>&1 | tee -a "$OUT/summary.txt"
      case ${PIPESTATUS[0]} in
        0) VERDICTS+=("replay $r $n: within 2 points") ;;
        1) VERDICTS+=("replay $r $n: NOT within 2 points") ;;
        *) VERDICTS+=("replay $r $n: not compared") ;;
      esac
    else
      VERDICTS+=("replay $r $n: no result or no CPU record")
    fi
  done
  grep -E "Traceback|CUDA graph|dsv41 KV pool" "$OUT/server_replay_$r.log" | head -n 4 |
    cut -c1-300 | sed "s/^/  server: /" | tee -a "$OUT/summary.txt"
  stop
done
say "stub calls: $(grep -c ' CALL ' "$STUB_CALL_LOG")"
grep " CALL " "$STUB_CALL_LOG" | sed 's/ pid=.*//' | sort | uniq -c | tee -a "$OUT/summary.txt"
say "against the CPU records:"
printf '  %s\n' "${VERDICTS[@]}" | tee -a "$OUT/summary.txt"
