"""SGLang's radix cache with two lifetimes: global KV persists, SWA is evicted first, and a hit
without its SWA resumes by bounded replay (docs/design.md 2.8).

    create_unified_radix_cache (before)  for this package's pool with prefix replay on, SWA no
        longer gates a radix match (SGLang's `swa_gates_prefix_match`, the switch its own
        per-request SWA pools use): a match extends over tokens whose SWA the tree tombstoned,
        while their global KV stays until the full pool needs room. The tree's own cap for
        decoder replay (`swa_reprefill_tail_tokens`) is left to `plan_hit`.
        Its SWA component is `SWAEvictedFirst` (through SGLang's `component_registry_override`,
        which selects the Python tree core): every node is a valid match boundary for it (with
        the switch off alone, SGLang still rejects a boundary inside live SWA shorter than a
        window after a tombstone), so the Full component alone bounds the match and it reaches
        the deepest prefix whose global KV is on the device.
    match_kv_cache (around)   the request's `HitPlan` (serving.prefix_replay.plan_hit, the one
        rule): an exact hit where the SWA window is resident (matched again at that length when
        it is shorter than the radix match), else a resume at the whole match. The plan waits
        on the request (`RequestHit`) for the prefill hook (hooks.py), which queues the replay.
        A resumed request whose next tokens the tree already holds (a full hit: SGLang never
        matches the last prompt token) publishes nothing (SGLang's `skip_radix_cache_insert`,
        its flag for KV the token ids alone do not determine): its insert would otherwise
        dedupe its rows onto the tree's copies, computed by another pass.

Everything passes through unless the tree's pool is this package's with prefix replay on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_dsv41.serving.prefix_replay import HitPlan, plan_hit

logger = logging.getLogger(__name__)

_CREATE_TREE = "sglang.srt.mem_cache.registry.create_unified_radix_cache"
_MATCH = "sglang.srt.mem_cache.common.match_kv_cache"


@dataclass
class RequestHit:
    """What the prefix cache gave one SGLang request (kept on its `Req` as `dsv41_hit`).

    resume: the resume point of its current prefill (0: none); kept: the resume point of its
    first prefill, which a retracted request replays again; prefilled: it has prefilled once;
    unpublished: this package set the request's skip_radix_cache_insert."""

    resume: int = 0
    kept: int = 0
    prefilled: bool = False
    unpublished: bool = False


def hit_of(req) -> RequestHit:
    hit = getattr(req, "dsv41_hit", None)
    if hit is None:
        hit = req.dsv41_hit = RequestHit()
    return hit


def replaying_pool(allocator):
    """The tree's DSV41KVPool when it runs prefix replay, else None."""
    from sglang_dsv41.sglang.pool import DSV41KVPool

    get = getattr(allocator, "get_kvcache", None)
    pool = get() if get is not None else None
    if isinstance(pool, DSV41KVPool) and pool.prefix_replay:
        return pool
    return None


def swa_evicted_first():
    """SGLang's SWA tree component, except that SWA never bounds a match (prefix replay serves
    a hit whose window is gone). Built on first use: the class derives from SGLang's."""
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

    class SWAEvictedFirst(SWAComponent):
        def create_match_validator(self, match_device_only: bool = False):
            return _any_node

    return SWAEvictedFirst


def _any_node(node) -> bool:
    return True


def _create_tree(ctx, *args, **kwargs):
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    params = ctx.params
    if replaying_pool(params.token_to_kv_pool_allocator) is not None:
        params.swa_gates_prefix_match = False
        params.decoder_swa_bounded_replay = False
        params.component_registry_override = {
            **(params.component_registry_override or {}),
            ComponentType.SWA: swa_evicted_first(),
        }
        logger.info(
            "dsv41 prefix cache: SWA is evicted first and does not gate a radix match; a hit "
            "whose SWA window is gone resumes by bounded replay of its last window"
        )


def request_plan(req, pool, match: int, slots: torch.Tensor | None) -> HitPlan:
    """The HitPlan of `req` for a radix match of `match` tokens at full slots `slots`."""
    options = pool.options
    present = torch.zeros(0, dtype=torch.bool)
    if match:
        present = (pool.full_to_swa_index_mapping[slots[:match].long()] > 0).cpu()
    hit = hit_of(req)
    start = getattr(req, "logprob_start_len", -1)
    wants_logprobs = bool(getattr(req, "return_logprob", False)) and start >= 0
    return plan_hit(
        match,
        present,
        options.cfg.sliding_window,
        pool.page,
        exact_cap=options.floor_of(req) if options.replay else None,
        exact_only=hit.prefilled or wants_logprobs,
        kept=hit.kept,
    )


def _match(original, req, tree_cache, token_ids=None, *args, **kwargs):
    result = original(req, tree_cache, token_ids, *args, **kwargs)
    pool = replaying_pool(getattr(tree_cache, "token_to_kv_pool_allocator", None))
    if pool is None:
        return result
    match = int(req.prefix_len)
    slots = tree_cache.prefix_device_indices(req) if match else None
    plan = request_plan(req, pool, match, slots)
    if plan.match < match:
        limit = kwargs.get("max_prefix_len")
        kwargs["max_prefix_len"] = plan.match if limit is None else min(limit, plan.match)
        result = original(req, tree_cache, token_ids, *args, **kwargs)
    prefix = int(req.prefix_len)
    hit = hit_of(req)
    hit.resume = prefix if plan.resume and prefix else 0
    if not hit.prefilled:
        unpublished = bool(hit.resume) and held_beyond(tree_cache, req, token_ids, prefix)
        if unpublished or hit.unpublished:
            req.skip_radix_cache_insert = hit.unpublished = unpublished
    return result


def held_beyond(tree_cache, req, token_ids, prefix: int) -> bool:
    """The tree's device KV covers more of the request's tokens than its prefix."""
    from sglang.srt.mem_cache.common import _req_radix_key

    ids = token_ids if token_ids is not None else req.origin_input_ids + req.output_ids
    held, _, _ = tree_cache.tree_core.match_full_device_prefix(_req_radix_key(tree_cache, req, ids))
    return held > prefix


def register_prefix_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_CREATE_TREE, _create_tree, HookType.BEFORE)
    HookRegistry.register(_MATCH, _match, HookType.AROUND)
