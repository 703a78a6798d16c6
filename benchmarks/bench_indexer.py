"""Paged lightning indexer on the GPU: Reindex N-independence and the Full-layer scan vs its floor.

    python benchmarks/bench_indexer.py [--quick] [--out DIR]

1. Ceiling: device-to-device copy (bytes read + written per second).
2. Scan launch-shape sweep at N = 1M (batch 1 and 32), keeping the fastest for what follows.
3. Full layer at N = 1M, batch 1 and 32: the scan alone (block maxima) against the floor
   T * N * 68 B / copy rate, then full_topk and candidate_source end to end.
4. Reindex per decode step at N = 16K, 64K, 256K, 1M, batch 1 and 32: the pooled path
   (2048-block pool, 512 out) next to the torch mask-and-topk path (ref.reindex_ref: score every
   visible entry, mask outside the pool, top-k), and t(1M) / t(64K).
Each decode query has its own request of N entries (pages shuffled through one pool). Times are
medians of triton.testing.do_bench (L2 flushed before each call, eager launches); the torch
path uses fewer repetitions. Prints a markdown table; writes JSON to --out.
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import triton
import triton.testing

from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ops, ref
from sglang_dsv41.kernels.indexer import testing as tt

P = 64
REC = 68
POOL_SHAPES = ((128, 1, 8), (128, 1, 4), (64, 1, 4), (128, 4, 4), (64, 4, 4))

FLASH = IndexerGeometry(topk=512, pool_blocks=2048, block=8)  # V4.1-Flash's sizes


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


def random_pool(T, n, nb=2048, seed=0):
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


def bench(fn, rep=200):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3  # us


def bench_graph(fn, rep=100):
    """Median of CUDA-graph replays (no launch gaps; L2 not flushed between replays)."""
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


_FLUSH = None


def bench_graph_cold(fn, rep=100):
    """CUDA-graph replays of (write 256 MB, fn) minus replays of the write alone: fn's time
    with a cold L2 and no launch gaps."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def both():
        _FLUSH.zero_()
        fn()

    return bench_graph(both, rep) - bench_graph(_FLUSH.zero_, rep)


def with_select(mode, fn):
    old, ops.SELECT = ops.SELECT, mode
    try:
        return fn()
    finally:
        ops.SELECT = old


def bench_slow(fn, n=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def copy_rate():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x), rep=100)
    return 2 * (2 << 30) / (t * 1e-6)  # B/s


def commit():
    if os.environ.get("DSV41_COMMIT"):
        return os.environ["DSV41_COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or "unknown"
        )
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit(),
        "time": time.ctime(),
    }
    bw = copy_rate()
    res["copy_TBps"] = bw / 1e12
    print(f"device {res['device']}  copy {bw / 1e12:.2f} TB/s (read+write)", flush=True)

    # 2. scan launch shapes at N = 1M
    n_big = 1 << 20
    cases = {T: pool_case(T, n_big, seed=T) for T in (1, 32)}
    sweep = [(128, 8, 4), (128, 8, 8), (256, 4, 8)]
    if args.quick:
        sweep = sweep[:2]
    res["sweep"] = []
    best, best_t = None, float("inf")
    for bn, tiles, nw in sweep:
        ops.TUNING["scan"].update(bn=bn, tiles=tiles, num_warps=nw)
        row = {"bn": bn, "tiles": tiles, "num_warps": nw}
        for T, c in cases.items():
            a = tt.case_args(c)
            row[f"us_T{T}"] = bench(lambda: ops.block_scores(*a, force_newest=True))
        res["sweep"].append(row)
        print("scan sweep", row, flush=True)
        if row["us_T32"] + 8 * row["us_T1"] < best_t:
            best, best_t = (bn, tiles, nw), row["us_T32"] + 8 * row["us_T1"]
    ops.TUNING["scan"].update(bn=best[0], tiles=best[1], num_warps=best[2])
    res["scan_tuning"] = dict(ops.TUNING["scan"])

    # 3. Full layer at N = 1M
    res["full"] = []
    for T, c in cases.items():
        a = tt.case_args(c)
        floor_us = T * n_big * REC / bw * 1e6  # bytes read once, at the copy byte rate
        row = {
            "T": T,
            "N": n_big,
            "floor_us": floor_us,
            "scan_us": bench(lambda: ops.block_scores(*a, force_newest=True)),
            "full_topk_us": bench(lambda: ops.full_topk(*a, FLASH)),
            "candidate_source_us": bench(lambda: ops.candidate_source(*a, FLASH)),
        }
        bscores = ops.block_scores(*a, force_newest=True)
        row["select_2048_blocks_us"] = bench(lambda: ops.select_blocks(bscores, 2048))
        row["select_2048_blocks_torch_us"] = with_select(
            "torch", lambda: bench(lambda: ops.select_blocks(bscores, 2048))
        )
        row["candidate_source_torchsel_us"] = with_select(
            "torch", lambda: bench(lambda: ops.candidate_source(*a, FLASH))
        )
        row["candidate_source_graph_us"] = bench_graph(lambda: ops.candidate_source(*a, FLASH))
        row["full_topk_graph_us"] = bench_graph(lambda: ops.full_topk(*a, FLASH))
        row["scan_TBps"] = T * n_big * REC / (row["scan_us"] * 1e-6) / 1e12
        res["full"].append(row)
        print("full", row, flush=True)
    del cases
    torch.cuda.empty_cache()

    # 3b. Prefill: 64 query tokens of one request at N = 1M; group = tokens sharing a key tile
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
    res["prefill"] = {
        "T": Tp,
        "N": n_big,
        "floor_bytes_us": n_big * REC / bw * 1e6,
        "floor_flop_us": flop / 701e12 * 1e6,
        "runs": [],
    }
    for group, bn, nw in ((1, 128, 4), (4, 128, 8), (8, 64, 8), (8, 128, 8)):
        ops.TUNING["scan_group"].update(bn=bn, tiles=8, num_warps=nw)
        t = bench(lambda: ops.block_scores(*a, force_newest=True, group=group))
        row = {
            "group": group,
            "bn": bn,
            "num_warps": nw,
            "scan_us": t,
            "us_per_token": t / Tp,
            "TFLOPs": flop / (t * 1e-6) / 1e12,
        }
        res["prefill"]["runs"].append(row)
        print("prefill", row, flush=True)
    best = min((r for r in res["prefill"]["runs"] if r["group"] > 1), key=lambda r: r["scan_us"])
    ops.TUNING["scan_group"].update(bn=best["bn"], tiles=8, num_warps=best["num_warps"])
    res["scan_group_tuning"] = dict(ops.TUNING["scan_group"], group=best["group"])
    res["prefill"]["candidate_source_us"] = bench(
        lambda: ops.candidate_source(*a, FLASH, group=best["group"])
    )
    c = a = base = None
    torch.cuda.empty_cache()

    # 4. Reindex per decode step; first the pool kernel's launch shape at N = 1M
    res["pool_sweep"] = []
    best, best_t = None, float("inf")
    for T in (1, 32):
        c = pool_case(T, n_big, seed=7 + T)
        a = tt.case_args(c)
        pool = random_pool(T, n_big)
        for bn, tiles, nw in POOL_SHAPES:
            ops.TUNING["pool"].update(bn=bn, tiles=tiles, num_warps=nw)
            row = {
                "T": T,
                "bn": bn,
                "tiles": tiles,
                "num_warps": nw,
                "us": bench(lambda: ops.pool_scores(*a, pool)),
            }
            res["pool_sweep"].append(row)
            print("pool sweep", row, flush=True)
        c = a = pool = None
    for shape in POOL_SHAPES:
        t = sum(
            r["us"] * (8 if r["T"] == 1 else 1)
            for r in res["pool_sweep"]
            if (r["bn"], r["tiles"], r["num_warps"]) == shape
        )
        if t < best_t:
            best, best_t = shape, t
    ops.TUNING["pool"].update(bn=best[0], tiles=best[1], num_warps=best[2])
    res["pool_tuning"] = dict(ops.TUNING["pool"])
    torch.cuda.empty_cache()
    res["reindex"] = []
    ns = [1 << 14, 1 << 16, 1 << 18, 1 << 20]
    for T in (1, 32):
        for n in ns:
            c = pool_case(T, n, seed=n + T)
            a = tt.case_args(c)
            pool = random_pool(T, n)
            row = {
                "T": T,
                "N": n,
                "pooled_us": bench(lambda: ops.reindex(*a, pool, FLASH)),
                "pooled_graph_us": bench_graph(lambda: ops.reindex(*a, pool, FLASH)),
                "pooled_graph_cold_us": bench_graph_cold(lambda: ops.reindex(*a, pool, FLASH)),
                "pooled_torchsel_us": with_select(
                    "torch", lambda: bench(lambda: ops.reindex(*a, pool, FLASH))
                ),
                "pool_scores_us": bench(lambda: ops.pool_scores(*a, pool)),
            }
            if not (args.quick and n > (1 << 16)):
                row["torch_mask_topk_us"] = bench_slow(lambda: ref.reindex_ref(*a, pool, FLASH))
            res["reindex"].append(row)
            print("reindex", row, flush=True)
            c = a = pool = None
            torch.cuda.empty_cache()
    for T in (1, 32):
        t = {r["N"]: r for r in res["reindex"] if r["T"] == T}
        for key in ("pooled_us", "pooled_graph_us", "pooled_graph_cold_us"):
            res[f"reindex_ratio_1M_64K_T{T}_{key}"] = t[1 << 20][key] / t[1 << 16][key]

    with open(os.path.join(args.out, "bench_indexer.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(
        f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, commit {res['commit']}"
    )
    print(f"scan launch shape {res['scan_tuning']}, pool launch shape {res['pool_tuning']}")
    print(
        "| T | N | scan us | floor us | scan TB/s | select 2048 us (torch.topk) | full_topk us"
        " (graph) | cand_src us (torch.topk sel) | cand_src graph us |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["full"]:
        print(
            f"| {r['T']} | {r['N']} | {r['scan_us']:.1f} | {r['floor_us']:.1f} | "
            f"{r['scan_TBps']:.2f} | {r['select_2048_blocks_us']:.1f} "
            f"({r['select_2048_blocks_torch_us']:.1f}) | {r['full_topk_us']:.1f} "
            f"({r['full_topk_graph_us']:.1f}) | "
            f"{r['candidate_source_us']:.1f} ({r['candidate_source_torchsel_us']:.1f}) | "
            f"{r['candidate_source_graph_us']:.1f} |"
        )
    pf = res["prefill"]
    print(
        f"prefill: {pf['T']} tokens of one request, N = {pf['N']}; floors: bytes "
        f"{pf['floor_bytes_us']:.1f} us, tensor FLOP {pf['floor_flop_us']:.0f} us; "
        f"candidate_source (best group) {pf['candidate_source_us']:.0f} us"
    )
    print("| group | bn | warps | scan us | us / token | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in pf["runs"]:
        print(
            f"| {r['group']} | {r['bn']} | {r['num_warps']} | {r['scan_us']:.0f} | "
            f"{r['us_per_token']:.1f} | {r['TFLOPs']:.0f} |"
        )
    print(
        "| T | N | pooled reindex us | graph us | graph cold-L2 us | torch.topk sel us |"
        " pool_scores us | torch mask-and-topk us |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in res["reindex"]:
        tm = r.get("torch_mask_topk_us")
        print(
            f"| {r['T']} | {r['N']} | {r['pooled_us']:.1f} | {r['pooled_graph_us']:.1f} | "
            f"{r['pooled_graph_cold_us']:.1f} | "
            f"{r['pooled_torchsel_us']:.1f} | {r['pool_scores_us']:.1f} | "
            f"{f'{tm:.0f}' if tm else '-'} |"
        )
    for T in (1, 32):
        print(
            f"t(1M)/t(64K) batch {T}: eager "
            f"{res[f'reindex_ratio_1M_64K_T{T}_pooled_us']:.3f}, graph "
            f"{res[f'reindex_ratio_1M_64K_T{T}_pooled_graph_us']:.3f}, graph cold-L2 "
            f"{res[f'reindex_ratio_1M_64K_T{T}_pooled_graph_cold_us']:.3f}"
        )


if __name__ == "__main__":
    main()
