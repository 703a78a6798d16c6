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
def deq(b_v, b_s, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, FMT: tl.constexpr):
    """What `raw` returned -> DT [BN, D], zeros where the slot was -1."""
    if FMT == 2:
        return b_v.to(DT)
    elif FMT == 1:
        return _deq_v41_fp4(b_v, b_s, D, BN, DT)
    else:
        return _deq_v41(b_v, b_s, D, BN, DT)
