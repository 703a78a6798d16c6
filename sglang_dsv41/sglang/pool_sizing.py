"""DSV41PoolConfigurator: SGLang's memory-pool configurator for this model.

Sizes the pool with the one byte calculator (serving.geometry.PoolGeometry), the bytes
DSV41KVPool really allocates, by SGLang's own flags for hybrid SWA models:
    full slots  the global room (890 B per token on V4.1-Flash): the rest of the budget, or
                --max-total-tokens
    SWA slots   the SWA room: with --swa-full-tokens-ratio R, R x the global room, at least one
                running request's window and the prefill chunks in flight; without it, what
                the running requests hold at most (SGLang sizes V4.1's SWA pool from its request
                cap when the flag is unset): serving.geometry.swa_slots_needed, with SGLang's
                eviction interval. When it runs out, SGLang's radix cache evicts cached SWA
                first, while the prefixes' global KV stays (docs/design.md 2.8)
    request     every request slot's state plus SGLang's slot table row
SGLang picks the request-slot count after the token count; until then the sizing charges the
most it can pick (the user's --max-running-requests, else SGLang's cap of 4096), and
`finalize_with_max_running_requests` re-sizes with the real count. On CPU, without
--max-total-tokens, full slots are capped at CPU_MAX_TOTAL_TOKENS: the pool is zero-filled up
front, and most of a CPU's memory is better left to the host.
"""

from __future__ import annotations

import logging

from sglang.srt.environ import envs
from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig, MemoryPoolConfigurator
from sglang.srt.runtime_context import get_schedule

from sglang_dsv41.serving.geometry import PoolGeometry, swa_slots_needed
from sglang_dsv41.sglang.options import ServingOptions
from sglang_dsv41.sglang.speculative import served_verify_width

logger = logging.getLogger(__name__)

CPU_MAX_TOTAL_TOKENS = 262144
SGLANG_MAX_REQUESTS = 4096  # the most request slots SGLang picks without --max-running-requests


class DSV41PoolConfigurator(MemoryPoolConfigurator):
    def __init__(self, kvc):
        options: ServingOptions = kvc.model.options  # built once, by the model
        self.geometry = PoolGeometry(
            options.cfg, options.replay, served_verify_width(), options.prefix_replay
        )
        self.window = options.cfg.sliding_window
        self.context_len = int(kvc.model_config.context_len)
        sched = get_schedule()
        self.user_requests = sched.max_running_requests
        self.user_tokens = sched.max_total_tokens
        chunk = sched.chunked_prefill_size
        self.chunk = chunk if chunk and chunk > 0 else self.context_len
        self.chunks_in_flight = 1 if sched.disable_overlap_schedule else 2
        self.interval = max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get())
        self.cap = (
            CPU_MAX_TOTAL_TOKENS if str(kvc.device) == "cpu" and not self.user_tokens else None
        )
        self.budget, self.page = None, int(kvc.pool_page_size)
        ratio = sched.swa_full_tokens_ratio
        explicit = getattr(sched, "_swa_full_tokens_ratio_explicitly_set", False)
        self.swa_ratio = float(ratio) if explicit and ratio is not None else None

    def swa_slots(self, requests: int, page_size: int) -> int:
        return swa_slots_needed(
            self.window, page_size, requests, self.chunk, self.interval, self.chunks_in_flight
        )

    def least_swa(self, requests: int, page_size: int) -> int:
        """The SWA room's floor: with a ratio, one running request; without, all of them."""
        return self.swa_slots(1 if self.swa_ratio is not None else requests, page_size)

    def swa_rule(self, page_size: int, requests: int) -> str:
        if self.swa_ratio is None:
            return f"the windows of {requests} running requests"
        return (
            f"--swa-full-tokens-ratio {self.swa_ratio:g}, at least "
            f"{self.least_swa(requests, page_size)}"
        )

    def _config(self, budget: int, page_size: int, requests: int) -> MemoryPoolConfig:
        g = self.geometry
        caps = [c for c in (self.cap, self.user_tokens) if c]
        full, swa = g.sized(
            budget,
            self.swa_ratio,
            self.least_swa(requests, page_size),
            page_size,
            requests,
            self.context_len,
            max_full=min(caps) if caps else None,
        )
        total = g.total_bytes(full, swa, page_size, requests, self.context_len)
        logger.info(
            "dsv41 pool sizing: %.2f GiB budget -> global room %d full slots x %.1f B + SWA "
            "room %d slots x %d B (%s) + %d request slots x %d B = %.3f GiB",
            budget / 2**30,
            full,
            g.global_bytes_per_token(),
            swa,
            g.swa_bytes_per_slot(),
            self.swa_rule(page_size, requests),
            requests,
            g.bytes_per_request_slot(self.context_len),
            total / 2**30,
        )
        return MemoryPoolConfig(
            max_total_num_tokens=full,
            full_max_total_num_tokens=full,
            swa_max_total_num_tokens=swa,
        )

    def calculate_pool_sizes(self, available_bytes: int, page_size: int) -> MemoryPoolConfig:
        self.budget, self.page = int(available_bytes), page_size
        return self._config(self.budget, page_size, self.user_requests or SGLANG_MAX_REQUESTS)

    def calculate_pool_sizes_from_max_tokens(
        self, max_total_num_tokens: int, page_size: int
    ) -> MemoryPoolConfig:
        full = max_total_num_tokens // page_size * page_size
        requests = self.user_requests or SGLANG_MAX_REQUESTS
        least = self.least_swa(requests, page_size)
        swa = self.geometry.swa_room(full, self.swa_ratio, least, page_size)
        logger.info(
            "dsv41 pool sizing: --max-total-tokens -> global room %d full slots, SWA room %d "
            "slots (%s)",
            full,
            swa,
            self.swa_rule(page_size, requests),
        )
        return MemoryPoolConfig(
            max_total_num_tokens=full, full_max_total_num_tokens=full, swa_max_total_num_tokens=swa
        )

    def finalize_with_max_running_requests(self, config: MemoryPoolConfig) -> MemoryPoolConfig:
        requests = int(config.max_running_requests)
        if self.budget is None:  # sized from a token count: only a request-cap SWA room follows
            if self.swa_ratio is None:
                config.swa_max_total_num_tokens = self.swa_slots(requests, self.page)
            return config
        final = self._config(self.budget, self.page, requests)
        final.max_running_requests = requests
        self.validate_swa_pool_size(final.swa_max_total_num_tokens, self.window, self.page)
        return final
