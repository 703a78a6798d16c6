"""Paged-pool arithmetic: pages, slots and compressed-entry visibility.

A pool stores records in slots; slot s lives in page s // P at offset s % P, and a page holds P
consecutive slots. A request's page table row lists its pages in order, so its item i (a token
for SWA caches, a compressed entry for main-KV / index-K caches) lives in slot
``page_table[b, i // P] * P + i % P``. Sentinel -1 everywhere: an unallocated page, a padding
position (e.g. top-k padding) and the slot / page / offset derived from them.

Compressed caches (ratio r >= 1): entry j covers tokens [j r, j r + r - 1], is written by the
token at position j r + r - 1 and is RoPE'd at position j r; at position ``pos`` the visible
entries are 0 .. (pos + 1) // r - 1. After n tokens a request holds n // r entries.

Every function takes Python ints or integer tensors (elementwise) unless its docstring says
otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

IntOrTensor = int | Tensor


def pages_needed(num_items: IntOrTensor, P: int) -> IntOrTensor:
    """Pages to hold ``num_items`` slots: ceil(num_items / P)."""
    if P < 1:
        raise ValueError(f"page size must be >= 1, got {P}")
    return (num_items + P - 1) // P


def entries_visible(pos: IntOrTensor, ratio: int) -> IntOrTensor:
    """Compressed entries visible to the token at ``pos``: (pos + 1) // ratio (ratio >= 1)."""
    if ratio < 1:
        raise ValueError(f"compress ratio must be >= 1 for a compressed cache, got {ratio}")
    return (pos + 1) // ratio


def entry_of(pos: IntOrTensor, ratio: int) -> IntOrTensor:
    """Index of the compressed entry that the token at ``pos`` contributes to: pos // ratio."""
    if ratio < 1:
        raise ValueError(f"compress ratio must be >= 1 for a compressed cache, got {ratio}")
    return pos // ratio


def entry_written_at(pos: IntOrTensor, ratio: int) -> IntOrTensor:
    """True where the token at ``pos`` completes (and writes) an entry: (pos + 1) % ratio == 0."""
    if ratio < 1:
        raise ValueError(f"compress ratio must be >= 1 for a compressed cache, got {ratio}")
    return (pos + 1) % ratio == 0


def slot_of(page_table: Tensor, positions: Tensor, req_idx: Tensor, P: int) -> Tensor:
    """Pool slot of item ``positions[t]`` of request ``req_idx[t]``.

    page_table: int32/int64 [B, max_pages], page ids, -1 = unallocated.
    positions: int [T] item index within the request (token position or entry index), -1 = pad.
    req_idx: int [T] row of page_table for each item.
    Returns int64 [T]: page * P + position % P, or -1 where the position is negative or its page
    is -1. A position at or beyond max_pages * P is an indexing error (IndexError on CPU); no
    host sync is done to check it.
    """
    if P < 1:
        raise ValueError(f"page size must be >= 1, got {P}")
    positions = positions.to(torch.int64)
    valid = positions >= 0
    pos = torch.where(valid, positions, torch.zeros_like(positions))
    page = page_table.to(torch.int64)[req_idx.to(torch.int64), pos // P]  # [T]
    valid = valid & (page >= 0)
    slots = page * P + pos % P
    return torch.where(valid, slots, torch.full_like(slots, -1))


def page_and_offset(slots: Tensor, P: int) -> tuple[Tensor, Tensor]:
    """int slots [...] -> (page int64 [...], offset int64 [...]); -1 slots give (-1, -1)."""
    if P < 1:
        raise ValueError(f"page size must be >= 1, got {P}")
    s = slots.to(torch.int64)
    valid = s >= 0
    neg = torch.full_like(s, -1)
    return torch.where(valid, s // P, neg), torch.where(valid, s % P, neg)


def slots_of_request(page_table_row: Tensor, num_items: int, P: int) -> Tensor:
    """Slots of items 0 .. num_items - 1 of one request, in order.

    page_table_row: int [max_pages]. Returns int64 [num_items] (-1 where the page is -1).
    """
    positions = torch.arange(num_items, dtype=torch.int64, device=page_table_row.device)
    req = torch.zeros_like(positions)
    return slot_of(page_table_row.unsqueeze(0), positions, req, P)
