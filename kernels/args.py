"""Named argument bundles of the kernel dispatchers: what one call reads, with no defaults.

Frozen dataclasses; constructing one checks what is cheap to check (ranks, dtypes, sizes that
must agree) and names the field in its error. Nothing here syncs with the device.

    PagedIndexK       the index-K pool as T indexer queries read it (records or split pages)
    IndexerGeometry   top-k, candidate-pool blocks and candidate block size, from the config
    SparseKV          the SWA and top-k slot lists one sparse-attention call reads
    DecodedRecords    a slot list's records decoded once (the CPU reference, shared by layers)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from sglang_dsv41.kv.records import Layout, record_bytes, record_dim, value_bytes
from sglang_dsv41.kv.split_pages import read_split_records

if TYPE_CHECKING:
    from sglang_dsv41.config import DeepseekV41Config


def _need(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {what}")


@dataclasses.dataclass(frozen=True)
class PagedIndexK:
    """Index K of one kv source, as T query tokens of B requests read it.

    index_k     uint8: [S, R] one R-byte INDEX_K record per slot (split_pages False), or
                [num_pages, page_size * R] pages in SGLang's split layout (split_pages True:
                kv.split_pages); R = DI/2 + DI/32, 68 at DI = 128
    page_table  int32 [B, max_pages]  page ids of each request, -1 = unallocated
    req_ids     int32 [T]             page-table row of each query token
    n_visible   int32 [T]             visible entries of each query: (pos + 1) // ratio
    page_size   P: entry s of request b sits in slot page_table[b, s // P] * P + s % P
    split_pages how index_k arranges its bytes (see above); with page_size 1 both agree
    Entries s >= n_visible[t] are never read.
    """

    index_k: Tensor
    page_table: Tensor
    req_ids: Tensor
    n_visible: Tensor
    page_size: int
    split_pages: bool

    def __post_init__(self):
        _need(self.index_k.dtype == torch.uint8, "index_k", f"uint8, got {self.index_k.dtype}")
        _need(self.index_k.dim() == 2, "index_k", f"2-D, got {tuple(self.index_k.shape)}")
        _need(self.page_size >= 1, "page_size", f">= 1, got {self.page_size}")
        if self.split_pages:
            _need(
                self.index_k.shape[1] % self.page_size == 0,
                "index_k",
                f"split pages of {self.page_size} slots, got rows of {self.index_k.shape[1]} B",
            )
        _need(self.page_table.dim() == 2, "page_table", "[B, max_pages]")
        _need(self.req_ids.dim() == 1, "req_ids", "[T]")
        _need(self.n_visible.shape == self.req_ids.shape, "n_visible", "[T], as req_ids")
        record_dim(Layout.INDEX_K, self.record_bytes)  # raises if R is no INDEX_K size

    @property
    def record_bytes(self) -> int:
        """R: bytes of one index-K record."""
        width = self.index_k.shape[1]
        return width // self.page_size if self.split_pages else width

    @property
    def head_dim(self) -> int:
        """DI of the records."""
        return record_dim(Layout.INDEX_K, self.record_bytes)

    @property
    def max_entries(self) -> int:
        """Entries the page table can address per request: max_pages * P."""
        return self.page_table.shape[1] * self.page_size

    def records(self, slots: Tensor) -> Tensor:
        """uint8 [..., R] records at slots [...] (-1 -> zero record), either layout."""
        if self.split_pages and self.page_size > 1:
            V = value_bytes(Layout.INDEX_K, self.head_dim)
            return read_split_records(self.index_k, slots, self.page_size, V)
        flat = self.index_k.view(-1, self.record_bytes)
        rec = flat[slots.clamp_min(0).long()]
        return torch.where((slots >= 0)[..., None], rec, torch.zeros_like(rec))


@dataclasses.dataclass(frozen=True)
class IndexerGeometry:
    """Selection sizes of the indexer (docs/design.md 2.2, steps 5-6); V4.1-Flash: 512, 2048, 8.

    topk        TOPK entries each index layer keeps
    pool_blocks candidate blocks the candidate source keeps per query
    block       entries per candidate block
    """

    topk: int
    pool_blocks: int
    block: int

    def __post_init__(self):
        _need(self.topk >= 1, "topk", f">= 1, got {self.topk}")
        _need(self.pool_blocks >= 0, "pool_blocks", f">= 0, got {self.pool_blocks}")
        _need(self.block >= 1, "block", f">= 1, got {self.block}")

    @classmethod
    def of(cls, cfg: DeepseekV41Config) -> IndexerGeometry:
        """From a DeepseekV41Config: index_topk, candidate_topk_blocks, candidate_block_size."""
        return cls(cfg.index_topk, cfg.candidate_topk_blocks, cfg.candidate_block_size)


@dataclasses.dataclass(frozen=True)
class SparseKV:
    """The keys one sparse-attention call reads, as explicit slot lists (-1 = skip).

    swa_cache   uint8 [..., D + D/32] V41 records (leading dims flatten to slots), or None
    swa_slots   int [T, W] slots into swa_cache, or None (SWA-less call)
    kv_cache    uint8 [..., record_bytes(kv_layout, D)] the source layer's main KV, or None
    topk_slots  int [T, TOPK] slots into kv_cache, or None (SWA-only layers)
    kv_layout   Layout.V41_FP4 or Layout.V41: the main-KV record (from the config)
    topk_decoded  the records of topk_slots already decoded (DecodedRecords), or None; only the
                torch reference reads it (layers that share a top-k list decode it once), the
                fast paths read the records
    max_slots   an upper bound on the distinct slots both lists reference together (host int),
                or None: sizes a prefill's workspace of dequantized records without a host
                sync (kernels.sparse_attn.triton_workspace; the served layer's bound is
                serving.context.slots_bound). A bound below the truth turns the affected
                tokens' outputs NaN on that route, never silently wrong.
    """

    swa_cache: Tensor | None
    swa_slots: Tensor | None
    kv_cache: Tensor | None
    topk_slots: Tensor | None
    kv_layout: Layout
    topk_decoded: DecodedRecords | None = None
    max_slots: int | None = None

    def __post_init__(self):
        _need(
            self.kv_layout in (Layout.V41, Layout.V41_FP4),
            "kv_layout",
            f"V41 or V41_FP4, got {self.kv_layout}",
        )
        for cache, slots, name in (
            (self.swa_cache, self.swa_slots, "swa"),
            (self.kv_cache, self.topk_slots, "topk"),
        ):
            _need(cache is not None or slots is None, f"{name}_slots", "given without its cache")
            if slots is not None:
                _need(slots.dim() == 2, f"{name}_slots", f"[T, N], got {tuple(slots.shape)}")
            if cache is not None:
                _need(cache.dtype == torch.uint8, f"{name}_cache", f"uint8, got {cache.dtype}")
        if self.max_slots is not None:
            _need(
                isinstance(self.max_slots, int) and self.max_slots >= 0,
                "max_slots",
                f"a host int >= 0, got {self.max_slots!r}",
            )
        if self.topk_decoded is not None:
            _need(
                self.topk_slots is not None
                and self.topk_decoded.index.shape == self.topk_slots.shape,
                "topk_decoded",
                "the records of topk_slots (an index of its shape)",
            )

    def flat(self, T: int, D: int, dev: torch.device) -> FlatKV:
        """The caches as rows of records and the slot lists as int32 [T, N] with unit stride,
        what the Triton / CUDA kernels take: an absent list is [T, 0] on `dev`, its cache one
        dummy byte row."""
        parts = []
        for cache, slots, layout, name in (
            (self.swa_cache, self.swa_slots, Layout.V41, "swa_slots"),
            (self.kv_cache, self.topk_slots, self.kv_layout, "topk_slots"),
        ):
            if slots is None:  # made only when needed: a served call pays per tensor made
                parts += [
                    torch.empty(1, 1, dtype=torch.uint8, device=dev),
                    torch.empty(T, 0, dtype=torch.int32, device=dev),
                ]
                continue
            _need(slots.shape[0] == T, name, f"[T={T}, N], got {tuple(slots.shape)}")
            slots = slots if slots.dtype == torch.int32 else slots.to(torch.int32)
            slots = slots if slots.stride(-1) == 1 else slots.contiguous()
            parts += [cache.view(-1, record_bytes(layout, D)), slots]
        return FlatKV(*parts)

    def check_dim(self, D: int) -> None:
        """Raise unless the caches hold records of D values."""
        if self.swa_slots is not None:
            B = record_bytes(Layout.V41, D)
            _need(self.swa_cache.shape[-1] == B, "swa_cache", f"[..., {B}] V41 records at D={D}")
        if self.topk_slots is not None:
            B = record_bytes(self.kv_layout, D)
            _need(
                self.kv_cache.shape[-1] == B,
                "kv_cache",
                f"[..., {B}] {self.kv_layout.name} records at D={D}",
            )


class FlatKV(NamedTuple):
    """SparseKV.flat: swa_flat uint8 [S1, D + D/32], swa_slots int32 [T, W], kv_flat uint8
    [S2, B], topk_slots int32 [T, TOPK] (W or TOPK 0 for an absent list)."""

    swa_flat: Tensor
    swa_slots: Tensor
    kv_flat: Tensor
    topk_slots: Tensor


@dataclasses.dataclass(frozen=True)
class DecodedRecords:
    """The records of one slot list [T, N] decoded once (kernels.sparse_attn.ref.decode_records).

    values  fp32 [U + 1, D]: the U distinct records, then one zero row
    index   int64 [T, N]: row of `values` per slot, U (the zero row) where the slot is -1
    """

    values: Tensor
    index: Tensor
