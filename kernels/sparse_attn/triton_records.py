"""Triton helpers shared by the sparse-attention kernels: slot lists in, dequantized K tiles out.

A tile is BN consecutive entries of one token's slot list (`-1` = skip). `raw` gathers the
records at those slots, `deq` turns them into a [BN, D] tile of DT (bf16 on tensor cores, fp32
under the interpreter and on the exact path). Both are exact: V41 values are e4m3 x 2^k and
V41_FP4 values e2m1 x e4m3 (at most 6 significant bits), so bf16 holds them without rounding.
Formats (FMT): V41 and V41_FP4 records (byte layouts: `kv/records.py`), or BF16 rows (a
workspace of already dequantized records, `triton_workspace`). RS is the row stride in elements
of the cache (record bytes, or D for BF16 rows), a compile-time constant so that addresses cost
one multiply-add and 16-byte loads are provably aligned.
"""

from __future__ import annotations

import triton
import triton.language as tl

V41 = 0
V41_FP4 = 1
BF16 = 2


@triton.jit
def load_idx(p_idx, u, n, live, BN: tl.constexpr):
    """Slots of tile u of a segment of n entries: int32 [BN], -1 beyond n or when not `live`."""
    o = u * BN + tl.arange(0, BN)
    return tl.load(p_idx + o, mask=(o < n) & live, other=-1)


@triton.jit
def _raw_v41(base, RS: tl.constexpr, idx, D: tl.constexpr):
    """V41 bytes at slots idx [BN]: values uint8 [BN, D/32, 32], UE8M0 scales uint8 [BN, D/32]."""
    NG: tl.constexpr = D // 32
    o_g = tl.arange(0, NG)
    o_j = tl.arange(0, 32)
    valid = idx >= 0
    p_row = base + idx.to(tl.int64) * RS  # [BN]
    p_v = p_row[:, None, None] + (o_g[None, :, None] * 32 + o_j[None, None, :])  # [BN, NG, 32]
    b_v = tl.load(p_v, mask=valid[:, None, None], other=0)
    b_s = tl.load(p_row[:, None] + D + o_g[None, :], mask=valid[:, None], other=127)  # [BN, NG]
    return b_v, b_s


@triton.jit
def _raw_v41_fp4(base, RS: tl.constexpr, idx, D: tl.constexpr):
    """V41_FP4 bytes at slots idx [BN]: packed uint8 [BN, D/16, 8], e4m3 scales uint8 [BN, D/16].

    The packed values are read as [BN, D/32, 16] (16-byte loads) and viewed 8 bytes per scale."""
    BN: tl.constexpr = idx.shape[0]
    NV: tl.constexpr = D // 32
    NG: tl.constexpr = D // 16
    o_v = tl.arange(0, NV)
    o_j = tl.arange(0, 16)
    valid = idx >= 0
    p_row = base + idx.to(tl.int64) * RS  # [BN]
    p_v = p_row[:, None, None] + (o_v[None, :, None] * 16 + o_j[None, None, :])  # [BN, NV, 16]
    b_v = tl.reshape(tl.load(p_v, mask=valid[:, None, None], other=0), (BN, NG, 8))
    o_g = tl.arange(0, NG)
    b_s = tl.load(p_row[:, None] + D // 2 + o_g[None, :], mask=valid[:, None], other=0x38)
    return b_v, b_s


@triton.jit
def _raw_bf16(base, RS: tl.constexpr, idx, D: tl.constexpr):
    """BF16 rows at slots idx [BN]: [BN, D] (zeros at -1), returned twice (no scales)."""
    o_d = tl.arange(0, D)
    p = base + idx.to(tl.int64)[:, None] * RS + o_d[None, :]  # [BN, D]
    b = tl.load(p, mask=(idx >= 0)[:, None], other=0.0)
    return b, b


@triton.jit
def _deq_v41(b_v, b_s, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr):
    """V41 raw bytes -> DT [BN, D]: e4m3 x 2^(byte - 127)."""
    b_scale = (b_s.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(DT)  # [BN, NG]
    b_k = b_v.to(tl.float8e4nv, bitcast=True).to(DT) * b_scale[:, :, None]
    return tl.reshape(b_k, (BN, D))


@triton.jit
def _deq_v41_fp4(b_v, b_s, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr):
    """V41_FP4 raw bytes -> DT [BN, D]: e2m1 x e4m3 scale per 16.

    An e2m1 code (s, e1 e0, m) placed at fp16 bits 15 and 11..9 is the fp16 number
    (-1)^s 2^(e-15) (1 + m/2) (subnormal when e = 0), i.e. the e2m1 value times 2^-14; the 2^14
    is folded into the tile scale.
    """
    b_b = b_v.to(tl.int32)
    codes = tl.interleave(b_b & 0xF, b_b >> 4)  # [BN, NG, 16]
    b_h = (((codes & 8) << 12) | ((codes & 7) << 9)).to(tl.int16).to(tl.float16, bitcast=True)
    b_scale = (b_s.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 16384.0).to(DT)  # [BN, NG]
    b_k = b_h.to(DT) * b_scale[:, :, None]
    return tl.reshape(b_k, (BN, D))


# The fast dequantization (GPU, bf16 tiles): bit tricks in inline PTX, four bytes at a time,
# instead of Triton's per-value integer and float conversions (~16 SASS instructions per value of
# an FP4 tile on SM90; these take ~2.5). A code is placed in a bf16's low exponent and mantissa
# bits, which makes the bf16 the exact value times a power of two (subnormal for the smallest
# codes), and one bf16x2 multiply applies the record's scale and that power. The tile comes out
# as the true values times FAST_FACTOR (2^-8): the caller multiplies the logit scale and the
# output by 2^8 (exact). 2^-8 keeps every multiplier a normal bf16: e4m3 scale x 2^118 <= 2^127
# for FP4, 2^(s - 15) for V41's UE8M0 byte s (s above 142: +-inf, i.e. |value| >= 2^24, loud).
FAST_FACTOR = 256.0

# e2m1 codes (even index in the low nibble): bytes b0..b3 reordered to b0 b2 b1 b3 put each
# output pair's two nibbles 16 bits apart; a nibble at bits k..k+3 gives sign -> bit 15 and
# magnitude -> bits 6..8 (exponent low bits + mantissa top bit: value x 2^-126).
_FP4_ASM = tl.constexpr("""
{
.reg .b32 x, s, m, y;
prmt.b32 x, $4, 0, 0x3120;
shl.b32 s, x, 12; shl.b32 m, x, 6;
and.b32 s, s, 0x80008000; and.b32 m, m, 0x01C001C0; or.b32 y, s, m; mul.rn.bf16x2 $0, y, $5;
shl.b32 s, x, 4; shr.b32 m, x, 2;
and.b32 s, s, 0x80008000; and.b32 m, m, 0x01C001C0; or.b32 y, s, m; mul.rn.bf16x2 $1, y, $6;
shl.b32 s, x, 8; shl.b32 m, x, 2;
and.b32 s, s, 0x80008000; and.b32 m, m, 0x01C001C0; or.b32 y, s, m; mul.rn.bf16x2 $2, y, $5;
shr.b32 m, x, 6;
and.b32 s, x, 0x80008000; and.b32 m, m, 0x01C001C0; or.b32 y, s, m; mul.rn.bf16x2 $3, y, $6;
}
""")

# e4m3 bytes: a byte at bits 8..15 (and 24..31) gives sign -> bit 15 and exponent + mantissa ->
# bits 4..10 (value x 2^-120).
_E4M3_ASM = tl.constexpr("""
{
.reg .b32 x, s, m, y;
prmt.b32 x, $2, 0, 0x1000;
shr.b32 m, x, 4; and.b32 s, x, 0x80008000; and.b32 m, m, 0x07F007F0; or.b32 y, s, m;
mul.rn.bf16x2 $0, y, $3;
prmt.b32 x, $2, 0, 0x3020;
shr.b32 m, x, 4; and.b32 s, x, 0x80008000; and.b32 m, m, 0x07F007F0; or.b32 y, s, m;
mul.rn.bf16x2 $1, y, $4;
}
""")


@triton.jit
def _fast_v41(b_v, b_s, D: tl.constexpr, BN: tl.constexpr):
    """V41 raw bytes -> bf16 [BN, D] x FAST_FACTOR (GPU only: inline PTX)."""
    b_m = ((tl.minimum(b_s.to(tl.int32), 143) + 112) << 23).to(tl.float32, bitcast=True)
    b_m = tl.broadcast_to(b_m.to(tl.bfloat16)[:, :, None], b_v.shape)
    b_k = tl.inline_asm_elementwise(
        _E4M3_ASM, "=r,=r,r,r,r", [b_v, b_m], dtype=tl.bfloat16, is_pure=False, pack=4
    )
    return tl.reshape(b_k, (BN, D))


@triton.jit
def _fast_v41_fp4(b_v, b_s, D: tl.constexpr, BN: tl.constexpr):
    """V41_FP4 raw bytes -> bf16 [BN, D] x FAST_FACTOR (GPU only: inline PTX)."""
    b_m = b_s.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 3.32306998946229e35  # 2^118
    b_m = tl.broadcast_to(b_m.to(tl.bfloat16)[:, :, None], b_v.shape)
    lo, hi = tl.inline_asm_elementwise(
        _FP4_ASM,
        "=r,=r,=r,=r,r,r,r",
        [b_v, b_m],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=False,
        pack=4,
    )
    return tl.reshape(tl.interleave(lo, hi), (BN, D))


@triton.jit
def raw(base, RS: tl.constexpr, idx, D: tl.constexpr, FMT: tl.constexpr):
    """Rows at slots idx [BN] of a cache in format FMT (V41, V41_FP4 or BF16); see `deq`."""
    if FMT == 2:
        return _raw_bf16(base, RS, idx, D)
    elif FMT == 1:
        return _raw_v41_fp4(base, RS, idx, D)
    else:
        return _raw_v41(base, RS, idx, D)


@triton.jit
def deq(
    b_v,
    b_s,
    D: tl.constexpr,
    BN: tl.constexpr,
    DT: tl.constexpr,
    FMT: tl.constexpr,
    FAST: tl.constexpr = False,
):
    """What `raw` returned -> DT [BN, D], zeros where the slot was -1. FAST (records only, DT
    bf16, not under the interpreter): the inline-PTX conversion, values x FAST_FACTOR."""
    if FMT == 2:
        return b_v.to(DT)
    elif FMT == 1:
        if FAST:
            return _fast_v41_fp4(b_v, b_s, D, BN)
        return _deq_v41_fp4(b_v, b_s, D, BN, DT)
    else:
        if FAST:
            return _fast_v41(b_v, b_s, D, BN)
        return _deq_v41(b_v, b_s, D, BN, DT)
