"""Attention views and head slicing, on the served cached path (serving.attention).

1. A view of all heads (`full_view`) is the layer itself: swapped in for every layer, the toy
   scheduler generates the same tokens and every layer's output is bit-identical.
2. Tensor parallelism by heads: 64 heads computed as 8 ranks x 8 local heads (sink, wq_b rows,
   wo_a groups and wo_b columns sliced by `local_heads`), the 8 partial outputs summed, equals
   the 64-head layer at every attention layer of a chunked prefill and decode (fp32 rounding),
   and every rank selects the same top-k (the indexer is replicated).
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch

sys.modules.setdefault("sglang", None)  # the pieces under test must not need SGLang

from sglang_dsv41.config import preset  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.serving import attention as kp  # noqa: E402
from sglang_dsv41.serving import layer_loop  # noqa: E402
from sglang_dsv41.serving.attention_view import full_view, head_slice, local_heads  # noqa: E402
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve  # noqa: E402

if sys.modules.get("sglang", 0) is None:
    del sys.modules["sglang"]

from forward_state import snapshot  # noqa: E402

TP = 8


def _model(heads: int):
    torch.manual_seed(0)
    cfg = preset("tiny")
    cfg.num_attention_heads, cfg.o_groups = heads, 8
    m = ReferenceModel(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("attn_sink"):
                p.normal_(0, 0.5)
    return m


class TPProbe:
    """At each attention call: the layer on a copy of the state, the TP ranks on copies of
    the same state (summed), compared; then the real call."""

    def __init__(self):
        self.calls = self.topk_checks = 0

    def _run(self, attn, x, rows, ctx, pool, floor, x_all, rows_all):
        pool, shared = copy.deepcopy(pool), snapshot(ctx.shared)
        y = kp.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        topk = dict(ctx.shared.topk)
        ctx.shared = shared
        return y, topk

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        args = (x, rows, ctx, pool, floor, x_all, rows_all)
        want, want_topk = self._run(attn, *args)
        parts = [self._run(local_heads(attn, TP, r), *args) for r in range(TP)]
        got = torch.stack([p[0] for p in parts]).sum(0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        for _, topk in parts[1:]:
            assert topk.keys() == parts[0][1].keys()
            for k in topk:
                assert torch.equal(topk[k], parts[0][1][k]), k  # every rank, the same top-k
                self.topk_checks += 1
        for k in want_topk:
            assert torch.equal(parts[0][1][k].sort(-1).values, want_topk[k].sort(-1).values), k
        self.calls += 1
        return kp.attention_layer(attn, *args)


@torch.no_grad()
def test_full_view_is_the_layer(monkeypatch):
    m = _model(4)
    ps = prompts([9, 30], seed=3)
    monkeypatch.setattr(layer_loop, "attention_layer", kp.attention_layer)
    want = serve(ToyEngine(m), ps, 3, chunk=11)
    calls = []

    def viewed(attn, *args):
        calls.append(attn.layer_id)
        return kp.attention_layer(full_view(attn), *args)

    monkeypatch.setattr(layer_loop, "attention_layer", viewed)
    got = serve(ToyEngine(m), ps, 3, chunk=11)
    assert got == want and calls  # the views served


@torch.no_grad()
def test_64_heads_as_8_ranks_of_8(monkeypatch):
    m = _model(64)
    probe = TPProbe()
    monkeypatch.setattr(layer_loop, "attention_layer", probe)
    eng = ToyEngine(m)
    serve(eng, prompts([5, 26], seed=4), 2, chunk=9)
    n_layers = m.cfg.num_hidden_layers
    assert probe.calls >= 4 * n_layers and probe.topk_checks > 0, (probe.calls, probe.topk_checks)


def test_slices_name_the_field():
    assert head_slice(64, 8, 3) == slice(24, 32)
    with pytest.raises(ValueError, match="num_attention_heads 64 .* attention TP 6"):
        head_slice(64, 6, 0)
