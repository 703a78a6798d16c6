"""Launchers and selection for the Triton indexer (interface in kernels/indexer/ref.py).

Limits (checked by the dispatcher, kernels/indexer/__init__.py `triton_unsupported`): DI a
multiple of 128, HI >= 16 a power of two, candidate blocks of BLOCK = 8, index K as one record
per slot (split pages only with a page size of 1).

Full layer, without a [T, N] logits tensor: the scan writes block maxima (blocks of 8), the
top-TOPK blocks are chosen, and only their 8 * TOPK entries are rescored (an O(1) pass) for the
final top-TOPK. Exact up to ties: let v be the TOPK-th score. Every entry above v lies in a block
whose max is above v, and fewer than TOPK blocks have that; so the top-TOPK blocks hold every
entry above v plus, from blocks whose max equals v, enough entries equal to v (or all of them).
The same argument with the forced newest block taking one place shows that a pool of
`pool_blocks > topk` blocks holds the Full layer's own top-k, so the candidate source reads its
top-k off the pool it builds. Output order along the TOPK axis is unspecified.
"""

import torch
import triton

from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK
from sglang_dsv41.kernels.dispatch import triton_interpreting
from sglang_dsv41.kernels.indexer.select import topk_rows
from sglang_dsv41.kernels.indexer.triton import _pool_kernel, _scan_group_kernel, _scan_kernel

BLOCK = 8
# Launch shapes (entries per tile, tiles per program, warps): the fastest of
# benchmarks/bench_indexer.py's sweeps on the H200 (RESULTS.md); prefill callers pass group=8.
TUNING = {
    "scan": {"bn": 128, "tiles": 8, "num_warps": 4},
    "scan_group": {"bn": 128, "tiles": 8, "num_warps": 8},
    "pool": {"bn": 128, "tiles": 1, "num_warps": 4},
}


def _prep(qI, w, kv: PagedIndexK):
    T, HI, DI = qI.shape
    index_k = kv.index_k.view(-1, kv.record_bytes)  # [S, R]: records (page size 1 if split)
    assert DI % 128 == 0 and HI >= 16 and (HI & (HI - 1)) == 0, (HI, DI)
    assert index_k.shape[1] == DI // 2 + DI // 32, (index_k.shape, DI)
    assert not kv.split_pages or kv.page_size == 1, "the Triton indexer reads slot records"
    assert index_k.is_contiguous() and index_k.storage_offset() % 4 == 0
    assert w.shape == (T, HI) and kv.req_ids.shape == (T,)
    q = qI.to(torch.bfloat16).contiguous()  # FP4 fake-quant values are exact in bf16
    w = w.to(torch.float32).contiguous()
    pt = kv.page_table.to(torch.int32).contiguous()
    return (
        q,
        w,
        index_k.view(torch.int32),
        pt,
        kv.req_ids.to(torch.int32).contiguous(),
        kv.n_visible.to(torch.int32).contiguous(),
    )


def groupable(req_ids_cpu: torch.Tensor, group: int) -> bool:
    """True when every aligned run of `group` tokens belongs to one request (host check, for
    callers that know the batch layout, e.g. from SGLang's extend_seq_lens_cpu)."""
    r = req_ids_cpu.cpu()
    T = r.shape[0]
    pad = (-T) % group
    r = torch.cat([r, r[-1:].expand(pad)]) if pad and T else r
    return T == 0 or bool((r.view(-1, group) == r.view(-1, group)[:, :1]).all())


def nibble_major(q: torch.Tensor) -> torch.Tensor:
    """bf16 [T, HI, DI] -> bf16 [T, 8, DI/8, HI] with out[t, j, i, h] = q[t, h, 8 i + j]."""
    T, HI, DI = q.shape
    return q.view(T, HI, DI // 8, 8).permute(0, 3, 2, 1).contiguous()


def _launch(kernel, tune: str, qI, w, kv: PagedIndexK, n_blk, cols, group=1, blocks=(), **flags):
    """Run one indexer kernel into a new fp32 [T, cols] and return it (empty launch skipped).

    Programs: ceil(T / group) x ceil(n_blk * BLOCK / (BN * TILES)), BN, TILES and warps from
    TUNING[tune]. Positional arguments: q, w, records, page table, req_ids, n_visible, *blocks,
    out, page-table stride, n_blk, P; with group > 1 (the grouped scan) q is nibble-major, T
    follows out and QB = group. `flags`: the kernel's other compile-time switches.
    """
    q, w, rec, pt, req, nvis = _prep(qI, w, kv)
    T, HI, DI = qI.shape
    bn, tiles, num_warps = (TUNING[tune][k] for k in ("bn", "tiles", "num_warps"))
    out = torch.empty(T, cols, dtype=torch.float32, device=q.device)
    if T == 0 or n_blk == 0:
        return out
    t_arg = ()
    if group > 1:
        q, t_arg, flags = nibble_major(q), (T,), {**flags, "QB": group}
    grid = (triton.cdiv(T, group), triton.cdiv(n_blk * BLOCK, bn * tiles))
    kernel[grid](
        q,
        w,
        rec,
        pt,
        req,
        nvis,
        *blocks,
        out,
        *t_arg,
        pt.stride(0),
        n_blk,
        kv.page_size,
        HI=HI,
        DI=DI,
        BN=bn,
        TILES=tiles,
        BLOCK=BLOCK,
        DOT_F32=triton_interpreting(),
        num_warps=num_warps,
        **flags,
    )
    return out


def block_scores(qI, w, kv: PagedIndexK, force_newest=False, group=1):
    """Block max of each query's score row: fp32 [T, ceil(max_pages * P / 8)].

    -inf for blocks past the visible ones; +inf for the newest visible block if force_newest.
    group > 1 (prefill): runs of `group` tokens share each dequantized key tile; the caller
    guarantees every aligned run is one request (see `groupable`).
    """
    nblk = triton.cdiv(kv.page_table.shape[1] * kv.page_size, BLOCK)
    if group > 1:
        assert group & (group - 1) == 0, group
        kernel, tune = _scan_group_kernel, "scan_group"
    else:
        kernel, tune = _scan_kernel, "scan"
    return _launch(kernel, tune, qI, w, kv, nblk, nblk, group, FORCE_NEWEST=force_newest)


def pool_scores(qI, w, kv: PagedIndexK, blocks):
    """Scores of the entries of blocks int32 [T, NB] (-1 = none): fp32 [T, NB * 8].

    Column 8 j + i is entry 8 * blocks[t, j] + i; -inf where the block is -1 or the entry is
    not visible. Work is proportional to NB, independent of N.
    """
    blocks = blocks.to(torch.int32).contiguous()
    NB = blocks.shape[1]
    return _launch(_pool_kernel, "pool", qI, w, kv, NB, NB * BLOCK, blocks=(blocks,))


def select_blocks(bscores: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Top blocks of bscores fp32 [T, NBLK]: int32 [T, n_blocks], -1 for -inf / padding
    (kernels/indexer/select.py)."""
    return topk_rows(bscores, n_blocks)


def select_in_blocks(scores: torch.Tensor, blocks: torch.Tensor, topk: int) -> torch.Tensor:
    """Top entries of pool scores fp32 [T, NB * 8] over blocks [T, NB]: int32 [T, topk], -1 pad
    (kernels/indexer/select.py)."""
    return topk_rows(scores, topk, blocks=blocks)


def full_topk(qI, w, kv: PagedIndexK, geo: IndexerGeometry, group=1):
    """Full layer: int32 [T, topk] entry ids, -1 padded (see module docstring)."""
    blocks = select_blocks(block_scores(qI, w, kv, group=group), geo.topk)
    return select_in_blocks(pool_scores(qI, w, kv, blocks), blocks, geo.topk)


def candidate_source(qI, w, kv: PagedIndexK, geo: IndexerGeometry, group=1):
    """Candidate source: (own top-k int32 [T, topk], pool int32 [T, pool_blocks]), one scan."""
    topk, pool_blocks = geo.topk, geo.pool_blocks
    if pool_blocks > topk:
        pool = select_blocks(block_scores(qI, w, kv, force_newest=True, group=group), pool_blocks)
        return select_in_blocks(pool_scores(qI, w, kv, pool), pool, topk), pool
    bscores = block_scores(qI, w, kv, group=group)
    own = select_blocks(bscores, topk)
    nv = kv.n_visible.to(torch.int64)
    newest = ((nv - 1).clamp_min(0) // BLOCK)[:, None]
    forced = torch.where(nv[:, None] > 0, torch.full_like(newest, 1), torch.zeros_like(newest))
    bscores.scatter_(1, newest, torch.where(forced > 0, float("inf"), bscores.gather(1, newest)))
    pool = select_blocks(bscores, pool_blocks)
    return select_in_blocks(pool_scores(qI, w, kv, own), own, topk), pool


def reindex(qI, w, kv: PagedIndexK, pool: torch.Tensor, geo: IndexerGeometry):
    """Reindex: top-k int32 [T, topk] inside pool [T, NB] block ids; O(NB) per query."""
    return select_in_blocks(pool_scores(qI, w, kv, pool), pool, geo.topk)
