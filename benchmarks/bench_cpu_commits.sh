#!/usr/bin/env bash
# CPU serving of two commits side by side in one run: `launch_server` on tiny and small for each
# tree, `benchmarks/serve_bench.py` at concurrency 1 and 16 against each, one compare per model.
#   bash benchmarks/bench_cpu_commits.sh OLD_COMMIT [OUT_DIR]
# The old tree is a git worktree with its own thin venv over the shared environment (the plugin
# installed editable from it, as scripts/setup_env.sh does for a checkout); both run with one
# torch thread (OMP_NUM_THREADS=1) so the serving code, not the thread default, is compared.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
OLD=${1:?usage: bench_cpu_commits.sh OLD_COMMIT [OUT]}
OUT=${2:-/tmp/bench_cpu_commits}
PY=$ROOT/.venv/bin/python
mkdir -p "$OUT"
TREE=$OUT/old-tree
[ -d "$TREE" ] || git -C "$ROOT" worktree add -q --detach "$TREE" "$OLD"
OLDPY=$OUT/venv-old/bin/python
if [ ! -x "$OLDPY" ]; then
  python3 -m venv --without-pip "$OUT/venv-old"
  shared=$(cat "$ROOT/.venv/.shared")
  site=$("$OLDPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    > "$site/_shared.pth"
  "$OLDPY" -m pip install -q --no-deps --no-build-isolation -e "$TREE" > /dev/null
fi
for m in tiny small; do
  [ -f "$OUT/ckpt/$m/config.json" ] ||
    "$PY" -m sglang_dsv41.tools.make_checkpoint --preset "$m" --out "$OUT/ckpt/$m" >/dev/null
done
run() {  # LABEL PYTHON MODEL PORT
  local label=$1 py=$2 m=$3 port=$4
  # started from $OUT: a checkout in the working directory would shadow the tree under test
  (cd "$OUT" && OMP_NUM_THREADS=1 exec setsid "$py" -m sglang.launch_server --model-path \
    "$OUT/ckpt/$m" --device cpu --host 127.0.0.1 --port "$port" > "$OUT/$label-$m.log" 2>&1) &
  local pid=$!
  for _ in $(seq 600); do
    grep -q "fired up" "$OUT/$label-$m.log" && break
    kill -0 "$pid" 2>/dev/null || { echo "server $label $m exited"; return 1; }
    sleep 1
  done
  "$PY" "$ROOT/benchmarks/serve_bench.py" --url "http://127.0.0.1:$port" \
    --concurrency 1,16 --input-len 128 --output-len 32 --rounds 2 --label "$label $m" \
    --out "$OUT/$label-$m"
  kill -TERM -- -"$pid" 2>/dev/null || true
  sleep 3
  kill -KILL -- -"$pid" 2>/dev/null || true
}
for m in tiny small; do
  run old "$OLDPY" "$m" 31701
  run new "$PY" "$m" 31702
  "$PY" "$ROOT/benchmarks/serve_bench.py" --compare "$OUT/old-$m/serve_bench.json" \
    "$OUT/new-$m/serve_bench.json" --out "$OUT/compare-$m"
done
cat "$OUT"/compare-*/compare.md
