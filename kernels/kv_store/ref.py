"""Torch reference of the fused KV stores: RMSNorm -> RoPE -> record codec -> scatter into a pool.

The intermediate rounding follows the torch layers: `rms_norm` returns x's dtype and RoPE rounds
the rotated span back to x's dtype, so a bf16 row is rounded to bf16 after each step, exactly as
`layers.norm.rms_norm` + `layers.rope.apply_rope` + `kv.records.pack` would do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kv.records import Layout, pack, record_bytes, value_bytes
from sglang_dsv41.kv.split_pages import write_split_records
from sglang_dsv41.layers import rope
from sglang_dsv41.layers.norm import rms_norm
from sglang_dsv41.layers.rope import rotate_pairs


def rope_cos_sin(pos: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """pos [T] int, inv_freq fp32 [R/2] -> (cos, sin) fp32 [T, R/2], as `apply_rope` computes
    them (layers.rope.rope_cos_sin)."""
    return rope.rope_cos_sin(pos, inv_freq)


def record_values(
    x: Tensor,
    norm_weight: Tensor | None = None,
    eps: float = 1e-6,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> Tensor:
    """x [T, D] fp32/bf16 -> fp32 [T, D]: the values a store quantizes (norm, then RoPE)."""
    y = x
    if norm_weight is not None:
        y = rms_norm(y, norm_weight, eps)
    if cos is not None:
        y = rotate_pairs(y, cos, sin)  # the layers' RoPE with per-row cos / sin [T, R/2]
    return y.to(torch.float32)


def store_records_ref(
    x: Tensor,
    pool: Tensor,
    slots: Tensor,
    layout: Layout,
    norm_weight: Tensor | None = None,
    eps: float = 1e-6,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
    split_page: int = 1,
) -> None:
    """Write pack(layout, record_values(x, ...)) rows into pool slots, in place.

    x [T, D]; pool uint8 [..., B] whose leading dims flatten to slots, or split pages
    [num_pages, split_page * B] (kv/split_pages.py); slots [T] int, -1 = skip; cos/sin fp32
    [T, R/2] per row (already gathered by position) or None for no RoPE.
    """
    D = x.shape[-1]
    B = record_bytes(layout, D)
    rec = pack(layout, record_values(x, norm_weight, eps, cos, sin))  # [T, B]
    if split_page > 1:
        write_split_records(pool, slots, rec, split_page, value_bytes(layout, D))
        return
    flat = pool.view(-1, B)
    if flat.device.type == "cpu":
        keep = slots >= 0
        flat[slots[keep].long()] = rec[keep]
        return
    write_rows_no_sync(flat, slots, rec)


def write_rows_no_sync(flat: Tensor, slots: Tensor, rec: Tensor) -> None:
    """flat[slots[t]] = rec[t] for slots[t] >= 0, without a host sync (a decode CUDA graph holds
    this). flat [S, B], slots [T] int (-1 = skip, distinct otherwise), rec [T, B].

    A skipped row repeats the first kept row's write (same slot, same bytes), so no two writes to
    one slot disagree; with no kept row at all, every row rewrites slot 0's own bytes.
    """
    keep = slots >= 0
    rows = torch.arange(slots.shape[0], device=slots.device)
    first = torch.argmax(keep.to(torch.int32))  # 0 when nothing is kept
    src = torch.where(keep, rows, first)
    any_kept = keep.any()
    dst = torch.where(any_kept, slots[src].long(), torch.zeros_like(src))
    flat[dst] = torch.where(any_kept, rec[src], flat[dst])
