"""Target-verify forwards through the cached path, driven by the toy scheduler (speculative
decoding's target side, without SGLang's worker: docs/speculative.md says why it cannot run on
CPU).

A step verifies gamma + 1 rows per request, [last token, d_1 .. d_gamma], in one extend-shaped
forward (`context.verify_context`: causal within the block), takes the greedy tokens of every
row, accepts the draft's longest matching prefix and commits it plus one token; the request's
length then moves back to what it committed. As SGLang's speculative worker does, the rejected
rows' slots stay reserved for their positions (or, second variant, are never used again).

  - greedy output with speculation equals plain greedy decoding, token for token, for a batch
    of requests, bounded replay on and off, with drafts that are sometimes right (so blocks are
    accepted in full, in part and not at all) and the pool sized for the verify width;
  - the same run with a pool sized for width 1 (no slack in the rings and pending pairs)
    diverges: rejected rows then overwrite state a later row reads, so the test can fail;
  - after the run, every request's committed records (SWA, main KV, index K at its slots) and
    its ring records at committed positions equal the plain run's.
Random weights accept little on their own; the drafts here come from the plain run's output,
corrupted at random, to exercise every acceptance length.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import verify_context
from sglang_dsv41.serving.layer_loop import run_layers
from sglang_dsv41.serving.toy import PAGE, ToyEngine, prompts, serve, toy_model

GAMMA = 5
WIDTH = GAMMA + 1
NEW = 28
LENS = [5, 17, 40]


class SpecEngine(ToyEngine):
    """ToyEngine with a pool sized for `verify_width` rows per request and, with `reuse`,
    SGLang's over-allocation: a position keeps its page once allocated, so a rolled-back
    position is rewritten in place."""

    def __init__(self, model, verify_width: int, reuse: bool, replay: bool):
        super().__init__(model, replay=replay)
        slots = self.mapping.shape[0] - PAGE - 1
        self.pool = RecordBuffers(
            self.cfg,
            replay,
            slots,
            slots,
            PAGE,
            self.req_to_token.shape[0] - 1,
            self.dev,
            verify_width=verify_width,
        )
        self.pool.register_mapping(self.mapping.to(self.dev))
        self.reuse, self.reserved = reuse, set()

    def _slot(self, r, pos):
        if self.reuse and pos % PAGE == 0 and (r, pos) in self.reserved:
            return int(self.req_to_token[r, pos])
        self.reserved.add((r, pos - pos % PAGE))
        return super()._slot(r, pos)

    def verify(self, work):
        """work: (request slot, [last token, d_1 .. d_gamma]) per request -> greedy token of
        every row int64 [B, WIDTH]."""
        prefix, _, seq, out_loc = self.admit(work)
        self.finish(work, seq)
        d = self.dev
        req_pool = torch.tensor([r for r, _ in work], device=d)
        ids = torch.tensor([t for _, toks in work for t in toks], device=d)
        ctx = verify_context(
            req_pool,
            torch.tensor(prefix, device=d),
            WIDTH,
            torch.tensor(out_loc, device=d),
            self.r2t,
            self.pool.floor[req_pool],
            max(seq),
        )
        h = run_layers(self.model, ids, ctx, self.pool)
        return upcast(self.model.head(h)).argmax(-1).view(len(work), WIDTH)

    def roll_back(self, r: int, length: int):
        """Request r keeps its first `length` tokens (its slots stay reserved)."""
        self.lens[r] = length
        self.tokens[r] = self.tokens[r][:length]


def speculative(engine, batch, want, floors, seed=0):
    """Greedy outputs of `batch` with drafts from `want` (the plain outputs) corrupted at
    random; returns (outputs, accepted draft tokens per step and request)."""
    g = torch.Generator().manual_seed(seed)
    vocab = engine.cfg.vocab_size
    logits = engine.step([(r, p) for r, p in enumerate(batch, start=1)], floors)
    out = [[int(t)] for t in logits.argmax(-1)]
    accepted = []
    while min(len(o) for o in out) < NEW:
        work, drafts = [], []
        for r, o in enumerate(out, start=1):
            truth = want[r - 1][len(o) : len(o) + GAMMA]
            truth += [0] * (GAMMA - len(truth))
            keep = torch.rand(GAMMA, generator=g) < 0.7
            noise = torch.randint(2, vocab, (GAMMA,), generator=g)
            d = torch.where(keep, torch.tensor(truth), noise).tolist()
            drafts.append(d)
            work.append((r, [o[-1], *d]))
        prefix = [engine.lens[r] for r, _ in work]
        greedy = engine.verify(work).tolist()
        for b, (r, _) in enumerate(work):
            a = 0
            while a < GAMMA and drafts[b][a] == greedy[b][a]:
                a += 1
            accepted.append(a)
            out[b] += drafts[b][:a] + [greedy[b][a]]
            engine.roll_back(r, prefix[b] + a + 1)
    return [o[:NEW] for o in out], accepted


def floors_of(batch, replay: bool, W: int):
    return [max(0, len(p) - W) for p in batch] if replay else None


@pytest.fixture(scope="module")
def model():
    return toy_model()


@pytest.fixture(scope="module")
def batch():
    return prompts(LENS, seed=11)


@pytest.fixture(scope="module")
def plain(model, batch):
    out = {}
    for replay in (False, True):
        eng = SpecEngine(model, 1, reuse=False, replay=replay)
        floors = floors_of(batch, replay, model.cfg.sliding_window)
        out[replay] = (serve(eng, batch, NEW, floors=floors), eng)
    return out


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("replay", [False, True])
def test_speculative_greedy_equals_plain_greedy(model, batch, plain, replay, reuse):
    want, plain_eng = plain[replay]
    eng = SpecEngine(model, WIDTH, reuse=reuse, replay=replay)
    got, accepted = speculative(
        eng, batch, want, floors_of(batch, replay, model.cfg.sliding_window)
    )
    assert got == want
    assert {0, GAMMA} <= set(accepted) and len(set(accepted)) >= 4  # none, all and partial
    _same_committed_state(eng, plain_eng, [len(p) + NEW - 1 for p in batch])


def test_without_slack_rejected_rows_corrupt(model, batch, plain):
    """Control: the pool sized for one row per request (rings of W records, one pending pair)
    lets rejected rows overwrite what the next block reads, and the output diverges."""
    want, _ = plain[True]
    eng = SpecEngine(model, 1, reuse=True, replay=True)
    got, _ = speculative(eng, batch, want, floors_of(batch, True, model.cfg.sliding_window))
    assert got != want


def _same_committed_state(spec, ref, lengths):
    """Records at every position both runs committed, and the decoder rings' records at the
    positions inside both runs' last windows, equal the plain run's (slots differ: compare by
    position)."""
    W = spec.cfg.sliding_window
    for r, n in enumerate(lengths, start=1):
        n = min(n, spec.lens[r], ref.lens[r])
        pos = torch.arange(n)
        s_full, r_full = spec.req_to_token[r, :n].long(), ref.req_to_token[r, :n].long()
        for i, buf in enumerate(spec.pool.swa):
            if buf is not None:
                a = buf[spec.mapping[s_full]]
                b = ref.pool.swa[i][ref.mapping[r_full]]
                lo = max(0, n - W)  # the SWA allocator may free slots out of the window
                assert torch.equal(a[lo:], b[lo:]), (r, i)
        for src, buf in spec.pool.main.items():
            ratio = spec.cfg.ratio(src)
            first = pos[(pos % ratio == 0) & (pos + ratio <= n)]
            rows_s = spec.pool.entry_rows(src, s_full[first])
            rows_r = ref.pool.entry_rows(src, r_full[first])
            assert torch.equal(buf[rows_s], ref.pool.main[src][rows_r]), (r, src)
            assert torch.equal(spec.pool.index_k[src][rows_s], ref.pool.index_k[src][rows_r])
        live = pos[max(0, spec.lens[r] - W, ref.lens[r] - W) :]  # in both rings' windows
        assert live.numel() > 0 or not spec.pool.ring
        for i, ring in spec.pool.ring.items():
            a = ring[r, live % ring.shape[1]]
            b = ref.pool.ring[i][r, live % ref.pool.ring[i].shape[1]]
            assert torch.equal(a, b), (r, i)
