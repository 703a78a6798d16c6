"""The Triton sparse-attention kernel: one query token x a block of heads x a split of its entries.

A token's entry list is the SWA segment (W slots into the V41 cache) followed by the top-k
segment (TOPK slots into the V41_FP4 or V41 main-KV cache, or into a BF16 workspace of
dequantized records: `triton_workspace`), walked in tiles of BN entries; the
split (program axis 2) takes a contiguous range of tiles. MQA: each K tile is gathered and
dequantized once per program and serves every head of the block, as keys and as values, in an
online softmax in base 2. Two orientations of the two products (compile-time SWAP):

- heads on M (SWAP = 0): S = Q K^T [BH, BN], O += P K [BH, D]. Right for 64 heads or more.
- entries on M (SWAP = 1): S^T = K Q^T [BN, BH], O^T += K^T P^T [D, BH]. Tensor cores need
  M >= 64 (wgmma) but take N = 16: with 8 or 16 heads the entries fill M instead of padding the
  heads, and the [D, BH] accumulator is small enough for several programs per SM.

Records are dequantized by inline PTX (FAST, `triton_records._fast_*`: ~2.5 SASS instructions a
value instead of ~16) where that was measured faster; see the comment at FAST below.

Options, each a compile-time switch measured in benchmarks/RESULTS.md:
- PREFETCH: the slots of tile u + 2 and the bytes of tile u + 1 are requested before tile u is
  computed, so the dependent index -> record loads overlap the products instead of preceding them.
- SKEW: tile u's P V product is issued in iteration u + 1 (P and K carried), so the two products
  of one iteration are independent: Triton then lays the S product out for its own shape instead
  of the chained-dot layout (which replicates M = 64 over both warpgroups of 8 warps).

With SPLIT, each program writes its normalized partial output and base-2 log-sum-exp and
`merge.combine_kernel` merges them with the sink; otherwise the sink is applied here.

Exact path (fp32 q, EXACT3): the records' values are exact in bf16 (e4m3 x 2^k; e2m1 x e4m3,
at most 6 significant bits), so an fp32 operand split into three bf16 parts x = x1 + x2 + x3
(each the bf16 rounding of what is left; exact, bf16 keeps fp32's exponent range) makes every
tensor-core product exact: q.K is three bf16 products accumulated in fp32, and P V the same
with P split. The result is the fp32 reference up to summation order, on tensor cores, at three
times the MMA work of the bf16 path (which rounds q and P to bf16 once).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang_dsv41.kernels.sparse_attn.triton_records import deq, load_idx, raw


@triton.jit
def split3(x, DT: tl.constexpr):
    """fp32 x -> (x1, x2, x3) in DT, each exactly a bf16 number, x1 + x2 + x3 == x exactly."""
    x1 = x.to(tl.bfloat16)
    r = x - x1.to(tl.float32)
    x2 = r.to(tl.bfloat16)
    x3 = (r - x2.to(tl.float32)).to(tl.bfloat16)
    return x1.to(DT), x2.to(DT), x3.to(DT)


@triton.jit
def _dot3(a, b, PREC: tl.constexpr, LEFT: tl.constexpr):
    """a @ b with the split operand a three-part tuple (LEFT) or b one (not LEFT); the small
    parts first, accumulated in fp32."""
    if LEFT:
        a1, a2, a3 = a
        acc = tl.dot(a3, b, input_precision=PREC)
        acc = tl.dot(a2, b, acc, input_precision=PREC)
        return tl.dot(a1, b, acc, input_precision=PREC)
    else:
        b1, b2, b3 = b
        acc = tl.dot(a, b3, input_precision=PREC)
        acc = tl.dot(a, b2, acc, input_precision=PREC)
        return tl.dot(a, b1, acc, input_precision=PREC)


@triton.jit
def _step(
    b_q,
    b_k,
    valid,
    state,
    qk_scale,
    SWAP: tl.constexpr,
    SKEW: tl.constexpr,
    PREC: tl.constexpr,
    EXACT3: tl.constexpr = False,
):
    """Online-softmax step over one K tile b_k [BN, D]: state (m_i, l_i, acc, p_prev, k_prev) in,
    the next state out.

    SWAP = 0: b_q [BH, D], acc [BH, D], m_i/l_i [BH]; SWAP = 1: b_q = Q^T [D, BH], acc [D, BH].
    With SKEW, p_prev/k_prev are the previous tile's P and K, whose product is added here.
    EXACT3 (not with SKEW): b_q is `split3`'s three parts and P is split the same way.
    """
    m_i, l_i, acc, p_prev, k_prev = state
    if EXACT3:
        if SWAP:
            s = _dot3(b_k, b_q, PREC, False) * qk_scale  # [BN, BH]
            s = tl.where(valid[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            pv = _dot3(tl.trans(b_k), split3(p, b_k.dtype), PREC, False)  # [D, BH]
            acc = acc * alpha[None, :] + pv
        else:
            s = _dot3(b_q, tl.trans(b_k), PREC, True) * qk_scale  # [BH, BN]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot3(split3(p, b_k.dtype), b_k, PREC, True)
    elif SWAP:
        s = tl.dot(b_k, b_q, input_precision=PREC) * qk_scale  # [BN, BH]
        s = tl.where(valid[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])  # [BN, BH]
        l_i = l_i * alpha + tl.sum(p, 0)
        if SKEW:
            acc = tl.dot(tl.trans(k_prev), p_prev, acc, input_precision=PREC) * alpha[None, :]
            p_prev = p.to(b_k.dtype)
            k_prev = b_k
        else:
            pv = tl.dot(tl.trans(b_k), p.to(b_k.dtype), input_precision=PREC)  # [D, BH]
            acc = acc * alpha[None, :] + pv
    else:
        s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BH, BN]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # [BH, BN]
        l_i = l_i * alpha + tl.sum(p, 1)
        if SKEW:
            acc = tl.dot(p_prev, k_prev, acc, input_precision=PREC) * alpha[:, None]
            p_prev = p.to(b_k.dtype)
            k_prev = b_k
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(b_k.dtype), b_k, input_precision=PREC)
    return m_new, l_i, acc, p_prev, k_prev


@triton.jit
def _walk(
    b_q,
    p_idx,
    n,
    base,
    RS: tl.constexpr,
    t0,
    t1,
    state,
    qk_scale,
    D: tl.constexpr,
    BN: tl.constexpr,
    FMT: tl.constexpr,
    SWAP: tl.constexpr,
    SKEW: tl.constexpr,
    PREFETCH: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    EXACT3: tl.constexpr,
    FAST: tl.constexpr,
):
    """Tiles t0 .. t1 - 1 of one segment: n slots at p_idx into the rows (format FMT, stride RS)
    at base; state (m_i, l_i, acc, p_prev, k_prev) as in `_step`, returned updated."""
    if PREFETCH:
        idx = load_idx(p_idx, t0, n, t0 < t1, BN)
        b_v, b_s = raw(base, RS, idx, D, FMT)
        idx_n = load_idx(p_idx, t0 + 1, n, t0 + 1 < t1, BN)
        for u in range(t0, t1):
            n_v, n_s = raw(base, RS, idx_n, D, FMT)  # tile u + 1, in flight during tile u
            idx_nn = load_idx(p_idx, u + 2, n, u + 2 < t1, BN)
            b_k = deq(b_v, b_s, D, BN, DT, FMT, FAST)
            state = _step(b_q, b_k, idx >= 0, state, qk_scale, SWAP, SKEW, PREC, EXACT3)
            idx = idx_n
            idx_n = idx_nn
            b_v = n_v
            b_s = n_s
    else:
        for u in range(t0, t1):
            idx = load_idx(p_idx, u, n, True, BN)
            b_v, b_s = raw(base, RS, idx, D, FMT)
            b_k = deq(b_v, b_s, D, BN, DT, FMT, FAST)
            state = _step(b_q, b_k, idx >= 0, state, qk_scale, SWAP, SKEW, PREC, EXACT3)
    return state


@triton.jit(do_not_specialize=["H", "W", "TOPK", "num_splits"])
def sparse_attn_kernel(
    q_ptr,  # [T, H, D]
    stride_qt,
    stride_qh,
    swa_ptr,  # uint8 [S, D + D/32]
    swa_idx_ptr,  # int32 [T, W]
    stride_swt,
    kv_ptr,  # [S', KV_RS]: V41 / V41_FP4 records (uint8) or BF16 rows
    kv_idx_ptr,  # int32 [T, TOPK]
    stride_kvt,
    sink_ptr,  # fp32 [H]
    o_ptr,  # out [T, H, D], or fp32 partials [T, NS, H, D] with SPLIT
    stride_ot,
    stride_os,
    stride_oh,
    lse_ptr,  # fp32 [T, NS, H] (SPLIT)
    H,
    W,
    TOPK,
    num_splits,
    qk_scale,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    KV_FMT: tl.constexpr,
    KV_RS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr,
    SWAP: tl.constexpr,
    SKEW: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ROUND_Q: tl.constexpr,
    PREC: tl.constexpr,
    EXACT3: tl.constexpr = False,
    FAST_DEQ: tl.constexpr = True,
):
    # DOT_FP32: fp32 tiles, for TRITON_INTERPRET=1 (its bf16 dot is wrong) and for the IEEE
    # exact path (fp32 q, PREC = "ieee": true fp32 products, as the torch reference computes
    # them). Otherwise the products are bf16: EXACT3 splits fp32 q and P into three bf16 parts
    # each (exact products); else ROUND_Q rounds q to bf16 first (the fast path's meaning).
    DT: tl.constexpr = tl.float32 if DOT_FP32 else tl.bfloat16
    # FAST: records dequantized by inline PTX (triton_records.FAST_FACTOR): the tiles are the
    # values x 2^-8, so the logit scale and the output take 2^8. Only where it was measured
    # faster and builds (benchmarks/RESULTS.md): 16-head programs, and 32-head ones with the
    # entries on M, with bf16 q. Not with a BF16 workspace (its rows are the values: the
    # factors would mix), not on the exact path (115.7 against 92.2 us at 8 heads, batch 128),
    # not for 32 heads on M (122 -> 156 us at batch 128), not at 64 heads per program (Triton
    # 3.6 fails to build it over V41_FP4 records).
    FAST_BH: tl.constexpr = BH <= 16 or (SWAP and BH <= 32)
    FAST: tl.constexpr = FAST_DEQ and (not DOT_FP32) and (not EXACT3) and KV_FMT != 2 and FAST_BH
    if FAST:
        qk_scale = qk_scale * 256.0
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)
    o_d = tl.arange(0, D)
    if SWAP:
        o_h = i_hb * BH + tl.arange(0, BH)
        m_h = o_h < H
        p_q = q_ptr + i_t * stride_qt + o_h[None, :] * stride_qh + o_d[:, None]  # [D, BH]
        b_q = tl.load(p_q, mask=m_h[None, :], other=0.0)
        m_i = tl.full([BH], -1e30, tl.float32)
        l_i = tl.zeros([BH], tl.float32)
        acc = tl.zeros([D, BH], tl.float32)
    else:
        o_h = i_hb * BH + tl.arange(0, BH)
        m_h = o_h < H
        p_q = q_ptr + i_t * stride_qt + o_h[:, None] * stride_qh + o_d[None, :]  # [BH, D]
        b_q = tl.load(p_q, mask=m_h[:, None], other=0.0)
        m_i = tl.full([BH], -1e30, tl.float32)
        l_i = tl.zeros([BH], tl.float32)
        acc = tl.zeros([BH, D], tl.float32)
    if EXACT3:
        b_q = split3(b_q.to(tl.float32), DT)
    else:
        if ROUND_Q:
            b_q = b_q.to(tl.bfloat16)
        b_q = b_q.to(DT)
    if SKEW:  # the previous tile's P and K; zeros add nothing before the first tile
        if SWAP:
            p_prev = tl.zeros([BN, BH], DT)
        else:
            p_prev = tl.zeros([BH, BN], DT)
        k_prev = tl.zeros([BN, D], DT)
    else:
        p_prev = 0.0
        k_prev = 0.0

    n_sw = tl.cdiv(W, BN)
    n_tiles = n_sw + tl.cdiv(TOPK, BN)
    per = tl.cdiv(n_tiles, num_splits)
    u0 = i_s * per
    u1 = tl.minimum(u0 + per, n_tiles)
    state = (m_i, l_i, acc, p_prev, k_prev)
    state = _walk(
        b_q,
        swa_idx_ptr + i_t * stride_swt,
        W,
        swa_ptr,
        D + D // 32,
        u0,
        tl.minimum(u1, n_sw),
        state,
        qk_scale,
        D,
        BN,
        0,
        SWAP,
        SKEW,
        PREFETCH,
        DT,
        PREC,
        EXACT3,
        FAST,
    )
    state = _walk(
        b_q,
        kv_idx_ptr + i_t * stride_kvt,
        TOPK,
        kv_ptr,
        KV_RS,
        tl.maximum(u0, n_sw) - n_sw,
        u1 - n_sw,
        state,
        qk_scale,
        D,
        BN,
        KV_FMT,
        SWAP,
        SKEW,
        PREFETCH,
        DT,
        PREC,
        EXACT3,
        FAST,
    )
    m_i, l_i, acc, p_prev, k_prev = state
    if SKEW:  # the last tile's P V
        if SWAP:
            acc = tl.dot(tl.trans(k_prev), p_prev, acc, input_precision=PREC)
        else:
            acc = tl.dot(p_prev, k_prev, acc, input_precision=PREC)

    if SPLIT:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        inv = (256.0 if FAST else 1.0) / l_safe
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(lse_ptr + (i_t * num_splits + i_s) * H + o_h, lse, mask=m_h)
    else:
        if HAS_SINK:
            s2 = tl.load(sink_ptr + o_h, mask=m_h, other=0.0) * 1.4426950408889634
        else:
            s2 = tl.full([BH], float("-inf"), tl.float32)
        m_f = tl.maximum(m_i, s2)
        w = tl.exp2(m_i - m_f)
        den = l_i * w + tl.exp2(s2 - m_f)
        inv = w / tl.where(den > 0, den, 1.0)
        if FAST:
            inv = inv * 256.0
    p_o = o_ptr + i_t * stride_ot + i_s * stride_os
    if SWAP:
        o = acc * inv[None, :]  # [D, BH]
        tl.store(
            p_o + o_h[None, :] * stride_oh + o_d[:, None],
            o.to(o_ptr.dtype.element_ty),
            mask=m_h[None, :],
        )
    else:
        o = acc * inv[:, None]  # [BH, D]
        tl.store(
            p_o + o_h[:, None] * stride_oh + o_d[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=m_h[:, None],
        )
