"""Sparse MQA attention over V4.1 records: SWA window + top-k entries + sink, one softmax.

`sparse_attention` serves decode and prefill (extend) alike: each query token t carries its own
explicit slot lists, so per-request windows, the bounded-replay floor and short sequences are all
expressed by -1 padding (see `indices.py`). Dispatch: Triton on CUDA with capability >= 9.0,
torch reference elsewhere or with DSV41_FORCE_REF=1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kernels.dispatch import use_triton
from sglang_dsv41.kernels.sparse_attn.indices import entry_slots, swa_window_slots
from sglang_dsv41.kernels.sparse_attn.ref import sparse_attention_ref
from sglang_dsv41.kv.records import Layout, record_bytes

__all__ = ["sparse_attention", "sparse_attention_ref", "swa_window_slots", "entry_slots"]


def sparse_attention(
    q: Tensor,
    swa_cache: Tensor | None,
    swa_slots: Tensor | None,
    kv_cache: Tensor | None = None,
    topk_slots: Tensor | None = None,
    kv_layout: Layout = Layout.V41_FP4,
    attn_sink: Tensor | None = None,
    scale: float | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: Tensor | None = None,
    **launch,
) -> Tensor:
    """o [T, H, D]: per token and head, softmax over SWA + top-k logits (x scale) and the sink.

    q [T, H, D] bf16, or fp32 for the exact path (H any, 8..128 typical; D a power of two >= 64,
    512 in V4.1);
    swa_cache uint8 [..., D + D/32] (V41; leading dims flatten to slots) and swa_slots int32
    [T, W] (-1 = skip); kv_cache uint8 [..., record_bytes(kv_layout, D)] (V41_FP4 or V41) and
    topk_slots int32 [T, TOPK] (-1 = skip); either pair may be None (SWA-only layers);
    attn_sink fp32 [H] (unscaled logit of a zero value) or None; scale defaults to D^-0.5.
    Returns `out` (allocated as out_dtype bf16/fp32 if None). No host syncs: graph-capturable.
    `launch` passes tuning knobs to the Triton launcher (num_splits, block_n, num_warps, ...).
    """
    T, H, D = q.shape
    scale = D**-0.5 if scale is None else float(scale)
    if kv_layout not in (Layout.V41, Layout.V41_FP4):
        raise ValueError(f"main KV layout must be V41 or V41_FP4, got {kv_layout}")
    if out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    if not use_triton(q.device):
        out.copy_(
            sparse_attention_ref(
                q,
                swa_cache,
                swa_slots,
                kv_cache,
                topk_slots,
                kv_layout,
                attn_sink,
                scale,
                out.dtype,
            )
        )
        return out
    from sglang_dsv41.kernels.sparse_attn import triton as tri

    if D < 64 or D & (D - 1):
        raise ValueError(f"the Triton kernel needs D a power of two >= 64, got {D}")
    empty = torch.empty(T, 0, dtype=torch.int32, device=q.device)
    dummy = torch.empty(1, 1, dtype=torch.uint8, device=q.device)
    swa_flat = dummy if swa_slots is None else swa_cache.view(-1, record_bytes(Layout.V41, D))
    kv_flat = dummy if topk_slots is None else kv_cache.view(-1, record_bytes(kv_layout, D))
    swa_slots = empty if swa_slots is None else _as_index(swa_slots, T)
    topk_slots = empty if topk_slots is None else _as_index(topk_slots, T)
    q = q if q.stride(-1) == 1 else q.contiguous()
    sink = None if attn_sink is None else attn_sink.to(torch.float32).contiguous()
    return tri.sparse_attention(
        q,
        swa_flat,
        swa_slots,
        kv_flat,
        topk_slots,
        kv_layout is Layout.V41_FP4,
        sink,
        scale,
        out,
        **launch,
    )


def _as_index(slots: Tensor, T: int) -> Tensor:
    if slots.dim() != 2 or slots.shape[0] != T:
        raise ValueError(f"slot lists must be [T={T}, N], got {tuple(slots.shape)}")
    slots = slots if slots.dtype == torch.int32 else slots.to(torch.int32)
    return slots if slots.stride(-1) == 1 else slots.contiguous()
