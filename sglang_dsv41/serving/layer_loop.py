"""The served layer loop: the oracle's loop (reference/model.py) with the cached attention.

Bounded replay (docs/design.md 2.5): at the first decoder layer, rows of a request below its
floor are dropped after the decoder's Full layer has taken its attention input over every row (its
compressor runs over all tokens); dropped rows come out as zero hidden states (their logits are
never used). Encoder layers floor SWA at the request's SWA floor (a prefix resume's
replay_floor(M), docs/design.md 2.8; 0 otherwise), decoder layers at its decoder floor (at least
that). Engram layers rewrite the residual before their attention, with hash rows from the
rows' n-gram windows (engram_history: this forward's ids and the request slots' tails, which the
forward then moves on).
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.protocols import LayerStack
from sglang_dsv41.serving import engram_history
from sglang_dsv41.serving.attention import attention_layer
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import BatchContext


def run_layers(
    model: LayerStack, input_ids: torch.Tensor, ctx: BatchContext, pool: RecordBuffers
) -> torch.Tensor:
    """model: the oracle's or the served torch model (LayerStack). input_ids int64 [T]
    (the batch rows in order) -> final normed hidden states [T, hidden] (zeros for rows dropped
    by replay)."""
    cfg = model.cfg
    rows = ctx.rows
    state = model.residual.init(model.embed(input_ids))
    floors, swa_floors = ctx.row_floors(rows), ctx.row_swa_floors(rows)
    hash_rows = None
    if cfg.engram_layer_ids:
        tails = pool.engram_tail[ctx.req_pool]  # [B, n - 1]
        windows = engram_history.windows(rows, input_ids, tails, cfg.engram_max_ngram_size)
        pool.engram_tail[ctx.req_pool] = engram_history.advance_tails(rows, input_ids, tails)
        hash_rows = model.engram_hasher.rows_from_windows(*windows)  # [T, n_layers, cols]
    for i, block in enumerate(model.layers):
        if getattr(block, "engram", None) is not None:
            hr = hash_rows[rows.ids, block.engram.hash_index]
            state = model.residual.inject(state, lambda H, e=block.engram, r=hr: e(H, r))
        x_all = rows_all = None
        if i == cfg.decoder_start and ctx.replaying:
            x_all, rows_all = model.residual.attn_input(state, block), rows
            keep = rows.pos >= floors
            state = model.residual.select(state, keep.nonzero().flatten())
            rows = rows.select(keep)
            floors = floors[keep]
        floor = floors if cfg.is_decoder(i) else swa_floors
        x = model.residual.attn_input(state, block)
        y = attention_layer(block.attn, x, rows, ctx, pool, floor, x_all, rows_all)
        if rows.n == 0:
            continue
        state = model.residual.attn_done(state, block, y)
        state = model.residual.ffn_done(
            state, block, block.ffn(model.residual.ffn_input(state, block))
        )
    h = torch.zeros(
        ctx.rows.n, cfg.hidden_size, dtype=model.head.weight.dtype, device=input_ids.device
    )
    if rows.n:
        h[rows.ids] = model.norm(model.residual.final(state)).to(h.dtype)
    return h
