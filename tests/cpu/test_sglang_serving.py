"""The dsv41 serving path without SGLang: record pool + batch context + layer loop, driven by a
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
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.sglang.buffers import RecordBuffers  # noqa: E402
from sglang_dsv41.sglang.context import BatchContext, build_rows  # noqa: E402
from sglang_dsv41.sglang.engram_history import EngramHistory  # noqa: E402
from sglang_dsv41.sglang.layer_loop import run_layers  # noqa: E402

PAGE = 2


class ToyEngine:
    """Slot table + page allocator + one forward per `step` (what SGLang does for the backend)."""

    def __init__(self, model, max_len=512, n_pages=2048, seed=0, decoder_ring=False):
        self.model, self.cfg = model, model.cfg
        self.pool = RecordBuffers(self.cfg, n_pages * PAGE, PAGE, max_requests=8,
                                  decoder_ring=decoder_ring)
        g = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()  # page 0 = padding
        self.req_to_token = torch.zeros(9, max_len, dtype=torch.int32)
        self.lens = {}
        if self.cfg.engram_layer_ids:
            self.history = EngramHistory(self.cfg.engram_max_ngram_size)
            self.lookup = None  # requests here never start after a radix hit

    def _slot(self, r, pos):
        if pos % PAGE == 0:
            page = self.free.pop()
            self.req_to_token[r, pos] = page * PAGE
        else:
            self.req_to_token[r, pos] = self.req_to_token[r, pos - 1] + 1
        return int(self.req_to_token[r, pos])

    def share_prefix(self, src: int, dst: int, n: int):
        """A radix hit: request dst starts with src's first n (even) slots."""
        assert n % PAGE == 0
        self.req_to_token[dst, :n] = self.req_to_token[src, :n]
        self.lens[dst] = n

    def step(self, work, floors=None):
        """work: list of (request slot r, new token ids). Returns next-token logits [B, V]."""
        prefix = [self.lens.get(r, 0) for r, _ in work]
        extend = [len(t) for _, t in work]
        out_loc = [self._slot(r, p + k) for (r, _), p, n in zip(work, prefix, extend)
                   for k in range(n)]
        seq = [p + n for p, n in zip(prefix, extend)]
        ctx = BatchContext(rows=build_rows(prefix, extend),
                           req_pool=torch.tensor([r for r, _ in work]),
                           req_to_token=self.req_to_token, seq_lens=seq,
                           floors=floors or [0] * len(work), out_loc=torch.tensor(out_loc))
        ids = torch.tensor([t for _, toks in work for t in toks], dtype=torch.int64)
        if self.cfg.engram_layer_ids:
            ctx.engram = self.history.windows(ctx.rows, ids, [r for r, _ in work],
                                              [r for r, _ in work], self.lookup)
        h = run_layers(self.model, ids, ctx, self.pool)
        for (r, _), s in zip(work, seq):
            self.lens[r] = s
        last = torch.tensor([st + n - 1 for st, n in ctx.rows.spans])
        return self.model.head(h[last]).float()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = ReferenceModel(preset("tiny")).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("attn_sink"):
                p.normal_(0, 0.1)
    return m


def _prompts(n_list, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 512, (n,), generator=g).tolist() for n in n_list]


def _serve(engine, prompts, new, chunk=None, floors=None):
    """Greedy generation for all prompts in one batch; prefill in chunks of `chunk` tokens."""
    outs = [[] for _ in prompts]
    todo = {r: list(p) for r, p in enumerate(prompts, start=1)}
    first = {}
    while todo:  # chunked prefill: every unfinished request in each forward
        work = []
        for r in list(todo):
            take = todo[r][: chunk or len(todo[r])]
            todo[r] = todo[r][len(take):]
            work.append((r, take))
        fl = [floors[r - 1] for r, _ in work] if floors else None
        logits = engine.step(work, fl)
        for (r, _), row in zip(work, logits):
            if not todo[r]:
                first[r] = int(row.argmax())
                del todo[r]
    nxt = [first[r] for r in range(1, len(prompts) + 1)]
    for _ in range(new):
        for b, t in enumerate(nxt):
            outs[b].append(t)
        if len(outs[0]) == new:
            break
        logits = engine.step([(r, [t]) for r, t in enumerate(nxt, start=1)], floors)
        nxt = logits.argmax(-1).tolist()
    return outs


@torch.no_grad()
@pytest.mark.parametrize("chunk", [None, 5])
def test_batched_prefill_decode_equals_reference(model, chunk):
    prompts = _prompts([1, 3, 20, 41, 66])
    got = _serve(ToyEngine(model), prompts, 5, chunk=chunk)
    for p, g in zip(prompts, got):
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
        eng = ToyEngine(model, decoder_ring=True)
        floors = [max(0, len(p) - W) for p in prompts]
        got = _serve(eng, prompts, 8, chunk=chunk, floors=floors)
        for p, g in zip(prompts, got):
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
    for p, g in zip(prompts, _serve(eng, prompts, 4, chunk=7)):
        assert g == m.generate(p, 4, replay=False)


@torch.no_grad()
def test_replay_radix_hit_with_remapped_slots(model):
    """Replay on: B shares A's prefix up to B's floor (the radix cap); then B's slots past the
    cap are remapped onto A's identical tokens (SGLang's radix insert dedupes them), where A
    never wrote decoder SWA (A's floor is higher). B's outputs still equal the reference."""
    W = model.cfg.sliding_window
    base = _prompts([120], seed=11)[0]
    a, b = base + _prompts([30], seed=12)[0], base[:100] + [5, 6, 7]
    eng = ToyEngine(model, decoder_ring=True)
    fa, fb = len(a) - W, len(b) - W
    assert _serve(eng, [a], 3, floors=[fa]) == [model.generate(a, 3, replay=True)]
    cap = fb // PAGE * PAGE
    eng.share_prefix(1, 2, cap)
    logits = eng.step([(2, b[cap:])], floors=[fb])
    eng.req_to_token[2, cap:100] = eng.req_to_token[1, cap:100]  # the dedupe
    out = [int(logits.argmax())]
    for _ in range(3):
        out.append(int(eng.step([(2, [out[-1]])], floors=[fb]).argmax()))
    assert out == model.generate(b, 4, replay=True)
