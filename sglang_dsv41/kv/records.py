"""The three KV cache records, packed and unpacked byte for byte (docs/design.md 2.4).

One record holds one token's (or one compressed entry's) vector of D values, D a multiple of 32:

| layout  | bytes        | D=512/DI=128 | values                  | then scales                  |
|---------|--------------|--------------|-------------------------|------------------------------|
| V41     | D + D/32     | 528          | D e4m3 bytes            | D/32 UE8M0 (fmax 448), per 32 |
| V41_FP4 | D/2 + D/16   | 288          | D/2 bytes, 2 e2m1 each  | D/16 e4m3, per 16            |
| INDEX_K | DI/2 + DI/32 | 68           | DI/2 bytes, 2 e2m1 each | DI/32 UE8M0 (fmax 6), per 32 |

Packed e2m1: value 2i in the low nibble of byte i, value 2i+1 in the high nibble.

Exact formulas, per tile t of consecutive values (all fp32; bf16 inputs are cast first). They are
the bytes of SGLang's V4.1 writers and test oracles (tests/cpu/test_records_vs_sglang.py):
- V41:     y = amax_t / 448; scale, sbyte = ue8m0_ceil(max(y, 1e-4)); byte = e4m3(x / scale)
           (a non-finite y: sbyte 0xFF and the values are divided by y itself)
- V41_FP4: sc = clamp(amax_t / 6, 2^-9, 448) (NaN if the tile holds a NaN; +-inf saturates);
           sbyte = e4m3_encode(sc); scale = e4m3_decode(sbyte); code = e2m1_encode(x / scale)
- INDEX_K: scale, sbyte = ue8m0_ceil(max(amax_t / 6, 1e-4)) with the byte clamped to [1, 254]
           (amax_t over the tile's non-NaN values); code = e2m1_encode(x / scale), a code that
           rounds to zero written as +0 and a NaN as +6
amax_t = max |x| over the tile, NaN if the tile holds a NaN (except INDEX_K). ``x / scale`` is an
fp32 division (not a multiplication by a reciprocal). Decoding is decode(value) * scale, exact in
fp32.

Special tiles: an all-zero tile decodes to zeros (V41 and V41_FP4 keep -0.0, INDEX_K writes +0).
V41: a NaN or +-inf anywhere gives the NaN scale 0xFF and the tile decodes to NaN. V41_FP4: a NaN
gives the NaN scale 0x7F (codes 0, decodes to NaN); +-inf saturates (scale 448, code +-6).
INDEX_K: +-inf saturates (byte 254, code +-6, decodes to +-inf); a NaN is written as +6 and does
not enter the scale (SGLang's packer reduces with NaN-dropping max / min, on the GPU and in the
Triton interpreter alike), so index-K records never decode to NaN.
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
    SCALE_FLOOR,
    e2m1_decode,
    e2m1_decode_packed,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    pack_nibbles,
    ue8m0_ceil,
    ue8m0_decode,
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


def _v41_scale(amax: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """amax fp32 [...] -> (divisor fp32 [...], scale fp32 [...], UE8M0 byte uint8 [...]).

    scale = 2^ceil(log2(max(amax / 448, 1e-4))); where amax / 448 is not finite the byte is 0xFF
    (scale NaN) and the divisor is amax / 448 itself, as SGLang's V4.1 writer divides.
    """
    y = amax / E4M3_MAX
    scale, byte = ue8m0_ceil(y.clamp(min=SCALE_FLOOR))  # torch.clamp keeps NaN
    return torch.where(torch.isfinite(y), scale, y), scale, byte


def _index_k_scale(xt: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 tiles [..., 32] -> (scale fp32 [...], byte uint8 [...]): 2^ceil(log2(max(amax / 6,
    1e-4))) with the byte clamped to [1, 254] (an inf amax gives 254, scale 2^127). NaN values do
    not enter amax (SGLang's packer takes a NaN-dropping max)."""
    amax = torch.where(torch.isnan(xt), 0.0, xt.abs()).amax(dim=-1)
    return ue8m0_ceil((amax / E2M1_MAX).clamp(min=SCALE_FLOOR), lo=1, hi=254)


def _index_k_codes(xt: Tensor, scale: Tensor) -> Tensor:
    """e2m1 codes uint8 [..., 32] of xt / scale [..., 1]: a value that rounds to zero is +0 (0x0)
    and a NaN is +6 (0x7), as SGLang's packer writes them."""
    codes = e2m1_encode(xt / scale)
    codes = torch.where(codes == 8, torch.zeros_like(codes), codes)
    return torch.where(torch.isnan(xt), torch.full_like(codes, 7), codes)


def _fp4_e4m3_scale(amax: Tensor) -> tuple[Tensor, Tensor]:
    """amax fp32 [...] -> (scale fp32 [...], e4m3 byte uint8 [...]) for V41_FP4 tiles: a NaN amax
    gives the NaN byte 0x7F, +inf saturates at 448 (torch.clamp keeps NaN, clamps inf)."""
    byte = e4m3_encode((amax / E2M1_MAX).clamp(FP4_SCALE_MIN, E4M3_MAX))
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
    div, _, sbyte = _v41_scale(amax)
    values = e4m3_encode(xt / div.unsqueeze(-1)).flatten(-2)  # [..., D]
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
    v = e2m1_decode_packed(packed).unflatten(-1, (-1, 16))  # [..., D/16, 16]
    return (v * e4m3_decode(sbytes).unsqueeze(-1)).flatten(-2)


def pack_index_k(x: Tensor) -> Tensor:
    """x float [..., DI] -> uint8 [..., DI/2 + DI/32]: packed e2m1, then DI/32 UE8M0 scales."""
    xt, _ = _tiles(x, 32)
    scale, sbyte = _index_k_scale(xt)
    codes = _index_k_codes(xt, scale.unsqueeze(-1)).flatten(-2)  # [..., DI]
    return torch.cat((pack_nibbles(codes), sbyte), dim=-1)


def unpack_index_k(rec: Tensor) -> Tensor:
    """uint8 [..., DI/2 + DI/32] -> fp32 [..., DI]."""
    packed, sbytes, _ = _split(rec, Layout.INDEX_K)
    v = e2m1_decode_packed(packed).unflatten(-1, (-1, 32))  # [..., DI/32, 32]
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
    once. NaN positions follow the special tiles of the module docstring (payload/sign of the NaN
    not specified).
    """
    if layout is Layout.V41:
        xt, amax = _tiles(x, 32)
        div, scale, _ = _v41_scale(amax)
        q = (xt / div.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return (q.to(torch.float32) * scale.unsqueeze(-1)).flatten(-2)
    if layout is Layout.V41_FP4:
        xt, amax = _tiles(x, 16)
        scale, _ = _fp4_e4m3_scale(amax)
        codes = e2m1_encode(xt / scale.unsqueeze(-1))
    elif layout is Layout.INDEX_K:
        xt, _ = _tiles(x, 32)
        scale, _ = _index_k_scale(xt)
        codes = _index_k_codes(xt, scale.unsqueeze(-1))
    else:
        raise ValueError(f"unknown layout {layout}")
    return (e2m1_decode(codes) * scale.unsqueeze(-1)).flatten(-2)
