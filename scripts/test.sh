#!/usr/bin/env bash
# Set up (or reuse) the environment, then lint (ruff check + ruff format --check) and run the CPU
# test suite: unit tests, the end-to-end server tests and the dry run of the GPU tests that have one
# (DSV41_GPU_TEST_DEVICE=cpu). The GPU tests themselves (tests/gpu) run only where
# CUDA is present: `scripts/test.sh tests/gpu`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$here/scripts/setup_env.sh" | tail -n 1)"
cd "$here"
ruff="$(cat "$here/.venv/.shared")/bin/ruff"  # the shared environment's (requirements/env.txt)
echo "[test] ruff check + ruff format --check" >&2
"$ruff" check .
"$ruff" format --check .
echo "[test] hadolint docker/Dockerfile*; compose file" >&2
"$(cat "$here/.venv/.shared")/bin/hadolint" docker/Dockerfile docker/Dockerfile.cpu
if docker compose version >/dev/null 2>&1; then
  docker compose -f docker/compose.yaml --profile gpu config -q
fi  # without the compose plugin, tests/cpu/test_tools_docker.py checks the file's schema
set +e
"$py" -m pytest -q -p no:cacheprovider ${@:-tests/cpu tests/e2e}
rc=$?
if [ $# -eq 0 ] && [ "$rc" -eq 0 ]; then
  # The GPU tests that can dry-run here (their plumbing, with the torch references and gloo), so
  # a signature change cannot leave them stale until the next GPU run.
  echo "[test] tests/gpu dry run on CPU (DSV41_GPU_TEST_DEVICE=cpu)" >&2
  DSV41_GPU_TEST_DEVICE=cpu DSV41_TP_PROMPT_LENS=20,41 "$py" -m pytest -q -p no:cacheprovider \
    tests/gpu/test_serving_gpu.py tests/gpu/test_tp_attention.py
  rc=$?
fi
set -e
[ "$rc" -eq 5 ] && { echo "no tests collected" >&2; exit 1; }
exit "$rc"
