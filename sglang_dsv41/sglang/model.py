"""DeepseekV41ForCausalLM: the V4.1 text model as SGLang serves it (registered under that name).

Parameters are the reference's modules (`layers.block.Block`: MqaAttentionBase with the
role-specific compressor / indexer, FFN, norms), named as in the checkpoint, so one definition of
each formula serves both. The forward is the reference's layer loop with the cached attention of
`serving_attention` and the batch metadata the `dsv41` backend builds for this forward.

Bounded replay (DESIGN.md 5): at the first decoder layer, rows of a request below its floor are
dropped after the decoder's Full layer has taken its attention input over all rows (its
compressor runs over every token); hidden states of dropped rows are zero and their logits unused.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.model_executor.forward_context import get_attn_backend

from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.residual import build_residual
from sglang_dsv41.sglang import runtime
from sglang_dsv41.sglang.serving_attention import attention_layer
from sglang_dsv41.sglang.weights import load_named

logger = logging.getLogger(__name__)


class DeepseekV41ForCausalLM(nn.Module):
    served_by = "sglang_dsv41"

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        cfg = config.dsv41()
        self.config, self.cfg = config, cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.residual = build_residual(cfg)
        self.logits_processor = LogitsProcessor(config)
        runtime.activate(cfg)
        logger.info("sglang_dsv41: DeepseekV41ForCausalLM, roles %s, decoder SWA bounded replay "
                    "%s", cfg.roles(), "on" if runtime.STATE.replay else "off")

    def load_weights(self, weights):
        return load_named(self, weights, where=str(getattr(self.config, "_name_or_path", "")))

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        backend = get_attn_backend()
        ctx, pool = backend.context, backend.token_to_kv_pool
        cfg = self.cfg
        rows = ctx.rows
        state = self.residual.init(self.embed(input_ids))
        floors = ctx.row_floors(rows)
        replaying = bool((rows.pos < floors).any())
        zero = torch.zeros_like(floors)
        for i, block in enumerate(self.layers):
            x_all = rows_all = None
            if i == cfg.decoder_start and replaying:
                x_all, rows_all = self.residual.attn_input(state, block), rows
                keep = rows.pos >= floors
                state = self.residual.select(state, keep.nonzero().flatten())
                rows = rows.select(keep)
                floors = ctx.row_floors(rows)
            floor = floors if i >= cfg.decoder_start else zero[: rows.n]
            x = self.residual.attn_input(state, block)
            y = attention_layer(block.attn, x, rows, ctx, pool, floor, x_all, rows_all)
            if rows.n == 0:
                continue
            state = self.residual.attn_done(state, block, y)
            state = self.residual.ffn_done(state, block,
                                           block.ffn(self.residual.ffn_input(state, block)))
        h = torch.zeros(ctx.rows.n, cfg.hidden_size, dtype=self.head.weight.dtype)
        if rows.n:
            h[rows.ids] = self.norm(self.residual.final(state)).to(h.dtype)
        return self.logits_processor(input_ids, h, self.head, forward_batch)


EntryClass = [DeepseekV41ForCausalLM]
