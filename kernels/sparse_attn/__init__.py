"""Sparse MQA attention over V4.1 records: SWA window + top-k entries + sink, one softmax.

`sparse_attention` serves decode and prefill (extend) alike: each query token t carries its own
explicit slot lists (kernels.args.SparseKV), so per-request windows, the bounded-replay floor and
short sequences are all expressed by -1 padding (see `indices.py`). Paths (kernels/dispatch.py):
FlashMLA's V4.1 kernels on SM100 / SM103 (sm100.py: bf16 queries, D 512, 64 or 128 heads),
Triton on CUDA with capability >= 9.0, the torch reference elsewhere, with DSV41_FORCE_REF=1,
or for a shape no fast path takes (logged once).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.sparse_attn.indices import entry_slots, swa_window_slots
from sglang_dsv41.kernels.sparse_attn.ref import sparse_attention_ref
from sglang_dsv41.kernels.sparse_attn.variants import Tiles, Variant
from sglang_dsv41.kv.records import Layout

__all__ = [
    "SparseKV",
    "sparse_attention",
    "sparse_attention_ref",
    "swa_window_slots",
    "Tiles",
    "Variant",
    "entry_slots",
]


def triton_unsupported(q: Tensor) -> str | None:
    """None when the Triton kernel takes q [T, H, D], else the reason."""
    D = q.shape[-1]
    if D < 64 or D & (D - 1):
        return f"head dim {D} (needs a power of two >= 64)"
    if q.dtype not in (torch.bfloat16, torch.float32):
        return f"queries in {q.dtype} (needs bf16 or fp32)"
    return None


def sparse_attention(
    q: Tensor,
    kv: SparseKV,
    attn_sink: Tensor | None,
    scale: float | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    out: Tensor | None = None,
    variant: Variant | str | None = None,
    num_splits: int | None = None,
    tiles: Tiles | None = None,
) -> Tensor:
    """o [T, H, D]: per token and head, softmax over SWA + top-k logits (x scale) and the sink.

    q [T, H, D] bf16, or fp32 for the exact path (H any, 8..128 typical; D a power of two >= 64,
    512 in V4.1); kv: the caches and slot lists (kernels.args.SparseKV; either list may be None);
    attn_sink fp32 [H] (unscaled logit of a zero value) or None; scale defaults to D^-0.5.
    Returns `out`, or when it is None a new out_dtype (bf16 / fp32) tensor (on the FlashMLA
    route FlashMLA's own output, not copied: with fewer than 64 heads, padded to 64 there, the
    view of its first H heads). Graph-capturable: no host syncs, except eagerly where a prefill
    workspace's static bound (min(cache slots, kv.max_slots, T N)) passes 256 MB, which is then
    sized to the slots referenced (one sync; `triton_workspace.workspaces`).
    On the Triton path (SM90+) the plan picks the kernel from the shapes (`plan.plan_for`; the
    table: `python -m sglang_dsv41.kernels.sparse_attn.plan`); variant runs a named one instead
    (`variants.Variant`), num_splits and tiles override its splits and Triton tile shape
    (`triton.sparse_attention`).
    """
    T, H, D = q.shape
    kv.check_dim(D)
    scale = D**-0.5 if scale is None else float(scale)

    def sm100_check():
        from sglang_dsv41.kernels.sparse_attn import sm100

        return sm100.unsupported(q, kv)

    fast = {Path.SM100: sm100_check, Path.TRITON: lambda: triton_unsupported(q)}
    path = dispatch.select("sparse_attention", q.device, fast)
    if path is not Path.TRITON and out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    if path is Path.SM100:
        from sglang_dsv41.kernels.sparse_attn import sm100

        return sm100.sparse_attention(q, kv, attn_sink, scale, out)
    if path is Path.REF:
        out.copy_(sparse_attention_ref(q, kv, attn_sink, scale, out.dtype))
        return out
    from sglang_dsv41.kernels.sparse_attn import triton as tri

    flat = kv.flat(T, D, q.device)
    q = q if q.stride(-1) == 1 else q.contiguous()
    sink = None if attn_sink is None else attn_sink.to(torch.float32).contiguous()
    return tri.sparse_attention(
        q,
        *flat,
        kv.kv_layout is Layout.V41_FP4,
        sink,
        scale,
        out,
        out_dtype,
        max_slots=kv.max_slots,
        variant=variant,
        num_splits=num_splits,
        tiles=tiles,
    )
