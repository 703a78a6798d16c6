"""The three KV cache records, packed and unpacked byte for byte (DESIGN.md section 4).

One record holds one token's (or one compressed entry's) vector of D values, D a multiple of 32:

| layout  | bytes        | D=512/DI=128 | values                  | then scales                  |
|---------|--------------|--------------|-------------------------|------------------------------|
| V41     | D + D/32     | 528          | D e4m3 bytes            | D/32 UE8M0 (fmax 448), per 32 |
| V41_FP4 | D/2 + D/16   | 288          | D/2 bytes, 2 e2m1 each  | D/16 e4m3, per 16            |
| INDEX_K | DI/2 + DI/32 | 68           | DI/2 bytes, 2 e2m1 each | DI/32 UE8M0 (fmax 6), per 32 |

Packed e2m1: value 2i in the low nibble of byte i, value 2i+1 in the high nibble.

Exact formulas, per tile t of consecutive values (all fp32; bf16 inputs are cast first):
- V41:     scale, sbyte = ue8m0_scale(amax_t, 448); byte = e4m3_encode(x / scale)
- V41_FP4: s = amax_t / 6; sc = clamp(s, 2^-9, 448) (NaN if amax_t is not finite);
           sbyte = e4m3_encode(sc); scale = e4m3_decode(sbyte); code = e2m1_encode(x / scale)
- INDEX_K: scale, sbyte = ue8m0_scale(amax_t, 6); code = e2m1_encode(x / scale)
amax_t = max |x| over the tile, NaN if the tile holds a NaN. ``x / scale`` is an fp32 division
(not a multiplication by a reciprocal). Decoding is decode(value) * scale, exact in fp32.

Special tiles: an all-zero tile decodes to zeros (signs kept: -0.0 stays -0.0). A tile holding
any NaN or +-inf gets the NaN scale (UE8M0 0xFF, e4m3 0x7F); every value in it then divides to
NaN and encodes as the NaN code (e4m3 0x7F, e2m1 0), and the whole tile decodes to NaN.
Range: V41_FP4 saturates at 6 * 448 = 2688 (larger finite values decode to +-2688); the UE8M0
layouts cover all of fp32, but a tile with amax >= 2^127 may round up to a grid value whose
decoded product overflows to +-inf. Full rules and worked bytes: docs/kv_records.md.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from sglang_dsv41.kv.fp import (
    E2M1_MAX,
    E4M3_MAX,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    pack_nibbles,
    ue8m0_decode,
    ue8m0_scale,
    unpack_nibbles,
)

FP4_SCALE_MIN = 2.0**-9  # smallest e4m3 subnormal


class Layout(enum.Enum):
    """KV record layouts; the value is a stable name for configs and logs."""

    V41 = "v41"  # e4m3 values + UE8M0 scale per 32 (SWA KV; main KV on request)
    V41_FP4 = "v41_fp4"  # e2m1 values + e4m3 scale per 16 (main KV, default)
    INDEX_K = "index_k"  # e2m1 values + UE8M0 scale per 32 (indexer keys and FP4 queries)


_TILE = {Layout.V41: 32, Layout.V41_FP4: 16, Layout.INDEX_K: 32}


def _check_dim(dim: int) -> None:
    if dim <= 0 or dim % 32:
        raise ValueError(f"record dim must be a positive multiple of 32, got {dim}")


def scale_tile(layout: Layout) -> int:
    """Consecutive values sharing one scale byte: 32 (V41, INDEX_K) or 16 (V41_FP4)."""
    return _TILE[layout]


def value_bytes(layout: Layout, dim: int) -> int:
    """Bytes of a record's value part = byte offset of its first scale (D, or D/2 for e2m1)."""
    _check_dim(dim)
    return dim if layout is Layout.V41 else dim // 2


def record_bytes(layout: Layout, dim: int) -> int:
    """Bytes of one record of ``dim`` values: 528 / 288 / 68 at dim 512 / 512 / 128."""
    return value_bytes(layout, dim) + dim // _TILE[layout]


def record_dim(layout: Layout, nbytes: int) -> int:
    """Inverse of record_bytes: the dim D whose record is ``nbytes`` long (ValueError if none)."""
    num, den = {Layout.V41: (32, 33), Layout.V41_FP4: (16, 9), Layout.INDEX_K: (32, 17)}[layout]
    dim = nbytes * num // den
    if dim <= 0 or dim % 32 or record_bytes(layout, dim) != nbytes:
        raise ValueError(f"{nbytes} bytes is not a {layout.name} record size")
    return dim


def _tiles(x: Tensor, tile: int) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (fp32 tiles [..., D / tile, tile], amax fp32 [..., D / tile],
    NaN-propagating)."""
    _check_dim(x.shape[-1])
    xt = x.to(torch.float32).unflatten(-1, (-1, tile))  # [..., D / tile, tile]
    return xt, xt.abs().amax(dim=-1)  # torch.amax propagates NaN (tested)


def _fp4_e4m3_scale(amax: Tensor) -> tuple[Tensor, Tensor]:
    """amax fp32 [...] -> (scale fp32 [...], e4m3 byte uint8 [...]) for V41_FP4 tiles."""
    sc = (amax / E2M1_MAX).clamp(FP4_SCALE_MIN, E4M3_MAX)
    sc = torch.where(torch.isfinite(amax), sc, torch.full_like(sc, float("nan")))
    byte = e4m3_encode(sc)
    return e4m3_decode(byte), byte


def _split(rec: Tensor, layout: Layout) -> tuple[Tensor, Tensor, int]:
    """rec uint8 [..., B] -> (value bytes [..., Bv], scale bytes [..., D / tile], D)."""
    if rec.dtype != torch.uint8:
        raise TypeError(f"records are uint8, got {rec.dtype}")
    dim = record_dim(layout, rec.shape[-1])
    nv = value_bytes(layout, dim)
    return rec[..., :nv], rec[..., nv:], dim


def pack_v41(x: Tensor) -> Tensor:
    """x float [..., D] -> uint8 [..., D + D/32]: D e4m3 bytes, then D/32 UE8M0 scale bytes."""
    xt, amax = _tiles(x, 32)
    scale, sbyte = ue8m0_scale(amax, E4M3_MAX)
    values = e4m3_encode(xt / scale.unsqueeze(-1)).flatten(-2)  # [..., D]
    return torch.cat((values, sbyte), dim=-1)


def unpack_v41(rec: Tensor) -> Tensor:
    """uint8 [..., D + D/32] -> fp32 [..., D]."""
    values, sbytes, _ = _split(rec, Layout.V41)
    v = e4m3_decode(values).unflatten(-1, (-1, 32))  # [..., D/32, 32]
    return (v * ue8m0_decode(sbytes).unsqueeze(-1)).flatten(-2)


def pack_v41_fp4(x: Tensor) -> Tensor:
    """x float [..., D] -> uint8 [..., D/2 + D/16]: packed e2m1, then D/16 e4m3 scale bytes."""
    xt, amax = _tiles(x, 16)
    scale, sbyte = _fp4_e4m3_scale(amax)
    codes = e2m1_encode(xt / scale.unsqueeze(-1)).flatten(-2)  # [..., D]
    return torch.cat((pack_nibbles(codes), sbyte), dim=-1)


def unpack_v41_fp4(rec: Tensor) -> Tensor:
    """uint8 [..., D/2 + D/16] -> fp32 [..., D]."""
    packed, sbytes, _ = _split(rec, Layout.V41_FP4)
    v = e2m1_decode(unpack_nibbles(packed)).unflatten(-1, (-1, 16))  # [..., D/16, 16]
    return (v * e4m3_decode(sbytes).unsqueeze(-1)).flatten(-2)


def pack_index_k(x: Tensor) -> Tensor:
    """x float [..., DI] -> uint8 [..., DI/2 + DI/32]: packed e2m1, then DI/32 UE8M0 scales."""
    xt, amax = _tiles(x, 32)
    scale, sbyte = ue8m0_scale(amax, E2M1_MAX)
    codes = e2m1_encode(xt / scale.unsqueeze(-1)).flatten(-2)  # [..., DI]
    return torch.cat((pack_nibbles(codes), sbyte), dim=-1)


def unpack_index_k(rec: Tensor) -> Tensor:
    """uint8 [..., DI/2 + DI/32] -> fp32 [..., DI]."""
    packed, sbytes, _ = _split(rec, Layout.INDEX_K)
    v = e2m1_decode(unpack_nibbles(packed)).unflatten(-1, (-1, 32))  # [..., DI/32, 32]
    return (v * ue8m0_decode(sbytes).unsqueeze(-1)).flatten(-2)


_PACK = {Layout.V41: pack_v41, Layout.V41_FP4: pack_v41_fp4, Layout.INDEX_K: pack_index_k}
_UNPACK = {Layout.V41: unpack_v41, Layout.V41_FP4: unpack_v41_fp4, Layout.INDEX_K: unpack_index_k}


def pack(layout: Layout, x: Tensor) -> Tensor:
    """x float [..., D] -> uint8 [..., record_bytes(layout, D)]."""
    return _PACK[layout](x)


def unpack(layout: Layout, rec: Tensor) -> Tensor:
    """uint8 [..., B] -> fp32 [..., D], D = record_dim(layout, B)."""
    return _UNPACK[layout](rec)


def fake_quant(layout: Layout, x: Tensor) -> Tensor:
    """x float [..., D] -> fp32 [..., D], bit-identical to unpack(layout, pack(layout, x)).

    Skips the byte packing: the scale and rounded values are computed as in pack and decoded at
    once. NaN tiles give NaN (payload/sign of the NaN not specified).
    """
    if layout is Layout.V41:
        xt, amax = _tiles(x, 32)
        scale, _ = ue8m0_scale(amax, E4M3_MAX)
        scale = scale.unsqueeze(-1)
        q = (xt / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
        return (q * scale).flatten(-2)
    if layout is Layout.V41_FP4:
        xt, amax = _tiles(x, 16)
        scale, _ = _fp4_e4m3_scale(amax)
    elif layout is Layout.INDEX_K:
        xt, amax = _tiles(x, 32)
        scale, _ = ue8m0_scale(amax, E2M1_MAX)
    else:
        raise ValueError(f"unknown layout {layout}")
    scale = scale.unsqueeze(-1)
    return (e2m1_decode(e2m1_encode(xt / scale)) * scale).flatten(-2)
