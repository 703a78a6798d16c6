"""DeepseekV41ForCausalLM: the V4.1 text model as SGLang serves it (registered under that name).

Parameters are the reference's modules (`layers.block.Block`: MqaAttentionBase with the
role-specific compressor / indexer, FFN, norms), named as in the checkpoint, so one definition of
each formula serves both. The forward is `serving.layer_loop.run_layers` (the oracle's layer loop
with the cached attention) over the batch metadata the `dsv41` backend built for this forward,
then SGLang's logits processor.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.model_executor.forward_context import get_attn_backend
from torch import nn

from sglang_dsv41.layers.attention import set_attention_dtype
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.engram import build_engram_hasher
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.residual import build_residual
from sglang_dsv41.serving.layer_loop import run_layers
from sglang_dsv41.sglang.options import ServingOptions, register_served
from sglang_dsv41.weights.checkpoint import dense_weights_from_release, is_release_format
from sglang_dsv41.weights.named import load_named
from sglang_dsv41.weights.release_manifest import is_skipped

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
        self.engram_hasher = None  # built from the checkpoint's tokenizer in load_weights
        self.logits_processor = LogitsProcessor(config)
        self.options = ServingOptions.from_server(cfg)
        set_attention_dtype(self, self.options.attn_dtype)
        register_served(self.options)
        logger.info(
            "sglang_dsv41: DeepseekV41ForCausalLM, roles %s, decoder SWA bounded replay %s, "
            "prefix replay %s, attention queries and output %s",
            cfg.roles(),
            "on" if self.options.replay else "off",
            "on" if self.options.prefix_replay else "off",
            self.options.attn_mode,
        )

    def load_weights(self, weights):
        """Dense checkpoints load by name (tensors outside the text model skipped: the DSpark
        head, vision); the released FP8/FP4 format is dequantized on the way
        (weights.checkpoint.dense_weights_from_release validates names, dtypes, shapes)."""
        where = str(getattr(self.config, "_name_or_path", ""))
        if is_release_format(self.cfg):
            weights = dense_weights_from_release(weights, self.cfg, where)
        else:  # the DSpark head (mtp.*) is the draft model's
            weights = ((n, t) for n, t in weights if not is_skipped(n))
        loaded = load_named(self, weights, where=where)
        if self.cfg.engram_layer_ids:
            self.engram_hasher = build_engram_hasher(self.cfg, where or None)
        return loaded

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        if forward_batch.forward_mode.is_target_verify() and self.cfg.engram_layer_ids:
            raise NotImplementedError(
                "DeepseekV41ForCausalLM (pure torch): a target verify of an Engram model; this "
                "model's Engram tails would move past rejected rows (the CUDA model keeps "
                "SGLang's Engram history, which its speculative worker commits)"
            )
        pool = get_attn_backend().token_to_kv_pool
        ctx = forward_batch.dsv41_context
        if ctx.fold is None:
            h = run_layers(self, input_ids, ctx, pool)
        else:  # a prefix replay's rows ran ahead of the batch's (docs/design.md 2.8)
            h = run_layers(self, ctx.fold.input_ids, ctx, pool)[ctx.fold.keep]
        return self.logits_processor(input_ids, h, self.head, forward_batch)


EntryClass = [DeepseekV41ForCausalLM]
