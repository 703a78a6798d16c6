"""RecordBuffers: the dsv41 pool's storage, indexed by token slot (pure torch, no sglang).

    swa[layer]       uint8 [S, 528]  every layer's SWA key/value, V41 records, per slot
    main[src]        uint8 [S / r, 288 | 528]  kv sources only (V41_FP4 default, V41 on request)
    index_k[src]     uint8 [S / r, 68]          kv sources only
    pending[src]     fp32 [R, 2, D]   ratio-2 sources: (c, z) of a request's unpaired token
S = token slots (SGLang's size + one page; slot 0 is its padding slot), R = request slots. A
ratio-r entry j of a request is stored at row slot(j r) // r: with an even page size the two
tokens of a ratio-2 entry share a page, so that row is the page. Buffers are zero-filled, so a
masked-out read never meets NaN.
"""
from __future__ import annotations

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.sglang.geometry import PoolGeometry


class RecordBuffers:
    def __init__(self, cfg: DeepseekV41Config, slots: int, page_size: int, max_requests: int,
                 device="cpu"):
        g = PoolGeometry(cfg)
        if page_size % 2 and any(cfg.ratio(s) == 2 for s in g.kv_sources):
            raise ValueError(f"dsv41 pool: page_size {page_size} must be even (ratio-2 entries "
                             "pair the two tokens of one page)")
        self.cfg, self.geometry = cfg, g
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

    def source_layer_of(self, layer: int) -> int:
        """The kv source whose main KV / index K `layer` reads (itself for Full, -1 for SWA)."""
        return self.cfg.source_layer_of(layer)

    def entry_rows(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Buffer rows of the entries whose first token sits at `slots` (int64 [...])."""
        return slots // self.cfg.ratio(layer)

    def nbytes(self) -> int:
        bufs = list(self.swa) + list(self.main.values()) + list(self.index_k.values())
        bufs += list(self.pending.values())
        return sum(b.numel() * b.element_size() for b in bufs)
