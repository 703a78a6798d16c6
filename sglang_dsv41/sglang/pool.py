"""DSV41KVPool: the `dsv41` backend's KV pool, an SGLang hybrid-SWA pool over RecordBuffers.

SGLang sees a hybrid SWA model (`is_hybrid_swa` on the HF config): its `SWATokenToKVPoolAllocator`
hands out full (token) slots and, separately, SWA slots, registers the full -> SWA mapping here
and frees a request's SWA slots once they leave its window; the radix cache's SWA component keeps
or tombstones a cached prefix's trailing window. Global records (main KV, index K) live at full
slots, SWA records at SWA slots (serving/buffers.py has the layout), so allocation, freeing,
retraction and prefix caching work unchanged. Sized for the server's target-verify width
(speculative decoding): the rows a verify rejects leave nothing a later row reads
(serving/buffers.py).
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool
from sglang.srt.mem_cache.memory_pool import KVCache

from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.sglang.options import ServingOptions
from sglang_dsv41.sglang.speculative import served_verify_width

logger = logging.getLogger(__name__)


class _SWASlots(KVCache):
    """The SWA sub-pool as SGLang's SWA allocator sees it: a size (the records themselves are
    per layer in RecordBuffers.swa)."""

    def __init__(self, size: int, page_size: int, layer_num: int, device):
        super().__init__(size, page_size, torch.uint8, layer_num, device, False)

    def get_kv_size_bytes(self):
        return 0

    def _records(self, *args, **kwargs):
        raise NotImplementedError("dsv41 pool: SWA records are read and written by the backend")

    get_key_buffer = get_value_buffer = get_kv_buffer = set_kv_buffer = _records


class DSV41KVPool(RecordBuffers, BaseSWAKVPool):
    def __init__(
        self,
        options: ServingOptions,
        size: int,
        swa_size: int,
        page_size: int,
        max_requests: int,
        context_len: int,
        device: str = "cpu",
        enable_memory_saver: bool = False,
        verify_width: int | None = None,
    ):
        """verify_width: rows per request of the server's target-verify forwards (None: the
        server's, `speculative.served_verify_width`; 1 without speculative decoding)."""
        cfg = options.cfg
        if verify_width is None:
            verify_width = served_verify_width()
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
            self,
            cfg,
            options.replay,
            size,
            swa_size,
            page_size,
            max_requests,
            device,
            verify_width=verify_width,
            prefix_replay=options.prefix_replay,
        )
        self.verify_width = verify_width
        self.swa_kv_pool = _SWASlots(swa_size, page_size, cfg.num_hidden_layers, device)
        self.options = options
        g = self.geometry
        logger.info(
            "dsv41 KV pool: %d full slots x %.1f B (main KV + index K over kv sources %s), "
            "%d SWA slots x %d B (V41 records of %d layers), %d request slots x (%d B of state: "
            "pending, decoder SWA rings of %d layers, a prefix-replay window of %d B, Engram "
            "tail, floors; room for %d-row verifies; + %d B of SGLang's slot-table row); "
            "%.3f GiB allocated (%d B)",
            size,
            g.global_bytes_per_token(),
            g.kv_sources,
            swa_size,
            g.swa_bytes_per_slot(),
            len(g.swa_layers),
            max_requests,
            g.state_bytes_per_request(),
            len(g.ring_layers),
            g.replay_window_bytes_per_request(),
            verify_width,
            4 * context_len,
            self.nbytes() / 2**30,
            self.nbytes(),
        )

    def get_kv_size_bytes(self) -> int:
        return self.nbytes()

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa_index_mapping[kv_indices]

    def get_state_buf_infos(self):
        """SGLang's SWA slots of each SWA-pool layer (the replay windows after them stay)."""
        bufs = [b[: self.replay_base] for b in self.swa if b is not None]
        return (
            [b.data_ptr() for b in bufs],
            [b.nbytes for b in bufs],
            [b[0].nbytes for b in bufs],
        )

    # SGLang's generic K/V accessors: this pool's per-layer tensor is the SWA record buffer.
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
