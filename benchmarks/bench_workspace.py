"""The prefill workspace build against the size of the caches it compacts (one GPU, SM90+).

    PYTHONPATH=. python3 benchmarks/bench_workspace.py [--json out.json]

T = 4096 prefill tokens x (128-entry window + top-512) referencing one 16K-token prompt's
records, inside caches of S1 SWA slots and S2 main-KV (V41_FP4) slots, from the benchmark's
own prompt-sized caches up to a served pool's tens of millions of slots. For each size: the
build (`build_workspace`) at its static bound as graph replays (`graph_timing.graph_us`) and
sized to the referenced slots (`exact_size`, one host sync) eagerly, and whether every valid
entry of 64 sampled tokens reads what the uncompacted build gives it and the exact-size
workspace has one row per referenced slot. The whole 64-head prefill call
(FlashMLA route, where `flash_mla` imports) is timed with the default choice twice: as graph
replays (the static bound: chunks of MAX_ROWS rows) and eagerly, as the server runs prefill (a
large cache's workspace then sized to the referenced slots after one host sync): median of 20
calls timed with CUDA events, after 3 warm-up calls. Also the host's time in one eager call
issued behind ~20 ms of queued GPU work (`host_us_behind`: a host sync shows as ~20 ms), and
the three times again as the served layer calls it, with the batch's bound on the slots
referenced (`SparseKV.max_slots` = `serving.context.slots_bound` of one 16K-token request):
the workspace then sized by that bound, no host sync.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.sparse_attn import sparse_attention
from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw
from sglang_dsv41.kv.records import Layout
from sglang_dsv41.serving.context import slots_bound

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import (  # noqa: E402  (benchmarks/ is not a package)
    eager_us,
    graph_us,
    host_us_behind,
)

T, W, TOPK, CTX, D = 4096, 128, 512, 16384, 512
MAIN_SLOTS = (8192, 1 << 20, 1 << 24, 1 << 26)  # the last: 64 M slots, 19 GB of FP4 records


def case(s2: int, dev):
    """(swa, sw, kv, tk): the prompt's records at random slots of caches of S1 = max(CTX, s2/16)
    SWA and s2 main-KV slots (uninitialized beyond them: never read)."""
    g = torch.Generator(device=dev).manual_seed(0)
    s1 = max(CTX, s2 // 16)
    swa = torch.empty(s1, D + D // 32, dtype=torch.uint8, device=dev)
    kv = torch.empty(s2, 288, dtype=torch.uint8, device=dev)
    swa_at = torch.randperm(s1, device=dev, generator=g)[:CTX]
    kv_at = torch.randperm(s2, device=dev, generator=g)[: CTX // 2]
    swa[swa_at] = torch.randint(0, 0x70, (CTX, D + D // 32), dtype=torch.uint8, device=dev)
    kv[kv_at] = torch.randint(0, 0x70, (CTX // 2, 288), dtype=torch.uint8, device=dev)
    pos = torch.arange(CTX - T, CTX, device=dev)
    sw = swa_at[(pos[:, None] - torch.arange(W - 1, -1, -1, device=dev)[None]).clamp(min=0)]
    pick = torch.rand(T, CTX // 2, device=dev, generator=g).topk(TOPK, dim=1).indices
    return swa, sw.int(), kv, kv_at[pick].int()


def correct(swa, sw, kv, tk, ws, rows) -> bool:
    """Every valid entry of 64 sampled tokens reads, at its workspace row, the values the
    uncompacted build gives it (`build_private_workspace`: one row per (token, entry), the same
    dequantization; the random records' tiny scales make values that bf16 rounds, so the fp32
    reference is no bit-for-bit peer here)."""
    pick = torch.arange(0, T, T // 64, device=sw.device)
    priv, prow = tw.build_private_workspace(swa, sw[pick], kv, tk[pick], True, D)
    valid = torch.cat((sw[pick], tk[pick]), dim=1) >= 0
    want = priv[prow[:, : W + TOPK].clamp(min=0).long()]
    got = ws[rows[pick, : W + TOPK].clamp(min=0).long()]
    return bool(torch.equal(got[valid], want[valid]))


def measure(s2: int, dev) -> dict:
    swa, sw, kv, tk = case(s2, dev)
    row = dict(main_slots=s2, swa_slots=swa.shape[0], tokens=T, entries=W + TOPK)
    n_ref = int(torch.unique(sw).numel() + torch.unique(tk).numel())
    if min(swa.shape[0] + kv.shape[0], T * (W + TOPK)) < tw.MAX_ROWS:
        row["build_bound_us"] = graph_us(lambda: tw.build_workspace(swa, sw, kv, tk, True, D))
        ws, rows = tw.build_workspace(swa, sw, kv, tk, True, D)
        row["bound_correct"] = correct(swa, sw, kv, tk, ws, rows)
        del ws, rows
    row["build_exact_eager_us"] = eager_us(
        lambda: tw.build_workspace(swa, sw, kv, tk, True, D, exact_size=True)
    )
    ws, rows = tw.build_workspace(swa, sw, kv, tk, True, D, exact_size=True)
    row["exact_rows"], row["referenced_slots"] = ws.shape[0] - 1, n_ref
    row["exact_correct"] = correct(swa, sw, kv, tk, ws, rows) and ws.shape[0] == n_ref + 1
    del ws, rows
    q = torch.randn(T, 64, D, device=dev, dtype=torch.bfloat16)
    sink = torch.randn(64, device=dev)
    skv = SparseKV(swa, sw, kv, tk, Layout.V41_FP4)
    row["prefill_64_heads_us"] = graph_us(lambda: sparse_attention(q, skv, sink))
    row["prefill_64_heads_eager_us"] = eager_us(lambda: sparse_attention(q, skv, sink))
    row["prefill_64_heads_host_us_behind_20ms"] = host_us_behind(
        lambda: sparse_attention(q, skv, sink)
    )
    # as the served layer calls it: the batch's bound on the slots (one CTX-token request)
    bounded = SparseKV(swa, sw, kv, tk, Layout.V41_FP4, max_slots=slots_bound([CTX]))
    row["max_slots"] = bounded.max_slots
    row["prefill_64_heads_bounded_us"] = graph_us(lambda: sparse_attention(q, bounded, sink))
    row["prefill_64_heads_bounded_eager_us"] = eager_us(lambda: sparse_attention(q, bounded, sink))
    row["prefill_64_heads_bounded_host_us_behind_20ms"] = host_us_behind(
        lambda: sparse_attention(q, bounded, sink)
    )
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for s2 in MAIN_SLOTS:
        rows.append(measure(s2, dev))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
