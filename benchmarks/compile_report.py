"""Registers, spills, shared memory and tensor-core instructions of the sparse-attention kernel's
variants, compiled for SM90 without a GPU (Triton's bundled ptxas; no device needed).

    python benchmarks/compile_report.py [--fp4 0|1] [--split 0|1] [--exact 0|1]

(--exact 1: fp32 queries, the exact path's three-part bf16 products.)

Prints one row per variant: (block_h, block_n, warps, swap, skew, prefetch) -> registers per
thread, spill bytes, shared memory, wgmma / mma.sync instruction counts in the PTX, and whether
the MMA layout of the S product is replicated over warpgroups.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_dsv41.kernels.sparse_attn.triton_kernel import sparse_attn_kernel

# block_h, block_n, num_warps, then swap, skew, prefetch (1 = True); one variant a row
_VARIANT_TABLE = """
 16   64  4 1 0 1
 16   64  4 1 0 0
 16   32  4 1 0 1
 16   64  4 1 1 1
 32   64  4 1 0 1
 32   64  8 1 1 1
 16   32  4 0 0 0
 64   32  8 0 0 0
 64   32  8 0 0 1
 64   32  8 0 1 0
 64   64  8 0 1 0
 64   64  8 0 0 0
 64  128  8 1 0 0
"""
VARIANTS = [
    (*map(int, row[:3]), *(bool(int(x)) for x in row[3:]))
    for row in map(str.split, _VARIANT_TABLE.strip().splitlines())
]


SIG = {
    "q_ptr": "*bf16",
    "stride_qt": "i64",
    "stride_qh": "i64",
    "swa_ptr": "*u8",
    "swa_idx_ptr": "*i32",
    "stride_swt": "i64",
    "kv_ptr": "*u8",
    "kv_idx_ptr": "*i32",
    "stride_kvt": "i64",
    "sink_ptr": "*fp32",
    "o_ptr": "*bf16",
    "stride_ot": "i64",
    "stride_os": "i64",
    "stride_oh": "i64",
    "lse_ptr": "*fp32",
    "H": "i32",
    "W": "i32",
    "TOPK": "i32",
    "num_splits": "i32",
    "qk_scale": "fp32",
}


def divisibility_attrs(sig: dict) -> dict:
    """What the runtime specializes on: pointers, and strides (multiples of 16 here), by 16."""
    div = {}
    for i, (name, ty) in enumerate(sig.items()):
        if ty.startswith("*") or name.startswith("stride"):
            div[(i,)] = [["tt.divisibility", 16]]
    return div


def ptxas_report(ptx: str) -> dict:
    """Registers and spill bytes of one PTX module, from Triton's bundled ptxas."""
    ptxas = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(d, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill = re.search(r"(\d+) bytes spill stores", log)
    return {"regs": regs, "spill_bytes": int(spill.group(1)) if spill else 0}


def compile_variant(v, fp4: bool, split: bool, exact: bool = False) -> dict:
    bh, bn, nw, swap, skew, prefetch = v
    const = dict(
        D=512,
        BH=bh,
        BN=bn,
        KV_FMT=int(fp4),
        KV_RS=288 if fp4 else 528,
        HAS_SINK=True,
        SPLIT=split,
        SWAP=swap,
        SKEW=skew,
        PREFETCH=prefetch,
        DOT_FP32=False,
        ROUND_Q=not exact,
        PREC="tf32",
        EXACT3=exact,
        FAST_DEQ=True,
    )
    sig = dict(SIG, **{k: "constexpr" for k in const})
    if exact:
        sig["q_ptr"] = "*fp32"
    if split:
        sig["o_ptr"] = "*fp32"
    k = triton.compile(
        ASTSource(sparse_attn_kernel, sig, const, attrs=divisibility_attrs(sig)),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=nw, num_stages=1),
    )
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    mmas = re.findall(r"warpsPerCTA = \[(\d+), (\d+)\], instrShape = \[(\d+), (\d+)", ttgir)
    return dict(
        ptxas_report(ptx),
        smem=k.metadata.shared,
        wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
        mma_sync=len(re.findall(r"\bmma\.sync", ptx)),
        mma_layouts=sorted(set(mmas)),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4", type=int, default=1)
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--exact", type=int, default=0)
    ap.add_argument("--only", default=None, help="variants as python tuples, ';'-separated")
    args = ap.parse_args()
    variants = VARIANTS
    if args.only:
        variants = [tuple(eval(x)) for x in args.only.split(";")]
    print("(block_h, block_n, warps, swap, skew, prefetch): regs spill smem wgmma mma.sync")
    for v in variants:
        r = compile_variant(v, bool(args.fp4), bool(args.split), bool(args.exact))
        print(
            f"{v}: {r['regs']} {r['spill_bytes']} {r['smem']} {r['wgmma']} {r['mma_sync']}"
            f"  mma layouts (warps M, N, instr M, N): {r['mma_layouts']}"
        )


if __name__ == "__main__":
    main()
