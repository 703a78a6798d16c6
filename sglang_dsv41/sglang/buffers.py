"""RecordBuffers: the dsv41 pool's storage (pure torch, no sglang).

    swa[layer]       uint8 [S, 528]   SWA key/value V41 records per token slot (None for ring
                                      layers)
    ring[layer]      uint8 [R, W, 528] decoder layers with replay on: the request's last W SWA
                                      records, position p at p % W
    main[src]        uint8 [S / r, 288 | 528]  kv sources only (V41_FP4 default, V41 on request)
    index_k[src]     uint8 [S / r, 68]          kv sources only
    pending[src]     fp32 [R, 2, D]   ratio-2 sources: (c, z) of a request's unpaired token
S = token slots (SGLang's size + one page; slot 0 is its padding slot), R = request slots + 1.
A ratio-r entry j of a request is stored at row slot(j r) // r: with an even page size the two
tokens of a ratio-2 entry share a page, so that row is the page.

Why rings under replay: decoder SWA written under bounded replay depends on the request's floor
and is absent below it, so it must never be read through a shared slot (SGLang's radix cache
may remap a request's slots onto another request's identical tokens). With the radix match
capped at the floor, a request computes every decoder row it reads; keeping those rows in its
own ring makes that independent of slot sharing. Buffers are zero-filled, so a masked-out read
never meets NaN.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.sglang.geometry import PoolGeometry


class RecordBuffers:
    def __init__(
        self,
        cfg: DeepseekV41Config,
        slots: int,
        page_size: int,
        max_requests: int,
        device="cpu",
        decoder_ring: bool = False,
    ):
        g = PoolGeometry(cfg, decoder_ring)
        if page_size % 2 and any(cfg.ratio(s) == 2 for s in g.kv_sources):
            raise ValueError(
                f"dsv41 pool: page_size {page_size} must be even (ratio-2 entries "
                "pair the two tokens of one page)"
            )
        self.cfg, self.geometry = cfg, g
        z = dict(dtype=torch.uint8, device=device)
        ring = set(g.ring_layers)
        self.swa = [
            None if i in ring else torch.zeros(slots, g.swa_record, **z)
            for i in range(cfg.num_hidden_layers)
        ]
        self.ring = {
            i: torch.zeros(max_requests + 1, cfg.sliding_window, g.swa_record, **z) for i in ring
        }
        self.main, self.index_k, self.pending = {}, {}, {}
        for s in g.kv_sources:
            n = g.entries(slots, s)
            self.main[s] = torch.zeros(n, g.main_record, **z)
            self.index_k[s] = torch.zeros(n, g.index_record, **z)
            if cfg.ratio(s) == 2:
                self.pending[s] = torch.zeros(
                    max_requests + 1, 2, cfg.head_dim, dtype=torch.float32, device=device
                )

    def source_layer_of(self, layer: int) -> int:
        """The kv source whose main KV / index K `layer` reads (itself for Full, -1 for SWA)."""
        return self.cfg.source_layer_of(layer)

    def entry_rows(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Buffer rows of the entries whose first token sits at `slots` (int64 [...])."""
        return slots // self.cfg.ratio(layer)

    def nbytes(self) -> int:
        bufs = [b for b in self.swa if b is not None] + list(self.ring.values())
        bufs += list(self.main.values()) + list(self.index_k.values())
        bufs += list(self.pending.values())
        return sum(b.numel() * b.element_size() for b in bufs)
