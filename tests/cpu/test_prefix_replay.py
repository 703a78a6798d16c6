"""Prefix resume (docs/design.md 2.8) on the cached path without SGLang: a request shares a cached
prefix whose SWA was evicted, replays the last window of it and continues; its greedy tokens are
the oracle's with the same resume point (`ReferenceModel.generate(..., resumes=(M,))`), and the
shared prefix's global records are left as they were.

The toy engine plays SGLang's part (`ToyEngine.evict_swa` is the radix cache tombstoning a
prefix's SWA); the glue's decision (resident or not) is `prefix_replay.window_resident`.
"""

from __future__ import annotations

import sys

import pytest
import torch

sys.modules.setdefault("sglang", None)  # the pieces under test must not need SGLang

from sglang_dsv41.serving.prefix_replay import (  # noqa: E402
    HitPlan,
    fold_batch,
    longest_resident,
    plan_hit,
    window_resident,
)
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve, toy_model  # noqa: E402

if sys.modules.get("sglang", 0) is None:  # the imports above ran without SGLang
    del sys.modules["sglang"]

NEW = 6


@pytest.fixture(scope="module", params=["tiny", "retrieval"])
def model(request):
    """The tiny preset (random weights, window 16) and the shipped retrieval model (trained,
    window 32)."""
    if request.param == "tiny":
        return toy_model()
    from sglang_dsv41.reference import load_reference
    from sglang_dsv41.tools.serve import RETRIEVAL_DIR

    return load_reference(RETRIEVAL_DIR)


def greedy(eng, slot, first_logits, n):
    out = [int(first_logits.argmax(-1))]
    while len(out) < n:
        out.append(int(eng.step([(slot, [out[-1]])]).argmax(-1)))
    return out


def cached_prefix(model, a, replay, **kw):
    """An engine whose request slot 1 served prompt `a` (prefill and NEW decode steps)."""
    eng = ToyEngine(model, replay=replay, prefix_replay=True, **kw)
    W = model.cfg.sliding_window
    floors = [max(0, len(a) - W)] if replay else None
    serve(eng, [a], NEW, floors=floors)
    return eng


def resumed(model, eng, b, M, replay, evict=True, chunk=None, slot=2):
    """Request `slot` = b, sharing slot 1's first M tokens: SWA evicted (resume) or resident."""
    W = model.cfg.sliding_window
    eng.share_prefix(1, slot, M)
    if evict:
        eng.evict_swa(1, M)
    floor = max(0, len(b) - W) if replay else 0
    rest, logits = b[M:], None
    while rest:
        take, rest = rest[: chunk or len(rest)], rest[chunk or len(rest) :]
        logits = eng.step([(slot, take)], [floor], [M if evict else 0])
    return greedy(eng, slot, logits, NEW)


@torch.no_grad()
@pytest.mark.parametrize("replay", [True, False])
def test_evicted_hit_equals_oracle_with_the_same_resume(model, replay):
    base = prompts([120], seed=3)[0]
    a, b = base + [7, 8, 9], base[:100] + [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    eng = cached_prefix(model, a, replay)
    M = 100
    got = resumed(model, eng, b, M, replay)
    assert got == model.generate(b, NEW, replay=replay, resumes=(M,))
    # the replay is an approximation the test can see: without the resume the oracle differs
    assert (
        model.forward(torch.tensor(b), resumes=(M,))[-1]
        .ne(model.forward(torch.tensor(b))[-1])
        .any()
    )


@torch.no_grad()
def test_resident_hit_is_the_plain_oracle(model):
    base = prompts([90], seed=4)[0]
    a, b = base + [5, 6], base[:80] + list(range(9, 49))  # the decoder floor >= the hit
    eng = cached_prefix(model, a, True)
    W = model.cfg.sliding_window
    assert len(b) - W >= 80
    assert window_resident(eng.mapping[eng.req_to_token[1, :80].long()] > 0, 80, W)
    got = resumed(model, eng, b, 80, True, evict=False)
    assert got == model.generate(b, NEW, replay=True)


@torch.no_grad()
@pytest.mark.parametrize("replay", [True, False])
def test_hit_ending_mid_window(model, replay):
    """The new segment is shorter than a window: decode rows read the replay window too."""
    W = model.cfg.sliding_window
    base = prompts([150], seed=6)[0]
    a = base
    M = 140
    b = base[:M] + [3, 4, 5]  # 3 new tokens < W
    assert len(b) - M < W
    eng = cached_prefix(model, a, replay)
    got = resumed(model, eng, b, M, replay)
    assert got == model.generate(b, NEW, replay=replay, resumes=(M,))


@torch.no_grad()
def test_short_prefix_replays_from_zero_exactly(model):
    """M <= W: the replay segment is the whole prefix, floored at 0: the exact forward."""
    base = prompts([40], seed=8)[0]
    b = base[:14] + [21, 22, 23, 24, 25]  # 14 <= every model's window
    eng = cached_prefix(model, base, False)
    got = resumed(model, eng, b, 14, False)
    assert got == model.generate(b, NEW, replay=False)


@torch.no_grad()
@pytest.mark.parametrize("chunk", [5, 7])
def test_chunked_extend_after_the_replay(model, chunk):
    base = prompts([110], seed=10)[0]
    M = 96
    b = base[:M] + list(range(30, 52))
    eng = cached_prefix(model, base, True)
    got = resumed(model, eng, b, M, True, chunk=chunk)
    assert got == model.generate(b, NEW, replay=True, resumes=(M,))


@torch.no_grad()
def test_concurrent_hits_on_one_prefix_in_one_batch(model):
    base = prompts([100], seed=12)[0]
    M = 88
    b, c = base[:M] + [40, 41, 42, 43], base[:M] + [50, 51, 52, 53, 54, 55, 56, 57, 58]
    eng = cached_prefix(model, base, True)
    eng.share_prefix(1, 2, M)
    eng.share_prefix(1, 3, M)
    eng.evict_swa(1, M)
    W = model.cfg.sliding_window
    floors = [len(b) - W, len(c) - W]
    logits = eng.step([(2, b[M:]), (3, c[M:])], floors, [M, M])
    outs = [[int(logits[0].argmax())], [int(logits[1].argmax())]]
    for _ in range(NEW - 1):
        logits = eng.step([(2, [outs[0][-1]]), (3, [outs[1][-1]])])
        for k in range(2):
            outs[k].append(int(logits[k].argmax()))
    assert outs[0] == model.generate(b, NEW, replay=True, resumes=(M,))
    assert outs[1] == model.generate(c, NEW, replay=True, resumes=(M,))


@torch.no_grad()
def test_replay_leaves_the_shared_global_records_alone(model):
    base = prompts([100], seed=14)[0]
    M = 90
    eng = cached_prefix(model, base, True)
    pool = eng.pool
    rows = {
        s: eng.req_to_token[1, : M : model.cfg.ratio(s)].long() // model.cfg.ratio(s)
        for s in pool.main
    }
    before = {s: (pool.main[s][r].clone(), pool.index_k[s][r].clone()) for s, r in rows.items()}
    resumed(model, eng, base[:M] + [1, 2, 3, 4, 5], M, True)
    for s, r in rows.items():
        assert torch.equal(pool.main[s][r], before[s][0]), s
        assert torch.equal(pool.index_k[s][r], before[s][1]), s


def test_window_residency_rules():
    W = 16
    present = torch.ones(64, dtype=torch.bool)
    assert window_resident(present, 64, W)
    present[60] = False  # inside the window of 64: a hit there must replay
    assert not window_resident(present, 64, W)
    assert window_resident(present, 60, W)  # the window of 60 ends before it
    assert longest_resident(present, 64, W, 2) == 60
    present[:] = False
    assert longest_resident(present, 64, W, 2) == 0
    assert window_resident(present, 0, W)


def test_hit_plans():
    W, P = 16, 2
    gone = torch.zeros(200, dtype=torch.bool)
    live = torch.ones(200, dtype=torch.bool)
    assert plan_hit(0, gone, W, P, exact_cap=50) == HitPlan(0)
    assert plan_hit(120, live, W, P, exact_cap=90) == HitPlan(90)  # exact, at the decoder floor
    assert plan_hit(120, gone, W, P, exact_cap=90) == HitPlan(120, 120)  # replay the whole hit
    assert plan_hit(120, gone, W, P) == HitPlan(120, 120)  # no decoder replay
    assert plan_hit(10, live, W, P, exact_cap=0) == HitPlan(10, 10)  # a short prompt replays
    part = live.clone()
    part[100] = False
    assert plan_hit(110, part, W, P) == HitPlan(110, 110)  # a window partly gone replays
    assert plan_hit(110, part, W, P, exact_only=True) == HitPlan(100)  # retracted: exact only
    assert plan_hit(120, gone, W, P, exact_only=True, kept=100) == HitPlan(100, 100)
    assert plan_hit(80, gone, W, P, exact_only=True, kept=100) == HitPlan(0)


def test_fold_puts_the_segment_in_front():
    r2t = torch.arange(100).view(2, 50)
    ids = torch.tensor([10, 11, 20])
    out = torch.tensor([5, 6, 77])
    pre, ext, loc, fold = fold_batch([5, 27], [2, 1], [0, 1], ids, out, {1: [1, 2, 3]}, r2t)
    assert pre == [5, 24] and ext == [2, 4]
    assert fold.input_ids.tolist() == [10, 11, 1, 2, 3, 20]
    assert fold.keep.tolist() == [0, 1, 5]
    assert loc.tolist() == [5, 6, 74, 75, 76, 77]
    assert fold_batch([5], [2], [0], ids[:2], out[:2], {}, r2t)[3] is None


@torch.no_grad()
def test_a_prefix_computed_after_a_resume_carries_it(model):
    """B resumed at M1 and its tokens were cached; C hits B's prefix at M2: with B's SWA gone it
    resumes again (the oracle's two resume points), with it resident it continues B's pass."""
    base = prompts([160], seed=16)[0]
    M1, M2 = 60, 120
    b = base[:150]
    eng = cached_prefix(model, base[:M1] + [1, 2, 3], True)
    resumed(model, eng, b, M1, True)
    c = base[:M2] + list(range(60, 90))
    eng.share_prefix(2, 3, M2)
    W = model.cfg.sliding_window
    logits = eng.step([(3, c[M2:])], [len(c) - W])
    assert greedy(eng, 3, logits, NEW) == model.generate(c, NEW, resumes=(M1,))
    eng.share_prefix(2, 4, M2)
    eng.evict_swa(2, M2)
    logits = eng.step([(4, c[M2:])], [len(c) - W], [M2])
    assert greedy(eng, 4, logits, NEW) == model.generate(c, NEW, resumes=(M1, M2))
