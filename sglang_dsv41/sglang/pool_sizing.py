"""DSV41PoolConfigurator: SGLang's memory-pool configurator for this model.

Token capacity = (budget - per-request bytes x request slots) // bytes per token, where the bytes
are those of the records DSV41KVPool really allocates (geometry.PoolGeometry), not an MHA guess.
On CPU, without --max-total-tokens, capacity is capped at CPU_MAX_TOTAL_TOKENS: the pool is
zero-filled up front, and most of a CPU's memory is better left to the host.
"""

from __future__ import annotations

import logging

from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig, MemoryPoolConfigurator

from sglang_dsv41.sglang import runtime
from sglang_dsv41.sglang.geometry import PoolGeometry

logger = logging.getLogger(__name__)

CPU_MAX_TOTAL_TOKENS = 262144
EST_REQUESTS = 1024


class DSV41PoolConfigurator(MemoryPoolConfigurator):
    def __init__(self, kvc):
        self.geometry = PoolGeometry(kvc.model_config.hf_config.dsv41(), runtime.STATE.replay)
        self.cell_size = self.geometry.bytes_per_token()
        # Request slots are chosen after the token count; charge the per-request buffers for
        # the explicit cap, or for EST_REQUESTS, before sizing tokens.
        reqs = getattr(kvc.server_args, "max_running_requests", None) or EST_REQUESTS
        self.fixed = self.geometry.bytes_per_request() * reqs
        user_cap = getattr(kvc.server_args, "max_total_tokens", None)
        self.cap = CPU_MAX_TOTAL_TOKENS if str(kvc.device) == "cpu" and not user_cap else None

    def calculate_pool_sizes(self, available_bytes: int, page_size: int) -> MemoryPoolConfig:
        tokens = max(int(available_bytes) - self.fixed, 0) // self.cell_size
        if self.cap is not None:
            tokens = min(tokens, self.cap)
        tokens = tokens // page_size * page_size
        logger.info(
            "dsv41 pool sizing: %.2f GB available, %.3f GB per-request buffers, %d B per "
            "token -> %d tokens",
            available_bytes / 2**30,
            self.fixed / 2**30,
            self.cell_size,
            tokens,
        )
        return MemoryPoolConfig(max_total_num_tokens=tokens)

    def calculate_pool_sizes_from_max_tokens(
        self, max_total_num_tokens: int, page_size: int
    ) -> MemoryPoolConfig:
        return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens // page_size * page_size)
