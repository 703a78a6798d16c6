"""Byte geometry of the serving KV pool, from the config alone (no sglang, no tensors).

What one token and one request cost in the pool the `dsv41` backend allocates:
    swa      one V41 record per token slot (528 B at D = 512) for every layer whose SWA lives
             in token slots: all layers, or with decoder replay on only the encoder layers
    ring     with decoder replay on, decoder layers keep their SWA in a per-request ring of
             `window` V41 records instead (a request computes every decoder row it reads)
    main     kv sources only, one record per compressed entry (V41_FP4 288 B, or V41 528 B)
    index_k  kv sources only, one INDEX_K record per entry (68 B at DI = 128)
    pending  per request: the fp32 (c, z) of a ratio-2 source's unpaired token
A ratio-r source stores 1/r record per token: a ratio-2 entry lives at row slot // 2, which is
the page of its two tokens when the page size is even.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.kv.records import Layout, record_bytes


def main_layout(cfg: DeepseekV41Config) -> Layout:
    return Layout.V41_FP4 if cfg.kv_cache_dtype_main == "fp4" else Layout.V41


@dataclass(frozen=True)
class PoolGeometry:
    cfg: DeepseekV41Config
    decoder_ring: bool = False

    @property
    def swa_record(self) -> int:
        return record_bytes(Layout.V41, self.cfg.head_dim)

    @property
    def main_record(self) -> int:
        return record_bytes(main_layout(self.cfg), self.cfg.head_dim)

    @property
    def index_record(self) -> int:
        return record_bytes(Layout.INDEX_K, self.cfg.index_head_dim)

    @property
    def kv_sources(self) -> list:
        return list(self.cfg.kv_source_layer_ids)

    @property
    def ring_layers(self) -> list:
        if not self.decoder_ring:
            return []
        return list(range(self.cfg.decoder_start, self.cfg.num_hidden_layers))

    @property
    def slot_swa_layers(self) -> list:
        return [i for i in range(self.cfg.num_hidden_layers) if i not in self.ring_layers]

    def global_bytes_per_token(self) -> float:
        """Main KV + index K bytes per token over all kv sources (890 on V4.1-Flash)."""
        return sum(
            (self.main_record + self.index_record) / self.cfg.ratio(s) for s in self.kv_sources
        )

    def swa_bytes_per_token(self) -> int:
        """SWA records per token slot (layers whose SWA lives in token slots)."""
        return self.swa_record * len(self.slot_swa_layers)

    def swa_bytes_per_window(self) -> int:
        """SWA bytes one request needs live: a window of records per layer."""
        return self.swa_record * self.cfg.sliding_window * self.cfg.num_hidden_layers

    def pending_bytes_per_request(self) -> int:
        D = self.cfg.head_dim
        return sum(2 * D * 4 for s in self.kv_sources if self.cfg.ratio(s) == 2)

    def ring_bytes_per_request(self) -> int:
        return self.swa_record * self.cfg.sliding_window * len(self.ring_layers)

    def bytes_per_request(self) -> int:
        return self.pending_bytes_per_request() + self.ring_bytes_per_request()

    def bytes_per_token(self) -> int:
        """What one token slot costs in this pool (slot SWA + global state)."""
        return int(self.swa_bytes_per_token() + self.global_bytes_per_token() + 0.999)

    def entries(self, slots: int, layer: int) -> int:
        """Rows of a kv source's main/index buffers for a pool of `slots` token slots."""
        return -(-slots // self.cfg.ratio(layer))
