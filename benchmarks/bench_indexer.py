"""Paged lightning indexer on the GPU: Reindex N-independence and the Full-layer scan vs its floor,
each against the plain torch a user would write (gather, einsum, mask, top-k), over the FP4
records (dequantized in torch) and over a bf16 copy of the keys.

    python benchmarks/bench_indexer.py [--quick] [--sweep] [--out DIR]

1. Ceiling: device-to-device copy (bytes read + written per second).
2. Full layer at N = 1M, batch 1 and 32: the scan alone (block maxima) against the floor
   T * N * 68 B / copy rate, full_topk and candidate_source end to end; prefill: 64 tokens of
   one request, grouped 8 per key tile.
3. Reindex per decode step at N = 16K, 64K, 256K, 1M, batch 1 and 32 (2048-block pool, top-512),
   and t(1M) / t(64K).
Each decode query has its own request of N entries (pages shuffled through one pool). Kernel
times are medians of `triton.testing.do_bench` over CUDA-graph replays of one call (L2 flushed
before each replay): no host launch time. The torch baselines (`plain_torch_scores` + mask +
`torch.topk`) are timed with CUDA events around eager calls (they run for milliseconds).
`--sweep` also times the kernels' launch shapes. Prints markdown tables; writes JSON to --out.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import triton
import triton.testing

from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ops
from sglang_dsv41.kernels.indexer import testing as tt
from sglang_dsv41.kv.records import unpack_index_k
from sglang_dsv41.layers.index_math import pool_mask

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import eager_us, graph_us  # noqa: E402  (benchmarks/ is not a package)

P = 64
REC = 68
TOPK = 512
POOL_BLOCKS = 2048
GEO = IndexerGeometry(TOPK, POOL_BLOCKS, 8)
SHAPES = {  # launch shapes swept with --sweep: (entries per tile, tiles per program, warps)
    "scan": ((128, 8, 4), (128, 8, 8), (256, 4, 8)),
    "pool": ((128, 1, 8), (128, 1, 4), (64, 1, 4), (128, 4, 4)),
}


def torch_us(fn) -> float:
    """Eager median of 3 calls after one warm-up, for the millisecond plain-torch paths."""
    return eager_us(fn, warmup=1, rep=3)


def pool_case(T, n, seed=0):
    """T decode queries, each over its own request of n visible entries."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages = n // P
    perm = torch.randperm(T * pages, generator=g, device="cpu").int().view(T, pages)
    gd = torch.Generator(device="cuda").manual_seed(seed)
    index_k = torch.randint(
        0, 256, (T * pages * P, REC), dtype=torch.uint8, device="cuda", generator=gd
    )
    index_k[:, 64:] = torch.randint(
        122, 132, (T * pages * P, 4), dtype=torch.uint8, device="cuda", generator=gd
    )
    base = tt.random_case(T, 1, 8, 8, seed=seed)
    return dict(
        qI=base["qI"].cuda(),
        w=base["w"].cuda(),
        index_k=index_k,
        page_table=perm.cuda(),
        req_ids=torch.arange(T, dtype=torch.int32, device="cuda"),
        n_visible=torch.full((T,), n, dtype=torch.int32, device="cuda"),
        P=P,
    )


def random_pool(T, n, nb=POOL_BLOCKS, seed=0):
    """nb distinct blocks per query (the newest included), int32 [T, nb]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nblk = n // 8
    if nblk <= nb:
        pool = torch.full((T, nb), -1, dtype=torch.int32, device="cuda")
        pool[:, :nblk] = torch.arange(nblk, dtype=torch.int32, device="cuda")
        return pool
    keys = torch.rand(T, nblk, device="cuda", generator=g)
    keys[:, -1] = 2.0
    return keys.topk(nb, dim=1).indices.int()


def plain_torch_scores(qI, w, index_k, page_table, req_ids, n_visible, P):
    """What a torch user writes: gather each query's keys, one einsum, ReLU, head weights, -inf
    past n_visible. fp32 [T, N]. index_k: the uint8 records [S, 68] (dequantized here, in fp32
    as kv.records does) or a bf16 key cache [S, DI] kept beside them."""
    n = page_table.shape[1] * P
    s = torch.arange(n, device=qI.device)
    slots = page_table.long()[req_ids.long()][:, s // P].clamp_min(0) * P + s % P  # [T, N]
    keys = index_k[slots]  # [T, N, 68] or [T, N, DI]
    keys = (keys if keys.dtype == torch.bfloat16 else unpack_index_k(keys)).to(torch.bfloat16)
    logits = torch.einsum("thd,tnd->thn", qI.to(torch.bfloat16), keys).float()  # [T, HI, N]
    scores = (logits.relu() * w[:, :, None]).sum(1)  # [T, N]
    return scores.masked_fill(s[None, :] >= n_visible[:, None], float("-inf"))


def plain_torch_full_topk(qI, w, index_k, page_table, req_ids, n_visible, P, topk=TOPK):
    return plain_torch_scores(qI, w, index_k, page_table, req_ids, n_visible, P).topk(topk).indices


def plain_torch_reindex(qI, w, index_k, page_table, req_ids, n_visible, P, pool, topk=TOPK):
    scores = plain_torch_scores(qI, w, index_k, page_table, req_ids, n_visible, P)
    allowed = pool_mask(pool.long(), scores.shape[1], 8)
    return scores.masked_fill(~allowed, float("-inf")).topk(topk).indices


def flat(a):
    """(qI, w, PagedIndexK) -> the plain tensors the torch baselines take."""
    qI, w, kv = a
    return qI, w, kv.index_k, kv.page_table, kv.req_ids, kv.n_visible, kv.page_size


def bf16_keys(index_k):
    """The bf16 key cache [S, DI] a torch user might keep beside the records (built untimed)."""
    return torch.cat([unpack_index_k(c).to(torch.bfloat16) for c in index_k.split(1 << 20)])


def copy_rate():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), rep=100, return_mode="median")
    return 2 * (2 << 30) / (t * 1e-3)  # B/s


def commit():
    if os.environ.get("DSV41_COMMIT"):
        return os.environ["DSV41_COMMIT"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def sweep(res, n_big):
    """Launch shapes of the scan and the pool scoring at N = 1M, batch 1 and 32 (graph us)."""
    res["sweep"] = []
    for T in (1, 32):
        a = tt.case_args(pool_case(T, n_big, seed=T))
        pool = random_pool(T, n_big)
        for kind, shapes in SHAPES.items():
            old = dict(ops.TUNING[kind])
            for bn, tiles, nw in shapes:
                ops.TUNING[kind].update(bn=bn, tiles=tiles, num_warps=nw)
                if kind == "scan":
                    t = graph_us(lambda: ops.block_scores(*a, force_newest=True))
                else:
                    t = graph_us(lambda: ops.pool_scores(*a, pool))
                row = dict(kind=kind, T=T, bn=bn, tiles=tiles, num_warps=nw, graph_us=t)
                res["sweep"].append(row)
                print("sweep", row, flush=True)
            ops.TUNING[kind].update(old)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the torch baseline above 64K")
    ap.add_argument("--sweep", action="store_true", help="time the kernels' launch shapes")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit(),
        "time": time.ctime(),
        "tuning": {k: dict(v) for k, v in ops.TUNING.items()},
    }
    bw = copy_rate()
    res["copy_TBps"] = bw / 1e12
    print(f"device {res['device']}  copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    n_big = 1 << 20
    if args.sweep:
        sweep(res, n_big)

    res["full"] = []
    for T in (1, 32):
        a = tt.case_args(pool_case(T, n_big, seed=T))
        row = {
            "T": T,
            "N": n_big,
            "floor_us": T * n_big * REC / bw * 1e6,  # bytes read once, at the copy byte rate
            "scan_us": graph_us(lambda: ops.block_scores(*a, force_newest=True)),
            "full_topk_us": graph_us(lambda: ops.full_topk(*a, GEO)),
            "candidate_source_us": graph_us(lambda: ops.candidate_source(*a, GEO)),
            "torch_full_topk_us": torch_us(lambda: plain_torch_full_topk(*flat(a))),
        }
        a = (*flat(a)[:2], bf16_keys(flat(a)[2]), *flat(a)[3:])
        row["torch_bf16_cache_full_topk_us"] = torch_us(lambda: plain_torch_full_topk(*a))
        row["scan_TBps"] = T * n_big * REC / (row["scan_us"] * 1e-6) / 1e12
        res["full"].append(row)
        print("full", row, flush=True)
        a = None
        torch.cuda.empty_cache()

    Tp = 64
    c = pool_case(1, n_big, seed=5)
    base = tt.random_case(Tp, 1, 8, 8, seed=6)
    c.update(
        qI=base["qI"].cuda(),
        w=base["w"].cuda(),
        req_ids=torch.zeros(Tp, dtype=torch.int32, device="cuda"),
        n_visible=torch.arange(n_big - Tp + 1, n_big + 1, dtype=torch.int32, device="cuda"),
    )
    a = tt.case_args(c)
    flop = Tp * n_big * 2 * 32 * 128
    t = graph_us(lambda: ops.block_scores(*a, force_newest=True, group=8))
    res["prefill"] = {
        "T": Tp,
        "N": n_big,
        "group": 8,
        "floor_bytes_us": n_big * REC / bw * 1e6,
        "scan_us": t,
        "TFLOPs": flop / (t * 1e-6) / 1e12,
        "candidate_source_us": graph_us(lambda: ops.candidate_source(*a, GEO, group=8)),
    }
    print("prefill", res["prefill"], flush=True)
    c = a = base = None
    torch.cuda.empty_cache()

    res["reindex"] = []
    for T in (1, 32):
        for n in (1 << 14, 1 << 16, 1 << 18, 1 << 20):
            a = tt.case_args(pool_case(T, n, seed=n + T))
            pool = random_pool(T, n)
            row = {
                "T": T,
                "N": n,
                "pooled_us": graph_us(lambda: ops.reindex(*a, pool, GEO)),
                "pool_scores_us": graph_us(lambda: ops.pool_scores(*a, pool)),
            }
            if not (args.quick and n > (1 << 16)):
                row["torch_us"] = torch_us(lambda: plain_torch_reindex(*flat(a), pool))
                a = (*flat(a)[:2], bf16_keys(flat(a)[2]), *flat(a)[3:])
                row["torch_bf16_cache_us"] = torch_us(lambda: plain_torch_reindex(*a, pool))
            res["reindex"].append(row)
            print("reindex", row, flush=True)
            a = pool = None
            torch.cuda.empty_cache()
    for T in (1, 32):
        t = {r["N"]: r["pooled_us"] for r in res["reindex"] if r["T"] == T}
        res[f"reindex_ratio_1M_64K_T{T}"] = t[1 << 20] / t[1 << 16]

    with open(os.path.join(args.out, "bench_indexer.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, {res['commit']}")
    print("| T | N | scan us | floor us | scan TB/s | full_topk us | cand_src us | torch us"
          " (bf16 keys) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in res["full"]:
        print(
            f"| {r['T']} | {r['N']} | {r['scan_us']:.1f} | {r['floor_us']:.1f} | "
            f"{r['scan_TBps']:.2f} | {r['full_topk_us']:.1f} | {r['candidate_source_us']:.1f} | "
            f"{r['torch_full_topk_us']:.0f} ({r['torch_bf16_cache_full_topk_us']:.0f}) |"
        )
    pf = res["prefill"]
    print(
        f"prefill {pf['T']} tokens, N = {pf['N']}, group {pf['group']}: scan {pf['scan_us']:.0f} "
        f"us ({pf['TFLOPs']:.0f} TFLOP/s), candidate_source {pf['candidate_source_us']:.0f} us"
    )
    print("| T | N | reindex us | pool_scores us | torch us | torch, bf16 keys us |")
    print("|---|---|---|---|---|---|")
    for r in res["reindex"]:
        tm, tb = r.get("torch_us"), r.get("torch_bf16_cache_us")
        print(
            f"| {r['T']} | {r['N']} | {r['pooled_us']:.1f} | {r['pool_scores_us']:.1f} | "
            f"{f'{tm:.0f}' if tm else '-'} | {f'{tb:.0f}' if tb else '-'} |"
        )
    for T in (1, 32):
        print(f"t(1M)/t(64K) batch {T}: {res[f'reindex_ratio_1M_64K_T{T}']:.3f}")


if __name__ == "__main__":
    main()
