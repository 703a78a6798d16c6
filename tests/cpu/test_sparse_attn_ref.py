"""Sparse attention reference vs brute force, slot-list helpers, CPU dispatch, interpreted
Triton."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.sparse_attn import (
    entry_slots,
    sparse_attention,
    sparse_attention_ref,
    swa_window_slots,
)
from sglang_dsv41.kv.records import Layout, pack, unpack


def _brute(q, swa, sw, kv, tk, layout, sink, scale):
    """Per token and head: explicit entry list, one softmax in float64, sink unscaled with value
    0."""
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        keys = [unpack(Layout.V41, swa[s]) for s in sw[t].tolist() if s >= 0]
        keys += [unpack(layout, kv[s]) for s in tk[t].tolist() if s >= 0]
        for h in range(H):
            logits = [float(q[t, h].double() @ k.double()) * scale for k in keys]
            extra = [float(sink[h])] if sink is not None else []
            if not logits and not extra:
                continue
            m = max(logits + extra)
            w = [math.exp(v - m) for v in logits]
            den = sum(w) + sum(math.exp(v - m) for v in extra)
            for wi, k in zip(w, keys, strict=False):
                out[t, h] += wi / den * k.double()
    return out


def _case(T=4, H=3, D=64, W=5, TOPK=7, S=24, layout=Layout.V41_FP4):
    swa = pack(Layout.V41, torch.randn(S, D) * 2)
    kv = pack(layout, torch.randn(S, D) * 2)
    q = torch.randn(T, H, D)
    sw = torch.randint(0, S, (T, W), dtype=torch.int32)
    tk = torch.randint(0, S, (T, TOPK), dtype=torch.int32)
    sw[0, :2] = -1  # short sequence
    tk[1, 3:] = -1  # top-k larger than the visible entries
    sw[2] = -1
    tk[2] = -1  # sees nothing
    return q, swa, sw, kv, tk


@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("with_sink", [True, False])
def test_reference_vs_brute_force(layout, with_sink):
    q, swa, sw, kv, tk = _case(layout=layout)
    sink = torch.randn(q.shape[1]) if with_sink else None
    scale = q.shape[-1] ** -0.5
    bundle = SparseKV(swa, sw, kv, tk, layout)
    ref = sparse_attention_ref(q, bundle, sink, scale, torch.float64, chunk=3)
    torch.testing.assert_close(
        ref, _brute(q, swa, sw, kv, tk, layout, sink, scale), rtol=1e-5, atol=1e-6
    )
    assert (ref[2] == 0).all()


def test_sink_lowers_the_mass():
    q, swa, sw, kv, tk = _case()
    bundle = SparseKV(swa, sw, kv, tk, Layout.V41_FP4)
    o0 = sparse_attention_ref(q, bundle, None, None, torch.float32)
    big = sparse_attention_ref(q, bundle, torch.full((3,), 60.0), None, torch.float32)
    assert o0[0].abs().sum() > 0 and big.abs().max() < 1e-12


def test_swa_only_and_dispatch_on_cpu():
    q, swa, sw, kv, tk = _case()
    bundle = SparseKV(swa, sw, None, None, Layout.V41_FP4)
    a = sparse_attention(q, bundle, None, out_dtype=torch.float32)
    b = sparse_attention_ref(q, bundle, None, out_dtype=torch.float32)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_reference_is_the_oracle_formula():
    """The reference gathers records and calls layers.sparse_attention: same values, bit for
    bit, as the oracle's formula on the dequantized keys."""
    from sglang_dsv41.layers.sparse_attention import sparse_attention as formula

    q, swa, sw, kv, tk = _case(H=2)
    sink = torch.randn(2)
    got = sparse_attention_ref(q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4), sink, None)
    k_swa = unpack(Layout.V41, swa[sw.clamp_min(0).long()])
    k_top = unpack(Layout.V41_FP4, kv[tk.clamp_min(0).long()])
    want = formula(q, k_swa, sw >= 0, k_top, tk >= 0, sink, q.shape[-1] ** -0.5)
    assert torch.equal(got, want)


def test_swa_window_slots_vs_brute_force():
    B, L, W = 3, 20, 6
    req_to_slot = torch.randperm(B * L).view(B, L).to(torch.int32)
    req_to_slot[1, 4] = -1
    req_index = torch.tensor([0, 1, 1, 2, 2])
    pos = torch.tensor([2, 9, 4, 19, 12])
    floor = torch.tensor([0, 7, 0, 15, 0])
    got = swa_window_slots(req_to_slot, req_index, pos, W, floor)
    for t in range(5):
        for w in range(W):
            p = pos[t].item() - W + 1 + w
            want = req_to_slot[req_index[t], p].item() if p >= floor[t].item() else -1
            assert got[t, w].item() == want, (t, w)
    assert got.dtype == torch.int32


def test_entry_slots():
    req_to_entry = torch.arange(40, dtype=torch.int32).view(2, 20) + 100
    topk = torch.tensor([[3, -1, 0], [19, 5, -1]])
    got = entry_slots(req_to_entry, torch.tensor([1, 0]), topk)
    assert got.tolist() == [[123, -1, 120], [19 + 100, 105, -1]]


_INTERP = textwrap.dedent("""
    import torch
    from sglang_dsv41.kernels.sparse_attn import triton as tri
    from sglang_dsv41.kernels.args import SparseKV
    from sglang_dsv41.kernels.sparse_attn.ref import sparse_attention_ref
    from sglang_dsv41.kv.records import Layout, pack
    torch.manual_seed(0)
    D, H, T, W, TOPK, S = 64, 8, 3, 10, 20, 40
    for layout in (Layout.V41_FP4, Layout.V41):
        for ns in (1, 3):
            swa = pack(Layout.V41, torch.randn(S, D))
            kv = pack(layout, torch.randn(S, D))
            q = torch.randn(T, H, D).to(torch.bfloat16)
            sw = torch.randint(0, S, (T, W), dtype=torch.int32)
            sw[0, :4] = -1
            sw[2] = -1
            tk = torch.randint(0, S, (T, TOPK), dtype=torch.int32)
            tk[1, 5:] = -1
            tk[2] = -1
            sink = torch.randn(H) if ns == 1 else None
            bundle = SparseKV(swa, sw, kv, tk, layout)
            ref = sparse_attention_ref(q, bundle, sink, None, torch.float32)
            out = torch.full((T, H, D), float("nan"))
            tri.sparse_attention(q, swa, sw, kv, tk, layout is Layout.V41_FP4, sink, D ** -0.5,
                                 out, num_splits=ns, block_n=16)
            err = ((out - ref).norm() / ref.norm()).item()
            print(layout.name, ns, err)
            assert err < 1e-5 and (out[2] == 0).all()
""")


def test_triton_attention_interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, "-c", _INTERP], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
