"""Split pages: SGLang's (and DeepGEMM's) arrangement of records inside a page.

A split page of P slots holds the value parts of its P records back to back, then their scale
parts back to back: for records of R bytes whose first V bytes are values (kv.records.value_bytes),
slot offset o of page p has
    values  at bytes [p * P * R + o * V,          ... + V)
    scales  at bytes [p * P * R + P * V + o * (R - V), ... + R - V)
A split page of one slot is the plain record (values, then scales), so a pool of 68 B index-K
records is a split pool with P = 1. DeepGEMM's paged index kernels read index K this way with
P = 64 or 128 (`fused_kv_cache` [num_pages, P, 1, 68], page stride P * 68 B), and SGLang's
index-K store writes it.

Pages: uint8 [num_pages, P * R] (or any tensor whose rows are pages). Slots: int [...], slot s is
page s // P, offset s % P; -1 slots read as zero records and are skipped on write.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _byte_index(slots: Tensor, P: int, R: int, V: int) -> tuple[Tensor, Tensor]:
    """Flat byte indices of the records at slots [...]: int64 [..., R] and the valid mask [...]."""
    if P < 1 or not 0 < V < R:
        raise ValueError(f"split pages need P >= 1 and 0 < V < R, got P={P}, V={V}, R={R}")
    s = slots.to(torch.int64)
    ok = s >= 0
    s = torch.where(ok, s, torch.zeros_like(s))
    base = (s // P) * (P * R)  # [...]
    off = s % P
    j = torch.arange(R, device=slots.device)
    value = base[..., None] + off[..., None] * V + j  # [..., R] (first V columns used)
    scale = base[..., None] + P * V + off[..., None] * (R - V) + (j - V)
    return torch.where(j < V, value, scale), ok


def read_split_records(pages: Tensor, slots: Tensor, P: int, V: int) -> Tensor:
    """Records at slots [...] of split pages uint8 [num_pages, P * R]: uint8 [..., R]; zeros
    where the slot is -1."""
    R = pages.shape[-1] // P
    idx, ok = _byte_index(slots, P, R, V)
    rec = pages.reshape(-1)[idx]  # [..., R]
    return torch.where(ok[..., None], rec, torch.zeros_like(rec))


def write_split_records(pages: Tensor, slots: Tensor, records: Tensor, P: int, V: int) -> None:
    """Write records uint8 [n, R] at slots [n] of split pages uint8 [num_pages, P * R] (in
    place); slots -1 are skipped."""
    R = records.shape[-1]
    if pages.shape[-1] != P * R:
        raise ValueError(f"pages: rows of {pages.shape[-1]} B, expected P * R = {P} * {R}")
    idx, ok = _byte_index(slots, P, R, V)
    pages.view(-1)[idx[ok]] = records[ok]
