"""Paged lightning indexer: Full-layer top-k, candidate source, pooled Reindex.

Interface and semantics: kernels/indexer/ref.py. On SM90+ with Triton the fast path
(kernels/indexer/ops.py) never builds a [T, N] logits tensor and its Reindex work is independent
of N; elsewhere, or with DSV41_FORCE_REF=1, the torch references (mask-and-topk) run.
"""

from sglang_dsv41.kernels.dispatch import use_triton
from sglang_dsv41.kernels.indexer import ref


def _fast(qI):
    if use_triton(qI.device):
        from sglang_dsv41.kernels.indexer import ops

        return ops
    return None


def full_topk(qI, w, index_k, page_table, req_ids, n_visible, P, topk=512, group=1):
    """Full layer -> int32 [T, topk] entry ids, -1 padded (order unspecified on the fast path).

    group: prefill hint for the fast path, every aligned run of `group` tokens is one request
    (ops.groupable); 8 is fastest on the H200. The reference ignores it.
    """
    ops = _fast(qI)
    if ops:
        return ops.full_topk(qI, w, index_k, page_table, req_ids, n_visible, P, topk, group)
    return ref.full_topk_ref(qI, w, index_k, page_table, req_ids, n_visible, P, topk)


def candidate_source(
    qI, w, index_k, page_table, req_ids, n_visible, P, topk=512, pool_blocks=2048, group=1
):
    """Candidate source -> (own top-k int32 [T, topk], pool block ids int32 [T, pool_blocks])."""
    ops = _fast(qI)
    if ops:
        return ops.candidate_source(
            qI, w, index_k, page_table, req_ids, n_visible, P, topk, pool_blocks, group
        )
    return ref.candidate_source_ref(
        qI, w, index_k, page_table, req_ids, n_visible, P, topk, pool_blocks
    )


def reindex(qI, w, index_k, page_table, req_ids, n_visible, P, pool, topk=512):
    """Reindex inside pool int32 [T, NB] -> int32 [T, topk] entry ids, -1 padded."""
    ops = _fast(qI)
    impl = ops.reindex if ops else ref.reindex_ref
    return impl(qI, w, index_k, page_table, req_ids, n_visible, P, pool, topk)


__all__ = ["candidate_source", "full_topk", "reindex"]
