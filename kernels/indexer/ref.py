"""Torch references for the paged lightning indexer (DESIGN.md 3.5-3.6).

Interface shared with the Triton path (kernels/indexer/triton.py):
    qI          bf16/fp32 [T, HI, DI]  FP4 fake-quantized queries (values, not records; every such
                                      value is exact in bf16)
    w           fp32 [T, HI]           per-head weights (already scaled by DI^-0.5 HI^-0.5)
    index_k     uint8 [S, DI/2 + DI/32] the index-K pool (68 B records at DI=128, S slots)
    page_table  int32 [B, max_pages]   page ids of each request, -1 = unallocated
    req_ids     int32 [T]              page-table row of each query token
    n_visible   int32 [T]              visible entries of each query, (pos + 1) // ratio
    P                                  page size: entry s of request b sits in slot
                                       page_table[b, s // P] * P + s % P
Entries s >= n_visible[t] are never read. Outputs are entry ids (positions within the request),
int32, -1 = no entry; candidate pools are block ids, block b = entries [8b, 8b + 8).

Scoring and selection reuse the oracle's definitions (sglang_dsv41.layers.index_math); this file
only adds the paged gather, so it is O(N) everywhere: the mask-and-topk path.
"""

import torch

from sglang_dsv41.kv.records import unpack_index_k
from sglang_dsv41.layers.index_math import candidate_blocks, index_scores, pool_mask, topk_indices

NEG_INF = float("-inf")


def paged_records(index_k: torch.Tensor, page_table: torch.Tensor, P: int, n: int) -> torch.Tensor:
    """Records of entries 0..n-1 of every request: uint8 [B, n, R] (unallocated pages read slot
    0)."""
    s = torch.arange(n, device=index_k.device)
    page = page_table.long()[:, s // P].clamp_min(0)  # [B, n]
    return index_k[page * P + s % P]  # [B, n, R]


def paged_scores(qI, w, index_k, page_table, req_ids, n_visible, P, n=None, chunk=8):
    """I[t, s] for s < n (default max_pages * P): fp32 [T, n], -inf where s >= n_visible[t].

    Dequantizes the whole visible span of every request (O(N) per query). On CPU consecutive
    queries of one request (a prefill run) share one decode of its keys and one scoring product;
    elsewhere queries go `chunk` at a time with no host sync (CUDA-graph capturable).
    """
    T = qI.shape[0]
    n = page_table.shape[1] * P if n is None else n
    out = torch.full((T, n), NEG_INF, dtype=torch.float32, device=qI.device)
    vis = torch.arange(n, device=qI.device)[None, :] < n_visible.long()[:, None]  # [T, n]
    req = req_ids.long()
    if qI.device.type == "cpu":
        starts = torch.ones(T, dtype=torch.bool)
        starts[1:] = req[1:] != req[:-1]
        bounds = starts.nonzero().flatten().tolist() + [T]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            keys = unpack_index_k(paged_records(index_k, page_table[req[a] : req[a] + 1], P, n))
            s = index_scores(qI[a:b], w[a:b], keys[0])  # [t, n]
            out[a:b] = torch.where(vis[a:b], s, out[a:b])
        return out
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        keys = unpack_index_k(paged_records(index_k, page_table[req[rows]], P, n))
        for i, t in enumerate(range(rows.start, rows.stop)):
            s = index_scores(qI[t : t + 1], w[t : t + 1], keys[i])[0]  # [n]
            out[t] = torch.where(vis[t], s, out[t])
    return out


def full_topk_ref(qI, w, index_k, page_table, req_ids, n_visible, P, topk=512):
    """Full layer: top-min(topk, n_visible) entry ids per query, int32 [T, topk], -1 padded."""
    scores = paged_scores(qI, w, index_k, page_table, req_ids, n_visible, P)
    return topk_indices(scores, scores > NEG_INF, topk).int()


def candidate_source_ref(
    qI, w, index_k, page_table, req_ids, n_visible, P, topk=512, pool_blocks=2048, block=8
):
    """Candidate source: (own top-k int32 [T, topk], pool block ids int32 [T, pool_blocks]).

    Pool = the newest visible block plus the highest block max-scores, min(pool_blocks,
    #visible blocks) ids, -1 padded.
    """
    scores = paged_scores(qI, w, index_k, page_table, req_ids, n_visible, P)
    ids = topk_indices(scores, scores > NEG_INF, topk).int()
    blocks = candidate_blocks(scores, n_visible.long(), block, pool_blocks).int()
    return ids, blocks


def reindex_ref(qI, w, index_k, page_table, req_ids, n_visible, P, pool, topk=512, block=8):
    """Reindex, mask-and-topk: score every visible entry, mask outside `pool` [T, NB], top-k.

    Returns int32 [T, topk], -1 padded. O(N) per query: the baseline the pooled kernel beats.
    """
    scores = paged_scores(qI, w, index_k, page_table, req_ids, n_visible, P)
    allowed = (scores > NEG_INF) & pool_mask(pool.long(), scores.shape[1], block)
    return topk_indices(scores, allowed, topk).int()
