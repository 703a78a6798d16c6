"""What an attention layer writes to the pool: its SWA records and, for Full layers, the main-KV
and index-K entries its rows complete (docs/design.md 2.2, steps 2-4).

One `kernels.kv_store` call per write (Triton on SM90+, the torch reference elsewhere); the values
are the layers' formulas (`MqaAttentionBase.swa_kv`, `Compressor`, `Indexer.keys`), the bytes the
record codecs' (`kv.records`).
"""

from __future__ import annotations

import torch

from sglang_dsv41.kernels.kv_store import store_index_k, store_latent, store_records
from sglang_dsv41.kv.pages import entry_of, entry_written_at
from sglang_dsv41.kv.records import Layout
from sglang_dsv41.layers.protocols import Attention, NormOp, Project
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import BatchContext, PoolWindow, RingPlan, Rows


def _normed_input(lin: Project, norm: NormOp, x: torch.Tensor):
    """(rows, norm weight or None): fuse the RMSNorm into the store for fp32 projections (the
    kernel then rounds exactly like `norm(lin(x)).float()`); bf16 ones are normed here, because
    the layers apply RoPE after `.float()` while a bf16 store would round after RoPE too."""
    y = lin(x)
    if y.dtype == torch.float32:
        return y, norm.weight
    return norm(y).float(), None


def write_swa(
    attn: Attention,
    x: torch.Tensor,
    rows: Rows,
    ctx: BatchContext,
    pool: RecordBuffers,
    floor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Store the rows' SWA records (V41) and return what attention reads:
    (cache uint8 [S, 528], slots int32 [T, W]); row t at p sees the window of
    `layers.window.swa_window(p, W, floor)`, slots oldest first, -1 outside.

    SWA-pool layers write at the SWA slots of ctx.out_loc and read their window through the slot
    table and the full -> SWA mapping; a resumed request's positions below its resume point are
    its replay window's instead (PoolWindow, docs/design.md 2.8). Ring layers (decoder, replay
    on) read a scratch copy of the batch's rings plus this forward's records, then keep each
    request's last W records of this forward in its ring.
    """
    i, W = attn.layer_id, attn.cfg.sliding_window
    kv, w = _normed_input(attn.wkv, attn.kv_norm, x)
    rope = dict(norm_weight=w, eps=attn.kv_norm.eps, angles=ctx.shared.angles(attn, rows))
    part = ctx.shared.part(attn)
    if pool.swa[i] is not None:
        plan = part.swa_window
        if plan is None:  # the same rows and floors for every SWA-pool layer of the part
            plan = part.swa_window = PoolWindow.of(rows, ctx, pool, W, floor)
        store_records(kv, pool.swa[i], plan.dst, Layout.V41, **rope)
        return pool.swa[i], plan.slots
    ring = pool.ring[i]  # [R, Wr, B]
    Wr = ring.shape[1]
    plan = part.ring_plan
    if plan is None:  # the same rows and floors for every ring layer (the decoder's)
        plan = part.ring_plan = RingPlan.of(rows, ctx, W, floor, Wr)
    Bn, B, T, dev = ctx.batch_size, ring.shape[-1], rows.n, kv.device
    scratch = torch.empty(Bn * Wr + T, B, dtype=torch.uint8, device=dev)
    scratch[: Bn * Wr] = ring[ctx.req_pool].view(Bn * Wr, B)
    new = scratch[Bn * Wr :]
    store_records(kv, new, plan.new_rows, Layout.V41, **rope)
    ring[plan.keep_slot, plan.ring_pos] = new
    return scratch, plan.slots


def _pairs(rows: Rows, r: int):
    """Per row: (completes an entry, the row before it is the same request's previous row)."""
    done = entry_written_at(rows.pos, r)
    prev_same = torch.zeros_like(done)
    prev_same[1:] = rows.req[1:] == rows.req[:-1]
    return done, prev_same


def compress(
    attn: Attention, x: torch.Tensor, rows: Rows, ctx: BatchContext, pool: RecordBuffers
) -> None:
    """Full layer: write the main-KV and index-K entries completed by these rows (ratio 1 or 2;
    at ratio 2 each request's even-position tokens of its last K entries wait in
    pool.pending[layer][request slot, entry % K], where a later forward's first row finds its
    partner; K > 1 leaves a verify's rejected rows room: buffers.py).

    Static shapes, no host sync off the CPU: every row computes a latent (rows that complete no
    entry store nothing: slot -1), so decode runs inside a CUDA graph; on the CPU only completing
    rows do. Row-wise math, so the completed entries' bytes do not depend on the rows around
    them.
    """
    i, r = attn.layer_id, attn.ratio
    if r not in (1, 2):
        raise NotImplementedError(f"dsv41 serving: compress ratio {r} (layer {i})")
    c, z = attn.compressor.project(x)  # [T, D] fp32 each (z None at ratio 1)
    rp = ctx.req_pool[rows.req]  # [T]
    done, prev_same = _pairs(rows, r)
    if ctx.resume is not None:  # a replay segment's entries are the prefix cache's, kept
        done = done & (rows.pos >= ctx.resume[rows.req])
    if r == 2:
        # partner: the previous row of the same request, else the request's pending token
        prev = (torch.arange(rows.n, device=c.device) - 1).clamp_min(0)
        own = prev_same[:, None]
        pend = pool.pending[i]  # [R, K, 2, D]
        K = pend.shape[1]
        held = pend[rp, (rows.pos // 2) % K]  # [T, 2, D]: the entry's first token, if waiting
        cg = torch.stack((torch.where(own, c[prev], held[:, 0]), c), 1)  # [T, 2, D]
        zg = torch.stack((torch.where(own, z[prev], held[:, 1]), z), 1)
        last = rows.pos[rows.last_row()]
        hold = ~done & (rows.pos > last - 2 * K)  # even tokens of the request's last K entries
        if ctx.resume is not None:
            hold = hold & (rows.pos >= ctx.resume[rows.req])
        dst = torch.where(hold, rp, torch.zeros_like(rp))  # others to the padding slot 0
        pend[dst, (rows.pos // 2) % K] = torch.stack((c, z), 1)
    else:
        cg, zg = c[:, None], None
    entry_pos = entry_of(rows.pos, r) * r  # the entry's RoPE position
    rows_at = pool.entry_rows(i, ctx.req_to_token[rp, entry_pos].long())
    dst = torch.where(done, rows_at, torch.full_like(rows_at, -1))
    if c.device.type == "cpu":  # no graphs to keep static: only the completing rows go on
        keep = done.nonzero().flatten()
        if keep.numel() == 0:
            return
        cg, entry_pos, dst = cg[keep], entry_pos[keep], dst[keep]
        zg = None if zg is None else zg[keep]
    latent = attn.compressor.pool(cg, zg)  # [T, D]
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
