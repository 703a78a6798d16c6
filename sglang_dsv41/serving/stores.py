"""What an attention layer writes to the pool: its SWA records and, for Full layers, the main-KV
and index-K entries its rows complete (DESIGN.md 3, steps 2-4).

One `kernels.kv_store` call per write (Triton on SM90+, the torch reference elsewhere); the values
are the layers' formulas (`MqaAttentionBase.swa_kv`, `Compressor`, `Indexer.keys`), the bytes the
record codecs' (`kv.records`).
"""

from __future__ import annotations

import torch

from sglang_dsv41.kernels.kv_store import store_index_k, store_latent, store_records
from sglang_dsv41.kernels.sparse_attn import swa_window_slots
from sglang_dsv41.kv.records import Layout
from sglang_dsv41.layers.window import swa_window
from sglang_dsv41.serving.context import BatchContext, Rows


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
    (cache uint8 [S, 528], slots int32 [T, W]); row t at p sees the window of
    `layers.window.swa_window(p, W, floor)`, slots oldest first, -1 outside.

    SWA-pool layers write at the SWA slots of ctx.out_loc and read their window through the slot
    table and the full -> SWA mapping. Ring layers (decoder, replay on) read a scratch copy of
    the batch's rings plus this forward's records, then keep each request's last W records of
    this forward in its ring.
    """
    i, W = attn.layer_id, attn.cfg.sliding_window
    kv, w = _normed_input(attn.wkv, attn.kv_norm, x)
    rp = ctx.req_pool[rows.req]  # [T]
    rope = dict(norm_weight=w, eps=attn.kv_norm.eps, pos=rows.pos, inv_freq=attn.inv_freq)
    if pool.swa[i] is not None:
        dst = pool.swa_slot_of(ctx.out_loc[rows.ids])
        store_records(kv, pool.swa[i], dst, Layout.V41, **rope)
        full = swa_window_slots(ctx.req_to_token, rp, rows.pos, W, floor)  # [T, W]
        return pool.swa[i], pool.swa_slot_of(full).to(torch.int32)
    ring = pool.ring[i]  # [R, W, B]
    Bn, B, T, dev = ctx.batch_size, ring.shape[-1], rows.n, kv.device
    scratch = torch.empty(Bn * W + T, B, dtype=torch.uint8, device=dev)
    scratch[: Bn * W] = ring[ctx.req_pool].view(Bn * W, B)
    new = scratch[Bn * W :]
    store_records(kv, new, torch.arange(T, device=dev), Layout.V41, **rope)
    first = rows.first_of_request()  # [T]
    kpos, ok = swa_window(rows.pos, W, floor)  # [T, W]
    p0 = rows.pos[first]
    in_fwd = kpos >= p0[:, None]
    slots = torch.where(
        in_fwd, Bn * W + first[:, None] + kpos - p0[:, None], rows.req[:, None] * W + kpos % W
    )
    slots = torch.where(ok, slots, torch.full_like(slots, -1)).to(torch.int32)
    keep = rows.pos > rows.pos[rows.last_row()] - W  # the request's last W rows of this forward
    ring[rp[keep], rows.pos[keep] % W] = new[keep]
    return scratch, slots


def _pairs(rows: Rows, r: int):
    """Per row: (completes an entry, the row before it is the same request's previous row)."""
    done = (rows.pos + 1) % r == 0
    prev_same = torch.zeros_like(done)
    prev_same[1:] = rows.req[1:] == rows.req[:-1]
    return done, prev_same


def compress(attn, x, rows: Rows, ctx: BatchContext, pool) -> None:
    """Full layer: write the main-KV and index-K entries completed by these rows (ratio 1 or 2;
    a ratio-2 request's unpaired token waits in pool.pending[layer][request slot])."""
    i, r = attn.layer_id, attn.ratio
    if r not in (1, 2):
        raise NotImplementedError(f"dsv41 serving: compress ratio {r} (layer {i})")
    c, z = attn.compressor.project(x)  # [T, D] fp32 each (z None at ratio 1)
    rp = ctx.req_pool[rows.req]  # [T]
    done, prev_same = _pairs(rows, r)
    t = done.nonzero().flatten()  # rows that complete an entry (one sync for the size)
    if r == 2:
        # partner: the previous row of the same request, else the request's pending token
        prev = (t - 1).clamp_min(0)
        own = prev_same[t][:, None]
        pend = pool.pending[i]
        cg = torch.stack((torch.where(own, c[prev], pend[rp[t], 0]), c[t]), 1)  # [m, 2, D]
        zg = torch.stack((torch.where(own, z[prev], pend[rp[t], 1]), z[t]), 1)
        hold = rows.last_of_request() & ~done  # a request's last row, unpaired
        pend[rp[hold], 0] = c[hold]
        pend[rp[hold], 1] = z[hold]
    else:
        cg, zg = c[t][:, None], None
    if t.numel() == 0:
        return
    latent = attn.compressor.pool(cg, zg)  # [m, D]
    entry_pos = rows.pos[t] // r * r
    dst = pool.entry_rows(i, ctx.req_to_token[rp[t], entry_pos].long())
    store_latent(
        latent.float(),
        entry_pos,
        pool.main[i],
        dst,
        layout=attn.cfg.main_kv_layout,
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
