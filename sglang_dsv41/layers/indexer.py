"""The lightning indexer's learned parts: queries (Full and Reindex) and keys (Full only).

    qI = fp4(RoPE(wq_b q_lora))              [T, HI, DI]
    w  = weights_proj(x) * DI^-0.5 * HI^-0.5  [T, HI]
    k  = fp4(RoPE(k_norm(wk latent)))        [n, DI]   from the pre-RoPE main-KV latent
RoPE uses the layer's compressed-rope tables; entry j of a ratio-r layer sits at position j r.
"""

import torch
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.linear import Linear
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.quant import quant_index
from sglang_dsv41.layers.rope import apply_rope


class Indexer(nn.Module):
    def __init__(self, cfg: DeepseekV41Config, layer: int, owns_keys: bool):
        super().__init__()
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim)
        self.weights_proj = Linear(cfg.hidden_size, self.n_heads)
        self.wk = Linear(cfg.head_dim, self.head_dim) if owns_keys else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if owns_keys else None
        self.w_scale = cfg.index_weight_scale

    def queries(self, q_lora: torch.Tensor, x: torch.Tensor, pos: torch.Tensor, inv_freq):
        """q_lora [T, q_lora], x [T, hidden], pos [T] -> (qI fp32 [T, HI, DI], w fp32 [T, HI])."""
        q = self.wq_b(q_lora).float().view(-1, self.n_heads, self.head_dim)  # [T, HI, DI]
        q = quant_index(apply_rope(q, pos, inv_freq))
        w = self.weights_proj(x).float() * self.w_scale
        return q, w

    def keys(self, latent: torch.Tensor, entry_pos: torch.Tensor, inv_freq) -> torch.Tensor:
        """latent [n, D] (pre-RoPE), entry_pos [n] -> index K fp32 [n, DI] (record values)."""
        k = self.k_norm(self.wk(latent.to(self.wk.weight.dtype)).float())
        return quant_index(apply_rope(k, entry_pos, inv_freq))
