#!/usr/bin/env bash
# Build the torch-2.11 shim against a torch's libraries:
#   bash scripts/gpu_e2e/shim/build.sh OUT.so [TORCH_LIB_DIR]
# TORCH_LIB_DIR defaults to the lib/ folder of the torch that python3 imports (on the lent GPU
# machine: its torch 2.11). Links with --no-undefined, so a twin that torch lacks fails here.
set -euo pipefail
OUT=${1:?usage: build.sh OUT.so [TORCH_LIB_DIR]}
HERE=$(cd "$(dirname "$0")" && pwd)
LIB=${2:-$(${PY:-python3} -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")}
${CXX:-g++} -std=c++17 -O2 -fPIC -shared -o "$OUT" "$HERE/torch211_shim.cpp" \
  -L"$LIB" -Wl,-rpath,"$LIB" -Wl,--no-undefined -Wl,--no-as-needed -lc10 -lc10_cuda -ltorch_cpu
echo "built $OUT against $LIB"
