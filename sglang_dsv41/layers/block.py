"""One transformer block: attention sublayer (MqaAttentionBase) and FFN sublayer, with norms.

Checkpoint names under `layers.{i}.`: attn_norm, attn.*, ffn_norm, ffn.*.
"""
from torch import nn

from sglang_dsv41.layers.attention import MqaAttentionBase
from sglang_dsv41.layers.ffn import build_ffn
from sglang_dsv41.layers.norm import RMSNorm


class Block(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.layer_id = layer
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = MqaAttentionBase(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn = build_ffn(cfg, layer)
