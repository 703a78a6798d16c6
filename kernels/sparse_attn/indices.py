"""Argument preparation for sparse attention: explicit slot lists with -1 padding.

The kernels take, per query token, the slots to read: `swa_slots` [T, W] into the layer's SWA
cache and `topk_slots` [T, TOPK] into the source layer's main-KV cache. These helpers build them
from SGLang-style tables (`req_to_token`-like [B, L] maps from a request's item index to its
slot, -1 = unallocated), on device and with static shapes, so they can run inside a CUDA graph.

SWA span of a token at position `pos`: [max(pos - W + 1, floor), pos], where `floor` is 0, or
the first replayed position under decoder bounded replay (docs/design.md 2.5). Positions outside
the span, and slots that are -1 in the table, become -1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.layers.window import swa_window


def swa_window_slots(
    req_to_slot: Tensor, req_index: Tensor, pos: Tensor, window: int, floor: Tensor | None = None
) -> Tensor:
    """int32 [T, W]: entry w is the slot of position pos - W + 1 + w (oldest first), or -1.

    req_to_slot [B, L] int (slot of each token position of request b, -1 = none);
    req_index [T] int (request row of each query token); pos [T] int (its position);
    floor [T] int or None (first visible position; None = 0).
    """
    p, ok = swa_window(pos, window, floor)  # [T, W]
    L = req_to_slot.shape[1]
    ok &= p < L
    slots = req_to_slot[req_index.long()[:, None], p.clamp(0, L - 1)]  # [T, W]
    return torch.where(ok, slots, torch.full_like(slots, -1)).to(torch.int32)


def entry_slots(req_to_entry_slot: Tensor, req_index: Tensor, topk: Tensor) -> Tensor:
    """int32 [T, TOPK]: slots of the selected compressed entries; -1 stays -1.

    req_to_entry_slot [B, Lc] int (slot of entry j of request b in the main-KV pool);
    req_index [T] int; topk [T, TOPK] int entry indices from the indexer (-1 = padding).
    """
    Lc = req_to_entry_slot.shape[1]
    j = topk.long()
    slots = req_to_entry_slot[req_index.long()[:, None], j.clamp(0, Lc - 1)]  # [T, TOPK]
    return torch.where((j >= 0) & (j < Lc), slots, torch.full_like(slots, -1)).to(torch.int32)
