"""Decode steps of a ToyEngine through CUDA graphs, one per padded batch size (SGLang's part).

Mirrors SGLang's decode graph runner: static input buffers (token ids, request slots, sequence
lengths, output slots), the batch context built inside the capture (`context.decode_context`,
as the `dsv41` backend's in-graph metadata does), padded rows at request slot 0 and slot 0.
CUDA only.
"""

from __future__ import annotations

import torch

from sglang_dsv41.serving.context import decode_context
from sglang_dsv41.serving.layer_loop import run_layers


class GraphDecoder:
    def __init__(self, engine, sizes):
        self.eng, self.sizes = engine, sorted(sizes)
        d, m = engine.dev, max(sizes)
        self.ids = torch.zeros(m, dtype=torch.int64, device=d)
        self.req_pool = torch.zeros(m, dtype=torch.int64, device=d)
        self.seq = torch.ones(m, dtype=torch.int64, device=d)
        self.out = torch.zeros(m, dtype=torch.int64, device=d)
        self.graphs = {}
        mem = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(bs)  # warm-up: Triton compiles, allocator settles
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=mem):
                out = self._forward(bs)
            self.graphs[bs] = (g, out)

    def _forward(self, bs):
        e = self.eng
        rp = self.req_pool[:bs]
        width = e.req_to_token.shape[1]
        ctx = decode_context(rp, self.seq[:bs], self.out[:bs], e.r2t, e.pool.floor[rp], width)
        h = run_layers(e.model, self.ids[:bs], ctx, e.pool)
        return e.model.head(h).float()

    def step(self, work):
        """work: list of (request slot r, [token]) -> logits fp32 [B, V] (a graph replay)."""
        e = self.eng
        _, _, seq, out_loc = e.admit(work)
        B = len(work)
        bs = next(s for s in self.sizes if s >= B)
        pad = bs - B
        self.ids[:bs].copy_(torch.tensor([t[0] for _, t in work] + [0] * pad))
        self.req_pool[:bs].copy_(torch.tensor([r for r, _ in work] + [0] * pad))
        self.seq[:bs].copy_(torch.tensor(seq + [1] * pad))
        self.out[:bs].copy_(torch.tensor(out_loc + [0] * pad))
        g, out = self.graphs[bs]
        g.replay()
        e.finish(work, seq)
        return out[:B].clone()
