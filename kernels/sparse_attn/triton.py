"""Sparse MQA attention over V4.1 records in Triton (SM90): decode and prefill.

One program = one query token t x BH heads x one split of the token's entry list. The entry list
is the SWA segment (W slots into the V41 cache) followed by the top-k segment (TOPK slots into
the V41_FP4 or V41 main-KV cache), walked in tiles of BN entries. Since MQA shares the one KV
head, each K tile is gathered and dequantized once per program and serves all BH heads:
S = Q K^T [BH, BN] and O += P K [BH, D] on tensor cores in bf16 (the dequantized records are
exact in bf16: e4m3 x 2^k and e2m1 x e4m3 have at most 6 significant bits).

Splits (flash-decoding): with NSPLIT > 1 each program writes its normalized partial output and
its base-2 log-sum-exp; `_combine_kernel` merges the splits and the sink. NSPLIT is a function
of shapes only, so a decode call is CUDA-graph capturable (no host syncs, static grid).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _load_idx(p_idx, u, n, BN: tl.constexpr):
    """Slots of tile u of a segment of n entries: [BN] int32, -1 beyond n."""
    o = u * BN + tl.arange(0, BN)
    return tl.load(p_idx + o, mask=o < n, other=-1)


@triton.jit
def _raw_v41(base, stride, idx, D: tl.constexpr):
    """Raw V41 bytes at slots idx [BN]: values uint8 [BN, D/32, 32], scales uint8 [BN, D/32]."""
    NG: tl.constexpr = D // 32
    o_g = tl.arange(0, NG)
    o_j = tl.arange(0, 32)
    valid = idx >= 0
    p_row = base + idx.to(tl.int64) * stride  # [BN]
    p_v = p_row[:, None, None] + (o_g[None, :, None] * 32 + o_j[None, None, :])  # [BN, NG, 32]
    b_v = tl.load(p_v, mask=valid[:, None, None], other=0)
    b_s = tl.load(p_row[:, None] + D + o_g[None, :], mask=valid[:, None], other=127)  # [BN, NG]
    return b_v, b_s


@triton.jit
def _raw_v41_fp4(base, stride, idx, D: tl.constexpr):
    """Raw V41_FP4 bytes at slots idx [BN]: packed uint8 [BN, D/16, 8], scales uint8 [BN, D/16]."""
    NG: tl.constexpr = D // 16
    o_g = tl.arange(0, NG)
    o_j = tl.arange(0, 8)
    valid = idx >= 0
    p_row = base + idx.to(tl.int64) * stride  # [BN]
    p_v = p_row[:, None, None] + (o_g[None, :, None] * 8 + o_j[None, None, :])  # [BN, NG, 8]
    b_v = tl.load(p_v, mask=valid[:, None, None], other=0)
    b_s = tl.load(p_row[:, None] + D // 2 + o_g[None, :], mask=valid[:, None], other=0x38)
    return b_v, b_s


@triton.jit
def _deq_v41(b_v, b_s, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr):
    """V41 raw bytes -> DT [BN, D]: e4m3 x 2^(byte - 127); exact in bf16."""
    b_scale = (b_s.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(DT)  # [BN, NG]
    b_k = b_v.to(tl.float8e4nv, bitcast=True).to(DT) * b_scale[:, :, None]
    return tl.reshape(b_k, (BN, D))


@triton.jit
def _deq_v41_fp4(b_v, b_s, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr):
    """V41_FP4 raw bytes -> DT [BN, D]: e2m1 x e4m3 scale per 16; exact in bf16.

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
def _attend_tile(b_q, b_k, valid, m_i, l_i, acc, qk_scale, PREC: tl.constexpr):
    """Online-softmax step over one K tile. b_q [BH, D], b_k [BN, D] (bf16, or fp32 with
    PREC = "ieee" for the exact path), valid [BN]."""
    s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BH, BN], base-2 logits
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])  # [BH, BN]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(b_k.dtype), b_k, input_precision=PREC)  # [BH, D]
    return m_new, l_i, acc


@triton.jit
def _sparse_attn_kernel(
    q_ptr,
    stride_qt,
    stride_qh,  # bf16 [T, H, D]
    swa_ptr,
    swa_stride,
    swa_idx_ptr,
    stride_swt,  # uint8 [S, D + D/32]; int32 [T, W]
    kv_ptr,
    kv_stride,
    kv_idx_ptr,
    stride_kvt,  # uint8 [S', B]; int32 [T, TOPK]
    sink_ptr,  # fp32 [H]
    o_ptr,
    stride_ot,
    stride_os,
    stride_oh,  # out [T, H, D] or fp32 partials [T, NS, H, D]
    lse_ptr,  # fp32 [T, NS, H] (SPLIT)
    H,
    W,
    TOPK,
    qk_scale,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    KV_FP4: tl.constexpr,
    HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ROUND_Q: tl.constexpr,
    PREC: tl.constexpr,
):
    # DOT_FP32: fp32 tiles, for TRITON_INTERPRET=1 (its bf16 dot is wrong) and for the exact
    # path (fp32 q, PREC = "ieee": true fp32 products, as the torch reference computes them).
    # Otherwise the dots are bf16; ROUND_Q rounds q to bf16 first (the fast path's semantics).
    DT: tl.constexpr = tl.float32 if DOT_FP32 else tl.bfloat16
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)
    o_h = i_hb * BH + tl.arange(0, BH)
    m_h = o_h < H
    o_d = tl.arange(0, D)
    p_q = q_ptr + i_t * stride_qt + o_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_h[:, None], other=0.0)
    if ROUND_Q:
        b_q = b_q.to(tl.bfloat16)
    b_q = b_q.to(DT)  # [BH, D]

    m_i = tl.full([BH], -1e30, tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)

    n_sw = tl.cdiv(W, BN)
    n_tiles = n_sw + tl.cdiv(TOPK, BN)
    per = tl.cdiv(n_tiles, NUM_SPLITS)
    u0 = i_s * per
    u1 = tl.minimum(u0 + per, n_tiles)
    # One loop over the split's tiles; a tile comes from the SWA segment or the top-k segment.
    # (Two consecutive loops made ptxas spill ~900 B/thread; one loop with a branch spills none.)
    for u in range(u0, u1):
        if u < n_sw:
            idx = _load_idx(swa_idx_ptr + i_t * stride_swt, u, W, BN)
            s_v, s_s = _raw_v41(swa_ptr, swa_stride, idx, D)
            b_k = _deq_v41(s_v, s_s, D, BN, DT)
        else:
            idx = _load_idx(kv_idx_ptr + i_t * stride_kvt, u - n_sw, TOPK, BN)
            if KV_FP4:
                f_v, f_s = _raw_v41_fp4(kv_ptr, kv_stride, idx, D)
                b_k = _deq_v41_fp4(f_v, f_s, D, BN, DT)
            else:
                k_v, k_s = _raw_v41(kv_ptr, kv_stride, idx, D)
                b_k = _deq_v41(k_v, k_s, D, BN, DT)
        m_i, l_i, acc = _attend_tile(b_q, b_k, idx >= 0, m_i, l_i, acc, qk_scale, PREC)

    p_o = o_ptr + i_t * stride_ot + i_s * stride_os + o_h[:, None] * stride_oh + o_d[None, :]
    if SPLIT:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        tl.store(p_o, acc / l_safe[:, None], mask=m_h[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(lse_ptr + (i_t * NUM_SPLITS + i_s) * H + o_h, lse, mask=m_h)
    else:
        if HAS_SINK:
            s2 = tl.load(sink_ptr + o_h, mask=m_h, other=0.0) * 1.4426950408889634
        else:
            s2 = tl.full([BH], float("-inf"), tl.float32)
        m_f = tl.maximum(m_i, s2)
        w = tl.exp2(m_i - m_f)
        den = l_i * w + tl.exp2(s2 - m_f)
        o = acc * (w / tl.where(den > 0, den, 1.0))[:, None]
        tl.store(p_o, o.to(o_ptr.dtype.element_ty), mask=m_h[:, None])


@triton.jit
def _combine_kernel(
    part_ptr,
    lse_ptr,
    sink_ptr,
    o_ptr,
    stride_ot,
    stride_oh,
    H,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    NS_P2: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    """Merge split partials [T, NS, H, D] (normalized) with base-2 lse [T, NS, H] and the sink."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, NS_P2)
    o_d = tl.arange(0, D)
    m_s = o_s < NUM_SPLITS
    lse = tl.load(lse_ptr + (i_t * NUM_SPLITS + o_s) * H + i_h, mask=m_s, other=float("-inf"))
    if HAS_SINK:
        s2 = tl.load(sink_ptr + i_h) * 1.4426950408889634
    else:
        s2 = float("-inf")
    m = tl.maximum(tl.maximum(tl.max(lse, 0), s2), -1e30)
    w = tl.exp2(lse - m)  # [NS_P2]
    den = tl.sum(w, 0) + tl.exp2(s2 - m)
    p_p = part_ptr + ((i_t * NUM_SPLITS + o_s[:, None]) * H + i_h) * D + o_d[None, :]
    b_p = tl.load(p_p, mask=m_s[:, None], other=0.0)  # [NS_P2, D]
    o = tl.sum(b_p * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + i_t * stride_ot + i_h * stride_oh + o_d, o.to(o_ptr.dtype.element_ty))


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_splits(T: int, head_blocks: int, n_tiles: int, device: torch.device) -> int:
    """Splits per (token, head block) so that the grid roughly fills the GPU once (shape-only)."""
    if device.type != "cuda":
        return max(1, min(n_tiles, 2))
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(n_tiles, sms // max(1, T * head_blocks)))


def sparse_attention(
    q,
    swa_flat,
    swa_slots,
    kv_flat,
    topk_slots,
    kv_fp4: bool,
    attn_sink,
    scale: float,
    out: torch.Tensor,
    num_splits: int | None = None,
    block_h: int | None = None,
    block_n: int = 32,
    num_warps: int | None = None,
    num_stages: int = 1,
):
    """Launch; arguments as validated by `kernels.sparse_attn.sparse_attention`.

    q [T, H, D] bf16, or fp32 for the exact path (fp32 tiles, IEEE dots: the torch reference's
    arithmetic up to summation order, several times slower); swa_flat uint8 [S, D + D/32] and
    swa_slots int32
    [T, W]; kv_flat uint8 [S', B] and topk_slots int32 [T, TOPK]; attn_sink fp32 [H] or None;
    out [T, H, D] (bf16 or fp32) written in place. W or TOPK may be 0 (pass a dummy cache).
    """
    T, H, D = q.shape
    if T == 0:
        return out
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    exact = q.dtype == torch.float32  # fp32 q: fp32 tiles and IEEE products (exact path)
    W, TOPK = swa_slots.shape[1], topk_slots.shape[1]
    BH = block_h or min(64, max(16, triton.next_power_of_2(H)))
    if block_h is None and T * triton.cdiv(H, 64) < 8:
        # Too few tokens to fill the GPU: 16-head programs (4 warps, no register spills) give 4x
        # the programs; measured 14.1 vs 17.0 us at batch 1 (benchmarks/RESULTS.md).
        BH = 16
    num_warps = num_warps or (4 if BH <= 16 else 8)
    head_blocks = triton.cdiv(H, BH)
    n_tiles = triton.cdiv(W, block_n) + triton.cdiv(TOPK, block_n)
    ns = num_splits or pick_splits(T, head_blocks, n_tiles, q.device)
    ns = max(1, min(ns, max(n_tiles, 1)))
    split = ns > 1
    if split:
        part = torch.empty(T, ns, H, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(T, ns, H, dtype=torch.float32, device=q.device)
        o_t, o_args = part, (part.stride(0), part.stride(1), part.stride(2))
    else:
        lse = out
        o_t, o_args = out, (out.stride(0), 0, out.stride(1))
    sink = attn_sink if attn_sink is not None else lse
    _sparse_attn_kernel[(T, head_blocks, ns)](
        q,
        q.stride(0),
        q.stride(1),
        swa_flat,
        swa_flat.stride(0),
        swa_slots,
        swa_slots.stride(0),
        kv_flat,
        kv_flat.stride(0),
        topk_slots,
        topk_slots.stride(0),
        sink,
        o_t,
        *o_args,
        lse,
        H,
        W,
        TOPK,
        scale * LOG2E,
        D=D,
        BH=BH,
        BN=block_n,
        KV_FP4=kv_fp4,
        HAS_SINK=attn_sink is not None,
        SPLIT=split,
        NUM_SPLITS=ns,
        DOT_FP32=interpret or exact,
        ROUND_Q=not exact,
        PREC="ieee" if exact else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if split:
        _combine_kernel[(T, H)](
            part,
            lse,
            sink,
            out,
            out.stride(0),
            out.stride(1),
            H,
            D=D,
            NUM_SPLITS=ns,
            NS_P2=triton.next_power_of_2(ns),
            HAS_SINK=attn_sink is not None,
            num_warps=4,
        )
    return out
