"""The serving attention on the kernel dispatchers: stores, indexer and sparse attention.

Same arguments and results as `sglang_dsv41.sglang.serving_attention` (write + gather SWA,
`compress`, `select_topk`, gather + `sparse_attention`), but every step is one dispatcher call
(`sglang_dsv41.kernels.kv_store`, `.indexer`, `.sparse_attn`) over slot lists and page tables
built on the device from the batch context: no per-request Python loops, no host syncs except
where noted. On CUDA SM90+ the Triton kernels run; on CPU (or with DSV41_FORCE_REF=1) the
dispatchers' torch references run, and the results equal the torch serving path (tested in
tests/cpu/test_kernel_path.py).

Slot tables (all int32/int64, -1 = none):
    SWA slot layers   slot of position p of the row's request: req_to_token[req_pool[req], p]
    SWA ring layers   a scratch cache [B_batch * W + T, 528]: the batch's rings (read before this
                      forward overwrites them), then this forward's T new records
    entry table       [B_batch, n_max] buffer row of entry s of request b (page size 1 for the
                      indexer): req_to_token[req_pool[b], s r] // r  (RecordBuffers.entry_rows)
Cross-layer state in ctx.shared (this path's own keys; do not mix with serving_attention's
select_topk within one forward):
    ("topk", layer)       int64 [T_batch, TOPK] entry ids, -1 padded (as serving_attention)
    ("kp_pool", layer)    int32 [T_batch, NB] candidate block ids of the candidate source
    ("kp_table", src)     int32 [B_batch, n_max] entry table of kv source src
The indexer's dispatcher picks its path per call (kernels/dispatch.py): geometries its fast
paths do not take (the tiny / small presets) run the torch reference on the device, logged once.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import FULL
from sglang_dsv41.kernels import indexer as kidx
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK, SparseKV
from sglang_dsv41.kernels.kv_store import store_index_k, store_latent, store_records
from sglang_dsv41.kernels.sparse_attn import entry_slots, sparse_attention, swa_window_slots
from sglang_dsv41.kv.records import Layout
from sglang_dsv41.sglang.context import BatchContext, Rows
from sglang_dsv41.sglang.geometry import main_layout


def _normed_input(lin, norm, x):
    """(rows, norm weight or None): fuse the RMSNorm into the store for fp32 projections (the
    kernel then rounds exactly like `norm(lin(x)).float()`); bf16 ones are normed here, because
    the layers apply RoPE after `.float()` while a bf16 store would round after RoPE too."""
    y = lin(x)
    if y.dtype == torch.float32:
        return y, norm.weight
    return norm(y).float(), None


def write_swa(attn, x, rows: Rows, ctx: BatchContext, pool, floor: torch.Tensor):
    """Store the rows' SWA records (V41) and return what attention reads:
    (cache uint8 [S, 528], slots int32 [T, W]); row t at p sees [max(floor, p - W + 1), p],
    slots oldest first, -1 outside (or slot lists of `kernels.sparse_attn.swa_window_slots`).

    Slot layers write at ctx.out_loc and read through req_to_token. Ring layers (decoder, replay
    on) read a scratch copy of the batch's rings plus this forward's records, then keep each
    request's last W records of this forward in its ring.
    """
    i, W = attn.layer_id, attn.cfg.sliding_window
    kv, w = _normed_input(attn.wkv, attn.kv_norm, x)
    dev = kv.device
    rp = ctx.req_pool.to(dev)[rows.req]  # [T]
    if pool.swa[i] is not None:
        store_records(
            kv,
            pool.swa[i],
            ctx.out_loc.to(dev)[rows.ids],
            Layout.V41,
            norm_weight=w,
            eps=attn.kv_norm.eps,
            pos=rows.pos,
            inv_freq=attn.inv_freq,
        )
        return pool.swa[i], swa_window_slots(ctx.req_to_token.to(dev), rp, rows.pos, W, floor)
    ring = pool.ring[i]  # [R, W, B]
    Bn, B = ctx.req_pool.shape[0], ring.shape[-1]
    T = rows.n
    scratch = torch.empty(Bn * W + T, B, dtype=torch.uint8, device=dev)
    scratch[: Bn * W] = ring[ctx.req_pool.to(dev)].view(Bn * W, B)
    new = scratch[Bn * W :]
    store_records(
        kv,
        new,
        torch.arange(T, device=dev),
        Layout.V41,
        norm_weight=w,
        eps=attn.kv_norm.eps,
        pos=rows.pos,
        inv_freq=attn.inv_freq,
    )
    # first / last row of each row's request, without host syncs: rows are grouped by request
    t = torch.arange(T, device=dev)
    start = torch.ones(T, dtype=torch.bool, device=dev)
    start[1:] = rows.req[1:] != rows.req[:-1]
    first = torch.cummax(torch.where(start, t, torch.zeros_like(t)), 0).values  # [T]
    end = torch.ones(T, dtype=torch.bool, device=dev)
    end[:-1] = start[1:]
    last = torch.flip(
        torch.cummin(torch.flip(torch.where(end, t, torch.full_like(t, T)), [0]), 0).values, [0]
    )  # [T]
    kpos = rows.pos[:, None] - W + 1 + torch.arange(W, device=dev)[None, :]  # [T, W]
    ok = kpos >= torch.clamp(floor, min=0)[:, None]
    p0 = rows.pos[first]
    in_fwd = kpos >= p0[:, None]
    slots = torch.where(
        in_fwd, Bn * W + first[:, None] + kpos - p0[:, None], rows.req[:, None] * W + kpos % W
    )
    slots = torch.where(ok, slots, torch.full_like(slots, -1)).to(torch.int32)
    keep = rows.pos > rows.pos[last] - W  # the request's last W rows of this forward
    ring[rp[keep], rows.pos[keep] % W] = new[keep]
    return scratch, slots


def _pairs(rows: Rows, r: int):
    """Per row: (completes an entry, the row before it is the same request's previous row)."""
    T, dev = rows.n, rows.pos.device
    done = (rows.pos + 1) % r == 0
    prev_same = torch.zeros(T, dtype=torch.bool, device=dev)
    prev_same[1:] = rows.req[1:] == rows.req[:-1]
    return done, prev_same


def compress(attn, x, rows: Rows, ctx: BatchContext, pool) -> None:
    """Full layer: write the main-KV and index-K entries completed by these rows (ratio 1 or 2;
    a ratio-2 request's unpaired even token waits in pool.pending[layer][request slot])."""
    i, r = attn.layer_id, attn.ratio
    if r not in (1, 2):
        raise NotImplementedError(f"kernel path: compress ratio {r}")
    dev = x.device
    c, z = attn.compressor.project(x)  # [T, D] fp32 each (z None at ratio 1)
    rp = ctx.req_pool.to(dev)[rows.req]  # [T]
    done, prev_same = _pairs(rows, r)
    t = done.nonzero().flatten()  # rows that complete an entry (one device sync for the size)
    if r == 2:
        # partner: the previous row of the same request, else the request's pending token
        prev = (t - 1).clamp_min(0)
        own = prev_same[t][:, None]
        pend = pool.pending[i]
        cg = torch.stack((torch.where(own, c[prev], pend[rp[t], 0]), c[t]), 1)  # [m, 2, D]
        zg = torch.stack((torch.where(own, z[prev], pend[rp[t], 1]), z[t]), 1)
        last = torch.ones(rows.n, dtype=torch.bool, device=dev)
        last[:-1] = ~prev_same[1:]
        hold = last & ~done  # a request's last row, unpaired
        pend[rp[hold], 0] = c[hold]
        pend[rp[hold], 1] = z[hold]
    else:
        cg, zg = c[t][:, None], None
    if t.numel() == 0:
        return
    latent = attn.compressor.pool(cg, zg)  # [m, D]
    entry_pos = rows.pos[t] // r * r
    dst = pool.entry_rows(i, ctx.req_to_token.to(dev)[rp[t], entry_pos].long())
    store_latent(
        latent.float(),
        entry_pos,
        pool.main[i],
        dst,
        layout=main_layout(attn.cfg),
        inv_freq=attn.inv_freq,
    )
    ix = attn.indexer
    k, w = _normed_input(ix.wk, ix.k_norm, latent.to(ix.wk.weight.dtype))
    if w is not None:
        store_index_k(k, w, ix.k_norm.eps, entry_pos, pool.index_k[i], dst, inv_freq=attn.inv_freq)
    else:
        store_records(
            k, pool.index_k[i], dst, Layout.INDEX_K, pos=entry_pos, inv_freq=attn.inv_freq
        )


def entry_table(cfg, src: int, ctx: BatchContext, device) -> torch.Tensor:
    """int32 [B_batch, n_max]: buffer row of entry s of request b of kv source src (page size 1
    for the indexer; n_max = max seq_len // r, known on the host)."""
    key = ("kp_table", src)
    if key not in ctx.shared:
        r = cfg.ratio(src)
        n = max(1, max(ctx.seq_lens) // r) if ctx.seq_lens else 1
        cols = torch.arange(n, device=device) * r
        tok = ctx.req_to_token.to(device)[ctx.req_pool.to(device)[:, None], cols[None, :]]
        ctx.shared[key] = (tok.long() // r).to(torch.int32)
    return ctx.shared[key]


def select_topk(attn, x, q_lora, rows: Rows, ctx: BatchContext, pool) -> torch.Tensor:
    """Index source (Full / Reindex): top-k int64 [T, TOPK] entry ids (-1 padded, order
    unspecified) of these rows; the candidate source also leaves its pool in ctx.shared."""
    cfg, i = attn.cfg, attn.layer_id
    src = cfg.source_layer_of(i)
    qI, w = attn.indexer.queries(q_lora, x, rows.pos, attn.inv_freq)
    dev = qI.device
    kv = PagedIndexK(
        index_k=pool.index_k[src],
        page_table=entry_table(cfg, src, ctx, dev),
        req_ids=rows.req.to(torch.int32),
        n_visible=((rows.pos + 1) // attn.ratio).to(torch.int32),
        page_size=1,
        split_pages=False,
    )
    geo = IndexerGeometry.of(cfg)
    if cfg.uses_candidates(i):
        cand = ctx.shared[("kp_pool", cfg.candidate_source_layer_id)][rows.ids]
        out = kidx.reindex(qI, w, kv, cand, geo)
    elif i == cfg.candidate_source_layer_id:
        out, cand = kidx.candidate_source(qI, w, kv, geo)
        full = torch.full((ctx.rows.n, geo.pool_blocks), -1, dtype=torch.int32, device=dev)
        full[rows.ids] = cand.to(torch.int32)
        ctx.shared[("kp_pool", i)] = full
    else:
        out = kidx.full_topk(qI, w, kv, geo)
    return out.long()


def attend(attn, q, topk, rows: Rows, ctx: BatchContext, pool, swa) -> torch.Tensor:
    """Sparse attention of q fp32 [T, H, D] over the SWA window `swa` = write_swa's (cache,
    slots) and the top-k entries int64 [T, TOPK] (-1 padded; None for SWA-only layers) of the
    layer's kv source, plus the sink: o fp32 [T, H, D]."""
    cfg = attn.cfg
    kv = topk_slots = None
    layout = main_layout(cfg)
    if topk is not None and topk.shape[1]:
        src = cfg.source_layer_of(attn.layer_id)
        kv = pool.main[src]
        topk_slots = entry_slots(entry_table(cfg, src, ctx, q.device), rows.req, topk)
    return sparse_attention(
        q,
        SparseKV(swa[0], swa[1], kv, topk_slots, layout),
        attn.attn_sink,
        attn.scale,
        out_dtype=torch.float32,
    )


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
    """serving_attention.attention_layer on this path: x [T, hidden] -> [T, hidden]."""
    cfg, i = attn.cfg, attn.layer_id
    if attn.role == FULL:
        compress(
            attn, x if x_all is None else x_all, rows if rows_all is None else rows_all, ctx, pool
        )
    if rows.n == 0:
        return x.new_zeros(0, cfg.hidden_size)
    q, q_lora = attn.query(x, rows.pos)  # [T, H, D]
    swa = write_swa(attn, x, rows, ctx, pool, floor)
    topk = None
    if attn.ratio != 0:
        if attn.indexer is not None:
            full = torch.full((ctx.rows.n, cfg.index_topk), -1, dtype=torch.int64, device=x.device)
            full[rows.ids] = select_topk(attn, x, q_lora, rows, ctx, pool)
            ctx.shared[("topk", i)] = full
        topk = ctx.shared[("topk", cfg.index_source_of(i))][rows.ids]
    return attn.output(attend(attn, q, topk, rows, ctx, pool, swa), rows.pos)


__all__ = ["attend", "attention_layer", "compress", "entry_table", "select_topk", "write_swa"]
