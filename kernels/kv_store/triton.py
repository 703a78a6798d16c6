"""Fused KV stores in Triton: one launch writes finished records for T projected rows.

Per row t (one program): optional RMSNorm (fp32 statistics), optional RoPE on the last R dims
(interleaved pairs), then the record bytes of `sglang_dsv41.kv.records` (V41, V41_FP4 or
INDEX_K), written at slot `slots[t]` of a flat pool view (-1 = skip the row), or into split
pages of PAGE slots (kv/split_pages.py: a page's value parts, then its scale parts; PAGE = 1 is
the plain record).

The row is held as pairs: `b_e`/`b_o` are the even/odd elements [NG, GP] (NG scale tiles of
GP = G/2 pairs), which is the RoPE pairing, the e2m1 nibble pairing, and a scale-tile split at
once. Every encoder below is the integer/compare form of the codecs in `kv/fp.py` and
`kv/records.py`, so the bytes are equal, not close (and equal to SGLang's V4.1 writers). Float
fusion is disabled at launch so `a*c - b*s` rounds like torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FMT_V41 = 0
FMT_V41_FP4 = 1
FMT_INDEX_K = 2


@triton.jit
def _signbit(x):
    return (x.to(tl.int32, bitcast=True) >> 31) & 1


@triton.jit
def e4m3_encode(x):
    """fp32 [...] -> int32 e4m3 codes [...]: RNE, saturating at 448, subnormals kept, NaN ->
    0x7F."""
    a = tl.minimum(tl.abs(x), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    mant = bits & 0x7FFFFF
    q = mant >> 20
    rem = mant & 0xFFFFF
    up = ((rem > 0x80000) | ((rem == 0x80000) & ((q & 1) == 1))).to(tl.int32)
    normal = ((((bits >> 23) & 0xFF) - 120) << 3) + q + up
    # below 2^-6 the grid is uniform with step 2^-9: round a * 512 to an integer (RNE by 2^23 trick)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal) | (_signbit(x) << 7)
    return tl.where(x != x, 0x7F, code)


@triton.jit
def e4m3_decode(code):
    """int32 e4m3 codes [...] -> fp32 [...] (exact; 0x7F / 0xFF -> NaN)."""
    e = (code >> 3) & 15
    m = code & 7
    mag = tl.where(
        e == 0, m.to(tl.float32) * 0.001953125, ((8 + m) << e).to(tl.float32) * 0.0009765625
    )
    val = tl.where((code & 0x80) != 0, -mag, mag)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def e2m1_encode(x):
    """fp32 [...] -> int32 codes 0..15 [...]: RNE on the e2m1 grid, saturating at 6, NaN -> 0."""
    a = tl.abs(x)
    mag = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    sign = tl.where(x != x, 0, _signbit(x))
    return mag | (sign << 3)


@triton.jit
def ue8m0_ceil(y, LO: tl.constexpr, HI: tl.constexpr):
    """fp32 y [...] (positive, NaN or inf) -> int32 byte [...] = clamp(127 + ceil(log2 y), LO, HI)
    on the IEEE bits, as `kv.fp.ue8m0_ceil` (NaN / inf give 255 or 256 before the clamp)."""
    bits = y.to(tl.int32, bitcast=True)
    byte = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return tl.minimum(tl.maximum(byte, LO), HI)


@triton.jit
def _floored(y):
    """max(y, 1e-4) keeping NaN (a GPU max would drop it)."""
    return tl.where(y != y, y, tl.maximum(y, 1e-4))


@triton.jit
def round_bf16(x):
    """fp32 [...] -> fp32 [...] rounded to bf16 (RNE), in integer ops (the interpreter
    truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _tile_amax(b_e, b_o):
    """[NG, GP] pairs -> fp32 [NG] max |x| per tile, NaN if the tile holds a NaN."""
    amax = tl.max(tl.maximum(tl.abs(b_e), tl.abs(b_o)), axis=1)
    nan = tl.max(((b_e != b_e) | (b_o != b_o)).to(tl.int32), axis=1)
    return tl.where(nan > 0, float("nan"), amax)


@triton.jit(do_not_specialize=["PAGE"])
def _store_records_kernel(
    x_ptr,
    stride_x,  # [T, D] float rows
    w_ptr,
    eps,  # [D] fp32 RMSNorm weight (HAS_NORM)
    cs_row_ptr,  # [T] int: row of cos/sin for token t (CS_INDEXED), else row t
    cos_ptr,
    sin_ptr,
    stride_cs,  # [*, R/2] fp32
    slot_ptr,  # [T] int, -1 = skip
    out_ptr,
    stride_out,  # uint8 [S / PAGE, PAGE * B] pool rows (pages)
    PAGE,  # slots per split page (1: one record per row)
    D: tl.constexpr,
    R: tl.constexpr,
    G: tl.constexpr,
    NG_P2: tl.constexpr,
    FMT: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_ROPE: tl.constexpr,
    CS_INDEXED: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    i_t = tl.program_id(0)
    slot = tl.load(slot_ptr + i_t).to(tl.int64)
    if slot < 0:
        return
    GP: tl.constexpr = G // 2
    NG: tl.constexpr = D // G
    o_g = tl.arange(0, NG_P2)
    o_j = tl.arange(0, GP)
    o_p = o_g[:, None] * GP + o_j[None, :]  # [NG_P2, GP] pair index
    m_p = o_g[:, None] < NG
    p_x = x_ptr + i_t.to(tl.int64) * stride_x + 2 * o_p
    b_e = tl.load(p_x, mask=m_p, other=0.0).to(tl.float32)  # [NG_P2, GP]
    b_o = tl.load(p_x + 1, mask=m_p, other=0.0).to(tl.float32)  # [NG_P2, GP]
    if HAS_NORM:
        ms = tl.math.div_rn(tl.sum(tl.sum(b_e * b_e + b_o * b_o, axis=1), axis=0), D * 1.0)
        r = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))
        b_e = b_e * r * tl.load(w_ptr + 2 * o_p, mask=m_p, other=0.0)
        b_o = b_o * r * tl.load(w_ptr + 2 * o_p + 1, mask=m_p, other=0.0)
        if ROUND_BF16:
            b_e = round_bf16(b_e)
            b_o = round_bf16(b_o)
    if HAS_ROPE:
        P0: tl.constexpr = (D - R) // 2
        m_r = m_p & (o_p >= P0)
        if CS_INDEXED:
            row = tl.load(cs_row_ptr + i_t).to(tl.int64)
        else:
            row = i_t.to(tl.int64)
        o_c = row * stride_cs + (o_p - P0)
        b_cos = tl.load(cos_ptr + o_c, mask=m_r, other=1.0)
        b_sin = tl.load(sin_ptr + o_c, mask=m_r, other=0.0)
        r_e = b_e * b_cos - b_o * b_sin
        r_o = b_e * b_sin + b_o * b_cos
        if ROUND_BF16:
            r_e = round_bf16(r_e)
            r_o = round_bf16(r_o)
        b_e = tl.where(m_r, r_e, b_e)
        b_o = tl.where(m_r, r_o, b_o)
    amax = _tile_amax(b_e, b_o)  # [NG_P2]
    NVB: tl.constexpr = D if FMT == 0 else D // 2  # value bytes of a record
    p_page = out_ptr + (slot // PAGE) * stride_out
    p_out = p_page + (slot % PAGE) * NVB  # the record's values
    p_sc = p_page + PAGE * NVB + (slot % PAGE) * NG  # its scales (PAGE = 1: right after)
    if FMT == 0:  # V41: e4m3 values, UE8M0 per 32 of max(amax / 448, 1e-4)
        y = tl.math.div_rn(amax, 448.0)
        sbyte = ue8m0_ceil(_floored(y), 0, 255)
        # a non-finite y (NaN or inf tile) divides the values by itself; its byte is 0xFF
        div = tl.where(y < float("inf"), (sbyte << 23).to(tl.float32, bitcast=True), y)
        c_e = e4m3_encode(tl.math.div_rn(b_e, div[:, None]))
        c_o = e4m3_encode(tl.math.div_rn(b_o, div[:, None]))
        tl.store(p_out + 2 * o_p, c_e.to(tl.uint8), mask=m_p)
        tl.store(p_out + 2 * o_p + 1, c_o.to(tl.uint8), mask=m_p)
        tl.store(p_sc + o_g, sbyte.to(tl.uint8), mask=o_g < NG)
    else:
        if FMT == 1:  # V41_FP4: e4m3 scale per 16; NaN tile -> NaN scale, inf saturates
            sc = tl.minimum(tl.maximum(tl.math.div_rn(amax, 6.0), 0.001953125), 448.0)
            sbyte = e4m3_encode(tl.where(amax == amax, sc, float("nan")))
            scale = e4m3_decode(sbyte)
        else:  # INDEX_K: UE8M0 per 32 of max(amax / 6, 1e-4) over non-NaN values, in [1, 254]
            a_e = tl.where(b_e == b_e, tl.abs(b_e), 0.0)
            a_o = tl.where(b_o == b_o, tl.abs(b_o), 0.0)
            amax_k = tl.max(tl.maximum(a_e, a_o), axis=1)
            sbyte = ue8m0_ceil(tl.maximum(tl.math.div_rn(amax_k, 6.0), 1e-4), 1, 254)
            scale = (sbyte << 23).to(tl.float32, bitcast=True)
        c_e = e2m1_encode(tl.math.div_rn(b_e, scale[:, None]))
        c_o = e2m1_encode(tl.math.div_rn(b_o, scale[:, None]))
        if FMT == 2:  # index K: +0 for a value that rounds to zero, +6 for NaN
            c_e = tl.where(b_e != b_e, 7, tl.where(c_e == 8, 0, c_e))
            c_o = tl.where(b_o != b_o, 7, tl.where(c_o == 8, 0, c_o))
        tl.store(p_out + o_p, (c_e | (c_o << 4)).to(tl.uint8), mask=m_p)
        tl.store(p_sc + o_g, sbyte.to(tl.uint8), mask=o_g < NG)


def store_records(
    x,
    pool_flat,
    slots,
    fmt: int,
    weight=None,
    eps: float = 0.0,
    cs_rows=None,
    cos=None,
    sin=None,
    rope_dim: int = 0,
    page: int = 1,
):
    """Launch the store; arguments as prepared by `kernels.kv_store.store_records`.

    x [T, D] fp32/bf16 (last dim contiguous); pool_flat uint8 [S, B], or [S / page, page * B]
    split pages; slots [T] int (-1 = skip); weight fp32 [D] or None; cos/sin fp32 [*, R/2]
    (last dim contiguous), read at row cs_rows[t] ([T] int, e.g. positions into a table) or at
    row t when cs_rows is None.
    """
    T, D = x.shape
    if T == 0:
        return
    G = 16 if fmt == FMT_V41_FP4 else 32
    has_rope = rope_dim > 0
    _store_records_kernel[(T,)](
        x,
        x.stride(0),
        weight if weight is not None else x,
        float(eps),
        cs_rows if cs_rows is not None else slots,
        cos if has_rope else x,
        sin if has_rope else x,
        cos.stride(0) if has_rope else 0,
        slots,
        pool_flat,
        pool_flat.stride(0),
        page,
        D=D,
        R=rope_dim,
        G=G,
        NG_P2=triton.next_power_of_2(D // G),
        FMT=fmt,
        HAS_NORM=weight is not None,
        HAS_ROPE=has_rope,
        CS_INDEXED=cs_rows is not None,
        ROUND_BF16=x.dtype == torch.bfloat16,
        num_warps=4 if D >= 256 else 1,
        enable_fp_fusion=False,
    )
