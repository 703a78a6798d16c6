"""A toy scheduler for the cached path without SGLang (tests and demos).

`ToyEngine` plays SGLang's part: a `RecordBuffers` pool, a `req_to_token` slot table, shuffled
page allocators for full slots and (separately, through a full -> SWA mapping like SGLang's
hybrid SWA allocator) for SWA slots, request slots with their replay floor and Engram tail, and
one forward per `step` through `serving.layer_loop.run_layers`. `serve` generates greedy tokens
for a batch with chunked prefill and optional decoder replay floors. Every BatchContext tensor
lives on `device`.
"""

from __future__ import annotations

import torch

from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import BatchContext, build_rows
from sglang_dsv41.serving.layer_loop import run_layers

PAGE = 2


class ToyEngine:
    """Slot table + shuffled page allocators + one forward per `step` (SGLang's part)."""

    def __init__(
        self, model, max_len=512, n_pages=2048, seed=0, replay=False, device="cpu", max_requests=8
    ):
        self.model, self.cfg, self.dev = model, model.cfg, device
        slots = n_pages * PAGE
        self.pool = RecordBuffers(self.cfg, replay, slots, slots, PAGE, max_requests, device)
        g = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()  # page 0 = padding
        self.swa_free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()
        self.mapping = torch.zeros(slots + PAGE + 1, dtype=torch.int64)
        self.pool.register_mapping(self.mapping.to(device))
        self.req_to_token = torch.zeros(max_requests + 1, max_len, dtype=torch.int32)
        self.lens, self.tokens = {}, {}

    def share_prefix(self, src: int, dst: int, n: int):
        """A radix hit: request dst starts with src's first n (even) slots."""
        assert n % PAGE == 0
        self.req_to_token[dst, :n] = self.req_to_token[src, :n]
        self.lens[dst] = n
        self.tokens[dst] = list(self.tokens[src][:n])

    def _slot(self, r, pos):
        if pos % PAGE == 0:
            full, swa = self.free.pop() * PAGE, self.swa_free.pop() * PAGE
            self.req_to_token[r, pos] = full
            self.mapping[full : full + PAGE] = torch.arange(swa, swa + PAGE)
        else:
            self.req_to_token[r, pos] = self.req_to_token[r, pos - 1] + 1
        return int(self.req_to_token[r, pos])

    def step(self, work, floors=None):
        """work: list of (request slot r, new token ids) -> next-token logits fp32 [B, V].
        floors: per request of `work`, its decoder replay floor (set when it starts a prefill)."""
        d = self.dev
        prefix = [self.lens.get(r, 0) for r, _ in work]
        extend = [len(t) for _, t in work]
        n1 = self.pool.engram_tail.shape[1]
        for b, ((r, _), p) in enumerate(zip(work, prefix, strict=True)):
            if extend[b] > 1 or p == 0 or floors is not None:
                tail = ([-1] * n1 + self.tokens.get(r, [])[:p])[len(self.tokens.get(r, [])[:p]) :]
                self.pool.start_request(r, floors[b] if floors else 0, tail)
        out_loc = [
            self._slot(r, p + k)
            for (r, _), p, n in zip(work, prefix, extend, strict=True)
            for k in range(n)
        ]
        self.pool.register_mapping(self.mapping.to(d))
        rows = build_rows(prefix, extend, d)
        req_pool = torch.tensor([r for r, _ in work], device=d)
        seq = [p + n for p, n in zip(prefix, extend, strict=True)]
        ids = torch.tensor([t for _, toks in work for t in toks], dtype=torch.int64, device=d)
        floors_t = self.pool.floor[req_pool]
        ctx = BatchContext(
            rows=rows,
            req_pool=req_pool,
            req_to_token=self.req_to_token.to(d),
            seq_lens=torch.tensor(seq, device=d),
            max_seq_len=max(seq),
            floors=floors_t,
            out_loc=torch.tensor(out_loc, device=d),
            replaying=bool((rows.pos < floors_t[rows.req]).any()),
        )
        h = run_layers(self.model, ids, ctx, self.pool)
        for (r, toks), s in zip(work, seq, strict=True):
            self.lens[r] = s
            self.tokens[r] = self.tokens.get(r, [])[: s - len(toks)] + list(toks)
        last = torch.tensor(seq, device=d) - torch.tensor(prefix, device=d)
        last = torch.cumsum(last, 0) - 1
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
        for (r, _), row in zip(work, logits, strict=True):
            if not todo[r]:
                first[r] = int(row.argmax())
                del todo[r]
    nxt = [first[r] for r in range(1, len(prompts) + 1)]
    for _ in range(new):
        for b, t in enumerate(nxt):
            outs[b].append(t)
        if len(outs[0]) == new:
            break
        logits = engine.step([(r, [t]) for r, t in enumerate(nxt, start=1)])
        nxt = logits.argmax(-1).tolist()
    return outs


def prompts(n_list, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 512, (n,), generator=g).tolist() for n in n_list]
