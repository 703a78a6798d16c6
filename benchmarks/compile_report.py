"""Registers, spills, shared memory and tensor-core instructions of the Triton variants the plan
chooses, compiled for SM90 without a GPU (Triton's bundled ptxas; no device needed).

    python benchmarks/compile_report.py [--fp4 0|1] [--split 0|1] [--exact 0|1] [--heads 8,64]

(--exact 1: fp32 queries, the exact path's three-part bf16 products; --fp4 0: V41 main-KV
records. Workspace variants read bf16 rows whatever --fp4 says.)

Prints one row per Triton variant and head count with its tiles (`variants.Tiles`: block_h,
block_n, warps, stages, swap, skew, prefetch) -> registers per thread, spill bytes, shared
memory, wgmma / mma.sync instruction counts in the PTX, and the MMA layouts (whether the S
product is replicated over warpgroups).
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

from sglang_dsv41.kernels.sparse_attn import plan as plan_mod
from sglang_dsv41.kernels.sparse_attn.triton_kernel import sparse_attn_kernel
from sglang_dsv41.kernels.sparse_attn.variants import SPECS, Tiles, Triton

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


def triton_rows(heads, exact: bool) -> dict:
    """{(variant name, H): (Triton spec, tiles)} of the Triton variants the plan chooses at each
    of `heads` (one row per distinct launch)."""
    rows, seen = {}, set()
    for H in heads:
        for v in plan_mod.variants_at(H, exact):
            spec = SPECS[v]
            if isinstance(spec, Triton):
                tiles = spec.tiles(H, exact)
                if (v, tiles) not in seen:
                    seen.add((v, tiles))
                    rows[(v.value, H)] = (spec, tiles)
    return rows


def compile_variant(t: Tiles, kv_fmt: int, split: bool, exact: bool, ieee: bool) -> dict:
    """kv_fmt: 0 V41 records, 1 V41_FP4, 2 bf16 workspace rows (the launcher's constexprs)."""
    const = dict(
        D=512,
        BH=t.block_h,
        BN=t.block_n,
        KV_FMT=kv_fmt,
        KV_RS=(528, 288, 512)[kv_fmt],
        HAS_SINK=True,
        SPLIT=split,
        SWAP=t.swap,
        SKEW=t.skew,
        PREFETCH=t.prefetch,
        DOT_FP32=exact and ieee,
        ROUND_Q=not exact,
        PREC="ieee" if exact else "tf32",
        EXACT3=exact and not ieee,
        FAST_DEQ=True,  # the kernel's default, which the launcher keeps
    )
    sig = dict(SIG, **{k: "constexpr" for k in const})
    if exact:
        sig["q_ptr"] = "*fp32"
    if split:
        sig["o_ptr"] = "*fp32"
    if kv_fmt == 2:
        sig["kv_ptr"] = "*bf16"
    k = triton.compile(
        ASTSource(sparse_attn_kernel, sig, const, attrs=divisibility_attrs(sig)),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=t.num_warps, num_stages=t.num_stages),
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
    ap.add_argument("--heads", default=",".join(map(str, plan_mod.HEADS)))
    args = ap.parse_args()
    exact = bool(args.exact)
    heads = [int(h) for h in args.heads.split(",")]
    print("variant (heads): (block_h, block_n, warps, stages, swap, skew, prefetch): regs spill "
          "smem wgmma mma.sync")  # fmt: skip
    for (name, H), (spec, t) in triton_rows(heads, exact).items():
        kv_fmt = 2 if spec.workspace else int(bool(args.fp4))
        r = compile_variant(t, kv_fmt, bool(args.split), exact, spec.ieee)
        shape = (t.block_h, t.block_n, t.num_warps, t.num_stages, t.swap, t.skew, t.prefetch)
        print(
            f"{name} ({H}): {shape}: {r['regs']} {r['spill_bytes']} {r['smem']} {r['wgmma']} "
            f"{r['mma_sync']}  mma layouts (warps M, N, instr M, N): {r['mma_layouts']}"
        )


if __name__ == "__main__":
    main()
