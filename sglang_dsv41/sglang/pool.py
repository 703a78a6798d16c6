"""DSV41KVPool: the token-to-KV pool of the `dsv41` backend (an SGLang KVCache).

Indexed by SGLang's token slots (`out_cache_loc`, `req_to_token`), so allocation, freeing,
retraction and the radix prefix cache work unchanged: a slot's records live exactly as long as
SGLang keeps the slot.
    swa[layer]       uint8 [S, 528]  every layer's SWA key/value, V41 records, per slot
    main[src]        uint8 [S / r, 288 | 528]  kv sources only (V41_FP4 default, V41 on request)
    index_k[src]     uint8 [S / r, 68]          kv sources only
    pending[src]     fp32 [R, 2, D]   ratio-2 sources: (c, z) of a request's unpaired token
S = size + page_size slots (slot 0 is SGLang's padding slot), R = request slots. A ratio-2
entry j of a request is stored at row slot(2j) // 2 (page size even, so tokens 2j and 2j+1 share
a page and that row). `source_layer_of(layer)` names the kv source whose buffers a layer reads.
"""
from __future__ import annotations

import logging

import torch

from sglang.srt.mem_cache.memory_pool import KVCache

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.sglang.geometry import PoolGeometry

logger = logging.getLogger(__name__)


class DSV41KVPool(KVCache):
    def __init__(self, cfg: DeepseekV41Config, size: int, page_size: int, max_requests: int,
                 device: str = "cpu", enable_memory_saver: bool = False):
        super().__init__(size=size, page_size=page_size, dtype=torch.uint8,
                         layer_num=cfg.num_hidden_layers, device=device,
                         enable_memory_saver=enable_memory_saver)
        self.cfg, self.geometry = cfg, PoolGeometry(cfg)
        g = self.geometry
        if page_size % 2 and any(cfg.ratio(s) == 2 for s in g.kv_sources):
            raise ValueError(f"dsv41 pool: page_size {page_size} must be even (ratio-2 entries "
                             "pair the two tokens of one page)")
        slots = size + page_size
        z = dict(dtype=torch.uint8, device=device)
        self.swa = [torch.zeros(slots, g.swa_record, **z) for _ in range(cfg.num_hidden_layers)]
        self.main, self.index_k, self.pending = {}, {}, {}
        for s in g.kv_sources:
            n = g.entries(slots, s)
            self.main[s] = torch.zeros(n, g.main_record, **z)
            self.index_k[s] = torch.zeros(n, g.index_record, **z)
            if cfg.ratio(s) == 2:
                self.pending[s] = torch.zeros(max_requests + 1, 2, cfg.head_dim,
                                              dtype=torch.float32, device=device)
        self.max_requests = max_requests
        logger.info(
            "dsv41 KV pool: %d token slots, page %d; per token %d B (SWA %d B over %d layers, "
            "global %.1f B main+index over kv sources %s); per request %d B pending, "
            "%d B SWA window; total %.3f GB",
            size, page_size, g.bytes_per_token(), g.swa_bytes_per_token(),
            cfg.num_hidden_layers, g.global_bytes_per_token(), g.kv_sources,
            g.pending_bytes_per_request(), g.swa_bytes_per_window(),
            self.get_kv_size_bytes() / 2**30)

    def source_layer_of(self, layer: int) -> int:
        """The kv source whose main KV / index K `layer` reads (itself for Full, -1 for SWA)."""
        return self.cfg.source_layer_of(layer)

    def entry_rows(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Buffer rows of the entries whose *first* token sits at `slots` (int64 [...])."""
        return slots // self.cfg.ratio(layer)

    def get_kv_size_bytes(self) -> int:
        bufs = list(self.swa) + list(self.main.values()) + list(self.index_k.values())
        bufs += list(self.pending.values())
        return sum(b.numel() * b.element_size() for b in bufs)

    # SGLang's generic K/V accessors: this pool has no per-layer K/V tensors of that shape.
    def get_key_buffer(self, layer_id: int):
        return self.swa[layer_id]

    def get_value_buffer(self, layer_id: int):
        return self.swa[layer_id]

    def get_kv_buffer(self, layer_id: int):
        return self.swa[layer_id], self.swa[layer_id]

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, *args, **kwargs):
        raise NotImplementedError("dsv41 pool: records are written by the dsv41 backend")
