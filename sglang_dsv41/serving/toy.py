"""A toy scheduler for the cached path without SGLang (tests and demos).

`ToyEngine` plays SGLang's part: a `RecordBuffers` pool, a `req_to_token` slot table, shuffled
page allocators for full slots and (separately, through a full -> SWA mapping like SGLang's
hybrid SWA allocator) for SWA slots, request slots with their replay floor and Engram tail, and
one forward per `step` through `serving.layer_loop.run_layers`. `serve` generates greedy tokens
for a batch with chunked prefill and optional decoder replay floors. With `prefix_replay`, a
request whose shared prefix lost its SWA (`evict_swa`) resumes there (`step(..., resumes=)`,
docs/design.md 2.8). Every BatchContext tensor lives on `device`.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import compute_dtype, upcast
from sglang_dsv41.layers.protocols import LayerStack
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import BatchContext, build_rows, decode_context, slots_bound
from sglang_dsv41.serving.layer_loop import run_layers
from sglang_dsv41.serving.prefix_replay import fold_batch

PAGE = 2


class ToyEngine:
    """Slot table + shuffled page allocators + one forward per `step` (SGLang's part)."""

    def __init__(
        self,
        model: LayerStack,
        max_len=512,
        n_pages=2048,
        seed=0,
        replay=False,
        device="cpu",
        max_requests=8,
        prefix_replay=False,
    ):
        self.model, self.cfg, self.dev = model, model.cfg, torch.device(device)
        slots = n_pages * PAGE
        dtype = compute_dtype(model.embed.weight)
        self.pool = RecordBuffers(
            self.cfg,
            replay,
            slots,
            slots,
            PAGE,
            max_requests,
            device,
            dtype=dtype,
            prefix_replay=prefix_replay,
        )
        g = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()  # page 0 = padding
        self.swa_free = (torch.randperm(n_pages - 1, generator=g) + 1).tolist()
        self.mapping = torch.zeros(slots + PAGE + 1, dtype=torch.int64)
        self.req_to_token = torch.zeros(max_requests + 1, max_len, dtype=torch.int32)
        # device mirrors, updated in place (a CUDA graph reads them at fixed addresses)
        self.pool.register_mapping(self.mapping.to(self.dev))
        self.r2t = self.req_to_token.to(self.dev)
        self.lens, self.tokens = {}, {}
        self.folds = {}  # request slot -> replay segment ids of the last admitted forward

    def share_prefix(self, src: int, dst: int, n: int):
        """A radix hit: request dst starts with src's first n (even) slots."""
        assert n % PAGE == 0
        self.req_to_token[dst, :n] = self.req_to_token[src, :n]
        self.lens[dst] = n
        self.tokens[dst] = list(self.tokens[src][:n])

    def release(self, r: int):
        """Request slot r finishes: its pages go back to the allocators."""
        n = self.lens.pop(r, 0)
        for pos in range(0, n, PAGE):
            full = int(self.req_to_token[r, pos])
            self.free.append(full // PAGE)
            if int(self.mapping[full]):
                self.swa_free.append(int(self.mapping[full]) // PAGE)
        self.tokens.pop(r, None)

    def evict_swa(self, r: int, upto: int):
        """The SWA of request slot r's positions [0, upto) is evicted (SGLang's radix cache
        tombstones it): its SWA pages are freed and unmapped, the full slots (global KV) stay."""
        for pos in range(0, upto, PAGE):
            full = int(self.req_to_token[r, pos])
            if int(self.mapping[full]):
                self.swa_free.append(int(self.mapping[full]) // PAGE)
                self.mapping[full : full + PAGE] = 0

    def _slot(self, r, pos):
        if pos % PAGE == 0:
            full, swa = self.free.pop() * PAGE, self.swa_free.pop() * PAGE
            self.req_to_token[r, pos] = full
            self.mapping[full : full + PAGE] = torch.arange(swa, swa + PAGE)
        else:
            self.req_to_token[r, pos] = self.req_to_token[r, pos - 1] + 1
        return int(self.req_to_token[r, pos])

    @staticmethod
    def is_decode(prefix, extend, floors) -> bool:
        return floors is None and all(n == 1 for n in extend) and all(p > 0 for p in prefix)

    def table_len(self, seq) -> int:
        """As the backend: decode page tables span the slot table's width on CUDA."""
        return self.req_to_token.shape[1] if self.dev.type == "cuda" else max(seq)

    def admit(self, work, floors=None, resumes=None):
        """Host bookkeeping of one forward: request starts, slot allocation, device mirrors.
        resumes: per request of `work`, the prefix length it resumed at with a replay (its
        shared prefix, SWA evicted) or 0. Returns (prefix, extend, seq, out_loc) host lists;
        the replay segments of this forward are left in self.folds."""
        prefix = [self.lens.get(r, 0) for r, _ in work]
        extend = [len(t) for _, t in work]
        n1 = self.pool.engram_tail.shape[1]
        for b, ((r, _), p) in enumerate(zip(work, prefix, strict=True)):
            if not self.is_decode([p], [extend[b]], floors):
                M = resumes[b] if resumes else 0
                if M > p:
                    raise ValueError(f"request {r} resumes at {M} with a prefix of {p}")
                replays = bool(M) and M == p  # its first prefill: the replay runs now
                start = self.cfg.replay_floor(M) if replays else p
                hist = self.tokens.get(r, [])[:start]
                tail = ([-1] * n1 + hist)[len(hist) :]
                fold = self.tokens[r][start:p] if replays else None
                self.pool.start_request(r, floors[b] if floors else 0, tail, M, fold)
        out_loc = [
            self._slot(r, p + k)
            for (r, _), p, n in zip(work, prefix, extend, strict=True)
            for k in range(n)
        ]
        self.folds = self.pool.apply_starts()
        self.pool.full_to_swa_index_mapping.copy_(self.mapping)
        self.r2t.copy_(self.req_to_token)
        seq = [p + n for p, n in zip(prefix, extend, strict=True)]
        return prefix, extend, seq, out_loc

    def finish(self, work, seq):
        for (r, toks), s in zip(work, seq, strict=True):
            self.lens[r] = s
            self.tokens[r] = self.tokens.get(r, [])[: s - len(toks)] + list(toks)

    def step(self, work, floors=None, resumes=None):
        """work: list of (request slot r, new token ids) -> next-token logits fp32 [B, V].
        floors: per request of `work`, its decoder replay floor (set when it starts a prefill);
        resumes: per request, the prefix length it resumed at by a replay (every prefill of the
        request names it; the one whose prefix is that length runs the replay), or 0."""
        return self.forward(*self.prepare(work, floors, resumes))

    def prepare(self, work, floors=None, resumes=None):
        """The host part of a step: bookkeeping and the batch's tensors -> (ids, ctx, last)."""
        d = self.dev
        prefix, extend, seq, out_loc = self.admit(work, floors, resumes)
        self.finish(work, seq)
        slots = [r for r, _ in work]
        req_pool = torch.tensor(slots, device=d)
        ids = torch.tensor([t for _, toks in work for t in toks], dtype=torch.int64, device=d)
        seq_t = torch.tensor(seq, device=d)
        out_t = torch.tensor(out_loc, device=d)
        last = torch.cumsum(torch.tensor(extend, device=d), 0) - 1
        floors_t = self.pool.floor[req_pool]
        resume = self.pool.resume[req_pool] if self.pool.prefix_replay else None
        if self.is_decode(prefix, extend, floors):
            ctx = decode_context(
                req_pool, seq_t, out_t, self.r2t, floors_t, self.table_len(seq), resume
            )
            return ids, ctx, last
        prefix, extend, out_t, fold = fold_batch(
            prefix, extend, slots, ids, out_t, self.folds, self.r2t
        )
        rows = build_rows(prefix, extend, d)
        ctx = BatchContext(
            rows=rows,
            req_pool=req_pool,
            req_to_token=self.r2t,
            seq_lens=seq_t,
            table_len=max(seq),
            floors=floors_t,
            out_loc=out_t,
            replaying=bool((rows.pos < floors_t[rows.req]).any()),
            max_slots=slots_bound(seq),
            resume=resume,
            swa_floors=self.pool.swa_floor[req_pool] if resume is not None else None,
            fold=fold,
        )
        return ids, ctx, last

    def forward(self, ids, ctx, last):
        """The device part of a step: the layer loop and the head of each request's last row
        (fp32 logits, fp64 for a float64 model)."""
        if ctx.fold is not None:
            h = run_layers(self.model, ctx.fold.input_ids, ctx, self.pool)[ctx.fold.keep]
        else:
            h = run_layers(self.model, ids, ctx, self.pool)
        return upcast(self.model.head(h[last]))


def serve(engine, prompts, new, chunk=None, floors=None, logits_out=None):
    """Greedy tokens for all prompts in one batch; prefill in chunks of `chunk` tokens.
    logits_out: a list with one list per prompt, to receive the logits row [V] of each step."""
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
                if logits_out is not None:
                    logits_out[r - 1].append(row)
                del todo[r]
    nxt = [first[r] for r in range(1, len(prompts) + 1)]
    for _ in range(new):
        for b, t in enumerate(nxt):
            outs[b].append(t)
        if len(outs[0]) == new:
            break
        logits = engine.step([(r, [t]) for r, t in enumerate(nxt, start=1)])
        nxt = logits.argmax(-1).tolist()
        if logits_out is not None:
            for b, row in enumerate(logits):
                logits_out[b].append(row)
    return outs


def toy_model(cfg: DeepseekV41Config | None = None, seed: int = 0):
    """The oracle's model with random weights (default: the tiny preset) and sinks drawn away from
    zero, so the sink's term shows in every test that uses it."""
    from sglang_dsv41.config import preset
    from sglang_dsv41.reference.model import ReferenceModel

    torch.manual_seed(seed)
    m = ReferenceModel(cfg or preset("tiny")).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("attn_sink"):
                p.normal_(0, 0.1)
    return m


def prompts(n_list, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 512, (n,), generator=g).tolist() for n in n_list]
