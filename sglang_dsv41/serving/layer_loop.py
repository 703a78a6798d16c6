"""`sglang.layer_loop.run_layers` with the kernel path's attention and device-clean tensors.

Identical control flow (bounded replay drops decoder rows below a request's floor after the
decoder's Full layer took its input over every row); the floors and the output buffer live on the
input's device, so the loop runs on CUDA with every BatchContext tensor there.
"""
from __future__ import annotations

import torch

from sglang_dsv41.serving.kernel_path import attention_layer
from sglang_dsv41.sglang.context import BatchContext


def run_layers(model, input_ids: torch.Tensor, ctx: BatchContext, pool) -> torch.Tensor:
    """input_ids int64 [T] -> final normed hidden states [T, hidden] (zeros for dropped rows)."""
    cfg, dev = model.cfg, input_ids.device
    rows = ctx.rows
    state = model.residual.init(model.embed(input_ids))
    floors = torch.tensor(ctx.floors, dtype=torch.int64, device=dev)[rows.req]
    replaying = any(f > 0 for f in ctx.floors)
    hash_rows = None
    if ctx.engram is not None:
        hash_rows = model.engram_hasher.rows_from_windows(*ctx.engram)
    for i, block in enumerate(model.layers):
        if getattr(block, "engram", None) is not None:
            hr = hash_rows[rows.ids, block.engram.hash_index]
            state = model.residual.inject(state, lambda H, e=block.engram, r=hr: e(H, r))
        x_all = rows_all = None
        if i == cfg.decoder_start and replaying:
            x_all, rows_all = model.residual.attn_input(state, block), rows
            keep = rows.pos >= floors
            state = model.residual.select(state, keep.nonzero().flatten())
            rows = rows.select(keep)
            floors = floors[keep]
        floor = floors if i >= cfg.decoder_start else torch.zeros_like(floors)
        x = model.residual.attn_input(state, block)
        y = attention_layer(block.attn, x, rows, ctx, pool, floor, x_all, rows_all)
        if rows.n == 0:
            continue
        state = model.residual.attn_done(state, block, y)
        state = model.residual.ffn_done(state, block,
                                        block.ffn(model.residual.ffn_input(state, block)))
    h = torch.zeros(ctx.rows.n, cfg.hidden_size, dtype=model.head.weight.dtype, device=dev)
    if rows.n:
        h[rows.ids] = model.norm(model.residual.final(state)).to(h.dtype)
    return h
