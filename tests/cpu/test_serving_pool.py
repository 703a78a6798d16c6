"""The pool of the cached path: bytes equal the one calculator, SWA records at SWA slots through
the full -> SWA mapping, why decoder SWA under replay lives in per-request rings, batch rows and
Engram windows from request-slot tails."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.layers.engram import ngram_windows
from sglang_dsv41.serving import engram_history
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import build_rows
from sglang_dsv41.serving.geometry import PoolGeometry, swa_slots_needed
from sglang_dsv41.serving.toy import PAGE, ToyEngine, prompts, serve, toy_model


@pytest.mark.parametrize("name", ["tiny", "small", "flash"])
@pytest.mark.parametrize("replay", [False, True])
def test_buffers_allocate_what_the_calculator_says(name, replay):
    cfg = preset(name)
    full, swa, page, reqs = 1000, 300, 2, 5
    buf = RecordBuffers(cfg, replay, full, swa, page, reqs, device="meta")
    g = PoolGeometry(cfg, replay)
    assert buf.nbytes() == g.buffer_bytes(full, swa, page, reqs)
    assert (g.ring_bytes_per_request() > 0) == replay
    assert set(g.ring_layers) | set(g.swa_layers) == set(range(cfg.num_hidden_layers))
    assert buf.source_layer_of(4) == cfg.source_layer_of(4) and buf.source_layer_of(0) == -1
    with pytest.raises(ValueError, match="page_size"):
        RecordBuffers(cfg, replay, full, swa, 1, reqs, device="meta")


def test_flash_global_bytes_and_sizing():
    g = PoolGeometry(preset("flash"), replay=True)
    assert g.global_bytes_per_token() == 890.0
    assert g.swa_bytes_per_slot() == 528 * 20 and g.ring_bytes_per_request() == 528 * 128 * 20
    budget, ctx = 100 * 2**30, 1 << 20
    swa = swa_slots_needed(128, 64, 256, 8192, eviction_interval=128)
    full = g.full_slots_for(budget, swa, 64, 256, ctx)
    assert full % 64 == 0
    assert g.total_bytes(full, swa, 64, 256, ctx) <= budget
    assert g.total_bytes(full + 64, swa, 64, 256, ctx) > budget
    # context per byte: the global state dominates, SWA and request slots are constants
    per_token = budget / full
    assert 890 < per_token < 890 * 1.05, per_token


def _model():
    return toy_model()


@torch.no_grad()
def test_swa_records_live_at_mapped_slots():
    m = _model()
    eng = ToyEngine(m)
    serve(eng, prompts([9]), 1)
    full = eng.req_to_token[1, :9].long()
    swa = eng.mapping[full]
    assert not torch.equal(full, swa)  # separate allocators
    layer = eng.pool.swa[0]
    assert layer[swa].any(dim=1).all()  # written at the SWA slots
    untouched = torch.ones(layer.shape[0], dtype=torch.bool)
    untouched[swa] = False
    assert not layer[untouched].any()


def _remap_scenario(m, replay_pool: bool):
    """Replay on: B shares A's prefix up to B's floor (the radix cap); then B's slots past the
    cap are remapped onto A's identical tokens (SGLang's radix insert dedupes them), where A
    never wrote decoder SWA (A's floor is higher). Returns B's logits of 4 steps and the oracle's
    tokens."""
    W = m.cfg.sliding_window
    base = prompts([120], seed=11)[0]
    a, b = base + prompts([30], seed=12)[0], base[:100] + [5, 6, 7]
    eng = ToyEngine(m, replay=replay_pool)
    fa, fb = len(a) - W, len(b) - W
    serve(eng, [a], 3, floors=[fa])
    cap = fb // PAGE * PAGE
    eng.share_prefix(1, 2, cap)
    logits = [eng.step([(2, b[cap:])], floors=[fb])]
    eng.req_to_token[2, cap:100] = eng.req_to_token[1, cap:100]  # the dedupe
    out = [int(logits[-1].argmax())]
    for _ in range(3):
        logits.append(eng.step([(2, [out[-1]])]))
        out.append(int(logits[-1].argmax()))
    return out, m.generate(b, 4, replay=True)


@torch.no_grad()
def test_decoder_rings_keep_replay_exact_under_slot_remapping():
    m = _model()
    out, want = _remap_scenario(m, replay_pool=True)
    assert out == want


@torch.no_grad()
def test_decoder_swa_in_shared_slots_breaks_under_remapping():
    """The evidence for the rings: the same scenario with decoder SWA kept at (remappable) slots
    reads A's rows, which A never computed below its own floor, and leaves the oracle."""
    m = _model()
    out, want = _remap_scenario(m, replay_pool=False)
    assert out != want


def test_rows_select_keeps_suffixes():
    rows = build_rows([0, 5, 2], [4, 3, 2])
    assert rows.pos.tolist() == [0, 1, 2, 3, 5, 6, 7, 2, 3]
    assert rows.first_of_request().tolist() == [0, 0, 0, 0, 4, 4, 4, 7, 7]
    assert rows.last_row().tolist() == [3, 3, 3, 3, 6, 6, 6, 8, 8]
    kept = rows.select(rows.pos >= torch.tensor([2, 2, 2, 2, 6, 6, 6, 9, 9]))
    assert kept.ids.tolist() == [2, 3, 5, 6] and kept.req.tolist() == [0, 0, 1, 1]


def test_engram_windows_from_tails_match_whole_sequence():
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 50, (23,), generator=g), torch.randint(0, 50, (9,), generator=g)]
    n = 3
    tails = torch.full((3, n - 1), -1, dtype=torch.int64)  # request slots 1, 2 (0 = padding)
    # a: chunks [0, 10), [10, 17), decode 17, 18; b: radix hit at 4 (tail from its tokens)
    tails[2] = seqs[1][2:4]
    steps = [[(0, 0, 10)], [(0, 10, 7), (1, 4, 5)], [(0, 17, 1)], [(0, 18, 1)]]
    for step in steps:
        rows = build_rows([p for _, p, _ in step], [k for _, _, k in step])
        ids = torch.cat([seqs[r][p : p + k] for r, p, k in step])
        slots = torch.tensor([r + 1 for r, _, _ in step])
        tok, blk = engram_history.windows(rows, ids, tails[slots], n)
        tails[slots] = engram_history.advance_tails(rows, ids, tails[slots])
        start = 0
        for r, p, k in step:
            want_t, want_b = ngram_windows(seqs[r], torch.arange(len(seqs[r])), n)
            assert torch.equal(tok[start : start + k], want_t[p : p + k]), (r, p)
            assert torch.equal(blk[start : start + k], want_b[p : p + k]), (r, p)
            start += k
