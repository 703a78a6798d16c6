"""Fused KV stores: projected rows in, finished V41 / V41_FP4 / INDEX_K records out.

One launch per cache write. `store_records` is the general entry; `store_swa`, `store_latent`
and `store_index_k` name the three uses of docs/design.md 2.2:

| use          | steps                         | layout              | record (D=512 / DI=128) |
|--------------|-------------------------------|---------------------|-------------------------|
| SWA rows     | RMSNorm(kv_norm), RoPE last R | V41                 | 528 B                   |
| main latents | RoPE last R                   | V41_FP4 (or V41)    | 288 B (528 B)           |
| index K      | RMSNorm(k_norm), RoPE last R  | INDEX_K             | 68 B                    |

Pools: uint8 [..., B] with contiguous slots (e.g. [num_pages, P, B]); slot s is row s of
`pool.view(-1, B)`, i.e. page s // P, offset s % P. Slots -1 are skipped. With `split_page=P`
the pool is [num_pages, P * B] split pages (kv/split_pages.py: the page's P value parts, then
its P scale parts), SGLang's index-K page that DeepGEMM reads on SM100
(kernels.dispatch.index_page_size); split_page=1 is the plain record layout.
RoPE: pass `pos` [T] with either `inv_freq` fp32 [R/2] (cos/sin computed per call exactly like
`layers.rope.apply_rope`) or `cos_sin_cache` = (cos, sin) fp32 [max_pos, R/2] read at `pos`.
Everything is on-device and shape-static: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.kv_store.ref import rope_cos_sin, store_records_ref
from sglang_dsv41.kv.records import Layout, record_bytes

_FMT = {Layout.V41: 0, Layout.V41_FP4: 1, Layout.INDEX_K: 2}

__all__ = ["store_records", "store_swa", "store_latent", "store_index_k", "rope_cos_sin"]


def triton_unsupported(x: Tensor) -> str | None:
    """None when the Triton store takes rows x, else the reason (float64 rows: the twin check)."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"rows in {x.dtype} (needs bf16, fp16 or fp32)"
    return None


def store_records(
    x: Tensor,
    pool: Tensor,
    slots: Tensor,
    layout: Layout,
    *,
    norm_weight: Tensor | None = None,
    eps: float = 1e-6,
    pos: Tensor | None = None,
    inv_freq: Tensor | None = None,
    cos_sin_cache: tuple[Tensor, Tensor] | None = None,
    split_page: int = 1,
    angles: tuple[Tensor, Tensor] | None = None,
) -> None:
    """Normalize (optional), rotate (optional) and pack T rows into `pool` at `slots`, in place.

    x [T, D] fp32 or bf16 (D a multiple of 32; bf16 rows are rounded to bf16 after the norm and
    after RoPE, like the torch layers); pool uint8 [..., record_bytes(layout, D)], or
    [num_pages, split_page * record_bytes(layout, D)] split pages;
    slots [T] int32/int64 (-1 = skip); norm_weight [D] (RMSNorm, fp32 statistics) or None;
    pos [T] int with inv_freq [R/2] or cos_sin_cache (cos, sin) [max_pos, R/2] fp32; or angles
    (cos, sin) fp32 [T, R/2] of the rows themselves (layers.rope.RopeAngles); or no RoPE.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [T, D], got {tuple(x.shape)}")
    T, D = x.shape
    B = record_bytes(layout, D)
    row = split_page * B
    if pool.dtype != torch.uint8 or pool.shape[-1] != row:
        raise ValueError(f"pool must be uint8 [..., {row}] for {layout.name} at D={D}")
    if slots.shape != (T,):
        raise ValueError(f"slots must be [T]={T}, got {tuple(slots.shape)}")
    flat = pool.view(-1, row)
    has_rope = inv_freq is not None or cos_sin_cache is not None
    if has_rope and pos is None and angles is None:
        raise ValueError("RoPE needs pos")
    path = dispatch.select("kv_store", x.device, {Path.TRITON: lambda: triton_unsupported(x)})
    if path is Path.REF:
        cos = sin = None
        if angles is not None:
            cos, sin = angles
        elif cos_sin_cache is not None:
            cos, sin = (c[pos.long()] for c in cos_sin_cache)
        elif inv_freq is not None:
            cos, sin = rope_cos_sin(pos, inv_freq)
        store_records_ref(x, flat, slots, layout, norm_weight, eps, cos, sin, split_page)
        return
    from sglang_dsv41.kernels.kv_store import triton as tri

    x = x if x.stride(-1) == 1 else x.contiguous()
    w = None if norm_weight is None else norm_weight.to(torch.float32).contiguous()
    cos = sin = rows = None
    if angles is not None:
        cos, sin = (c.to(torch.float32).contiguous() for c in angles)
    elif cos_sin_cache is not None:
        cos, sin = (c.to(torch.float32).contiguous() for c in cos_sin_cache)
        rows = pos
    elif inv_freq is not None:
        cos, sin = rope_cos_sin(pos, inv_freq)
    rope_dim = 0 if cos is None else 2 * cos.shape[-1]
    tri.store_records(x, flat, slots, _FMT[layout], w, eps, rows, cos, sin, rope_dim, split_page)


def store_swa(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    pos: Tensor,
    pool: Tensor,
    slots: Tensor,
    *,
    inv_freq: Tensor | None = None,
    cos_sin_cache: tuple[Tensor, Tensor] | None = None,
) -> None:
    """SWA rows x [T, D] -> V41 records (RMSNorm, RoPE on the last R dims) at slots [T]."""
    rope = dict(pos=pos, inv_freq=inv_freq, cos_sin_cache=cos_sin_cache)
    store_records(x, pool, slots, Layout.V41, norm_weight=norm_weight, eps=eps, **rope)


def store_latent(
    x: Tensor,
    pos: Tensor,
    pool: Tensor,
    slots: Tensor,
    *,
    layout: Layout,
    inv_freq: Tensor | None = None,
    cos_sin_cache: tuple[Tensor, Tensor] | None = None,
) -> None:
    """Compressed latents x [n, D] (already normed) -> RoPE at entry positions pos [n] ->
    records of the config's main-KV layout (V41_FP4 or V41)."""
    store_records(x, pool, slots, layout, pos=pos, inv_freq=inv_freq, cos_sin_cache=cos_sin_cache)


def store_index_k(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    pos: Tensor,
    pool: Tensor,
    slots: Tensor,
    *,
    inv_freq: Tensor | None = None,
    cos_sin_cache: tuple[Tensor, Tensor] | None = None,
    split_page: int = 1,
) -> None:
    """Index keys x [n, DI] (after `wk`) -> k_norm, RoPE -> INDEX_K records at slots [n]
    (split_page: see the module docstring; 128 for an SM100 pool)."""
    rope = dict(pos=pos, inv_freq=inv_freq, cos_sin_cache=cos_sin_cache)
    store_records(
        x,
        pool,
        slots,
        Layout.INDEX_K,
        norm_weight=norm_weight,
        eps=eps,
        split_page=split_page,
        **rope,
    )
