"""The SGLang side of the prefix cache's two lifetimes, without a server: the two rooms of the
pool sizing (SGLang's --swa-full-tokens-ratio and --max-total-tokens), the prefix-replay switch,
the tree the plugin asks SGLang for, the per-request hit plan and the prefill start that queues a
replay (docs/design.md 2.8)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.serving.geometry import PoolGeometry, swa_slots_needed


def test_the_swa_room_follows_the_ratio():
    g = PoolGeometry(preset("tiny"), True)
    budget, least = 64 << 20, swa_slots_needed(16, 2, 1, 64, 128, 2)
    full, swa = g.sized(budget, 0.05, least, 2, 8, 4096)
    assert swa == int(full * 0.05) // 2 * 2 > least
    assert g.total_bytes(full, swa, 2, 8, 4096) <= budget
    assert g.total_bytes(full + 2, g.swa_room(full + 2, 0.05, least, 2), 2, 8, 4096) > budget
    assert g.sized(budget, 1e-6, least, 2, 8, 4096)[1] == least  # never below one request
    assert g.sized(budget, 0.05, least, 2, 8, 4096, max_full=20000) == (20000, 1000)
    # without a ratio the SWA room is what the running requests need, as before
    need = swa_slots_needed(16, 2, 8, 64, 128, 2)
    full0, swa0 = g.sized(budget, None, need, 2, 8, 4096)
    assert swa0 == need and full0 == g.full_slots_for(budget, need, 2, 8, 4096)


def test_prefix_replay_switch():
    from sglang_dsv41.sglang.options import PREFIX_REPLAY_ENV, prefix_replay_flag

    assert prefix_replay_flag(True, {}) and not prefix_replay_flag(False, {})
    assert prefix_replay_flag(False, {PREFIX_REPLAY_ENV: "on"})
    assert not prefix_replay_flag(True, {PREFIX_REPLAY_ENV: "off"})
    with pytest.raises(ValueError, match=PREFIX_REPLAY_ENV):
        prefix_replay_flag(True, {PREFIX_REPLAY_ENV: "maybe"})


def pool(prefix_replay: bool):
    from sglang_dsv41.sglang.options import ServingOptions
    from sglang_dsv41.sglang.pool import DSV41KVPool

    options = ServingOptions(preset("tiny"), True, None, prefix_replay)
    p = DSV41KVPool(options, 512, 200, 2, 4, context_len=600)
    p.register_mapping(torch.zeros(512 + 3, dtype=torch.int64))
    return p


def test_the_tree_lets_a_match_pass_tombstoned_swa():
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    from sglang_dsv41.sglang import prefix_hooks

    classes = {}
    for replaying in (True, False):
        allocator = NS(get_kvcache=lambda r=replaying: pool(r))
        params = NS(
            token_to_kv_pool_allocator=allocator,
            swa_gates_prefix_match=True,
            decoder_swa_bounded_replay=True,
            component_registry_override=None,
        )
        prefix_hooks._create_tree(NS(params=params))
        assert params.swa_gates_prefix_match is not replaying
        swa = (params.component_registry_override or {}).get(ComponentType.SWA)
        assert (swa is not None) is replaying
        classes[replaying] = swa
    swa = classes[True]
    validator = swa.create_match_validator(object.__new__(swa))
    assert validator(None) is True


def request(prompt: int, output=(), **kw):
    fields = {"return_logprob": False, "logprob_start_len": -1, **kw}
    return NS(origin_input_ids=list(range(prompt)), output_ids=list(output), **fields)


def test_request_plans_and_prefill_starts():
    from sglang_dsv41.sglang.hooks import prefill_resume
    from sglang_dsv41.sglang.prefix_hooks import hit_of, request_plan

    p = pool(True)
    W = p.cfg.sliding_window
    slots = torch.arange(2, 402)
    p.full_to_swa_index_mapping[slots[360:]] = slots[360:]  # only the tail's SWA is resident
    req = request(400)
    plan = request_plan(req, p, 300, slots)  # the window at min(300, floor 384) is gone
    assert (plan.match, plan.resume) == (300, 300)
    assert request_plan(request(400), p, 398, slots) == type(plan)(384)  # exact at the floor
    assert request_plan(request(420), p, 398, slots) == type(plan)(398)  # floor 404: exact
    hit_of(req).resume = 300
    resume, fold, start = prefill_resume(req, 300, p)
    assert (resume, start) == (300, 300 - W) and fold == list(range(300 - W, 300))
    assert hit_of(req).kept == 300 and hit_of(req).prefilled
    assert prefill_resume(req, 364, p) == (300, None, 364)  # a later chunk keeps the point
    # after a retraction the hit is planned again from the kept point
    assert request_plan(req, p, 398, slots) == type(plan)(300, 300)
    logprobs = request(400, return_logprob=True)
    logprobs.logprob_start_len = 0
    assert request_plan(logprobs, p, 300, slots).match == 0  # prompt logprobs: exact only
    assert prefill_resume(request(10), 0, pool(False)) == (0, None, 0)
