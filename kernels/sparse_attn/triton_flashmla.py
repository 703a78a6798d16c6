"""Sparse attention through FlashMLA's SM90 sparse prefill over a bf16 workspace built from the
V4.1 records: the fast path for 64 (or 128) heads and prefill-sized token counts.

FlashMLA (`sgl-flash-mla`, a dependency of SGLang) reads bf16 KV rows through per-token indices;
it does not read V4.1 records on SM90. So the slots the tokens reference are compacted and
dequantized once into a workspace (each referenced record once, however many tokens read it):

1. mark: flag[c] = 1 for every referenced slot, in one slot space c (SWA slots first, then the
   main-KV slots shifted by the SWA cache's size);
2. rank: row[c] = (number of flagged slots before c), a cumulative sum;
3. dequantize: `dequant_rows_kernel` writes each flagged record's D values as bf16 at its row;
4. remap: each token's entry list becomes workspace rows (-1 stays -1; a token that sees no entry
   gets the workspace's last row, all zeros, so its output is 0 as the sink-only softmax gives).

The workspace has min(referenced slots bound, T x N) + 1 rows; when that would exceed
`MAX_ROWS`, tokens are taken in chunks. All steps run on device without host syncs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sglang_dsv41.kernels.sparse_attn.triton_records import deq, raw

MAX_ROWS = 1 << 18  # 256 MB of bf16 rows at D = 512
FM_TOPK_ALIGN = 64  # FlashMLA walks the index list in blocks of 64


@functools.cache
def available() -> bool:
    """True when `flash_mla` (with `flash_mla_sparse_fwd`) imports."""
    try:
        import flash_mla
    except Exception:
        return False
    return hasattr(flash_mla, "flash_mla_sparse_fwd")


@triton.jit
def dequant_rows_kernel(
    src_ptr,  # uint8 [S, B] records
    src_stride,
    flag_ptr,  # int32 [S]: 1 = referenced
    row_ptr,  # int32 [S]: workspace row of a referenced slot
    ws_ptr,  # bf16 [R, D]
    S,
    D: tl.constexpr,
    BS: tl.constexpr,
    FP4: tl.constexpr,
):
    """ws[row[s]] = dequantized record s, for the flagged slots s of this program's BS slots."""
    o_s = tl.program_id(0) * BS + tl.arange(0, BS)
    m_s = o_s < S
    flag = tl.load(flag_ptr + o_s, mask=m_s, other=0)
    slot = tl.where(flag != 0, o_s, -1)
    b_v, b_s = raw(src_ptr, src_stride, slot, D, FP4)
    b_k = deq(b_v, b_s, D, BS, tl.float32, FP4)  # [BS, D], exact in bf16
    row = tl.load(row_ptr + o_s, mask=m_s, other=0).to(tl.int64)
    o_d = tl.arange(0, D)
    p_ws = ws_ptr + row[:, None] * D + o_d[None, :]
    tl.store(p_ws, b_k.to(ws_ptr.dtype.element_ty), mask=(slot >= 0)[:, None])


def build_workspace(swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int):
    """(ws bf16 [R, D], rows int32 [T, N']): the referenced records dequantized once, and each
    token's entries as workspace rows (-1 = skip), N' = W + TOPK rounded up to 64.

    swa_flat uint8 [S1, D + D/32] with swa_slots int32 [T, W]; kv_flat uint8 [S2, B] with
    topk_slots int32 [T, TOPK] (-1 = skip). Row R - 1 is zeros: a token with no entry points
    there (its output is then 0, as the reference gives).
    """
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    dev = swa_slots.device
    S1 = swa_flat.shape[0] if W else 0
    S2 = kv_flat.shape[0] if TOPK else 0
    N = W + TOPK
    n_pad = triton.cdiv(N, FM_TOPK_ALIGN) * FM_TOPK_ALIGN
    R = min(S1 + S2, T * N) + 1
    c = torch.cat((swa_slots, torch.where(topk_slots >= 0, topk_slots + S1, -1)), dim=1)
    valid = c >= 0  # [T, N]
    c_any = torch.where(valid, c, S1 + S2).long()  # invalid entries flag the extra slot
    flag = torch.zeros(S1 + S2 + 1, dtype=torch.int32, device=dev)
    flag.index_fill_(0, c_any.flatten(), 1)
    flag[S1 + S2] = 0
    row = torch.cumsum(flag, 0, dtype=torch.int32) - flag  # [S1 + S2 + 1]
    ws = torch.empty(R, D, dtype=torch.bfloat16, device=dev)
    ws[R - 1].zero_()
    BS = 16
    for src, n, off, fp4 in ((swa_flat, S1, 0, False), (kv_flat, S2, S1, kv_fp4)):
        if n:
            dequant_rows_kernel[(triton.cdiv(n, BS),)](
                src, src.stride(0), flag[off:], row[off:], ws, n, D=D, BS=BS, FP4=fp4
            )
    rows = torch.full((T, n_pad), -1, dtype=torch.int32, device=dev)
    rows[:, :N] = torch.where(valid, row[c_any], -1)
    rows[:, 0] = torch.where(valid.any(dim=1), rows[:, 0], R - 1)
    return ws, rows


def sparse_attention(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out):
    """Same contract as `triton.sparse_attention`, for q bf16 [T, 64 or 128, 512] on SM90."""
    import flash_mla

    T, H, D = q.shape
    if q.dtype != torch.bfloat16 or H not in (64, 128) or D != 512:
        raise ValueError(
            f"the FlashMLA path takes bf16 q with 64 or 128 heads of 512, got {q.dtype} "
            f"{tuple(q.shape)}"
        )
    N = swa_slots.shape[1] + topk_slots.shape[1]
    bound = (swa_flat.shape[0] if swa_slots.shape[1] else 0) + (
        kv_flat.shape[0] if topk_slots.shape[1] else 0
    )
    chunk = T if min(bound, T * N) < MAX_ROWS else max(1, MAX_ROWS // max(N, 1))
    q = q if q.is_contiguous() else q.contiguous()
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        ws, rows = build_workspace(
            swa_flat, swa_slots[t0:t1], kv_flat, topk_slots[t0:t1], kv_fp4, D
        )
        o = flash_mla.flash_mla_sparse_fwd(
            q[t0:t1],
            ws.view(-1, 1, D),
            rows.view(t1 - t0, 1, -1),
            scale,
            D,
            attn_sink=attn_sink,
            use_legacy=True,
            return_log2_lse=False,
        )[0]
        out[t0:t1].copy_(o)
    return out
