"""Paged lightning indexer: Full-layer top-k, candidate source, pooled Reindex.

Interface and semantics: kernels/indexer/ref.py. Arguments are bundles (kernels/args.py):
`PagedIndexK` (pool, page table, req_ids, n_visible, page size) and `IndexerGeometry` (topk,
pool_blocks, block), built from the config by the caller; nothing here assumes Flash's sizes.

Paths (kernels/dispatch.py): on SM100 / SM103 DeepGEMM's paged FP4 logits (sm100.py); on SM90+
Triton (ops.py: no [T, N] logits tensor, Reindex work independent of N); elsewhere, with
DSV41_FORCE_REF=1, or for a configuration no fast path supports (logged once), the torch
references (mask-and-topk).
"""

import torch

from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.indexer import ref


def triton_unsupported(qI, kv: PagedIndexK, geo: IndexerGeometry) -> str | None:
    """None when the Triton kernels (ops.py) take this call, else the reason."""
    HI, DI = qI.shape[1], qI.shape[2]
    if qI.dtype == torch.float64:
        return "float64 index queries"
    if DI % 128:
        return f"index head dim {DI} is not a multiple of 128"
    if HI < 16 or HI & (HI - 1):
        return f"{HI} index heads (needs a power of two >= 16)"
    if geo.block != 8:
        return f"candidate blocks of {geo.block} entries (needs 8)"
    if kv.split_pages and kv.page_size > 1:
        return f"index K in split pages of {kv.page_size} slots (reads one record per slot)"
    return None


def _path(op: str, qI, kv: PagedIndexK, geo: IndexerGeometry) -> Path:
    def sm100_check():
        from sglang_dsv41.kernels.indexer import sm100

        return sm100.unsupported(op, qI, kv, geo)

    fast = {Path.SM100: sm100_check, Path.TRITON: lambda: triton_unsupported(qI, kv, geo)}
    return dispatch.select(f"indexer.{op}", qI.device, fast)


def _run(op: str, qI, w, kv: PagedIndexK, geo: IndexerGeometry, *args, **triton_kw):
    """`op` on the path `_path` selects: sm100.<op>, ops.<op> or ref.<op>_ref, each called as
    (qI, w, kv, *args, geo); the Triton one also gets `triton_kw` (the prefill hint `group`)."""
    path = _path(op, qI, kv, geo)
    if path is Path.SM100:
        from sglang_dsv41.kernels.indexer import sm100

        return getattr(sm100, op)(qI, w, kv, *args, geo)
    if path is Path.TRITON:
        from sglang_dsv41.kernels.indexer import ops

        return getattr(ops, op)(qI, w, kv, *args, geo, **triton_kw)
    return getattr(ref, f"{op}_ref")(qI, w, kv, *args, geo)


def full_topk(qI, w, kv: PagedIndexK, geo: IndexerGeometry, group=1):
    """Full layer -> int32 [T, topk] entry ids, -1 padded (order unspecified on fast paths).

    group: prefill hint for the Triton path, every aligned run of `group` tokens is one request
    (ops.groupable); 8 is fastest on the H200. The other paths ignore it.
    """
    return _run("full_topk", qI, w, kv, geo, group=group)


def candidate_source(qI, w, kv: PagedIndexK, geo: IndexerGeometry, group=1):
    """Candidate source -> (own top-k int32 [T, topk], pool block ids int32 [T, pool_blocks])."""
    return _run("candidate_source", qI, w, kv, geo, group=group)


def reindex(qI, w, kv: PagedIndexK, pool: torch.Tensor, geo: IndexerGeometry):
    """Reindex inside pool int32 [T, NB] block ids -> int32 [T, topk] entry ids, -1 padded."""
    return _run("reindex", qI, w, kv, geo, pool)


__all__ = ["IndexerGeometry", "PagedIndexK", "candidate_source", "full_topk", "reindex"]
