"""Kernel-level check of the SM100 paths against the torch references, for a B200 owner.

    python -m sglang_dsv41.kernels.sm100_check        (or scripts/b200_check.sh)

Runs on one SM100 / SM103 GPU with sgl-deep-gemm and sgl-flash-mla installed, forces the SM100
path (DSV41_KERNEL_PATH=sm100: a call it cannot take raises instead of falling back) and
compares, on fresh random inputs:
  - index-K records stored by the Triton store into split pages of 128 slots, byte for byte
    against the torch store (kv/split_pages.py), and kernels.dispatch.index_page_size == 128;
  - the indexer (Full decode and prefill, candidate source, Reindex) against kernels/indexer/
    ref.py: index sets equal up to ties within the logits' rounding (fp32 logits for the scans,
    bf16 for Reindex), -1 padding and visibility exact;
  - sparse attention (FlashMLA decode and sparse prefill, V41_FP4 and V41 main KV) against the
    fp32 reference: relative error at most twice that of plain bf16 torch, plus 1e-3;
  - CUDA-graph capture and replay of the decode calls, equal to eager.
Prints one verdict line, `sm100_check: PASS ...`, `FAIL ...` or `NOT RUN ...`; exit status 0
only for PASS. Written without access to an SM100 GPU: it has never run here.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

# (T, B, entries per request) of the indexer cases; the CPU dry run shrinks them
SIZES = {"decode": (8, 4, 40000), "prefill": (32, 1, 9000), "graph": (4, 2, 20000)}


def _indexer_checks(dev, notes):
    from sglang_dsv41.kernels import indexer
    from sglang_dsv41.kernels.args import IndexerGeometry
    from sglang_dsv41.kernels.indexer import ref, sm100
    from sglang_dsv41.kernels.indexer import testing as tt
    from sglang_dsv41.kv.pages import entries_visible

    geo = IndexerGeometry(topk=512, pool_blocks=2048, block=8)
    for name in ("decode", "prefill"):
        T, B, n_max = SIZES[name]
        nvis = name == "prefill"
        T = T + sm100.FLAT_MIN_ROWS if nvis else T
        kw = {}
        if nvis:
            pos = torch.arange(2 * n_max - T, 2 * n_max)
            kw = dict(lengths=[n_max], n_visible=entries_visible(pos, 2))
        c = tt.random_case(T, B, n_max, 128, HI=32, device=dev, seed=T, **kw)
        if nvis:
            c["req_ids"].zero_()
        kv = tt.split_view(c)
        qI, w = c["qI"], c["w"]
        scores, tol = ref.paged_scores(qI, w, kv), tt.rounding_bound(c)
        ids = indexer.full_topk(qI, w, kv, geo)
        tt.check_selection(ids, ref.full_topk_ref(qI, w, kv, geo), scores, tol, f"{name} full")
        own, pool = indexer.candidate_source(qI, w, kv, geo)
        rown, rpool = ref.candidate_source_ref(qI, w, kv, geo)
        tt.check_selection(own, rown, scores, tol, f"{name} candidate top-k")
        key = tt.block_key(scores, c["n_visible"])
        tt.check_selection(pool, rpool, key, tol, f"{name} pool")
        w16 = w.to(torch.bfloat16).float()  # the sparse kernel takes bf16 head weights
        s16 = ref.paged_scores(qI, w16, kv)
        got = indexer.reindex(qI, w16, kv, rpool, geo)
        pkey = tt.pool_key(s16, rpool)
        bf16_tol = torch.where(pkey > float("-inf"), pkey.abs(), torch.zeros_like(pkey)).amax(1)
        tt.check_selection(
            got,
            ref.reindex_ref(qI, w16, kv, rpool, geo),
            pkey,
            bf16_tol * 2.0**-7,
            f"{name} reindex",
        )
        notes.append(f"indexer {name} T={T} N={kv.max_entries}")
    if dev.type != "cuda":
        return
    # graph capture of the decode calls
    c = tt.random_case(*SIZES["graph"], 128, HI=32, device=dev, seed=99)
    kv = tt.split_view(c)
    qI, w = c["qI"], c["w"]
    pool = ref.candidate_source_ref(qI, w, kv, geo)[1]
    eager = (indexer.full_topk(qI, w, kv, geo), indexer.reindex(qI, w, kv, pool, geo))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (indexer.full_topk(qI, w, kv, geo), indexer.reindex(qI, w, kv, pool, geo))
    g.replay()
    torch.cuda.synchronize()
    for a, b, what in zip(out, eager, ("full", "reindex"), strict=True):
        if not torch.equal(a.sort(1).values, b.sort(1).values):
            raise AssertionError(f"graph replay of {what} differs from eager")
    notes.append("indexer graph capture")


def _store_check(dev, notes):
    from sglang_dsv41.kernels.dispatch import index_page_size
    from sglang_dsv41.kernels.kv_store import store_index_k
    from sglang_dsv41.kernels.kv_store.ref import rope_cos_sin, store_records_ref
    from sglang_dsv41.kv.records import Layout

    P = index_page_size(dev)
    if P != 128:
        raise AssertionError(f"index_page_size on this device is {P}, expected 128")
    n, pages = 1000, 10
    x = torch.randn(n, 128, device=dev)
    wn = torch.rand(128, device=dev) + 0.5
    pos = torch.randint(0, 1 << 16, (n,), device=dev)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, device=dev).float() / 64))
    slots = torch.randperm(pages * P, device=dev)[:n]
    got = torch.zeros(pages, P * 68, dtype=torch.uint8, device=dev)
    store_index_k(x, wn, 1e-6, pos, got, slots, inv_freq=inv, split_page=P)
    want = torch.zeros_like(got)
    cos, sin = rope_cos_sin(pos, inv)
    store_records_ref(x, want, slots, Layout.INDEX_K, wn, 1e-6, cos, sin, split_page=P)
    diff = (got != want).sum().item()
    if diff > got.numel() * 1e-4:  # the RMS sum order may differ from torch's
        raise AssertionError(f"split-page index-K store: {diff} bytes differ")
    notes.append(f"index-K store ({diff} bytes off)")


def _attention_checks(dev, notes):
    from sglang_dsv41.kernels.args import SparseKV
    from sglang_dsv41.kernels.sparse_attn import sm100, sparse_attention, sparse_attention_ref
    from sglang_dsv41.kv.records import Layout, pack

    H, D, W, TOPK, S = 64, 512, 128, 512, 4096
    for layout in (Layout.V41_FP4, Layout.V41):
        for T in (8, sm100.PREFILL_MIN_TOKENS + 40):
            g = torch.Generator(device=dev).manual_seed(T)
            swa = pack(Layout.V41, torch.randn(S, D, device=dev, generator=g))
            kvc = pack(layout, torch.randn(S, D, device=dev, generator=g))
            sw = torch.randint(0, S, (T, W), device=dev, generator=g, dtype=torch.int32)
            tk = torch.randint(0, S, (T, TOPK), device=dev, generator=g, dtype=torch.int32)
            sw[0, :50] = -1
            tk[1, 100:] = -1
            sw[2], tk[2] = -1, -1  # sees only the sink
            q = torch.randn(T, H, D, device=dev, generator=g).to(torch.bfloat16)
            sink = torch.randn(H, device=dev, generator=g)
            kv = SparseKV(swa, sw, kvc, tk, layout)
            ref = sparse_attention_ref(q, kv, sink, None, torch.float32)
            bf = sparse_attention_ref(q, kv, sink, None, torch.float32, torch.bfloat16)
            out = sparse_attention(q, kv, sink, out_dtype=torch.float32)
            err = ((out - ref).norm() / ref.norm()).item()
            err_bf = ((bf - ref).norm() / ref.norm()).item()
            if not torch.isfinite(out).all() or err > 2 * err_bf + 1e-3:
                raise AssertionError(
                    f"attention {layout.name} T={T}: err {err:.2e}, bf16 {err_bf:.2e}"
                )
            if not (out[2] == 0).all():
                raise AssertionError(f"attention {layout.name} T={T}: sink-only token not 0")
            notes.append(f"attention {layout.name} T={T} err {err:.1e} (bf16 torch {err_bf:.1e})")
    if dev.type != "cuda":
        return
    q8, kv8 = q[:8].contiguous(), SparseKV(swa, sw[:8], kvc, tk[:8], layout)
    out = torch.empty(8, H, D, dtype=torch.bfloat16, device=dev)
    sparse_attention(q8, kv8, sink, out=out)
    eager = out.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_attention(q8, kv8, sink, out=out)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    if not torch.equal(out, eager):
        raise AssertionError("graph replay of decode attention differs from eager")
    notes.append("attention graph capture")


def main() -> int:
    os.environ["DSV41_KERNEL_PATH"] = "sm100"
    os.environ.pop("DSV41_FORCE_REF", None)
    if not torch.cuda.is_available():
        print("sm100_check: NOT RUN (no CUDA device)")
        return 2
    dev = torch.device("cuda")
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] != 10:
        print(f"sm100_check: NOT RUN (capability {cap}, not SM100 / SM103)")
        return 2
    from sglang_dsv41.kernels.indexer import sm100 as idx
    from sglang_dsv41.kernels.sparse_attn import sm100 as att

    for why in (idx.missing(), att.missing()):
        if why:
            print(f"sm100_check: NOT RUN ({why})")
            return 2
    notes = []
    try:
        with torch.no_grad():
            _store_check(dev, notes)
            _indexer_checks(dev, notes)
            _attention_checks(dev, notes)
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        done = "; ".join(notes) or "nothing"
        print(f"sm100_check: FAIL on {torch.cuda.get_device_name(dev)}: {e} (passed: {done})")
        return 1
    name = torch.cuda.get_device_name(dev)
    print(f"sm100_check: PASS on {name} ({len(notes)} checks: {'; '.join(notes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
