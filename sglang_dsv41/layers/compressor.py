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


def stream_groups(ratio: int, start_pos: int, c: torch.Tensor, z, pending=None):
    """Group one request's newly projected tokens into complete entries, carrying a remainder.

    Serving sees a request's tokens in chunks; an entry is only written once its last token
    ((pos + 1) % ratio == 0) has arrived, and the earlier tokens of an unfinished group wait in a
    per-request pending slot.
        start_pos   position of c[0] (consecutive positions follow)
        c, z        [T, D] fp32 projections of the new tokens (z None for ratio 1)
        pending     None or (c_p [m, D], z_p [m, D] or None) for positions start_pos - m ..
    Returns (c_groups [n, ratio, D], z_groups or None, entry_ids int64 [n], new_pending or None).
    Entry j covers positions [j ratio, j ratio + ratio - 1].
    """
    if pending is not None and pending[0].shape[0]:
        m = pending[0].shape[0]
        c = torch.cat((pending[0], c), 0)
        z = torch.cat((pending[1], z), 0) if z is not None else None
        start_pos -= m
    if start_pos % ratio:
        raise ValueError(
            f"stream_groups: tokens start at {start_pos}, not a group boundary "
            f"(ratio {ratio}); the pending slot is missing"
        )
    n = c.shape[0] // ratio
    cut = n * ratio
    D = c.shape[-1]
    cg = c[:cut].view(n, ratio, D)
    zg = z[:cut].view(n, ratio, D) if z is not None else None
    rest = None
    if cut < c.shape[0]:
        rest = (c[cut:], z[cut:] if z is not None else None)
    entry_ids = torch.arange(n, dtype=torch.int64) + start_pos // ratio
    return cg, zg, entry_ids, rest
