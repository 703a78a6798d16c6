"""The CSA2 compressor of a Full layer: main-KV latents from groups of `ratio` tokens.

No overlap between groups and no positional bias (APE). Entry j covers tokens [j r, j r + r - 1]:
    r = 1: latent_j = norm(wkv x_j)
    r = 2: c = wkv x, z = wgate x (fp32); latent_j = norm(sum_i softmax_i(z) * c) over the pair,
           softmax per channel.
An entry is written when (pos + 1) % r == 0; RoPE of entry j uses position j r. The pre-RoPE
latent also feeds the index-K projection (Indexer.keys).
"""

import torch
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.layers.linear import Linear
from sglang_dsv41.layers.norm import RMSNorm


class Compressor(nn.Module):
    def __init__(self, cfg: DeepseekV41Config, layer: int):
        super().__init__()
        self.ratio = cfg.ratio(layer)
        D, hid = cfg.head_dim, cfg.hidden_size
        self.wkv = Linear(hid, D)
        self.wgate = Linear(hid, D) if self.ratio > 1 else None
        self.norm = RMSNorm(D, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor):
        """x [T, hidden] -> (c [T, D] fp32, z [T, D] fp32 or None for ratio 1)."""
        c = upcast(self.wkv(x))
        z = upcast(self.wgate(x)) if self.wgate is not None else None
        return c, z

    def pool(self, c: torch.Tensor, z) -> torch.Tensor:
        """c [n, r, D], z [n, r, D] or None -> latent fp32 [n, D] (pre-RoPE, normed)."""
        if z is None:
            pooled = c[:, 0]
        else:
            pooled = (torch.softmax(upcast(z), dim=1) * upcast(c)).sum(1)  # [n, D]
        return self.norm(pooled)

    def latents(self, x: torch.Tensor) -> torch.Tensor:
        """Whole-sequence helper: x [T, hidden] from position 0 -> latents [T // r, D]."""
        c, z = self.project(x)
        n = x.shape[0] // self.ratio
        D = c.shape[-1]
        c = c[: n * self.ratio].view(n, self.ratio, D)
        z = z[: n * self.ratio].view(n, self.ratio, D) if z is not None else None
        return self.pool(c, z)
