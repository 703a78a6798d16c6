"""Which tile shapes give right output: relative error against the fp32 reference per (layout,
heads per program, entries per tile, warps, bf16 / fp32 q), on one GPU (SM90+).

    PYTHONPATH=. python3 benchmarks/probe_exact_tiles.py

It found that the three-part kernel (fp32 q) is wrong over V41_FP4 records with tiles of 16
(benchmarks/RESULTS.md); `kernels/sparse_attn/triton.py` refuses that launch.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from test_sparse_attn import make_case  # noqa: E402

from sglang_dsv41.kernels.args import SparseKV  # noqa: E402
from sglang_dsv41.kernels.sparse_attn import (  # noqa: E402
    Tiles,
    sparse_attention,
    sparse_attention_ref,
)
from sglang_dsv41.kv.records import Layout  # noqa: E402

SHAPES = [(16, 16, 4), (16, 16, 8), (32, 16, 4), (32, 16, 8), (32, 32, 8), (64, 16, 8)]


def main():
    for layout in (Layout.V41_FP4, Layout.V41):
        for bh, bn, nw in SHAPES:
            for exact in (False, True):
                if exact and bh == 64:
                    continue  # 64-head programs do not fit the exact path (shared memory)
                q, swa, sw, kv, tk, sink = make_case(40, min(bh, 32) * 2, 512, 128, 512, layout)
                q = q.float() if exact else q
                skv = SparseKV(swa, sw, kv, tk, layout)
                ref = sparse_attention_ref(q, skv, sink, None, torch.float32)
                try:
                    out = sparse_attention(  # the plan's Triton choice with these tiles
                        q, skv, sink, out_dtype=torch.float32, num_splits=1,
                        tiles=Tiles(block_h=bh, block_n=bn, num_warps=nw),
                    )  # fmt: skip
                    err = f"{((out - ref).norm() / ref.norm()).item():.2e}"
                except ValueError as exc:
                    err = f"refused ({exc})"[:60]
                print(layout.value, bh, bn, nw, "fp32 q" if exact else "bf16 q", err, flush=True)


if __name__ == "__main__":
    main()
