"""The model's layer loop over a served batch (pure torch; the model class wraps it for SGLang).

The reference's loop (reference/model.py) with cached attention that reads and writes the pool
through the batch context: `serving_attention` (torch) on CPU, `serving.kernel_path` (the Triton
kernels on SM90+, their torch references elsewhere) when the batch lives on a CUDA device. Bounded
replay (DESIGN.md 5): at the first decoder
layer, rows of a request below its floor are dropped after the decoder's Full layer has taken
its attention input over every row (its compressor runs over all tokens); dropped rows come out
as zero hidden states (their logits are never used).
"""

from __future__ import annotations

import torch

from sglang_dsv41.sglang import serving_attention
from sglang_dsv41.sglang.context import BatchContext


def run_layers(
    model, input_ids: torch.Tensor, ctx: BatchContext, pool, attention=None
) -> torch.Tensor:
    """model: has cfg, embed, layers (Blocks), norm, residual, engram_hasher. input_ids int64 [T]
    (the batch rows in order) -> final normed hidden states [T, hidden] (zeros for rows dropped
    by replay). Engram layers rewrite the residual before their attention, with hash rows from
    the n-gram windows in ctx.engram. attention: the per-layer attention function (default: by
    the device of input_ids, see the module docstring)."""
    if attention is None:
        if input_ids.is_cuda:
            from sglang_dsv41.serving.kernel_path import attention_layer as attention
        else:
            attention = serving_attention.attention_layer
    cfg = model.cfg
    rows = ctx.rows
    state = model.residual.init(model.embed(input_ids))
    floors = ctx.row_floors(rows)
    replaying = bool((rows.pos < floors).any())
    hash_rows = None
    if ctx.engram is not None:
        hash_rows = model.engram_hasher.rows_from_windows(*ctx.engram)  # [T, n_layers, cols]
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
        y = attention(block.attn, x, rows, ctx, pool, floor, x_all, rows_all)
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
