"""A toy scheduler for the dsv41 serving loop without SGLang (tests and demos).

`ToyEngine` owns a RecordBuffers pool, a `req_to_token` slot table and a shuffled page allocator
(page size 2; page 0 is padding), and runs one forward per `step` through a layer loop `run`
(`sglang.layer_loop.run_layers` or `serving.layer_loop.run_layers`); `serve` generates greedy
tokens for a batch with chunked prefill, optional decoder replay floors. Every BatchContext tensor
lives on `device`.
"""

from __future__ import annotations

import torch

from sglang_dsv41.sglang.buffers import RecordBuffers
from sglang_dsv41.sglang.context import BatchContext, build_rows
from sglang_dsv41.sglang.engram_history import EngramHistory

PAGE = 2


class ToyEngine:
    """Slot table + shuffled page allocator + one forward per `step` (SGLang's part)."""

    def __init__(
        self, model, run=None, max_len=512, n_pages=2048, seed=0, decoder_ring=False, device="cpu"
    ):
        if run is None:
            from sglang_dsv41.sglang.layer_loop import run_layers as run
        self.model, self.cfg, self.run, self.dev = model, model.cfg, run, device
        self.pool = RecordBuffers(
            self.cfg, n_pages * PAGE, PAGE, max_requests=8, device=device, decoder_ring=decoder_ring
        )
        g = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()  # page 0 = padding
        self.req_to_token = torch.zeros(9, max_len, dtype=torch.int32)
        self.lens = {}
        self.history = None
        if self.cfg.engram_layer_ids:
            self.history = EngramHistory(self.cfg.engram_max_ngram_size)

    def share_prefix(self, src: int, dst: int, n: int):
        """A radix hit: request dst starts with src's first n (even) slots."""
        assert n % PAGE == 0
        self.req_to_token[dst, :n] = self.req_to_token[src, :n]
        self.lens[dst] = n

    def _slot(self, r, pos):
        if pos % PAGE == 0:
            self.req_to_token[r, pos] = self.free.pop() * PAGE
        else:
            self.req_to_token[r, pos] = self.req_to_token[r, pos - 1] + 1
        return int(self.req_to_token[r, pos])

    def step(self, work, floors=None):
        """work: list of (request slot r, new token ids) -> next-token logits fp32 [B, V]."""
        prefix = [self.lens.get(r, 0) for r, _ in work]
        extend = [len(t) for _, t in work]
        out_loc = [
            self._slot(r, p + k)
            for (r, _), p, n in zip(work, prefix, extend, strict=False)
            for k in range(n)
        ]
        seq = [p + n for p, n in zip(prefix, extend, strict=False)]
        rows = build_rows(prefix, extend)
        d = self.dev
        rows.ids, rows.pos, rows.req = rows.ids.to(d), rows.pos.to(d), rows.req.to(d)
        ctx = BatchContext(
            rows=rows,
            req_pool=torch.tensor([r for r, _ in work], device=d),
            req_to_token=self.req_to_token.to(d),
            seq_lens=seq,
            floors=floors or [0] * len(work),
            out_loc=torch.tensor(out_loc, device=d),
        )
        ids = torch.tensor([t for _, toks in work for t in toks], dtype=torch.int64, device=d)
        if self.history is not None:  # requests here never start after a radix hit: no lookup
            slots = [r for r, _ in work]
            ctx.engram = self.history.windows(ctx.rows, ids.cpu(), slots, slots, None)
        h = self.run(self.model, ids, ctx, self.pool)
        for (r, _), s in zip(work, seq, strict=False):
            self.lens[r] = s
        last = torch.tensor([st + n - 1 for st, n in ctx.rows.spans], device=d)
        return self.model.head(h[last]).float()


def serve(engine, prompts, new, chunk=None, floors=None):
    """Greedy tokens for all prompts in one batch; prefill in chunks of `chunk` tokens."""
    outs = [[] for _ in prompts]
    todo = {r: list(p) for r, p in enumerate(prompts, start=1)}
    first = {}
    while todo:
        work = []
        for r in list(todo):
            take = todo[r][: chunk or len(todo[r])]
            todo[r] = todo[r][len(take) :]
            work.append((r, take))
        fl = [floors[r - 1] for r, _ in work] if floors else None
        logits = engine.step(work, fl)
        for (r, _), row in zip(work, logits, strict=False):
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


def prompts(n_list, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 512, (n,), generator=g).tolist() for n in n_list]
