"""recall_report on the tiny model: the CLI writes table, JSON and PNG; the capture hook leaves
the oracle's logits unchanged and removes itself; pool recall equals the share of the
unrestricted top-k that the oracle's served (pool-restricted) top-k holds; and the metrics give
the planted answers on hand-made layer states."""

import json
import struct

import pytest
import torch

from sglang_dsv41.config import REINDEX, REUSE
from sglang_dsv41.layers.index_math import index_scores, topk_indices, visible_mask
from sglang_dsv41.reference.attention import SharedState
from sglang_dsv41.reference.model import load_reference
from sglang_dsv41.tools import recall_report
from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint
from sglang_dsv41.tools.recall_report import QueryCapture, capture_queries, layer_metrics


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert make_checkpoint(["--preset", "tiny", "--out", str(out), "--force"]) == 0
    return out


@pytest.fixture(scope="module")
def model(tiny):
    return load_reference(tiny)


def test_cli_on_tiny(tiny, tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["--model", str(tiny), "--contexts", "32,256", "--rows", "4"]
    assert recall_report.main(argv + ["--json", str(js), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "Reindex: share of the unrestricted top-k" in text and "Reuse:" in text
    rep = json.loads(js.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png.read_bytes()[16:24])[0] >= 1200
    layers = {x["layer"]: x["role"] for x in rep["layers"]}
    assert [i for i, r in layers.items() if r == REINDEX] == [8, 10]
    assert len(rep["results"]) == 2 * len(layers)
    for r in rep["results"]:
        for name in ("pool_recall", "reuse_overlap", "attn_mass"):
            if name in r:
                assert 0.0 <= r[name]["min"] <= r[name]["mean"] <= 1.0 + 1e-6
        assert ("pool_recall" in r) == (r["role"] == REINDEX)
        assert ("reuse_overlap" in r) == (r["role"] == REUSE)
    by = {(r["layer"], r["context"]): r for r in rep["results"]}
    # 32 tokens < the 48-entry pool: the pool is everything; 256 tokens: it is not
    assert by[(8, 32)]["pool_recall"]["mean"] == 1.0 == by[(10, 32)]["pool_recall"]["mean"]
    assert min(by[(i, 256)]["pool_recall"]["mean"] for i in (8, 10)) < 1.0
    assert by[(8, 256)]["pool_recall"]["chance"] == pytest.approx(48 / 256, rel=0.05)


def test_capture_is_transparent_and_removed(model):
    ids = torch.randint(2, model.cfg.vocab_size, (70,))
    plain = model(ids)
    state = SharedState()
    with capture_queries(model, torch.tensor([5, 69])) as cap:
        captured = model(ids, shared=state)
    assert torch.equal(plain, captured)
    assert sorted(cap.qi) == [1, 3, 6, 8, 10] and cap.q[8][0].tolist() == [5, 69]
    for block in model.layers:
        assert "query" not in block.attn.__dict__
        if block.attn.indexer is not None:
            assert "queries" not in block.attn.indexer.__dict__
    assert state.pool_mask.shape == (70, 70) and sorted(state.topk) == [1, 3, 6, 8, 10]


def test_pool_recall_is_what_the_served_topk_keeps(model):
    cfg = model.cfg
    L = 200
    ids = torch.randint(2, cfg.vocab_size, (L,))
    rows = torch.arange(150, L)
    state = SharedState()
    with capture_queries(model, rows) as cap:
        model(ids, shared=state)
    for layer in (8, 10):
        m = layer_metrics(model, state, cap, layer)
        _, qi, w = cap.qi[layer]
        k = state.index_k[cfg.source_layer_of(layer)]
        free = topk_indices(index_scores(qi, w, k), visible_mask(rows, 1, k.shape[0]), 8)
        served = state.topk[layer][rows]
        both = (free[:, :, None] == served[:, None, :]).any(-1).sum(-1) / 8
        assert torch.allclose(m["pool_recall"], both.float())
        assert float(m["pool_recall"].mean()) < 1.0


def _planted(model, layer, n=40):
    """A hand-made state for `layer` at one query row that sees all n entries: main KV and index
    K are basis vectors, so scores and attention land exactly where the queries point."""
    cfg = model.cfg
    D, DI, H = cfg.head_dim, cfg.index_head_dim, cfg.num_attention_heads
    src, isrc = cfg.source_layer_of(layer), cfg.index_source_of(layer)
    pos = torch.tensor([n - 1])
    state, cap = SharedState(), QueryCapture()
    state.main_kv[src] = torch.eye(n, D)
    state.index_k[src] = torch.eye(n, DI)
    q = torch.zeros(1, H, D)
    q[:, :, 3] = q[:, :, 5] = 400.0  # all attention on entries 3 and 5
    cap.q[layer] = (pos, q)
    return state, cap, isrc, pos


def test_planted_reuse_layer(model):
    layer = 9  # Reuse, top-k from Reindex layer 8
    state, cap, isrc, _ = _planted(model, layer)
    state.topk[isrc] = torch.zeros(40, 8, dtype=torch.int64)
    state.topk[isrc][39] = torch.tensor([3, 5, 0, 1, 2, 4, 6, 7])  # own choice, ties -> low ids
    m = layer_metrics(model, state, cap, layer)
    assert m["reuse_overlap"].item() == 1.0 and m["attn_mass"].item() > 0.999
    state.topk[isrc][39] = torch.tensor([3, 10, 11, 12, 13, 14, 15, 16])
    m = layer_metrics(model, state, cap, layer)
    assert m["reuse_overlap"].item() == 1 / 8 and 0.49 < m["attn_mass"].item() < 0.51


def test_planted_reindex_layer(model):
    layer = 8
    state, cap, _, pos = _planted(model, layer)
    qi = torch.zeros(1, model.cfg.index_n_heads, model.cfg.index_head_dim)
    qi[0, 0, 20], qi[0, 1, 30] = 1.0, 2.0  # index scores: entry 30 > entry 20 > the rest
    cap.qi[layer] = (pos, qi, torch.ones(1, model.cfg.index_n_heads))
    pool = torch.ones(40, 40, dtype=torch.bool)
    pool[39, 30] = False  # the pool lost the best entry
    state.pool_mask = pool
    state.topk[layer] = torch.zeros(40, 8, dtype=torch.int64)
    state.topk[layer][39] = torch.tensor([20, 0, 1, 2, 3, 4, 5, 6])  # top-8 inside the pool
    m = layer_metrics(model, state, cap, layer)
    assert m["pool_recall"].item() == 7 / 8  # unrestricted {30, 20, 0..5}: 30 is gone
    assert m["attn_mass"].item() > 0.999  # attention sits on 3 and 5, both served
    state.topk[layer][39] = torch.tensor([20, 0, 1, 2, 4, 6, 7, 8])  # 3 and 5 left out
    assert layer_metrics(model, state, cap, layer)["attn_mass"].item() < 1e-3
