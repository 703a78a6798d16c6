"""DSV41KVPool: the `dsv41` backend's token-to-KV pool, an SGLang KVCache over RecordBuffers.

Indexed by SGLang's token slots (`out_cache_loc`, `req_to_token`), so allocation, freeing,
retraction and the radix prefix cache work unchanged: a slot's records live exactly as long as
SGLang keeps the slot. See buffers.py for the layout and `source_layer_of`.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.mem_cache.memory_pool import KVCache

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.sglang.buffers import RecordBuffers

logger = logging.getLogger(__name__)


class DSV41KVPool(RecordBuffers, KVCache):
    def __init__(
        self,
        cfg: DeepseekV41Config,
        size: int,
        page_size: int,
        max_requests: int,
        device: str = "cpu",
        enable_memory_saver: bool = False,
        decoder_ring: bool = False,
    ):
        KVCache.__init__(
            self,
            size=size,
            page_size=page_size,
            dtype=torch.uint8,
            layer_num=cfg.num_hidden_layers,
            device=device,
            enable_memory_saver=enable_memory_saver,
        )
        RecordBuffers.__init__(
            self, cfg, size + page_size, page_size, max_requests, device, decoder_ring
        )
        g = self.geometry
        logger.info(
            "dsv41 KV pool: %d token slots, page %d, %d request slots; per token %d B (SWA %d B "
            "over %d layers, global %.1f B main+index over kv sources %s); per request %d B "
            "(pending %d B, decoder SWA rings %d B over %d layers); total %.3f GB",
            size,
            page_size,
            max_requests,
            g.bytes_per_token(),
            g.swa_bytes_per_token(),
            len(g.slot_swa_layers),
            g.global_bytes_per_token(),
            g.kv_sources,
            g.bytes_per_request(),
            g.pending_bytes_per_request(),
            g.ring_bytes_per_request(),
            len(g.ring_layers),
            self.nbytes() / 2**30,
        )

    def get_kv_size_bytes(self) -> int:
        return self.nbytes()

    # SGLang's generic K/V accessors; this pool's per-layer tensor is the SWA record buffer.
    def get_key_buffer(self, layer_id: int):
        return self._swa_of(layer_id)

    def get_value_buffer(self, layer_id: int):
        return self._swa_of(layer_id)

    def get_kv_buffer(self, layer_id: int):
        return self._swa_of(layer_id), self._swa_of(layer_id)

    def _swa_of(self, layer_id: int):
        buf = self.swa[layer_id]
        return buf if buf is not None else self.ring[layer_id]

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, *args, **kwargs):
        raise NotImplementedError("dsv41 pool: records are written by the dsv41 backend")
