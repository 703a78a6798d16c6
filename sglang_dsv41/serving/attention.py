"""The one cached V4.1 attention sublayer (CSA2) over a batch of requests.

The cached counterpart of `reference.attention.attention_layer`, with the same formulas from
`layers/`: it differs only in where keys come from. SWA keys, main-KV entries and index keys are
written as records into the pool (`stores.py`) and read back through SGLang's slot table, so a
request's history may come from earlier forwards (chunked prefill, decode) or another request
(radix prefix hit). Every step is one `kernels` dispatcher call over slot lists and page tables
built on the device: the Triton kernels on SM90+, their torch references (which call the
formulas in `layers/`) on CPU or with DSV41_FORCE_REF=1.

Slot tables (int32/int64, -1 = none):
    SWA window    the SWA slots of positions [max(floor, p - W + 1), p] of the row's request
    page table    int32 [B, n_pages]: the page ids of each request's token slots
                  (req_to_token[req_pool[b], j P] // P, P the pool's page size). A ratio-r
                  source's entry s sits in buffer row page_table[b, s // (P/r)] (P/r) + s % (P/r)
                  (kv.pages.slot_of), one table for every source; its width covers
                  ctx.table_len positions, fixed under CUDA graphs.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import FULL, DeepseekV41Config
from sglang_dsv41.kernels import indexer as kidx
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK, SparseKV
from sglang_dsv41.kernels.sparse_attn import sparse_attention
from sglang_dsv41.kernels.sparse_attn.ref import decode_records
from sglang_dsv41.kv.pages import entries_visible, slot_of
from sglang_dsv41.layers.dtypes import compute_dtype
from sglang_dsv41.layers.protocols import Attention
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import BatchContext, Rows
from sglang_dsv41.serving.stores import compress, write_swa


def page_table(ctx: BatchContext, page: int) -> torch.Tensor:
    """int32 [B, ceil(table_len / page)] page ids of the batch's requests; built once per
    forward."""
    table = ctx.shared.page_table
    if table is None:
        cols = torch.arange(0, ctx.table_len, page, device=ctx.req_pool.device)
        cols = cols.clamp_max(ctx.req_to_token.shape[1] - 1)
        tok = ctx.req_to_token[ctx.req_pool[:, None], cols[None, :]]  # [B, n_pages]
        table = (tok // page).to(torch.int32)
        ctx.shared.page_table = table
    return table


def select_topk(
    attn: Attention,
    x: torch.Tensor,
    q_lora: torch.Tensor,
    rows: Rows,
    ctx: BatchContext,
    pool: RecordBuffers,
) -> torch.Tensor:
    """Index source (Full / Reindex): top-k int64 [T, TOPK] entry ids (-1 padded, order
    unspecified) of these rows; the candidate source also leaves its pool in ctx.shared."""
    cfg, i = attn.cfg, attn.layer_id
    src = cfg.source_layer_of(i)
    qI, w = attn.indexer.queries(q_lora, x, ctx.shared.angles(attn, rows), attn.inv_freq)
    kv = PagedIndexK(
        index_k=pool.index_k[src],
        page_table=page_table(ctx, pool.page),
        req_ids=rows.req.to(torch.int32),
        n_visible=entries_visible(rows.pos, attn.ratio).to(torch.int32),
        page_size=pool.page // cfg.ratio(src),  # entries per page
        split_pages=False,
    )
    geo = IndexerGeometry.of(cfg)
    if cfg.uses_candidates(i):
        out = kidx.reindex(qI, w, kv, ctx.shared.candidates[rows.ids], geo)
    elif i == cfg.candidate_source_layer_id:
        out, cand = kidx.candidate_source(qI, w, kv, geo)
        full = torch.full((ctx.rows.n, geo.pool_blocks), -1, dtype=torch.int32, device=qI.device)
        full[rows.ids] = cand.to(torch.int32)
        ctx.shared.candidates = full
    else:
        out = kidx.full_topk(qI, w, kv, geo)
    return out.long()


def topk_slots(
    cfg: DeepseekV41Config, isrc: int, rows: Rows, ctx: BatchContext, pool: RecordBuffers
) -> torch.Tensor:
    """int32 [T, TOPK]: the rows' top-k entries of index source `isrc` as rows of its kv
    source's main-KV buffer (-1 padded). Mapped once per forward over every batch row; the
    source's Reuse layers read the same."""
    slots = ctx.shared.topk_slots.get(isrc)
    if slots is None:
        topk = ctx.shared.topk[isrc]  # [T_batch, TOPK]
        src = cfg.source_layer_of(isrc)
        req = ctx.rows.req[:, None].expand_as(topk).reshape(-1)
        rows_of = slot_of(
            page_table(ctx, pool.page), topk.reshape(-1), req, pool.page // cfg.ratio(src)
        )
        slots = ctx.shared.topk_slots[isrc] = rows_of.view(topk.shape).to(torch.int32)
    return slots if rows.n == ctx.rows.n else slots[rows.ids]


def topk_decoded(attn: Attention, kv: torch.Tensor, top: torch.Tensor, ctx: BatchContext):
    """CPU: the records of `top` (the layer's rows' top-k slots in kv, from `topk_slots`) as
    kernels.args.DecodedRecords, decoded once per forward for each part and index source and
    shared by the layers that read them (the index source and its Reuse layers: same rows and
    slots, in a kv source written before the first of them); None elsewhere (the fast paths
    read the records)."""
    if top.device.type != "cpu":
        return None
    cfg = attn.cfg
    decoded = ctx.shared.part(attn).topk_decoded
    isrc = cfg.index_source_of(attn.layer_id)
    got = decoded.get(isrc)
    if got is None:
        got = decoded[isrc] = decode_records(kv, top, cfg.main_kv_layout, cfg.head_dim)
    return got


def attend(
    attn: Attention,
    q: torch.Tensor,
    rows: Rows,
    ctx: BatchContext,
    pool: RecordBuffers,
    swa: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Sparse attention of q fp32 [T, H, D] over the SWA window `swa` = write_swa's (cache,
    slots) and, for compressed layers, the top-k entries of the layer's index source in its kv
    source, plus the sink: o [T, H, D] in q's dtype (fp32; fp64 for fp64 q: the twin check), or
    q and o in the layer's attn_dtype when it has one (bf16: the kernels' bf16 path)."""
    cfg, i = attn.cfg, attn.layer_id
    kv = top = decoded = None
    if attn.ratio != 0:
        isrc = cfg.index_source_of(i)
        kv = pool.main[cfg.source_layer_of(i)]
        top = topk_slots(cfg, isrc, rows, ctx, pool)
        decoded = topk_decoded(attn, kv, top, ctx)
    return sparse_attention(
        attn.attention_in(q),
        SparseKV(swa[0], swa[1], kv, top, cfg.main_kv_layout, decoded, ctx.max_slots),
        attn.attn_sink,
        attn.scale,
        out_dtype=attn.attn_dtype or compute_dtype(q),
    )


def attention_layer(
    attn: Attention,
    x: torch.Tensor,
    rows: Rows,
    ctx: BatchContext,
    pool: RecordBuffers,
    floor: torch.Tensor,
    x_all: torch.Tensor | None = None,
    rows_all: Rows | None = None,
) -> torch.Tensor:
    """x [T, hidden] attention input of `rows` -> [T, hidden].

    floor int64 [T]: lowest SWA key position per row (bounded replay; 0 otherwise).
    x_all / rows_all: for the decoder's Full layer under replay, its attention input over every
    batch row (the compressor runs over all of them, attention only over `rows`).
    """
    cfg, i = attn.cfg, attn.layer_id
    if attn.role == FULL:
        compress(
            attn, x if x_all is None else x_all, rows if rows_all is None else rows_all, ctx, pool
        )
    if rows.n == 0:
        return x.new_zeros(0, cfg.hidden_size)
    angles = ctx.shared.angles(attn, rows)  # RoPE of rows.pos, once per forward
    q, q_lora = attn.query(x, angles)  # [T, H, D]
    swa = write_swa(attn, x, rows, ctx, pool, floor)
    if attn.ratio != 0 and attn.indexer is not None:
        full = torch.full((ctx.rows.n, cfg.index_topk), -1, dtype=torch.int64, device=x.device)
        full[rows.ids] = select_topk(attn, x, q_lora, rows, ctx, pool)
        ctx.shared.topk[i] = full
    return attn.output(attend(attn, q, rows, ctx, pool, swa), angles)
