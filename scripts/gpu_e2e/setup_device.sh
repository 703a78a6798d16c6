#!/usr/bin/env bash
# On the lent GPU machine, from the repository root: unpack the carried archives into $SITE
# (default /tmp/gpu_e2e_site; it stays while the machine is warm, so a later call may carry
# other archives and find these), write $SITE/env.sh, check that SGLang's kernel libraries
# load natively (torch-2.11 builds: wheels-kernels.txt) and that sglang-kernel's wrappers fit
# the op library's schemas (kernel_abi.py). Prints one line per step; exit status 1 if a
# carried library does not load.
#   bash scripts/gpu_e2e/setup_device.sh        (~1 min: xz)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SITE=${SITE:-/tmp/gpu_e2e_site}
PY=${PY:-python3}
mkdir -p "$SITE"
for a in .gpu_e2e/carry/site-sglang.tar.xz .gpu_e2e/carry/site-deps.tar.xz \
         .gpu_e2e/carry-kernels/site-kernels.tar.xz .gpu_e2e/carry-flashinfer/site-flashinfer.tar.xz; do
  [ -s "$a" ] || continue
  stamp="$SITE/.$(basename "$a").sha"
  sum=$(sha256sum "$a" | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    echo "setup: $a already unpacked"
  elif tar -C "$SITE" -xJf "$a"; then
    echo "$sum" > "$stamp"
    echo "setup: unpacked $a"
  else
    echo "setup: unpacking $a failed"; exit 1
  fi
done
# the carried checkout's package over the wheel's copy, so that a call runs the code it carries
# (kernels/ is installed as sglang_dsv41.kernels)
if [ -d "$SITE/sglang_dsv41" ]; then
  cp -r sglang_dsv41/. "$SITE/sglang_dsv41/" && cp -r kernels/. "$SITE/sglang_dsv41/kernels/" &&
    echo "setup: sglang_dsv41 synced from the checkout"
fi
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
cat > "$SITE/env.sh" <<ENV
export PYTHONPATH=$SITE:$ROOT/scripts/gpu_e2e/preload
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")")}
export PATH=\$CUDA_HOME/bin:\$PATH
export PYTHONUNBUFFERED=1
ENV
. "$SITE/env.sh"
cd /tmp  # not the checkout: `python` would import the source tree instead of the wheel
"$PY" - <<'CHECK'
import importlib, sys
import torch
print(f"setup: torch {torch.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
bad = 0
for name in ("sgl_kernel", "deep_gemm", "flash_mla", "flashinfer", "sglang", "sglang_dsv41"):
    try:
        m = importlib.import_module(name)
    except ModuleNotFoundError as e:
        print(f"setup: {name}: not carried ({e})")
        continue
    except Exception as e:
        bad += 1
        print(f"setup: {name}: FAILED to load: {type(e).__name__}: {str(e)[:300]}")
        continue
    extra = ""
    if name == "sgl_kernel":
        ops = [o for o in dir(torch.ops.sgl_kernel) if not o.startswith("_")]
        extra = f", {len(ops)} ops in torch.ops.sgl_kernel, common_ops {m.common_ops.__file__}"
    print(f"setup: {name} {getattr(m, '__version__', '')} loaded{extra}")
sys.exit(1 if bad else 0)
CHECK
rc=$?
[ -d "$SITE/sgl_kernel" ] && "$PY" "$ROOT/scripts/gpu_e2e/kernel_abi.py" --json "$SITE/kernel_abi.json"
exit $rc
