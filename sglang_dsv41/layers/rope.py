"""Rotary embeddings on the last R dims of a head, interleaved pairs, with DeepSeek YaRN.

Layers with compress ratio > 0 use `compress_rope_theta` with YaRN (`rope_scaling`: factor,
original_max_position_embeddings, beta_fast, beta_slow) whenever `rope_scaling` gives an original
length, whatever max_position_embeddings says (docs/design.md 2.3; SGLang's
`precompute_freqs_cis` does the same); ratio-0 layers use `rope_theta` without YaRN. Pair i of
the rotated span is (x[2i], x[2i+1]), rotated by angle pos * inv_freq[i].
"""

import math
from typing import NamedTuple

import torch

from sglang_dsv41.layers.dtypes import upcast


def _correction_dim(n_rot: float, dim: int, base: float, max_pos: int) -> float:
    return dim * math.log(max_pos / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(
    dim: int, base: float, factor: float, original: int, beta_fast: float, beta_slow: float
) -> torch.Tensor:
    """fp32 [dim/2]: base frequencies blended with frequencies / factor over YaRN's ramp."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    low = max(math.floor(_correction_dim(beta_fast, dim, base, original)), 0)
    high = min(math.ceil(_correction_dim(beta_slow, dim, base, original)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    smooth = 1 - ramp
    return (freqs / factor * (1 - smooth) + freqs * smooth).float()


def rope_inv_freq(cfg, ratio: int) -> torch.Tensor:
    """fp32 [R/2] inverse frequencies for a layer of the given compress ratio."""
    R = cfg.qk_rope_head_dim
    if ratio == 0:
        return (1.0 / (cfg.rope_theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))).float()
    rs = cfg.rope_scaling or {}
    original = int(rs.get("original_max_position_embeddings") or 0)
    if original > 0:
        return yarn_inv_freq(
            R,
            cfg.compress_rope_theta,
            float(rs.get("factor", 1.0)),
            original,
            float(rs.get("beta_fast", 32)),
            float(rs.get("beta_slow", 1)),
        )
    return (
        1.0 / (cfg.compress_rope_theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    ).float()


class RopeAngles(NamedTuple):
    """cos, sin fp32 [T, R/2] of T positions under one inv_freq (`rope_cos_sin`): computed once
    and passed in place of the positions wherever the same rows are rotated again."""

    cos: torch.Tensor
    sin: torch.Tensor


def apply_rope(
    x: torch.Tensor,
    pos: "torch.Tensor | RopeAngles",
    inv_freq: torch.Tensor,
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate the last 2*len(inv_freq) dims of x.

    x [T, ..., C] float, pos [T] int64 (or their RopeAngles under this inv_freq), inv_freq fp32
    [R/2] -> same shape and dtype as x. inverse=True applies the opposite rotation (used on the
    attention output).
    """
    R = 2 * inv_freq.numel()
    if isinstance(pos, RopeAngles):
        cos, sin = pos
    else:
        cos, sin = rope_cos_sin(pos.to(x.device), inv_freq)
    if inverse:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (R // 2,)
    return rotate_pairs(x, cos.view(shape), sin.view(shape))


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor):
    """pos [T] int, inv_freq fp32 [R/2] -> (cos, sin) fp32 [T, R/2] of the angles pos * inv_freq.

    Computed in fp64 and rounded once to fp32: CPU and CUDA libraries disagree by an ulp or two
    on fp32 sin / cos of large angles, and an ulp is enough to move an FP4 / FP8 record value
    across a rounding boundary; in fp64 they agree after the rounding."""
    ang = pos.to(torch.float64)[:, None] * inv_freq.to(pos.device, torch.float64)[None, :]
    return torch.cos(ang).to(torch.float32), torch.sin(ang).to(torch.float32)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation itself: the last R = 2 * cos.shape[-1] dims of x, pairs (x[2i], x[2i+1])
    turned by (cos[i], sin[i]) in fp32 (float64 for float64 x), returned in x's dtype. cos / sin
    fp32 broadcast against x[..., :R/2] (e.g. [T, 1, R/2] for x [T, H, C])."""
    R = 2 * cos.shape[-1]
    head, tail = x[..., :-R], upcast(x[..., -R:])
    a, b = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((head, rot.to(x.dtype)), dim=-1)
