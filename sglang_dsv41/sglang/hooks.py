"""HookRegistry hooks: the seams SGLang offers no registry for (DESIGN.md 6).

    create_memory_pool_configurator   size the pool from this model's real bytes per token
    KVCacheConfigurator._build_token_to_kv_pool   build DSV41KVPool instead of an MHA pool
    ForwardBatch.init_new             record each request's decoder replay floor (and, for Engram,
                                      its token lists) by request id
                                      (the backend looks it up through ForwardBatch.rids; the
                                      batch object itself may be copied before the forward)
    Req._compute_max_prefix_len       with replay on, a radix hit stops at the request's floor,
                                      so decoder SWA state written by a replay (approximate, or
                                      absent below the floor) is never reused
Every hook passes through untouched unless this package's architecture is being served.
"""

from __future__ import annotations

import logging

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dsv41.sglang import runtime
from sglang_dsv41.sglang.hf_config import ARCH

logger = logging.getLogger(__name__)

_CONFIGURATOR = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"
_BUILD_POOL = (
    "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_token_to_kv_pool"
)
_INIT_NEW = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
_MAX_PREFIX = "sglang.srt.managers.schedule_batch.Req._compute_max_prefix_len"


def _is_ours(model_config) -> bool:
    archs = getattr(model_config.hf_config, "architectures", None) or []
    return bool(archs) and archs[0] == ARCH


def _configurator(original, kvc, *args, **kwargs):
    if not _is_ours(kvc.model_config):
        return original(kvc, *args, **kwargs)
    from sglang_dsv41.sglang.pool_sizing import DSV41PoolConfigurator

    return DSV41PoolConfigurator(kvc)


def _build_pool(original, self, *, sizes, req_to_token_pool, **kwargs):
    if not _is_ours(self.model_config):
        return original(self, sizes=sizes, req_to_token_pool=req_to_token_pool, **kwargs)
    from sglang_dsv41.sglang.pool import DSV41KVPool

    return DSV41KVPool(
        self.model_config.hf_config.dsv41(),
        size=sizes.max_total_num_tokens,
        page_size=self.pool_page_size,
        max_requests=req_to_token_pool.size,
        device=self.device,
        decoder_ring=runtime.STATE.replay,
    )


def request_floor(req) -> int:
    """Decoder replay floor of a scheduler Req (see runtime.replay_floor). Only prompt logprobs
    (a start inside the prompt) need the full forward: for output-only logprobs SGLang sets
    `logprob_start_len = len(prompt)`, which must leave the floor as it is."""
    n = len(req.origin_input_ids)
    start = getattr(req, "logprob_start_len", -1)
    wants = bool(getattr(req, "return_logprob", False)) and 0 <= start < n
    return runtime.replay_floor(n, wants)


def _init_new(result, cls, batch, *args, **kwargs):
    if runtime.active():
        for r in batch.reqs:
            runtime.remember_floor(r.rid, request_floor(r))
            if runtime.STATE.cfg.engram_layer_ids:
                runtime.remember_tokens(r.rid, r.origin_input_ids, r.output_ids)
    return result


def _max_prefix(result, req, *args, **kwargs):
    if runtime.active() and runtime.STATE.replay:
        return min(result, request_floor(req))
    return result


def register_hooks() -> None:
    HookRegistry.register(_CONFIGURATOR, _configurator, HookType.AROUND)
    HookRegistry.register(_BUILD_POOL, _build_pool, HookType.AROUND)
    HookRegistry.register(_INIT_NEW, _init_new, HookType.AFTER)
    HookRegistry.register(_MAX_PREFIX, _max_prefix, HookType.AFTER)
