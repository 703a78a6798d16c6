"""A prefill's SWA windows attended once per group of neighbouring query tokens.

In a prefill (or any extend) the window of token t at position p is the W slots of positions
p - W + 1 .. p, so G consecutive tokens of one request read W + G - 1 distinct window records
between them instead of G W: the per-token kernels dequantize and multiply each window record
once per token that sees it (a window record costs ~1.7 top-k records' time: 528 B of e4m3
against 288 B of e2m1). `window_partials` takes groups of G = ROWS / HB consecutive tokens (HB
= H rounded up to a power of two, ROWS = 64 rows of (token, head)) and, for each group, the
union of its first and last token's windows; a token is *covered* when its own list is exactly
its slice of that union (`covered_ref` states the rule; tokens of another request, shuffled
tokens or lists that are not windows are not), and for covered tokens it returns the softmax
partial of the window alone: o_w (normalized, bf16) and its base-2 log-sum-exp. The CUDA kernel
(`cuda_decode.sparse_attention(..., win_share=True)`) then reads only the top-k entries of a
covered token and joins the partial in its output factors like a second sink; an uncovered token
keeps its whole list there, so the result is the same softmax for any slot lists.

Shapes: q bf16 [T, H, D]; swa_flat uint8 [S, D + D/32] (V41 records); swa_slots int32 [T, W]
(-1 = left out) with W >= G. Out: o_w bf16 [T, H, D], lse_w fp32 [T, H] (base 2, of the logits
x scale; -inf where the window holds no entry), covered int32 [T] (1 / 0).

The math is `layers.sparse_attention.attend_keys` over the window's keys alone (`partials_ref`
is the torch reference; the GPU tests compare both and the joined output with the whole
formula, `ref.sparse_attention_ref`). Runs on CUDA GPUs Triton supports (measured on the H200,
benchmarks/RESULTS.md) and under TRITON_INTERPRET=1 on the CPU (the CPU tests).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from sglang_dsv41.kernels.sparse_attn.triton_records import FAST_FACTOR, V41, deq, raw

ROWS = 64  # (token, head) rows of one program: the M of its products
BN = 32  # union entries per tile
NUM_WARPS = 8
LOG2E = 1.4426950408889634


def group_tokens(H: int) -> int:
    """Tokens per group at H heads: ROWS over H rounded up to a power of two (at least 1)."""
    return max(1, ROWS // triton.next_power_of_2(max(H, 1)))


@triton.jit
def _union_slots(idx_ptr, stride_it, t0, t_last, j, W, mask):
    """Slots of union entries j (any shape): token t0's window for j < W, then token t_last's
    last t_last - t0 entries."""
    first = j < W
    row = tl.where(first, t0, t_last).to(tl.int64)
    col = tl.where(first, j, j - (t_last - t0))
    return tl.load(idx_ptr + row * stride_it + col, mask=mask, other=-1)


@triton.jit
def _window_kernel(
    q_ptr,
    stride_qt,
    stride_qh,
    swa_ptr,
    idx_ptr,
    stride_it,
    o_ptr,
    lse_ptr,
    cov_ptr,
    T,
    H,
    W,
    qk_scale,
    D: tl.constexpr,
    HB: tl.constexpr,
    G: tl.constexpr,
    WP: tl.constexpr,
    BN: tl.constexpr,
    FAST: tl.constexpr,
    OUT_F: tl.constexpr,
    DT: tl.constexpr,
    FMT: tl.constexpr,
):
    """One program = tokens t0 .. t0 + G - 1 (grid: cdiv(T, G)). Rows r = (token r // HB, head
    r % HB); union entry j is visible to token i when i <= j < i + W and its slot is >= 0."""
    t0 = tl.program_id(0) * G
    t_last = tl.minimum(t0 + G, T) - 1
    # coverage: entry w of token i must be union entry i + w
    o_i = tl.arange(0, G)
    o_w = tl.arange(0, WP)
    live_i = t0 + o_i < T
    m_iw = live_i[:, None] & (o_w[None, :] < W)
    own = tl.load(
        idx_ptr + (t0 + o_i).to(tl.int64)[:, None] * stride_it + o_w[None, :], mask=m_iw, other=-1
    )
    uni = _union_slots(idx_ptr, stride_it, t0, t_last, o_i[:, None] + o_w[None, :], W, m_iw)
    bad = tl.sum(((own != uni) & m_iw).to(tl.int32), axis=1)  # [G]
    tl.store(cov_ptr + t0 + o_i, (bad == 0).to(tl.int32), mask=live_i)

    o_r = tl.arange(0, G * HB)
    r_i = o_r // HB
    r_h = o_r % HB
    r_live = (t0 + r_i < T) & (r_h < H)
    o_d = tl.arange(0, D)
    p_q = q_ptr + (t0 + r_i).to(tl.int64)[:, None] * stride_qt + r_h[:, None] * stride_qh
    b_q = tl.load(p_q + o_d[None, :], mask=r_live[:, None], other=0.0).to(DT)  # [M, D]
    m_i = tl.full([G * HB], -1e30, tl.float32)
    l_i = tl.zeros([G * HB], tl.float32)
    acc = tl.zeros([G * HB, D], tl.float32)
    n_union = W + t_last - t0
    sc = qk_scale  # times OUT_F (FAST tiles hold the values / OUT_F)
    for j0 in range(0, n_union, BN):
        o_j = j0 + tl.arange(0, BN)
        slot = _union_slots(idx_ptr, stride_it, t0, t_last, o_j, W, o_j < n_union)
        b_v, b_s = raw(swa_ptr, D + D // 32, slot, D, FMT)
        b_k = deq(b_v, b_s, D, BN, DT, FMT, FAST)  # [BN, D]
        s = tl.dot(b_q, tl.trans(b_k)) * sc  # [M, BN], base-2 logits
        vis = (o_j[None, :] >= r_i[:, None]) & (o_j[None, :] < r_i[:, None] + W)
        vis = vis & (slot[None, :] >= 0)
        s = tl.where(vis, s, -1e30)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.where(vis, tl.exp2(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), b_k).to(tl.float32)
        m_i = m_new
    seen = l_i > 0.0
    scale_o = tl.where(seen, OUT_F / tl.where(seen, l_i, 1.0), 0.0)
    o = acc * scale_o[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    row = (t0 + r_i).to(tl.int64) * H + r_h
    tl.store(o_ptr + row[:, None] * D + o_d[None, :], o.to(tl.bfloat16), mask=r_live[:, None])
    tl.store(lse_ptr + row, lse, mask=r_live)


def window_partials(
    q: Tensor, swa_flat: Tensor, swa_slots: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(o_w bf16 [T, H, D], lse_w fp32 [T, H], covered int32 [T]); see the module docstring.
    Only covered tokens' o_w / lse_w are meaningful. One launch, no host sync."""
    T, H, D = q.shape
    W = swa_slots.shape[1]
    G = group_tokens(H)
    if q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        raise ValueError(f"window_partials takes bf16 q with unit stride in D, got {q.dtype}")
    if swa_slots.dtype != torch.int32 or swa_slots.stride(1) != 1:
        raise ValueError("swa_slots must be int32 [T, W] with unit stride")
    if W < G:
        raise ValueError(f"window_partials needs W >= {G} (tokens per group at {H} heads), got {W}")
    if swa_flat.dim() != 2 or swa_flat.shape[1] != D + D // 32 or swa_flat.stride(1) != 1:
        raise ValueError(f"swa_flat must be V41 records [S, {D + D // 32}], got {swa_flat.shape}")
    o = torch.empty(T, H, D, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    cov = torch.empty(T, dtype=torch.int32, device=q.device)
    if T == 0:
        return o, lse, cov
    fast = os.environ.get("TRITON_INTERPRET", "0") != "1"
    out_f = FAST_FACTOR if fast else 1.0
    _window_kernel[(triton.cdiv(T, G),)](
        q, q.stride(0), q.stride(1), swa_flat, swa_slots, swa_slots.stride(0), o, lse, cov,
        T, H, W, scale * LOG2E * out_f,
        D=D, HB=ROWS // G, G=G, WP=triton.next_power_of_2(W), BN=BN, FAST=fast, OUT_F=out_f,
        DT=tl.bfloat16 if fast else tl.float32, FMT=V41, num_warps=NUM_WARPS, num_stages=2,
    )  # fmt: skip
    return o, lse, cov


def covered_ref(swa_slots: Tensor, H: int) -> Tensor:
    """bool [T]: token t0 + i of its group (t0 = G floor(t / G), last token tl = min(t0 + G, T)
    - 1) is covered when entry w of its list equals union entry i + w for every w, the union
    being token t0's list followed by the last tl - t0 entries of token tl's."""
    T, W = swa_slots.shape
    G = group_tokens(H)
    cov = torch.zeros(T, dtype=torch.bool, device=swa_slots.device)
    for t0 in range(0, T, G):
        tl_ = min(t0 + G, T) - 1
        union = torch.cat((swa_slots[t0], swa_slots[tl_, W - (tl_ - t0) :]))
        for i in range(tl_ - t0 + 1):
            cov[t0 + i] = bool(torch.equal(swa_slots[t0 + i], union[i : i + W]))
    return cov


def partials_ref(
    q: Tensor, swa_cache: Tensor, swa_slots: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Torch reference of the window partials of every token (covered or not): (o_w fp32 [T,
    H, D] = `layers.sparse_attention.attend_keys` over the token's window alone, no sink;
    lse_w fp32 [T, H], base 2, -inf where the window holds no entry)."""
    from sglang_dsv41.kernels.sparse_attn.ref import gather_records
    from sglang_dsv41.kv.records import Layout
    from sglang_dsv41.layers.sparse_attention import attend_keys

    T, H, D = q.shape
    keys = gather_records(swa_cache, swa_slots, Layout.V41, D)  # [T, W, D]
    ok = swa_slots >= 0
    no_sink = torch.full((H,), float("-inf"), device=q.device)
    o = attend_keys(q.float(), keys, ok, no_sink, scale, torch.float32)
    logits = torch.einsum("thd,twd->thw", q.float(), keys) * scale
    logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    seen = ok.any(dim=1)[:, None, None]
    return torch.where(seen, o, torch.zeros((), device=q.device)), lse
