"""The cached path's indexer picks the oracle's top-k sets, and the Triton kernels inside it
(run by the Triton interpreter on CPU tensors) generate the oracle's tokens.

The toy scheduler (paged slots, shuffled pages, a full -> SWA mapping) drives the tiny model
through `serving.layer_loop`; every top-k row of every indexer layer, for every chunk of a chunked
prefill and every decode step, is compared with the row the oracle selects at that position.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.reference import attention as ref_attention
from sglang_dsv41.serving import attention as serving_attention
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve, toy_model


def make_model(cfg=None):
    return toy_model(cfg)


@pytest.fixture(scope="module")
def model():
    return make_model()


def _served_topk(model, monkeypatch, ps, new, floors=None, chunk=7):
    """Serve ps; return ({(request, layer, pos): sorted top-k ids}, outputs)."""
    seen = {}
    inner = serving_attention.select_topk

    def spy(attn, x, q_lora, rows, ctx, pool):
        out = inner(attn, x, q_lora, rows, ctx, pool)
        slots = ctx.req_pool[rows.req].tolist()
        for s, p, row in zip(slots, rows.pos.tolist(), out.tolist(), strict=True):
            seen[(s - 1, attn.layer_id, p)] = sorted(row)
        return out

    monkeypatch.setattr(serving_attention, "select_topk", spy)
    eng = ToyEngine(model, replay=floors is not None, seed=3)
    outs = serve(eng, ps, new, chunk=chunk, floors=floors)
    monkeypatch.undo()
    return seen, outs


def _oracle_topk(model, monkeypatch, ids, floor):
    """{(layer, pos): sorted top-k ids} of the oracle's forward over ids."""
    seen = {}
    inner = ref_attention.select_topk

    def spy(attn, x, q_lora, pos, state):
        out = inner(attn, x, q_lora, pos, state)
        for p, row in zip(pos.tolist(), out.tolist(), strict=True):
            seen[(attn.layer_id, p)] = sorted(row)
        return out

    monkeypatch.setattr(ref_attention, "select_topk", spy)
    model(torch.tensor(ids), replay_floor=floor)
    monkeypatch.undo()
    return seen


@torch.no_grad()
@pytest.mark.parametrize("replay", [False, True])
def test_topk_rows_equal_the_oracle(model, monkeypatch, replay):
    ps = prompts([3, 23, 57], seed=7 + replay)
    W = model.cfg.sliding_window
    floors = [max(0, len(p) - W) for p in ps] if replay else None
    seen, outs = _served_topk(model, monkeypatch, ps, 3, floors)
    checked = 0
    for b, (p, out) in enumerate(zip(ps, outs, strict=True)):
        full = p + out[:-1]  # every position the server computed
        oracle = _oracle_topk(model, monkeypatch, full, floors[b] if floors else 0)
        mine = {(layer, pos): row for (r, layer, pos), row in seen.items() if r == b}
        assert mine.keys() <= oracle.keys(), sorted(mine.keys() - oracle.keys())[:5]
        for key, row in mine.items():
            assert row == oracle[key], (b, key)
            checked += 1
        assert out == model.generate(p, 3, replay=replay), len(p)
    assert checked > 100, checked


def _force_triton(monkeypatch, *ops):
    """Triton (interpreted) for the named kernel ops on CPU tensors, the references elsewhere."""
    from sglang_dsv41.kernels import dispatch

    select = dispatch.select
    monkeypatch.setattr(dispatch, "device_paths", lambda device: (dispatch.Path.TRITON,))
    monkeypatch.setattr(
        dispatch,
        "select",
        lambda op, dev, fast: select(op, dev, fast) if op.startswith(ops) else dispatch.Path.REF,
    )


@pytest.mark.triton_interpret
@torch.no_grad()
def test_triton_stores_and_attention_generate_oracle_tokens(model, monkeypatch):
    pytest.importorskip("triton")
    _force_triton(monkeypatch, "kv_store", "sparse_attention")
    ps = prompts([21], seed=2)
    got = serve(ToyEngine(model), ps, 2)
    assert got == [model.generate(p, 2, replay=False) for p in ps]


@pytest.mark.triton_interpret
@torch.no_grad()
def test_triton_indexer_picks_oracle_topk(monkeypatch):
    """The Triton indexer (full_topk, candidate_source, reindex over page-size-1 entry tables)
    at shapes it takes (DI 128, HI 16, blocks of 8) selects the oracle's rows."""
    pytest.importorskip("triton")
    cfg = preset("tiny")
    cfg.index_head_dim, cfg.index_n_heads, cfg.candidate_block_size = 128, 16, 8
    m = make_model(cfg)
    _force_triton(monkeypatch, "indexer")
    ps = prompts([75], seed=4)
    seen, outs = _served_topk(m, monkeypatch, ps, 1, chunk=40)
    oracle = _oracle_topk(m, monkeypatch, ps[0], 0)
    assert len(seen) == len(cfg.index_source_layer_ids) * 75
    for (_, layer, pos), row in seen.items():
        assert row == oracle[(layer, pos)], (layer, pos)
