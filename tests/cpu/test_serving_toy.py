"""The cached serving path without SGLang: record pool + batch context + layer loop, driven by a
toy scheduler (paged slots, shuffled pages), against the reference's full recomputation.

Covers batched prefill, decode, chunked prefill at odd chunk sizes (ratio-2 pending token),
a prefix shared through the slot table (radix hit), and decoder bounded replay.
"""

from __future__ import annotations

import sys

import pytest
import torch

sys.modules.setdefault("sglang", None)  # the pieces under test must not need SGLang

from sglang_dsv41.config import preset  # noqa: E402
from sglang_dsv41.layers.attention import set_attention_dtype  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve, toy_model  # noqa: E402

if sys.modules.get("sglang", 0) is None:  # the imports above ran without SGLang; let
    del sys.modules["sglang"]  # later test modules (upstream parity) import the real one

PAGE = 2


@pytest.fixture(scope="module")
def model():
    return toy_model()


_prompts, _serve = prompts, serve


@torch.no_grad()
@pytest.mark.parametrize("chunk", [None, 5])
def test_batched_prefill_decode_equals_reference(model, chunk):
    prompts = _prompts([1, 3, 20, 41, 66])
    got = _serve(ToyEngine(model), prompts, 5, chunk=chunk)
    for p, g in zip(prompts, got, strict=False):
        assert g == model.generate(p, 5, replay=False), len(p)


@torch.no_grad()
def test_prefix_shared_through_slot_table(model):
    base = _prompts([40])[0]
    a, b = base + [7, 8, 9], base + [10, 11]
    eng = ToyEngine(model)
    ref_a = model.generate(a, 3, replay=False)
    assert _serve(eng, [a], 3) == [ref_a]
    eng.share_prefix(1, 2, 40)
    logits = eng.step([(2, b[40:])])
    first = int(logits.argmax(-1))
    assert first == model.generate(b, 1, replay=False)[0]


@torch.no_grad()
def test_bounded_replay_equals_reference_with_replay(model):
    prompts = _prompts([10, 37, 70], seed=9)
    W = model.cfg.sliding_window
    for chunk in (None, 7):
        eng = ToyEngine(model, replay=True)
        floors = [max(0, len(p) - W) for p in prompts]
        got = _serve(eng, prompts, 8, chunk=chunk, floors=floors)
        for p, g in zip(prompts, got, strict=False):
            assert g == model.generate(p, 8, replay=True), (len(p), chunk)


@torch.no_grad()
def test_fp8_main_kv_records():
    """kv_cache_dtype_main = fp8: main KV in V41 (528 B at D = 512) records, same equality."""
    cfg = preset("tiny")
    cfg.kv_cache_dtype_main = "fp8"
    torch.manual_seed(1)
    m = ReferenceModel(cfg).eval()
    eng = ToyEngine(m)
    assert eng.pool.main[1].shape[1] == cfg.head_dim + cfg.head_dim // 32
    prompts = _prompts([9, 30], seed=3)
    for p, g in zip(prompts, _serve(eng, prompts, 4, chunk=7), strict=False):
        assert g == m.generate(p, 4, replay=False)


@torch.no_grad()
@pytest.mark.parametrize("attn_dtype", [None, torch.bfloat16])
def test_batched_logits_bitwise_equal_to_reference(model, attn_dtype):
    """Six requests prefilled and decoded together: every row's logits equal the oracle's
    full-sequence logits bit for bit. Decode multiplies a handful of rows while the oracle
    multiplies whole sequences; without the row-stable products of layers/linear.py the rows
    differ by ~1e-6 (every one of them, measured), enough to flip an FP4 bucket or a near-tie.
    attn_dtype bf16: the served option and the oracle's switch (one model serves as both), q and
    o rounded on both sides."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # two threads: more row counts take a different CPU GEMM kernel
    set_attention_dtype(model, attn_dtype)
    try:
        ps = _prompts([7, 30, 61, 90, 130, 17], seed=21)
        eng = ToyEngine(model)
        logits = eng.step([(r, p) for r, p in enumerate(ps, start=1)])
        seqs = [list(p) for p in ps]
        for _ in range(4):
            for b, s in enumerate(seqs):
                assert torch.equal(logits[b], model(torch.tensor(s))[-1]), (len(s), b)
            nxt = logits.argmax(-1).tolist()
            for s, t in zip(seqs, nxt, strict=False):
                s.append(t)
            logits = eng.step([(r, [t]) for r, t in enumerate(nxt, start=1)])
    finally:
        torch.set_num_threads(old)
        set_attention_dtype(model, None)


@torch.no_grad()
def test_attention_dtype_switch_rounds_q_and_o(model):
    """The bf16 switch changes the oracle's logits (so the test above compares two different
    models): the attention reads q and writes o in bf16; off again, the logits are the exact
    path's."""
    ids = torch.tensor(_prompts([40], seed=5)[0])
    exact = model(ids)
    attn = model.layers[0].attn
    x = torch.randn(5, model.cfg.hidden_size)
    q, _ = attn.query(x, torch.arange(5))
    assert q.dtype == torch.float32 and attn.attention_in(q) is q
    set_attention_dtype(model, torch.bfloat16)
    try:
        rounded = model(ids)
        assert attn.attention_in(q).dtype == torch.bfloat16
        assert torch.equal(attn.attention_out(q), q.bfloat16())
    finally:
        set_attention_dtype(model, None)
    assert not torch.equal(rounded, exact)
    assert torch.equal(model(ids), exact)  # switched off again


@torch.no_grad()
def test_extend_batches_bound_the_slots_attention_reads(model, monkeypatch):
    """Every extend batch's sparse-attention call carries the batch's slots_bound (the served
    layer's bound that sizes a prefill workspace without a host sync), and the distinct SWA and
    main-KV slots the call's lists reference stay within it; decode calls carry none."""
    from sglang_dsv41.serving import attention as served

    seen = []
    inner = served.sparse_attention

    def spy(q, kv, *args, **kw):
        n = 0
        for slots in (kv.swa_slots, kv.topk_slots):
            if slots is not None:
                n += int(torch.unique(slots[slots >= 0]).numel())
        seen.append((q.shape[0], n, kv.max_slots))
        return inner(q, kv, *args, **kw)

    monkeypatch.setattr(served, "sparse_attention", spy)
    prompts = _prompts([3, 20, 41], seed=4)
    got = _serve(ToyEngine(model), prompts, 3, chunk=7)
    assert got == [model.generate(p, 3, replay=False) for p in prompts]
    bounded = [(n, m) for _, n, m in seen if m is not None]
    assert bounded and all(n <= m for n, m in bounded)
    assert max(n for n, _ in bounded) > 0 and any(m is None for _, _, m in seen)
