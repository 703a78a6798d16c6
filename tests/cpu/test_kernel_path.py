"""The kernel serving path (sglang_dsv41/serving) equals the torch serving path on CPU.

A toy scheduler (paged slots, shuffled pages) drives the tiny model through the torch serving
path; at every attention layer of every forward a probe runs both implementations of each step
on copies of the live pool and compares: SWA records (bytes) and the SWA keys read back, main-KV /
index-K / pending entries (bytes), top-k sets (sorted: the kernels' order is unspecified), and
attention outputs (fp32 rounding). Then the kernel path's own layer loop generates greedy tokens
equal to the reference's, and (subprocess, TRITON_INTERPRET=1) with the Triton stores and
attention forced on, within bf16 error.
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

sys.modules.setdefault("sglang", None)  # the pieces under test must not need SGLang

from sglang_dsv41.config import FULL, preset  # noqa: E402
from sglang_dsv41.kv.records import Layout, unpack  # noqa: E402
from sglang_dsv41.layers.sparse_attention import sparse_attention  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.serving import kernel_path as kp  # noqa: E402
from sglang_dsv41.serving import layer_loop as kp_loop  # noqa: E402
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve  # noqa: E402
from sglang_dsv41.sglang import layer_loop  # noqa: E402
from sglang_dsv41.sglang import serving_attention as sa  # noqa: E402

if sys.modules.get("sglang", 0) is None:  # the imports above ran without SGLang; let
    del sys.modules["sglang"]  # later test modules (upstream parity) import the real one


def make_model():
    torch.manual_seed(0)
    m = ReferenceModel(preset("tiny")).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("attn_sink"):
                p.normal_(0, 0.1)
    return m


@pytest.fixture(scope="module")
def model():
    return make_model()


def _pool_equal(a, b, what):
    for name in ("swa",):
        for i, (x, y) in enumerate(zip(getattr(a, name), getattr(b, name), strict=False)):
            if x is not None:
                assert torch.equal(x, y), (what, name, i)
    for name in ("ring", "main", "index_k", "pending"):
        for k in getattr(a, name):
            assert torch.equal(getattr(a, name)[k], getattr(b, name)[k]), (what, name, k)


class Probe:
    """Wraps serving_attention.attention_layer: compares each kernel-path step, then runs it."""

    def __init__(self):
        self.counts = dict(compress=0, swa=0, topk=0, attend=0, entries=0, reads=0)

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        cfg, i = attn.cfg, attn.layer_id
        if attn.role == FULL:
            xa, ra = (x, rows) if x_all is None else (x_all, rows_all)
            p_ref, p_new = copy.deepcopy(pool), copy.deepcopy(pool)
            sa.compress(attn, xa, ra, ctx, p_ref)
            kp.compress(attn, xa, ra, ctx, p_new)
            _pool_equal(p_ref, p_new, ("compress", i))
            self.counts["compress"] += 1
            self.counts["entries"] += int(((ra.pos + 1) % attn.ratio == 0).sum())
        if rows.n:
            q, q_lora = attn.query(x, rows.pos)
            p_ref, p_new = copy.deepcopy(pool), copy.deepcopy(pool)
            if attn.role == FULL:  # the state attention_layer sees after its compress
                sa.compress(attn, xa, ra, ctx, p_ref)
                sa.compress(attn, xa, ra, ctx, p_new)
            k_swa, ok = sa.swa_keys(attn, x, rows, ctx, p_ref, floor)
            swa = kp.write_swa(attn, x, rows, ctx, p_new, floor)
            _pool_equal(p_ref, p_new, ("write_swa", i))
            cache, slots = swa
            assert torch.equal(slots >= 0, ok), i
            got = unpack(Layout.V41, cache[slots.clamp_min(0).long()])
            assert torch.equal(got[ok], k_swa[ok]), i
            self.counts["swa"] += 1
            self.counts["reads"] += int(ok.sum())
            if attn.indexer is not None:
                shared = dict(ctx.shared)
                ref = sa.select_topk(attn, x, q_lora, rows, ctx, p_ref)
                ctx.shared.clear()
                ctx.shared.update(shared)  # serving_attention's call may add its own keys
                new = kp.select_topk(attn, x, q_lora, rows, ctx, p_new)
                assert new.dtype == torch.int64 and new.shape == ref.shape
                assert torch.equal(new.sort(-1).values, ref.sort(-1).values), i
                self.counts["topk"] += 1
        y = sa.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        if rows.n:
            topk = None
            k_top = torch.zeros(rows.n, 0, cfg.head_dim)
            top_ok = torch.zeros(rows.n, 0, dtype=torch.bool)
            if attn.ratio:
                topk = ctx.shared[("topk", cfg.index_source_of(i))][rows.ids]
                k_top, top_ok = sa.gather_topk(attn, topk, rows, ctx, pool)
            o_ref = sparse_attention(q, k_swa, ok, k_top, top_ok, attn.attn_sink, attn.scale)
            o_new = kp.attend(attn, q, topk, rows, ctx, p_new, swa)
            torch.testing.assert_close(o_new, o_ref, rtol=1e-5, atol=1e-6)
            self.counts["attend"] += 1
        return y


@torch.no_grad()
@pytest.mark.parametrize("ring", [False, True])
def test_each_step_equals_serving_attention(model, monkeypatch, ring):
    probe = Probe()
    ps = prompts([3, 23, 57], seed=7 + ring)
    W = model.cfg.sliding_window
    floors = [max(0, len(p) - W) for p in ps] if ring else None
    eng = ToyEngine(
        model, functools.partial(layer_loop.run_layers, attention=probe), decoder_ring=ring, seed=3
    )
    serve(eng, ps, 3, chunk=7, floors=floors)
    c = probe.counts
    assert c["compress"] and c["topk"] and c["attend"] and c["entries"] > 20, c


@torch.no_grad()
def test_kernel_layer_loop_generates_reference_tokens(model):
    ps = prompts([1, 20, 41, 66])
    got = serve(ToyEngine(model, kp_loop.run_layers), ps, 4, chunk=9)
    for p, g in zip(ps, got, strict=False):
        assert g == model.generate(p, 4, replay=False), len(p)
    ps = prompts([10, 37], seed=9)
    W = model.cfg.sliding_window
    eng = ToyEngine(model, kp_loop.run_layers, decoder_ring=True)
    got = serve(eng, ps, 4, chunk=7, floors=[max(0, len(p) - W) for p in ps])
    for p, g in zip(ps, got, strict=False):
        assert g == model.generate(p, 4, replay=True), len(p)


_INTERP = textwrap.dedent("""
    import sys, torch
    sys.modules.setdefault("sglang", None)
    sys.path.insert(0, %r)
    from sglang_dsv41.kernels import dispatch
    dispatch.device_paths = lambda device: (dispatch.Path.TRITON,)  # Triton on CPU tensors
    import test_kernel_path as t
    from sglang_dsv41.serving import layer_loop
    m = t.make_model()
    ps = t.prompts([21], seed=2)
    with torch.no_grad():
        got = t.serve(t.ToyEngine(m, layer_loop.run_layers), ps, 2)
        ref = [m.generate(p, 2, replay=False) for p in ps]
    print("GOT", got, "REF", ref)
    assert got == ref
    print("INTERP_OK")
""")


def test_kernel_path_under_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = _INTERP % os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert "INTERP_OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


_INTERP_INDEXER = textwrap.dedent("""
    import functools, sys, torch
    sys.modules.setdefault("sglang", None)
    sys.path.insert(0, %r)
    from sglang_dsv41.kernels import dispatch
    dispatch.device_paths = lambda device: (dispatch.Path.TRITON,)  # Triton on CPU tensors
    _select = dispatch.select  # ... for the indexer only (the rest as in serving_attention)
    dispatch.select = lambda op, dev, fast: (
        _select(op, dev, fast) if op.startswith("indexer.") else dispatch.Path.REF
    )
    import test_kernel_path as t
    from sglang_dsv41.config import preset
    from sglang_dsv41.reference.model import ReferenceModel
    from sglang_dsv41.sglang import layer_loop
    cfg = preset("tiny")  # indexer shapes the Triton indexer takes: DI 128, HI 16, blocks of 8
    cfg.index_head_dim, cfg.index_n_heads, cfg.candidate_block_size = 128, 16, 8
    torch.manual_seed(0)
    m = ReferenceModel(cfg).eval()
    probe = t.Probe()
    run = functools.partial(layer_loop.run_layers, attention=probe)
    with torch.no_grad():
        t.serve(t.ToyEngine(m, run), t.prompts([75], seed=4), 1, chunk=40)
    print(probe.counts)
    assert probe.counts["topk"] >= 10
    print("INTERP_OK")
""")


def test_triton_indexer_in_serving_under_interpreter():
    """The Triton indexer (full_topk, candidate_source, reindex over page-size-1 entry tables)
    picks serving_attention's top-k sets at every indexer layer of a chunked prefill.
    DSV41_FORCE_FAST: a call the Triton path does not take raises instead of running the ref."""
    pytest.importorskip("triton")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "DSV41_FORCE_FAST": "1",
    }
    code = _INTERP_INDEXER % os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert "INTERP_OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
