"""Rotary embeddings on the last R dims of a head, interleaved pairs, with DeepSeek YaRN.

Layers with compress ratio > 0 use `compress_rope_theta` with YaRN (`rope_scaling`: factor,
original_max_position_embeddings, beta_fast, beta_slow) whenever `rope_scaling` gives an original
length, whatever max_position_embeddings says (docs/design.md 2.3); ratio-0 layers use
`rope_theta` without YaRN. Pair i of the rotated span is (x[2i], x[2i+1]), turned by angle
pos * inv_freq[i].

The values are those the released model was trained with, bit for bit SGLang's in-tree
`precompute_freqs_cis` (DeepSeek's reference): inverse frequencies and the YaRN blend in fp32,
the angle of position p the fp32 product fl(fl(p) * inv_freq[i]) (`torch.outer(arange, freqs)`),
cos / sin that angle's unit complex number (`torch.polar`: the host C library's cosf / sinf),
which SGLang's kernels read as the (real, imag) = (cos, sin) pairs of `view_as_real`. Everything
is computed on the host: a CUDA cosf / sinf can differ from the host's by an ulp, and an ulp can
move an FP4 / FP8 record value across a rounding boundary. Positions on a device read a table of
positions [0, max_position_embeddings) built once on the host and copied there (`device_table`),
so the CPU oracle and every device agree bit for bit; a float64 model rotates by the same fp32
values cast up (`rotate_pairs`).
"""

import math
from typing import NamedTuple

import torch

from sglang_dsv41.layers.dtypes import upcast

HOST = torch.device("cpu")


def _correction_dim(n_rot: float, dim: int, base: float, max_pos: int) -> float:
    return dim * math.log(max_pos / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def plain_inv_freq(dim: int, base: float) -> torch.Tensor:
    """fp32 [dim/2] on the host: 1 / base^(2i / dim), every step in fp32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=HOST) / dim))


def yarn_inv_freq(
    dim: int, base: float, factor: float, original: int, beta_fast: float, beta_slow: float
) -> torch.Tensor:
    """fp32 [dim/2] on the host: base frequencies blended with frequencies / factor over YaRN's
    ramp between the correction dims of beta_fast and beta_slow rotations, in fp32."""
    freqs = plain_inv_freq(dim, base)
    low = max(math.floor(_correction_dim(beta_fast, dim, base, original)), 0)
    high = min(math.ceil(_correction_dim(beta_slow, dim, base, original)), dim - 1)
    if low == high:
        high += 0.001
    ramp = (torch.arange(dim // 2, dtype=torch.float32, device=HOST) - low) / (high - low)
    smooth = 1 - ramp.clamp(0, 1)
    return freqs / factor * (1 - smooth) + freqs * smooth


def rope_inv_freq(cfg, ratio: int) -> torch.Tensor:
    """fp32 [R/2] inverse frequencies (on the host) for a layer of the given compress ratio.
    Device tables of these frequencies cover max_position_embeddings positions."""
    R = cfg.qk_rope_head_dim
    rs = cfg.rope_scaling or {}
    original = int(rs.get("original_max_position_embeddings") or 0)
    if ratio == 0:
        inv = plain_inv_freq(R, cfg.rope_theta)
    elif original > 0:
        inv = yarn_inv_freq(
            R,
            cfg.compress_rope_theta,
            float(rs.get("factor", 1.0)),
            original,
            float(rs.get("beta_fast", 32)),
            float(rs.get("beta_slow", 1)),
        )
    else:
        inv = plain_inv_freq(R, cfg.compress_rope_theta)
    note_positions(inv, cfg.max_position_embeddings)
    return inv


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


def host_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor) -> RopeAngles:
    """pos [T] int, inv_freq fp32 [R/2] -> (cos, sin) fp32 [T, R/2] on the host: the angles
    fl(fl(pos) * inv_freq) in fp32, then the unit complex numbers of those angles. Each value
    depends on its own position and frequency only, so rows of a whole table equal the same
    positions computed alone."""
    ang = pos.to(HOST, torch.float32)[:, None] * inv_freq.to(HOST, torch.float32)[None, :]
    unit = torch.view_as_real(torch.polar(torch.ones_like(ang), ang))
    return RopeAngles(unit[..., 0].contiguous(), unit[..., 1].contiguous())


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor) -> RopeAngles:
    """pos [T] int, inv_freq fp32 [R/2] -> (cos, sin) fp32 [T, R/2] on pos's device.

    On the host computed directly (`host_cos_sin`); on a device gathered from the device table
    of these frequencies (`device_table`: the same values, and no host sync once the table
    exists, so it runs inside a CUDA graph). Frequencies not made by `rope_inv_freq` have no
    table length: their device positions go through the host (a synchronising copy)."""
    if pos.device.type == "cpu":
        return host_cos_sin(pos, inv_freq)
    table = device_table(inv_freq, pos.device)
    if table is None:
        cos, sin = host_cos_sin(pos, inv_freq)
        return RopeAngles(cos.to(pos.device), sin.to(pos.device))
    idx = pos.long()
    return RopeAngles(table.cos[idx], table.sin[idx])


_POSITIONS: dict[bytes, int] = {}
"""fp32 bytes of inverse frequencies -> positions their device tables cover (the largest
max_position_embeddings of the configs that asked `rope_inv_freq` for them)."""
_TABLES: dict[tuple[bytes, torch.device], RopeAngles] = {}
"""(frequencies, device) -> cos, sin fp32 [positions, R/2] on the device."""


def note_positions(inv_freq: torch.Tensor, n_positions: int) -> None:
    """Device tables of inv_freq (fp32 [R/2]) cover at least positions [0, n_positions)."""
    key = _key(inv_freq)
    _POSITIONS[key] = max(_POSITIONS.get(key, 0), int(n_positions))


def device_table(inv_freq: torch.Tensor, device: torch.device) -> "RopeAngles | None":
    """cos, sin fp32 [n, R/2] of positions [0, n) on `device`, n the positions noted for these
    frequencies (None if none were): built on the host once (`host_cos_sin`) and copied, kept for
    the process (at V4.1-Flash's 1M positions and R = 64: 256 MiB per kind of layer, as SGLang's
    own complex64 table). The first call per tensor reads inv_freq's values (a sync if it lives on
    a device); the first call per device builds the table: both before any CUDA graph capture."""
    key = _key(inv_freq)
    n = _POSITIONS.get(key)
    if n is None:
        return None
    got = _TABLES.get((key, device))
    if got is None or got.cos.shape[0] < n:
        host = host_cos_sin(torch.arange(n, device=HOST), inv_freq)
        got = _TABLES[(key, device)] = RopeAngles(host.cos.to(device), host.sin.to(device))
    return got


def _key(inv_freq: torch.Tensor) -> bytes:
    """The frequencies' fp32 bytes, remembered on the tensor (device buffers read them once)."""
    key = getattr(inv_freq, "_dsv41_rope_key", None)
    if key is None:
        key = inv_freq.detach().to(HOST, torch.float32).contiguous().numpy().tobytes()
        inv_freq._dsv41_rope_key = key
    return key


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation itself: the last R = 2 * cos.shape[-1] dims of x, pairs (x[2i], x[2i+1])
    turned by (cos[i], sin[i]) in fp32 (float64 for float64 x), returned in x's dtype. cos / sin
    fp32 broadcast against x[..., :R/2] (e.g. [T, 1, R/2] for x [T, H, C])."""
    R = 2 * cos.shape[-1]
    head, tail = x[..., :-R], upcast(x[..., -R:])
    a, b = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((head, rot.to(x.dtype)), dim=-1)
