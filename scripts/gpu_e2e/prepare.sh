#!/usr/bin/env bash
# Prepare, on this CPU machine, what run_on_device.sh (and head_to_head.sh) need on the lent GPU
# machine (which has torch 2.11 + Triton 3.6 but no SGLang and no network). Run from the
# repository root:
#   bash scripts/gpu_e2e/prepare.sh [--kernels] [--flashinfer]   (~5-8 min the first time, xz)
# Writes .gpu_e2e/ (git-ignored):
#   whl/                         sglang 0.5.23 and the wheels in wheels.txt (cp312, x86_64),
#                                and this checkout's own wheel
#   carry/site-sglang.tar.xz     sglang installed with pip --target, xz-packed (zipped wheels
#   carry/site-deps.tar.xz       are over the 64 MiB a device call carries; xz makes ~42 MB)
#   carry/reference.json         prompts and the CPU oracle's answers (reference.py)
# With --kernels (SGLang's compiled kernels, wheels-kernels.txt; head_to_head.sh):
#   carry-kernels/site-kernels.tar.xz   sglang-kernel's Python package with only a Hopper op
#                                library, and that library (sm90/common_ops.abi3.so) taken from
#                                the torch-2.11 build named "# op library" in wheels-kernels.txt
#                                (the 1.1 GB FlashAttention-3 library, the SM100 build and the
#                                legacy FlashMLA ops are left out), sgl-deep-gemm's torch-2.11
#                                build (its JIT headers included), sgl-flash-mla
# With --flashinfer (wheels-flashinfer.txt: SGLang's default SM90 FP4 MoE runner and mHC
# pre-GEMM; compiled at first use by its JIT):
#   carry-flashinfer/site-flashinfer.tar.xz
# Then, with the device tool: run(command="bash scripts/gpu_e2e/run_on_device.sh",
#   carry=[".gpu_e2e/carry"], timeout_s=600); head_to_head.sh says what it carries.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
HERE=scripts/gpu_e2e
PY=${PY:-$ROOT/.venv/bin/python}
W=.gpu_e2e/whl
C=.gpu_e2e/carry
KERNELS=0 FLASHINFER=0
for a in "$@"; do
  case $a in
    --kernels) KERNELS=1 ;;
    --flashinfer) FLASHINFER=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$W" "$C"
rm -f "$W"/*.whl
PLAT=()
for p in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
  PLAT+=(--platform "$p")
done
download() {  # DIR pip-requirement-args...
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" --platform any -d "$dir" "$@"
}
download "$W" sglang==0.5.23 -r "$HERE/wheels.txt"
# this checkout (tracked and untracked files) as a wheel: its entry point loads the plugin
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
git ls-files -z -co --exclude-standard | tar -c --null -T - -f - | tar -x -C "$SRC"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$W" "$SRC"

PRUNE=()
OVERLAY=
OPLIB=sgl_kernel/sm90/common_ops.abi3.so
pack() {  # ARCHIVE WHEEL...  (paths in PRUNE, relative to the site, are left out)
  local out=$1; shift
  rm -rf "$SRC/site"
  python3 -m pip install -q --no-deps --no-compile --no-index --only-binary=:all: \
    --python-version 3.12 --implementation cp "${PLAT[@]}" --target "$SRC/site" "$@"
  rm -rf "$SRC/site/bin"
  for p in "${PRUNE[@]}"; do
    rm -rf "$SRC"/site/$p
  done
  if [ -n "$OVERLAY" ]; then  # the op library of another sglang-kernel wheel over the installed one
    unzip -o -q -d "$SRC/site" "$OVERLAY" "$OPLIB"
    echo "prepare: $OPLIB from $(basename "$OVERLAY")"
  fi
  tar -C "$SRC/site" -cf - --sort=name --mtime=@0 --owner=0 --group=0 . | xz -T0 -6 > "$out"
}
SGL=$(ls "$W"/sglang-0.5.23-*.whl)
# what launch_server never loads, left out so that a call's carry stays under 64 MiB: the Rust
# gRPC / Rust-server / bench extensions (39 MB; loaded only for --grpc-mode and the Rust server)
# and the diffusion package multimodal_gen (23 MB)
PRUNE=('sglang/srt/rust_extensions/_bench.*.so' 'sglang/srt/rust_extensions/_grpc.*.so'
       'sglang/srt/rust_extensions/_server.*.so' sglang/multimodal_gen)
stamp=$( { sha256sum "$SGL"; echo "${PRUNE[*]}"; } | sha256sum | cut -c1-16)
if [ "$(cat "$C/site-sglang.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -s "$C/site-sglang.tar.xz" ]
then
  pack "$C/site-sglang.tar.xz" "$SGL"
  echo "$stamp" > "$C/site-sglang.stamp"
fi
PRUNE=()
# this package's data (the retrieval model's 10 MB of weights) travels with the checkout, which
# setup_device.sh lays over the wheel's package
PRUNE=(sglang_dsv41/data)
pack "$C/site-deps.tar.xz" $(ls "$W"/*.whl | grep -v "/sglang-0.5.23-")
PRUNE=()

if [ "$KERNELS" = 1 ]; then
  K=.gpu_e2e/whl-kernels
  L=.gpu_e2e/whl-oplib
  mkdir -p "$K" "$L" .gpu_e2e/carry-kernels
  rm -f "$K"/*.whl
  grep -v '^sglang-kernel==.*# op library' "$HERE/wheels-kernels.txt" > "$SRC/kernels.txt"
  download "$K" -r "$SRC/kernels.txt"
  oplib=$(sed -n 's/^\(sglang-kernel==[^ ]*\) *# op library.*/\1/p' "$HERE/wheels-kernels.txt")
  [ -n "$(ls "$L"/*.whl 2>/dev/null)" ] && [ "$(cat "$L/pin" 2>/dev/null)" = "$oplib" ] ||
    { rm -f "$L"/*.whl; download "$L" "$oplib" && echo "$oplib" > "$L/pin"; }
  # sglang-kernel's wheel is 373 MB: keep its Python files and the Hopper op library only;
  # the op library is the torch-2.11 build's (wheels-kernels.txt), under the newer wrappers
  PRUNE=(sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/sm100
         'sgl_kernel/infllm_ops.*.so')
  OVERLAY=$(ls "$L"/sglang_kernel-*.whl)
  pack .gpu_e2e/carry-kernels/site-kernels.tar.xz "$K"/*.whl
  OVERLAY=
fi
if [ "$FLASHINFER" = 1 ]; then
  F=.gpu_e2e/whl-flashinfer
  mkdir -p "$F" .gpu_e2e/carry-flashinfer
  rm -f "$F"/*.whl
  download "$F" -r "$HERE/wheels-flashinfer.txt"
  PRUNE=(flashinfer/experimental flashinfer/data/csrc/kda flashinfer/data/csrc/gdn
         'flashinfer/data/csrc/cake_*')
  pack .gpu_e2e/carry-flashinfer/site-flashinfer.tar.xz "$F"/*.whl
fi

"$PY" -m sglang_dsv41.tools.make_checkpoint --preset tiny --force --out "$SRC/tiny" >/dev/null
# the oracle's answers are recomputed only when the checkpoint or the script that makes them
# changed (the reference model itself is covered by the CPU tests)
rstamp=$(cat "$SRC/tiny/model.safetensors" "$HERE/reference.py" | sha256sum | cut -c1-16)
if [ "$(cat "$C/reference.stamp" 2>/dev/null)" != "$rstamp" ] || [ ! -s "$C/reference.json" ]; then
  "$PY" "$HERE/reference.py" "$SRC/tiny" "$C/reference.json"
  echo "$rstamp" > "$C/reference.stamp"
fi
du -sh "$C"/* .gpu_e2e/carry-*/* 2>/dev/null
