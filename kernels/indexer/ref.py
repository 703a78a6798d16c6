"""Torch references for the paged lightning indexer (docs/design.md 2.2, steps 5-6).

Interface shared with the fast paths (kernels/indexer/ops.py, kernels/indexer/sm100.py):
    qI   bf16/fp32 [T, HI, DI]  FP4 fake-quantized queries (values, not records; every such value
                                is exact in bf16)
    w    fp32 [T, HI]           per-head weights (already scaled by DI^-0.5 HI^-0.5)
    kv   kernels.args.PagedIndexK: the index-K pool, page table, req_ids, n_visible, page size
    geo  kernels.args.IndexerGeometry: topk, pool_blocks, block
Outputs are entry ids (positions within the request), int32, -1 = no entry; candidate pools are
block ids, block b = entries [geo.block * b, geo.block * (b + 1)).

Scoring and selection reuse the oracle's definitions (sglang_dsv41.layers.index_math); this file
only adds the paged gather, so it is O(N) everywhere: the mask-and-topk path.
"""

import torch

from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK
from sglang_dsv41.kv.records import unpack_index_k
from sglang_dsv41.layers.index_math import (
    candidate_blocks,
    head_sum,
    index_scores,
    pool_mask,
    topk_indices,
)
from sglang_dsv41.layers.linear import stable_linear

NEG_INF = float("-inf")


def paged_records(kv: PagedIndexK, page_table: torch.Tensor, n: int) -> torch.Tensor:
    """Records of entries 0..n-1 of every row of page_table [B', max_pages]: uint8 [B', n, R]
    (unallocated pages read slot 0)."""
    P = kv.page_size
    s = torch.arange(n, device=kv.index_k.device)
    page = page_table.long()[:, s // P].clamp_min(0)  # [B', n]
    return kv.records(page * P + s % P)  # [B', n, R]


def paged_scores(qI, w, kv: PagedIndexK, n=None, chunk=8):
    """I[t, s] for s < n (default kv.max_entries): fp32 [T, n], -inf where s >= n_visible[t].

    Dequantizes the whole visible span of every request (O(N) per query). On CPU the keys of
    every run of consecutive queries of one request (a prefill run, a decode row) are decoded in
    one go and each run takes one scoring product; elsewhere queries go `chunk` at a time with no
    host sync (CUDA-graph capturable).
    """
    T = qI.shape[0]
    n = kv.max_entries if n is None else n
    out = torch.full((T, n), NEG_INF, dtype=torch.float32, device=qI.device)
    vis = torch.arange(n, device=qI.device)[None, :] < kv.n_visible.long()[:, None]  # [T, n]
    req = kv.req_ids.long()
    if qI.device.type == "cpu":
        if T == 0:
            return out
        starts = torch.ones(T, dtype=torch.bool)
        starts[1:] = req[1:] != req[:-1]
        bounds = starts.nonzero().flatten().tolist() + [T]
        table = kv.page_table[req[bounds[:-1]]]  # one row per run
        keys = unpack_index_k(paged_records(kv, table, n))  # [runs, n, DI]
        HI = qI.shape[1]
        q = qI.float().reshape(T * HI, -1)  # [T HI, DI]
        dots = torch.cat(
            [
                stable_linear(q[a * HI : b * HI], keys[r].float())
                for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
            ]
        )  # [T HI, n]
        return torch.where(vis, head_sum(w, dots.view(T, HI, n)), out)
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        keys = unpack_index_k(paged_records(kv, kv.page_table[req[rows]], n))
        for i, t in enumerate(range(rows.start, rows.stop)):
            s = index_scores(qI[t : t + 1], w[t : t + 1], keys[i])[0]  # [n]
            out[t] = torch.where(vis[t], s, out[t])
    return out


def full_topk_ref(qI, w, kv: PagedIndexK, geo: IndexerGeometry):
    """Full layer: top-min(topk, n_visible) entry ids per query, int32 [T, topk], -1 padded."""
    scores = paged_scores(qI, w, kv)
    return topk_indices(scores, scores > NEG_INF, geo.topk).int()


def candidate_source_ref(qI, w, kv: PagedIndexK, geo: IndexerGeometry):
    """Candidate source: (own top-k int32 [T, topk], pool block ids int32 [T, pool_blocks]).

    Pool = the newest visible block plus the highest block max-scores, min(pool_blocks,
    #visible blocks) ids, -1 padded.
    """
    scores = paged_scores(qI, w, kv)
    ids = topk_indices(scores, scores > NEG_INF, geo.topk).int()
    blocks = candidate_blocks(scores, kv.n_visible.long(), geo.block, geo.pool_blocks).int()
    return ids, blocks


def reindex_ref(qI, w, kv: PagedIndexK, pool: torch.Tensor, geo: IndexerGeometry):
    """Reindex, mask-and-topk: score every visible entry, mask outside `pool` [T, NB], top-k.

    Returns int32 [T, topk], -1 padded. O(N) per query: the baseline the pooled kernels beat.
    """
    scores = paged_scores(qI, w, kv)
    allowed = (scores > NEG_INF) & pool_mask(pool.long(), scores.shape[1], geo.block)
    return topk_indices(scores, allowed, geo.topk).int()
