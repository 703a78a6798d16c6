"""One transformer block: attention sublayer (MqaAttentionBase) and FFN sublayer, with norms.

Checkpoint names under `layers.{i}.`: attn_norm, attn.*, ffn_norm, ffn.*; with hc_mult > 1 the
mHC parameters hc_attn_{fn,base,scale} and hc_ffn_{fn,base,scale} (layers/mhc.py); on
engram_layer_ids an `engram.*` module (layers/engram.py), applied before the attention mixing.
"""

from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.attention import MqaAttentionBase
from sglang_dsv41.layers.engram import Engram
from sglang_dsv41.layers.ffn import build_ffn
from sglang_dsv41.layers.mhc import add_hc_params
from sglang_dsv41.layers.norm import RMSNorm


class Block(nn.Module):
    def __init__(self, cfg: DeepseekV41Config, layer: int):
        super().__init__()
        self.layer_id = layer
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = MqaAttentionBase(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn = build_ffn(cfg, layer)
        if cfg.hc_mult > 1:
            add_hc_params(self, "hc_attn", cfg.hc_mult, cfg.hidden_size)
            add_hc_params(self, "hc_ffn", cfg.hc_mult, cfg.hidden_size)
        self.engram = Engram(cfg, layer) if layer in cfg.engram_layer_ids else None
