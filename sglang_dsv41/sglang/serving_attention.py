"""One V4.1 attention sublayer over a batch of requests, reading and writing the dsv41 pool.

The cached counterpart of `reference.attention.attention_layer`, with the same formulas from
`layers/` (MqaAttentionBase, Compressor, Indexer, index_math, sparse_attention). It differs only
in where keys come from: SWA keys, main-KV entries and index keys are written as records into
`DSV41KVPool` and read back through SGLang's slot table, so a request's history may come from
earlier forwards (chunked prefill, decode) or from another request (radix prefix hit).
unpack(pack(x)) is bit-identical to the reference's fake_quant(x), so the values match.

Within one forward, `ctx.shared` passes state from source layers to their consumers:
    ("kv", src, b)  -> (main fp32 [n_b, D], index K fp32 [n_b, DI]) entries visible to request b
    ("kv_all", src) -> main fp32 [B, N, D], every request's entries padded to the longest
    ("topk", layer) -> int64 [T_batch, TOPK], -1 padded, rows = batch row ids
    ("pool", b)     -> (first batch row id, bool [t_b, n_b]) candidate pool of request b
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import FULL
from sglang_dsv41.kv.records import Layout, pack, unpack
from sglang_dsv41.layers.compressor import stream_groups
from sglang_dsv41.layers.index_math import (
    candidate_blocks,
    index_scores,
    pool_mask,
    topk_indices,
    visible_mask,
)
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.sglang.context import BatchContext, Rows
from sglang_dsv41.sglang.geometry import main_layout


def swa_keys(attn, x, rows: Rows, ctx: BatchContext, pool, floor: torch.Tensor):
    """Store the rows' SWA key/values (V41 records) and return every row's SWA keys:
    (k fp32 [T, W, D], ok bool [T, W]); a row at p sees [max(floor, p - W + 1), p].

    Slot layers read records through the slot table. Ring layers (decoder, replay on) read
    positions computed in this forward from the new rows and older ones from the request's ring.
    """
    i, W = attn.layer_id, attn.cfg.sliding_window
    rec = pack(Layout.V41, attn.swa_kv(x, rows.pos))  # [T, B] uint8
    kpos = rows.pos[:, None] - W + 1 + torch.arange(W)[None, :]  # [T, W]
    ok = kpos >= floor[:, None]
    kpos = torch.maximum(kpos, floor[:, None])  # masked slots read a written record
    rp = ctx.req_pool[rows.req]  # [T]
    if pool.swa[i] is not None:
        pool.swa[i][ctx.out_loc[rows.ids]] = rec
        slots = ctx.req_to_token[rp[:, None], kpos].long()  # [T, W]
        return unpack(Layout.V41, pool.swa[i][slots]), ok
    ring = pool.ring[i]  # [R, W, B]
    first = torch.tensor([st for st, _ in rows.spans], dtype=torch.int64)[rows.req]  # [T]
    last = torch.tensor([st + n - 1 for st, n in rows.spans], dtype=torch.int64)[rows.req]
    p0 = rows.pos[first]
    in_fwd = kpos >= p0[:, None]
    new_row = (first[:, None] + kpos - p0[:, None]).clamp(0, rows.n - 1)  # [T, W]
    k = torch.where(
        in_fwd[..., None],
        unpack(Layout.V41, rec)[new_row],
        unpack(Layout.V41, ring[rp[:, None], kpos % W]),
    )
    keep = rows.pos > rows.pos[last] - W  # the request's last W rows of this forward
    ring[rp[keep], rows.pos[keep] % W] = rec[keep]
    return k, ok


def _index_k_prequant(attn, latent, entry_pos):
    """Index K before its record encoding: RoPE(k_norm(wk latent)) fp32 [n, DI] (Indexer.keys
    without quant_index, which the record applies)."""
    ix = attn.indexer
    k = ix.k_norm(ix.wk(latent.to(ix.wk.weight.dtype)).float())
    return apply_rope(k, entry_pos, attn.inv_freq)


def compress(attn, x, rows: Rows, ctx: BatchContext, pool) -> None:
    """Full layer: write the main-KV and index-K entries completed by these rows.

    Ratio 2 pairs tokens (2j, 2j + 1); a request's unpaired even token waits in
    pool.pending[layer][request slot] until its partner arrives in a later forward. The
    completed entries of all requests are encoded in one batch.
    """
    i, r = attn.layer_id, attn.ratio
    layout = main_layout(attn.cfg)
    c, z = attn.compressor.project(x)  # [T, D] fp32 each (z None at ratio 1)
    groups_c, groups_z, positions, dst = [], [], [], []
    for b, (s, n) in enumerate(rows.spans):
        if n == 0:
            continue
        p0, rp = int(rows.pos[s]), int(ctx.req_pool[b])
        pending = None
        if r == 2 and p0 % 2:
            pending = (pool.pending[i][rp, 0:1], pool.pending[i][rp, 1:2])
        cg, zg, ids, rest = stream_groups(
            r, p0, c[s : s + n], z[s : s + n] if z is not None else None, pending
        )
        if rest is not None:
            pool.pending[i][rp, 0] = rest[0][0]
            pool.pending[i][rp, 1] = rest[1][0]
        if ids.numel():
            groups_c.append(cg)
            groups_z.append(zg)
            positions.append(ids * r)
            dst.append(pool.entry_rows(i, ctx.slots(b, ids * r)))
    if not groups_c:
        return
    zg = torch.cat(groups_z) if z is not None else None
    latent = attn.compressor.pool(torch.cat(groups_c), zg)  # [m, D]
    entry_pos, dst = torch.cat(positions), torch.cat(dst)
    pool.main[i][dst] = pack(layout, attn.main_kv(latent, entry_pos))
    pool.index_k[i][dst] = pack(Layout.INDEX_K, _index_k_prequant(attn, latent, entry_pos))


def source_entries(cfg, src: int, b: int, ctx: BatchContext, pool):
    """(main fp32 [n, D], index K fp32 [n, DI]) of request b from kv source src, n = seq // r.
    Decoded once per forward for every request of the batch."""
    key = ("kv", src, b)
    if key not in ctx.shared:
        r = cfg.ratio(src)
        n = torch.tensor(ctx.seq_lens, dtype=torch.int64) // r  # [B]
        nmax = max(int(n.max()), 1)
        j = torch.minimum(torch.arange(nmax)[None, :], (n - 1).clamp_min(0)[:, None])  # [B, N]
        slots = ctx.req_to_token[ctx.req_pool[:, None], j * r].long()
        rows = pool.entry_rows(src, slots)
        main = unpack(main_layout(cfg), pool.main[src][rows])  # [B, N, D]
        index = unpack(Layout.INDEX_K, pool.index_k[src][rows])  # [B, N, DI]
        ctx.shared[("kv_all", src)] = main  # rows past n_b repeat entry n_b - 1 (or 0)
        for bb in range(len(ctx.seq_lens)):
            nb = int(n[bb])
            ctx.shared[("kv", src, bb)] = (main[bb, :nb], index[bb, :nb])
    return ctx.shared[key]


def select_topk(attn, x, q_lora, rows: Rows, ctx: BatchContext, pool) -> torch.Tensor:
    """Index source (Full / Reindex): top-k int64 [T, TOPK] (-1 padded) of these rows."""
    cfg, i = attn.cfg, attn.layer_id
    src = cfg.source_layer_of(i)
    qI, w = attn.indexer.queries(q_lora, x, rows.pos, attn.inv_freq)
    out = torch.full((rows.n, cfg.index_topk), -1, dtype=torch.int64)
    for b, (s, n) in enumerate(rows.spans):
        if n == 0:
            continue
        _, k = source_entries(cfg, src, b, ctx, pool)
        pos = rows.pos[s : s + n]
        scores = index_scores(qI[s : s + n], w[s : s + n], k)  # [n, N]
        allowed = visible_mask(pos, attn.ratio, k.shape[0])
        if cfg.uses_candidates(i):
            first, mask = ctx.shared[("pool", b)]
            off = rows.ids[s : s + n] - first
            allowed = allowed & mask[off]
        if i == cfg.candidate_source_layer_id:
            blocks = candidate_blocks(
                scores, (pos + 1) // attn.ratio, cfg.candidate_block_size, cfg.candidate_topk_blocks
            )
            ctx.shared[("pool", b)] = (
                int(rows.ids[s]),
                pool_mask(blocks, k.shape[0], cfg.candidate_block_size),
            )
        out[s : s + n] = topk_indices(scores, allowed, cfg.index_topk)
    return out


def gather_topk(attn, topk: torch.Tensor, rows: Rows, ctx: BatchContext, pool):
    """Selected main-KV entries: (k fp32 [T, TOPK, D], ok bool [T, TOPK]); -1 slots are masked."""
    src = attn.cfg.source_layer_of(attn.layer_id)
    source_entries(attn.cfg, src, 0, ctx, pool)  # decodes the whole batch's entries once
    main = ctx.shared[("kv_all", src)]  # [B, N, D]
    return main[rows.req[:, None], topk.clamp_min(0)], topk >= 0


def attention_layer(
    attn,
    x,
    rows: Rows,
    ctx: BatchContext,
    pool,
    floor: torch.Tensor,
    x_all=None,
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
    q, q_lora = attn.query(x, rows.pos)  # [T, H, D]
    k_swa, swa_ok = swa_keys(attn, x, rows, ctx, pool, floor)
    if attn.ratio == 0:
        k_top = torch.zeros(rows.n, 0, cfg.head_dim)
        top_ok = torch.zeros(rows.n, 0, dtype=torch.bool)
    else:
        if attn.indexer is not None:
            topk = select_topk(attn, x, q_lora, rows, ctx, pool)
            full = torch.full((ctx.rows.n, cfg.index_topk), -1, dtype=torch.int64)
            full[rows.ids] = topk
            ctx.shared[("topk", i)] = full
        topk = ctx.shared[("topk", cfg.index_source_of(i))][rows.ids]
        k_top, top_ok = gather_topk(attn, topk, rows, ctx, pool)
    o = sparse_attention(q, k_swa, swa_ok, k_top, top_ok, attn.attn_sink, attn.scale)
    return attn.output(o, rows.pos)
