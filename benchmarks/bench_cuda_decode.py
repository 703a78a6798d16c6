"""The CUDA sparse-attention kernel (`kernels/sparse_attn/cuda_decode.cu`) against the Triton
kernels and FlashMLA, decode only, one GPU (SM90).

    PYTHONPATH=. python3 benchmarks/bench_cuda_decode.py [--heads 8,16] [--exact]
        [--build=-DSTAGES=4 --build="-DMIN_BLOCKS=3 -DQK_CHAINS=2"] [--json out.json]

Cases, inputs and timer as `bench_attention.py` (decode batch 1 / 8 / 32 / 128 / 256, window
128 + top-512 V41_FP4 entries, CUDA-graph replays with the L2 flushed): per case FlashMLA's
64-head decode (bf16), the plan's Triton choice for the shape (the CUDA kernel left out), and
each CUDA variant the plan chooses at the head count (`plan.variants_at`: e.g. at 8 heads the
wide build, tiles of 16, the slim build in grids of 3 and 4 blocks per SM, the half build),
each also with every extra build (`--build`: NVRTC options, e.g. another STAGES or
MIN_BLOCKS). `--exact`: fp32 queries (the served layer's; the CUDA kernel's exact mode).
Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from sglang_dsv41.kernels.sparse_attn import cuda_decode
from sglang_dsv41.kernels.sparse_attn import plan as plan_mod
from sglang_dsv41.kernels.sparse_attn.variants import SPECS, Cuda, Variant
from sglang_dsv41.kv.records import Layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (benchmarks/ is not a package)
from graph_timing import graph_us  # noqa: E402


def triton_launch(n: int, H: int, exact: bool) -> dict:
    """The plan's choice for the shape without the CUDA kernel, as launch options."""
    return {"variant": plan_mod.plan_for(n, H, ba.D, ba.DEV, exact, cuda=False).variant.value}


def cuda_variants(H: int, exact: bool) -> list[Variant]:
    """The CUDA variants the plan chooses at H heads (any token count)."""
    return [v for v in plan_mod.variants_at(H, exact) if isinstance(SPECS[v], Cuda)]


def cuda_fn(n: int, H: int, exact: bool, variant: Variant, build: tuple):
    q, skv, sink = ba.ours_inputs("decode", n, H, Layout.V41_FP4, exact)
    swa, kv = skv.swa_cache.view(-1, 528), skv.kv_cache.view(-1, 288)
    spec = SPECS[variant]
    return lambda: cuda_decode.sparse_attention(
        q, swa, skv.swa_slots, kv, skv.topk_slots, True, sink, ba.D**-0.5, None,
        build=spec.build, per_sm=spec.per_sm, defines=build,
    )  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="8,16")
    ap.add_argument("--exact", action="store_true", help="fp32 queries (the exact mode)")
    ap.add_argument("--build", action="append", default=[], help="extra NVRTC options")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    why = cuda_decode.why_unavailable(ba.DEV)
    if why:
        raise SystemExit(f"the CUDA kernel does not run here: {why}")
    import flash_mla  # noqa: F401  (the peer)

    builds = [()] + [tuple(b.split()) for b in args.build]
    rows = []
    for H in (int(h) for h in args.heads.split(",")):
        for n in ba.BATCHES:
            row = {"H": H, "batch": n, "exact": args.exact}
            row["flashmla_64_heads_us"] = graph_us(ba.fm_decode_fn(n))
            launch = triton_launch(n, H, args.exact)
            row["triton_us"] = graph_us(
                ba.ours_fn("decode", n, H, Layout.V41_FP4, launch, args.exact)
            )
            for build in builds:
                for variant in cuda_variants(H, args.exact):
                    name = variant.value + ("" if not build else " " + " ".join(build))
                    row[name] = graph_us(cuda_fn(n, H, args.exact, variant, build))
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
