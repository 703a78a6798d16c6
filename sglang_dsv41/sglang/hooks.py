"""HookRegistry hooks: the seams SGLang offers no registry for (pool, scheduler).

    create_memory_pool_configurator   size the pool from this model's real bytes
    KVCacheConfigurator._build_token_to_kv_pool   build DSV41KVPool instead of an MHA pool
    ForwardBatch.init_new             a request that (re)starts prefilling writes its replay floor,
                                      Engram tail and prefix resume into its request slot of the
                                      pool, and the first chunk of a resumed hit queues its
                                      replay segment (docs/design.md 2.8)
    Req._compute_max_prefix_len       with replay on and prefix replay off, a radix hit stops at
                                      the request's floor, so decoder SWA written by a replay
                                      (approximate, or absent below the floor) is never reused
                                      (with prefix replay, prefix_hooks.py plans the hit)
The pool hooks act only for a runner serving this package's architecture (`serves_ours`): the
DSpark draft runner serves SGLang's `DeepseekV4ForCausalLMDSpark` (dspark_draft.py renames the
draft's architecture), so SGLang's own configurator and pool serve it, as they serve stock
SGLang's V4.1 draft (its `dsv4` backend comes from the DSpark worker), while the target keeps
ours. The scheduler hooks act only where this package's model registered its options.
"""

from __future__ import annotations

import logging

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dsv41.sglang.hf_config import ARCH
from sglang_dsv41.sglang.options import served
from sglang_dsv41.sglang.prefix_hooks import hit_of, register_prefix_hooks

logger = logging.getLogger(__name__)

_CONFIGURATOR = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"
_BUILD_POOL = (
    "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_token_to_kv_pool"
)
_INIT_NEW = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
_MAX_PREFIX = "sglang.srt.managers.schedule_batch.Req._compute_max_prefix_len"


def is_ours(hf_config) -> bool:
    """The config's architecture is this package's."""
    archs = getattr(hf_config, "architectures", None) or []
    return bool(archs) and archs[0] == ARCH


def serves_ours(kvc) -> bool:
    """True for the KV-cache configurator of a runner serving this package's model (the target);
    False for any other (SGLang's DSpark draft of our checkpoint included). A DSpark draft runner
    still of our architecture (a draft checkpoint without a `dspark_*` head) is refused: SGLang's
    DSpark worker needs its own draft model, which SGLang builds only from a head."""
    if not is_ours(kvc.model_config.hf_config):
        return False
    spec = getattr(kvc, "spec_algorithm", None)
    if kvc.is_draft_worker and spec is not None and spec.is_dspark():
        raise ValueError(
            f"--speculative-draft-model-path: the DSpark draft resolved to {ARCH}, this "
            "package's target model; a DSpark draft checkpoint must bundle a head (dspark_* "
            "config keys and mtp.* tensors, docs/speculative.md), which SGLang serves as "
            "DeepseekV4ForCausalLMDSpark"
        )
    return True


def _configurator(original, kvc, *args, **kwargs):
    if not serves_ours(kvc):
        return original(kvc, *args, **kwargs)
    from sglang_dsv41.sglang.pool_sizing import DSV41PoolConfigurator

    return DSV41PoolConfigurator(kvc)


def _build_pool(original, self, *, sizes, req_to_token_pool, **kwargs):
    if not serves_ours(self):
        return original(self, sizes=sizes, req_to_token_pool=req_to_token_pool, **kwargs)
    from sglang_dsv41.sglang.pool import DSV41KVPool

    return DSV41KVPool(
        self.model.options,  # built once, by the model (loaded before the pool)
        size=sizes.full_max_total_num_tokens,
        swa_size=sizes.swa_max_total_num_tokens,
        page_size=self.pool_page_size,
        max_requests=req_to_token_pool.size,
        context_len=req_to_token_pool.max_context_len,
        device=self.device,
    )


def prefill_starts(batch):
    """(request, request slot, prefix length) of every request of an extend or mixed batch that
    is prefilling (a mixed batch also carries running decode requests)."""
    decoding = {id(r) for r in (getattr(batch, "decoding_reqs", None) or [])}
    slots = batch.req_pool_indices.tolist()
    for req, slot, prefix in zip(batch.reqs, slots, batch.prefix_lens, strict=False):
        if id(req) not in decoding:
            yield req, int(slot), int(prefix)


def _init_new(result, cls, batch, *args, **kwargs):
    options = served()
    mode = batch.forward_mode
    if options is None or not (mode.is_extend() or mode.is_mixed()) or mode.is_target_verify():
        return result  # a target verify (an extend to SGLang) continues its requests
    model_runner = args[0] if args else kwargs["model_runner"]
    pool = model_runner.token_to_kv_pool
    if not hasattr(pool, "start_request"):  # another model in this process (a draft worker)
        return result
    n1 = pool.engram_tail.shape[1]
    for req, slot, prefix in prefill_starts(batch):
        resume, fold, start = prefill_resume(req, prefix, pool)
        tail = []
        if n1:
            ids = list(req.origin_input_ids) + list(req.output_ids)
            tail = ([-1] * n1 + ids[max(0, start - n1) : start])[-n1:]
        pool.start_request(slot, options.floor_of(req), tail, resume, fold)
    return result


def prefill_resume(req, prefix: int, pool):
    """(resume point, replay segment ids or None, first row) of a request's prefill chunk: the
    chunk at its resume point runs the replay of [replay_floor(M), M) first (prefix_hooks.py
    planned it); later chunks keep the resume point."""
    if not pool.prefix_replay:
        return 0, None, prefix
    hit = hit_of(req)
    if 0 < prefix < hit.resume:  # SGLang kept less of the hit than planned: resume there
        hit.resume = prefix
    if not hit.prefilled:
        hit.prefilled, hit.kept = True, hit.resume
    if not hit.resume or prefix != hit.resume:
        return hit.resume if prefix > hit.resume else 0, None, prefix
    start = pool.cfg.replay_floor(prefix)
    ids = list(req.origin_input_ids) + list(req.output_ids)
    logger.info(
        "dsv41 prefix replay: a hit of %d cached tokens without its SWA window replays [%d, %d)",
        prefix,
        start,
        prefix,
    )
    return prefix, ids[start:prefix], start


def _max_prefix(result, req, *args, **kwargs):
    options = served()
    if options is not None and options.replay and not options.prefix_replay:
        return min(result, options.floor_of(req))
    return result


def register_hooks() -> None:
    HookRegistry.register(_CONFIGURATOR, _configurator, HookType.AROUND)
    HookRegistry.register(_BUILD_POOL, _build_pool, HookType.AROUND)
    HookRegistry.register(_INIT_NEW, _init_new, HookType.AFTER)
    HookRegistry.register(_MAX_PREFIX, _max_prefix, HookType.AFTER)
    register_prefix_hooks()
