"""The CUDA model (SGLang's in-tree V4 skeleton with our attention), built and loaded on CPU.

For the released-format flash-mini checkpoint (every role, mHC on every layer, Engram on layers
1 and 14, FP8 blocks, packed-FP4 experts):
  - our `cuda_model.DeepseekV41ForCausalLM` builds (tests/cpu/intree_cpu.py says what that takes
    on a CPU) with `DSV41CudaAttention` in every layer and the replay tail wired as specified;
  - after SGLang's own `load_weights`, every in-tree parameter, dequantized
    (`intree_weights.dense_view`), equals our dequantizing loader's tensor of the same name,
    exactly, and every parameter is read by that map;
  - the adapter hands our attention exactly our model's weights: at every attention call of a
    chunked prefill and decode through the served cached path, the adapter over the in-tree
    layer (dequantized to fp32) gives our layer's output bit for bit, for every role;
  - `DSV41CudaAttention.forward`, driven as SGLang's in-tree layer loop drives it (batch context
    from the backend, replay tail entered at the decoder kv source), equals our layer loop's
    attention bit for bit (the adapter dequantized; the forward's kernels are CPU references).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.models.deepseek_v4")

from forward_state import same, snapshot  # noqa: E402
from intree_cpu import build_cuda_model, init_sglang_cpu, load  # noqa: E402

from sglang_dsv41.config import FULL, REINDEX, REUSE, SWA  # noqa: E402
from sglang_dsv41.layers.attention import set_attention_dtype  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.serving import attention as kp  # noqa: E402
from sglang_dsv41.serving import layer_loop  # noqa: E402
from sglang_dsv41.serving.intree_adapter import adapt  # noqa: E402
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve  # noqa: E402
from sglang_dsv41.sglang.replay_tail import LateLayerTailMixin  # noqa: E402
from sglang_dsv41.testing import assert_pools_equal  # noqa: E402
from sglang_dsv41.tools.release_checkpoint import write_flash_mini  # noqa: E402
from sglang_dsv41.weights.checkpoint import load_release_state  # noqa: E402
from sglang_dsv41.weights.intree import dense_view  # noqa: E402


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return write_flash_mini(tmp_path_factory.mktemp("flash_mini_intree"))


@pytest.fixture(scope="module")
def built(mini):
    from sglang.srt.runtime_context import restore_context, snapshot_context

    from sglang_dsv41.sglang import options

    saved, served = snapshot_context(), options.served()
    init_sglang_cpu(mini)
    model = build_cuda_model(mini)  # registers its ServingOptions (as serving does)
    load(model, mini)
    yield model
    restore_context(saved)
    options.register_served(served)


@pytest.fixture(scope="module")
def ours(mini):
    return ReferenceModel.from_pretrained(str(mini), torch.float32)


def test_builds_with_our_attention_and_tail(built):
    from sglang_dsv41.sglang.cuda_attention import DSV41CudaAttention

    cfg = built.dsv41_cfg
    layers = built.model.layers
    assert len(layers) == cfg.num_hidden_layers
    assert all(type(layer.self_attn) is DSV41CudaAttention for layer in layers)
    assert type(layers[0]).__name__ == "DSV41DecoderLayer"
    assert built.model.late_layer_start == cfg.decoder_start == max(cfg.kv_source_layer_ids)
    assert built.model.tail_writes_source_kv and built.model.decoder_replay_tail is None
    import sglang.srt.models.deepseek_v4 as intree

    assert intree.DeepseekV4DecoderLayer.__name__ != "DSV41DecoderLayer"  # restored
    # the in-tree model's attention I/O default: bf16, as SGLang's V4 attention
    assert built.options.attn_dtype is torch.bfloat16
    assert all(layer.self_attn.attn_dtype is torch.bfloat16 for layer in layers)
    for i in range(cfg.num_hidden_layers):
        a = layers[i].self_attn
        assert (a.compressor is not None) == (cfg.role(i) == FULL), i
        assert (a.indexer is not None) == (i in cfg.index_source_layer_ids), i
        assert (a.indexer is not None and hasattr(a.indexer, "wk")) == (cfg.role(i) == FULL), i


def test_weights_equal_our_loader_for_every_kind(built, mini):
    cfg = built.dsv41_cfg
    view, unread = dense_view(built, cfg)
    assert unread == []
    want = load_release_state(str(mini), cfg, torch.float32)
    assert set(view) == set(want)
    kinds = set()
    for name, t in want.items():
        got = view[name]
        assert got.shape == t.shape and torch.equal(got, t.float()), name
        kinds.add(name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1])
    assert {"wq_a", "wkv", "wo_a", "w1", "w2", "embed", "hc_attn_fn", "attn_sink"} <= kinds
    assert "layers.3.attn.compressor.wkv.weight" not in view  # Reuse: no compressor
    assert "layers.24.attn.indexer.wk.weight" not in view  # Reindex: no index keys


def test_a_broken_map_is_caught(built, mini):
    """The same comparison fails when the map swaps w1 and w3 of the routed experts."""
    cfg = built.dsv41_cfg
    view, _ = dense_view(built, cfg)
    want = load_release_state(str(mini), cfg, torch.float32)
    a, b = "layers.5.ffn.experts.3.w1.weight", "layers.5.ffn.experts.3.w3.weight"
    view[a], view[b] = view[b], view[a]
    assert not torch.equal(view[a], want[a])


class AdapterProbe:
    """At each attention call: our layer and the adapter over the in-tree layer, each on a copy
    of the pool and the cross-layer state, must agree bit for bit."""

    def __init__(self, views):
        self.views, self.roles = views, {}

    def _run(self, attn, args):
        x, rows, ctx, pool, floor, x_all, rows_all = args
        pool, shared = copy.deepcopy(pool), snapshot(ctx.shared)
        y = kp.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        after = ctx.shared
        ctx.shared = shared
        return y, pool, after

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        args = (x, rows, ctx, pool, floor, x_all, rows_all)
        i = attn.layer_id
        y0, p0, s0 = self._run(attn, args)
        y1, p1, s1 = self._run(self.views[i], args)
        assert torch.equal(y0, y1), i
        assert_pools_equal(p0, p1, i)
        assert same(s0, s1), i
        self.roles.setdefault(attn.cfg.role(i), set()).add(i)
        return kp.attention_layer(attn, *args)


@torch.no_grad()
@pytest.mark.parametrize("fused_compressor", [False, True])
def test_adapter_equals_our_layers(built, ours, fused_compressor, monkeypatch):
    cfg = built.dsv41_cfg
    layers = built.model.layers
    for layer in layers:  # fp32 attention I/O, as ours (the bf16 option: the protocol test)
        monkeypatch.setattr(layer.self_attn, "attn_dtype", None)
    swapped = {}
    if fused_compressor:  # the SM100 layout: one wkv_gate [2D, hidden] (rows kv, then gate)
        from sglang.srt.layers.attention.dsv4.dsv41_sparse import DeepseekV41Compressor

        for i in cfg.kv_source_layer_ids:
            old = layers[i].self_attn.compressor
            if cfg.ratio(i) != 2:
                continue
            new = DeepseekV41Compressor(
                cfg.hidden_size, cfg.head_dim, 2, cfg.rms_norm_eps, fused_compress=True
            )
            new.wkv_gate.weight.data = torch.cat((old.wkv.weight, old.wgate.weight))
            new.norm.weight.data = old.norm.weight.data
            swapped[i], layers[i].self_attn.compressor = old, new
    try:
        views = {i: adapt(layers[i].self_attn, cfg, dense=True) for i in range(len(layers))}
    finally:
        for i, old in swapped.items():
            layers[i].self_attn.compressor = old
    assert fused_compressor == bool(swapped)
    probe = AdapterProbe(views)
    monkeypatch.setattr(layer_loop, "attention_layer", probe)
    W = cfg.sliding_window
    ps = prompts([7, 37], seed=6)
    eng = ToyEngine(ours, replay=True, seed=2)  # bounded replay: rings, floors
    serve(eng, ps, 2, chunk=13, floors=[max(0, len(p) - W) for p in ps])
    if not fused_compressor:  # the full forward too
        serve(ToyEngine(ours), ps[1:], 1, chunk=20)
    assert set(probe.roles) == {SWA, FULL, REUSE, REINDEX}
    assert {2, 20, 24} <= probe.roles[FULL] | probe.roles[REINDEX]


class _TailBackend(LateLayerTailMixin):
    """The dsv41 backend's replay-tail members over a toy pool (the base metadata exists)."""

    def __init__(self, pool):
        self.token_to_kv_pool = pool


class ProtocolProbe:
    """Drives `DSV41CudaAttention.forward` the way SGLang's in-tree layer loop does (batch
    context, replay tail entered at the decoder kv source with its input over every row) and
    compares it with our layer on a copy of the state."""

    def __init__(self, layers, cfg, monkeypatch):
        from sglang_dsv41.sglang import cuda_attention

        self.layers, self.cfg, self.calls, self.tails = layers, cfg, 0, 0
        self.backend = None
        monkeypatch.setattr(cuda_attention, "get_attn_backend", lambda: self.backend)
        self.ctx = self.saved = None

    def _start(self, ctx, pool):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        per_request = torch.bincount(ctx.rows.req, minlength=ctx.batch_size)
        decode = bool((per_request == 1).all())
        self.fb = SimpleNamespace(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            dsv41_context=ctx,
            positions=ctx.rows.pos,
            out_cache_loc=ctx.out_loc,
        )
        self.backend = _TailBackend(pool)
        self.backend.init_late_layer_tail(self.fb)
        self.ctx, self.saved = ctx, None

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        i = attn.layer_id
        if ctx is not self.ctx:
            self._start(ctx, pool)
        self.backend.token_to_kv_pool = copy.deepcopy(pool)
        shared = snapshot(ctx.shared)
        layer = self.layers[i].self_attn
        meta = self.backend.tail_forward_metadata
        if i == self.cfg.decoder_start and meta is not None:
            src = x if x_all is None else x_all
            self.backend.write_tail_source_kv(
                layer=layer, x=src, positions=None, forward_batch=self.fb
            )
            self.saved = self.backend.enter_late_layer_tail(self.fb)
            assert self.backend.late_tail.rows.ids.tolist() == rows.ids.tolist()
            self.tails += 1
        got = layer.forward(x, rows.pos, self.fb)
        if i == self.cfg.decoder_start and meta is not None:
            assert self.backend.late_tail.source is None  # the source layer took its x_all
        if i == self.cfg.num_hidden_layers - 1 and self.saved is not None:
            self.backend.exit_late_layer_tail(self.saved, self.fb)
        ctx.shared = shared
        want = kp.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        assert torch.equal(got, want), i
        self.calls += 1
        return want


@torch.no_grad()
@pytest.mark.parametrize("attn_dtype", [None, torch.bfloat16])
def test_forward_follows_the_in_tree_protocol(built, ours, monkeypatch, attn_dtype):
    """attn_dtype: the served option on the in-tree layers (their views take it) and the same
    switch on ours; bf16 rounds q and o on both sides, so the outputs stay equal bit for bit."""
    cfg = built.dsv41_cfg
    layers = built.model.layers
    for layer in layers:
        monkeypatch.setattr(layer.self_attn, "attn_dtype", attn_dtype)
        layer.self_attn._view = adapt(layer.self_attn, cfg, dense=True)
        assert layer.self_attn._view.attn_dtype is attn_dtype
    assert set_attention_dtype(ours, attn_dtype) == cfg.num_hidden_layers
    try:
        probe = ProtocolProbe(layers, cfg, monkeypatch)
        monkeypatch.setattr(layer_loop, "attention_layer", probe)
        W = cfg.sliding_window
        ps = prompts([6, 41], seed=8)
        eng = ToyEngine(ours, replay=True, seed=4)
        serve(eng, ps, 2, chunk=17, floors=[max(0, len(p) - W) for p in ps])
    finally:
        set_attention_dtype(ours, None)
        for layer in layers:
            layer.self_attn._view = None
    assert probe.calls > 3 * cfg.num_hidden_layers and probe.tails >= 3
