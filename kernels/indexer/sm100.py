"""Blackwell (SM100 / SM103) indexer on DeepGEMM's FP4 MQA-logits kernels.

Interface and semantics: kernels/indexer/ref.py. This path was written against DeepGEMM's
documented API (sgl-deep-gemm >= 0.2.3: host checks, headers, SGLang 0.5.23's call sites) and
is tested on CPU by contract (tests/cpu/test_sm100_contract.py, a recording stand-in for
`deep_gemm`); it has never run on an SM100 GPU here. `scripts/b200_check.sh` checks it against
the references on a B200.

    Full scan, candidate source   decode: fp8_fp4_paged_mqa_logits over the paged pool
                                  prefill (T >= FLAT_MIN_ROWS): fp8_fp4_mqa_logits over the
                                  batch's entries gathered flat (static shapes, no host sync)
                                  -> logits fp32 [T, N]; then the oracle's own selection
                                  (layers.index_math.topk_indices / candidate_blocks)
    Reindex                       fp8_fp4_paged_sparse_mqa_logits over the pool's blocks only
                                  (sorted ascending, INT32_MAX padded; metadata built on the
                                  device by get_paged_sparse_mqa_logits_metadata) -> bf16 logits
                                  [T, NB * block]; top-k among the visible pool entries
Given the same logits the selections equal the references' exactly (ties included): the
selection is the references' code, and sorted blocks keep "ties -> lower entry".

Operands: queries are re-packed from their FP4 values into INDEX_K bytes (int8 [T, 1, HI, 64] +
packed UE8M0 int32 [T, 1, HI]; the values round-trip exactly); index K must be split pages of
128 slots (kernels.dispatch.index_page_size), viewed [num_pages, 128, 1, 68] (page stride
8704 B = 17 x 512 B, as the sparse kernel requires). Everything is on the device with shapes
fixed by the arguments: CUDA-graph capturable.
"""

from __future__ import annotations

import functools

import torch

from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK
from sglang_dsv41.kernels.dispatch import SM100_INDEX_PAGE, older_than
from sglang_dsv41.kv.records import pack_index_k
from sglang_dsv41.layers.index_math import candidate_blocks, topk_indices

NEG_INF = float("-inf")
INT32_MAX = 2**31 - 1
PAGE = SM100_INDEX_PAGE  # index-K slots per split page
FLAT_MIN_ROWS = 64  # from this many query rows the flat prefill kernel scores the batch
HEADS = (16, 32, 64)  # index heads DeepGEMM's FP4 MQA-logits kernels take
SPARSE_BLOCKS = (8, 16)  # entries per candidate block the sparse kernel takes
MAX_SPARSE_BLOCKS = 4096
API = (
    "fp8_fp4_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_sparse_mqa_logits",
    "get_paged_sparse_mqa_logits_metadata",
    "get_num_sms",
)


@functools.cache
def missing() -> str | None:
    """None when deep_gemm has the API this path calls, else why not (cached per process)."""
    try:
        import deep_gemm
    except Exception as e:  # ImportError, or a CUDA / JIT setup error raised at import
        return f"deep_gemm is not importable ({type(e).__name__}: {e})"
    version = getattr(deep_gemm, "__version__", "?")
    absent = [name for name in API if not callable(getattr(deep_gemm, name, None))]
    if absent:
        return f"deep_gemm {version} lacks {', '.join(absent)} (needs sgl-deep-gemm >= 0.2.3)"
    if older_than(version, (0, 2, 3)):  # 128-slot pages in the paged logits came with 0.2.3
        return f"deep_gemm {version} is older than 0.2.3"
    return None


def unsupported(op: str, qI, kv: PagedIndexK, geo: IndexerGeometry) -> str | None:
    """None when this path takes the call, else the reason (kernels.dispatch.select)."""
    why = missing()
    if why is not None:
        return why
    HI, DI = qI.shape[1], qI.shape[2]
    if DI != 128:
        return f"index head dim {DI} (DeepGEMM's FP4 logits need 128)"
    if HI not in HEADS:
        return f"{HI} index heads (DeepGEMM's FP4 logits take {HEADS})"
    if not kv.split_pages or kv.page_size != PAGE:
        layout = f"split pages of {kv.page_size}" if kv.split_pages else "one record per slot"
        return f"index K needs split pages of {PAGE} slots, the pool has {layout}"
    if op == "reindex":
        if geo.block not in SPARSE_BLOCKS:
            return f"candidate blocks of {geo.block} entries (the sparse kernel takes 8 or 16)"
        if -(-geo.pool_blocks // 4) * 4 > MAX_SPARSE_BLOCKS:
            return f"{geo.pool_blocks} candidate blocks (the sparse kernel takes <= 4096)"
    return None


def pack_queries(qI: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 query values bf16 [T, HI, DI] -> (codes int8 [T, 1, HI, DI/2], UE8M0 scales packed
    little-endian int32 [T, 1, HI]): SGLang's quantize_fp4_indexer_tensor layout."""
    T, HI, DI = qI.shape
    rec = pack_index_k(qI.float())  # [T, HI, DI/2 + DI/32]
    codes = rec[..., : DI // 2].contiguous().view(torch.int8)
    sf = rec[..., DI // 2 :].contiguous().view(torch.int32)  # [T, HI, 1]
    return codes.view(T, 1, HI, DI // 2), sf.view(T, 1, HI)


def kv_cache_view(kv: PagedIndexK) -> torch.Tensor:
    """The pool's split pages as DeepGEMM's fused cache: uint8 [num_pages, P, 1, 68]."""
    R = kv.record_bytes
    return kv.index_k.view(kv.index_k.shape[0], kv.page_size, 1, R)


def row_tables(kv: PagedIndexK) -> torch.Tensor:
    """Per-query page tables int32 [T, max_pages] (a row per query, as DeepGEMM indexes)."""
    return kv.page_table.to(torch.int32)[kv.req_ids.long()].contiguous()


def pair_ids(req_ids: torch.Tensor) -> torch.Tensor:
    """int32 [T]: one id per consecutive row pair of a request (DeepGEMM pairs rows with equal
    ids on one KV pass; equal-id runs of two keep its request walk short)."""
    T = req_ids.shape[0]
    t = torch.arange(T, device=req_ids.device)
    start = torch.ones(T, dtype=torch.bool, device=req_ids.device)
    start[1:] = req_ids[1:] != req_ids[:-1]
    first = torch.cummax(torch.where(start, t, torch.zeros_like(t)), 0).values
    return (t - ((t - first) & 1)).to(torch.int32)


def _paged_logits(dg, q, kv: PagedIndexK, w: torch.Tensor) -> torch.Tensor:
    n_vis = kv.n_visible.to(torch.int32).view(-1, 1).contiguous()  # [T, 1]
    meta = dg.get_paged_mqa_logits_metadata(n_vis, kv.page_size, dg.get_num_sms())
    return dg.fp8_fp4_paged_mqa_logits(
        q,
        kv_cache_view(kv),
        w.float().contiguous(),
        n_vis,
        row_tables(kv),
        meta,
        kv.max_entries,
        False,
        logits_dtype=torch.float32,
    )


def flat_records(kv: PagedIndexK) -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's entries 0 .. max_entries - 1 gathered flat, request after request:
    (codes int8 [B * N, 64], UE8M0 scales int32 [B * N]); unallocated pages read as zeros."""
    N, P = kv.max_entries, kv.page_size
    s = torch.arange(N, device=kv.index_k.device)
    page = kv.page_table.long()[:, s // P]  # [B, N]
    slots = torch.where(page >= 0, page * P + s % P, torch.full_like(page, -1))
    rec = kv.records(slots.view(-1))  # [B * N, 68]
    codes = rec[:, :64].contiguous().view(torch.int8)
    return codes, rec[:, 64:].contiguous().view(torch.int32).view(-1)


def _flat_logits(dg, q, kv: PagedIndexK, w: torch.Tensor) -> torch.Tensor:
    N = kv.max_entries
    start = (kv.req_ids.to(torch.int64) * N).to(torch.int32).contiguous()
    end = (start + kv.n_visible.to(torch.int32)).contiguous()
    q_fp4, q_sf = q
    return dg.fp8_fp4_mqa_logits(
        (q_fp4[:, 0], q_sf[:, 0]),
        flat_records(kv),
        w.float().contiguous(),
        start,
        end,
        False,
        N,
        logits_dtype=torch.float32,
    )


def index_logits(qI, w, kv: PagedIndexK) -> torch.Tensor:
    """Scores of every addressable entry: fp32 [T, max_entries], -inf at s >= n_visible[t]
    (the reference's paged_scores, from DeepGEMM)."""
    import deep_gemm as dg

    q = pack_queries(qI)
    T = qI.shape[0]
    logits = (_flat_logits if T >= FLAT_MIN_ROWS else _paged_logits)(dg, q, kv, w)
    N = kv.max_entries
    vis = torch.arange(N, device=qI.device)[None, :] < kv.n_visible.long()[:, None]
    return torch.where(vis, logits[:, :N].float(), torch.full_like(vis, NEG_INF, dtype=torch.float))


def full_topk(qI, w, kv: PagedIndexK, geo: IndexerGeometry):
    """Full layer -> int32 [T, topk] entry ids, -1 padded (ascending score order not kept)."""
    if qI.shape[0] == 0:
        return torch.full((0, geo.topk), -1, dtype=torch.int32, device=qI.device)
    scores = index_logits(qI, w, kv)
    return topk_indices(scores, scores > NEG_INF, geo.topk).int()


def candidate_source(qI, w, kv: PagedIndexK, geo: IndexerGeometry):
    """Candidate source -> (own top-k int32 [T, topk], pool block ids int32 [T, pool_blocks])."""
    if qI.shape[0] == 0:
        empty = torch.full((0, geo.topk), -1, dtype=torch.int32, device=qI.device)
        return empty, empty.new_full((0, geo.pool_blocks), -1)
    scores = index_logits(qI, w, kv)
    ids = topk_indices(scores, scores > NEG_INF, geo.topk).int()
    pool = candidate_blocks(scores, kv.n_visible.long(), geo.block, geo.pool_blocks).int()
    return ids, pool


def sparse_blocks(pool: torch.Tensor, kv: PagedIndexK, block: int):
    """The pool as DeepGEMM's sparse block table: (ascending distinct block ids int32 [T, NBp]
    with INT32_MAX padding, NBp = NB rounded up to a multiple of 4; live block count int32 [T]).
    Ids that are -1 or past the page table's reach are dropped."""
    T, NB = pool.shape
    reach = -(-kv.max_entries // block)
    live = (pool >= 0) & (pool < reach)
    pad = torch.full_like(pool, INT32_MAX, dtype=torch.int32)
    ids = torch.where(live, pool.to(torch.int32), pad)
    NBp = -(-max(NB, 1) // 4) * 4
    if NBp != NB:
        ids = torch.cat((ids, ids.new_full((T, NBp - NB), INT32_MAX)), dim=1)
    ids = ids.sort(dim=1).values
    dup = torch.zeros_like(ids, dtype=torch.bool)
    dup[:, 1:] = ids[:, 1:] == ids[:, :-1]
    ids = torch.where(dup, torch.full_like(ids, INT32_MAX), ids).sort(dim=1).values
    return ids.contiguous(), (ids != INT32_MAX).sum(1).to(torch.int32)


def reindex(qI, w, kv: PagedIndexK, pool: torch.Tensor, geo: IndexerGeometry):
    """Reindex inside pool int32 [T, NB] -> int32 [T, topk] entry ids, -1 padded; DeepGEMM
    scores only the pool's entries (work independent of the context length)."""
    T = qI.shape[0]
    if T == 0:
        return torch.full((0, geo.topk), -1, dtype=torch.int32, device=qI.device)
    import deep_gemm as dg

    blk = geo.block
    blocks, live = sparse_blocks(pool, kv, blk)
    NBp = blocks.shape[1]
    # DeepGEMM reads min(NBp, ceil(context / blk)) ids per row: give it the live count exactly
    context = (live * blk).contiguous()
    meta = dg.get_paged_sparse_mqa_logits_metadata(
        context, row_tables(kv), pair_ids(kv.req_ids), kv.page_size, blocks, torch.int8, blk
    )
    logits = dg.fp8_fp4_paged_sparse_mqa_logits(
        pack_queries(qI), kv_cache_view(kv), w.to(torch.bfloat16).contiguous(), meta, NBp, blk
    )  # [T, NBp * blk]
    j = torch.arange(NBp * blk, device=qI.device)
    entry = blocks.long()[:, j // blk] * blk + j % blk  # [T, NBp * blk]
    allowed = ((j // blk)[None, :] < live.long()[:, None]) & (entry < kv.n_visible.long()[:, None])
    col = topk_indices(logits[:, : NBp * blk].float(), allowed, geo.topk)  # [T, topk]
    ids = entry.gather(1, col.clamp_min(0))
    return torch.where(col >= 0, ids, torch.full_like(ids, -1)).int()
