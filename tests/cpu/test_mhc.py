"""mHC: hand-computed values, a scalar-loop reference, Sinkhorn convergence, the delayed pre."""

import math

import pytest
import torch
from torch import nn

from sglang_dsv41.layers.mhc import (
    add_hc_params,
    hc_collapse,
    hc_expand,
    hc_mix,
    hc_post,
    hc_sublayer,
    mix_width,
    sinkhorn,
)
from sglang_dsv41.layers.norm import rms_norm

EPS = 1e-6


def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def _scalar_mix(H, fn, base, scale, iters, eps, rms_eps):
    """Python-float loops for one token: H list[S][d], fn list[W][S*d]."""
    S, d = len(H), len(H[0])
    x = [H[j][c] for j in range(S) for c in range(d)]
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + rms_eps)
    m = [sum(fn[w][k] * x[k] for k in range(S * d)) * r for w in range(len(fn))]
    pre = [_sig(m[j] * scale[0] + base[j]) + eps for j in range(S)]
    post = [2 * _sig(m[S + j] * scale[1] + base[S + j]) for j in range(S)]
    z = [
        [m[2 * S + j * S + i] * scale[2] + base[2 * S + j * S + i] for i in range(S)]
        for j in range(S)
    ]
    c = []
    for row in z:
        mx = max(row)
        e = [math.exp(v - mx) for v in row]
        c.append([v / sum(e) + eps for v in e])

    def colnorm(c):
        cs = [sum(c[j][i] for j in range(S)) + eps for i in range(S)]
        return [[c[j][i] / cs[i] for i in range(S)] for j in range(S)]

    c = colnorm(c)
    for _ in range(iters - 1):
        c = [[v / (sum(row) + eps) for v in row] for row in c]
        c = colnorm(c)
    return pre, post, c


def test_hand_computed_zero_fn():
    """fn = 0: m = 0, so pre = sigmoid(base)+eps, post = 2 sigmoid(base), C from base alone.
    With comb base 0 every C entry is 1/2 up to eps; H'_i = post_i y + (H_0 + H_1) / 2."""
    S, d = 2, 3
    fn = torch.zeros(mix_width(S), S * d)
    base = torch.zeros(mix_width(S))
    base[:4] = torch.tensor([0.0, math.log(3.0), 0.0, -math.log(3.0)])
    scale = torch.tensor([1.0, 1.0, 1.0])
    H = torch.tensor([[[1.0, 2.0, 3.0], [5.0, -2.0, 1.0]]])  # [1, 2, 3]
    pre, post, C = hc_mix(H, fn, base, scale, iters=20, hc_eps=EPS, rms_eps=1e-6)
    torch.testing.assert_close(pre[0], torch.tensor([0.5 + EPS, 0.75 + EPS]))
    torch.testing.assert_close(post[0], torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(C[0], torch.full((2, 2), 0.5), atol=1e-5, rtol=0)
    y = torch.tensor([[10.0, 0.0, -10.0]])
    out = hc_post(y, H, post, C)
    want = torch.tensor([[[13.0, 0.0, -8.0], [8.0, 0.0, -3.0]]])
    torch.testing.assert_close(out, want, atol=1e-4, rtol=0)
    # collapse with pre = [0.5, 0.75]: 0.5 H_0 + 0.75 H_1
    torch.testing.assert_close(
        hc_collapse(H, pre)[0], torch.tensor([4.25, -0.5, 2.25]), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("S,d,seed", [(2, 3, 0), (4, 5, 1), (4, 8, 2)])
def test_mix_matches_scalar_loops(S, d, seed):
    g = torch.Generator().manual_seed(seed)
    T = 3
    H = torch.randn(T, S, d, generator=g)
    fn = torch.randn(mix_width(S), S * d, generator=g) * 0.5
    base = torch.randn(mix_width(S), generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    pre, post, C = hc_mix(H, fn, base, scale, iters=20, hc_eps=EPS, rms_eps=1e-6)
    for t in range(T):
        p, q, c = _scalar_mix(
            H[t].tolist(), fn.tolist(), base.tolist(), scale.tolist(), 20, EPS, 1e-6
        )
        torch.testing.assert_close(pre[t], torch.tensor(p), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(post[t], torch.tensor(q), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(C[t], torch.tensor(c), atol=1e-5, rtol=1e-5)
    y = torch.randn(T, d, generator=g)
    out = hc_post(y, H, post, C)
    for t in range(T):
        for i in range(S):
            want = post[t, i] * y[t] + sum(C[t, j, i] * H[t, j] for j in range(S))
            torch.testing.assert_close(out[t, i], want, atol=1e-5, rtol=1e-5)


def test_sinkhorn_doubly_stochastic():
    """Columns are normalized last (exact up to eps); rows converge with the iterations: at
    20 iterations (V4.1's hc_sinkhorn_iters) within 5e-3 for unit-scale logits (measured
    1.8e-3 over 4096 draws), within 1e-5 after 100."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(256, 4, 4, generator=g)
    for iters, tol in ((20, 5e-3), (100, 1e-5)):
        C = sinkhorn(logits, iters, EPS)
        assert (C > 0).all()
        torch.testing.assert_close(C.sum(-2), torch.ones(256, 4), atol=1e-5, rtol=0)  # columns
        torch.testing.assert_close(C.sum(-1), torch.ones(256, 4), atol=tol, rtol=0)  # rows
    # 1 iteration is visibly not doubly stochastic: the row check above can fail.
    assert (sinkhorn(logits, 1, EPS).sum(-1) - 1).abs().max() > 1e-2


def test_sinkhorn_2x2_closed_form():
    """Scaling rows/columns keeps the cross ratio k00 k11 / (k01 k10); the doubly stochastic
    2x2 limit is [[a, 1-a], [1-a, a]] with (a / (1-a))^2 equal to it."""
    z = torch.tensor([[[1.0, -0.5], [0.25, 0.75]]])
    cross = math.exp(1.0 + 0.75 - (-0.5) - 0.25)
    a = math.sqrt(cross) / (1 + math.sqrt(cross))
    C = sinkhorn(z, 50, 0.0)
    torch.testing.assert_close(C[0], torch.tensor([[a, 1 - a], [1 - a, a]]), atol=1e-6, rtol=0)


def test_expand_collapse():
    h = torch.randn(5, 7)
    H = hc_expand(h, 4)
    assert H.shape == (5, 4, 7)
    torch.testing.assert_close(hc_collapse(H, None), h)  # first sublayer: [1, 0, 0, 0]
    H2 = H + torch.randn(5, 4, 7)
    pre = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(5, 4)
    torch.testing.assert_close(hc_collapse(H2, pre), hc_collapse(H2, None))
    torch.testing.assert_close(hc_collapse(H2, torch.full((5, 4), 0.25)), H2.mean(1))


def test_delayed_pre_reaches_the_next_sublayer():
    """Two hyper-connections (attention, FFN): the FFN's input is built with the attention
    hyper-connection's pre, and the attention's input with the pre given (None = stream 0)."""
    S, d, T = 4, 6, 3
    g = torch.Generator().manual_seed(4)
    m = nn.Module()
    add_hc_params(m, "hc_attn", S, d)
    add_hc_params(m, "hc_ffn", S, d)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    w = torch.rand(d, generator=g) + 0.5
    seen = []

    def norm(x):
        return rms_norm(x, w, 1e-6)

    def sub(x):
        seen.append(x.clone())
        return x * 2.0 + 1.0

    kw = dict(iters=20, hc_eps=EPS, rms_eps=1e-6)
    H0 = torch.randn(T, S, d, generator=g)
    H1, pre_a = hc_sublayer(m, "hc_attn", H0, None, norm, sub, **kw)
    H2, pre_f = hc_sublayer(m, "hc_ffn", H1, pre_a, norm, sub, **kw)
    torch.testing.assert_close(seen[0], norm(H0[:, 0]))
    torch.testing.assert_close(seen[1], norm(hc_collapse(H1, pre_a)))
    own_pre = hc_mix(H1, m.hc_ffn_fn, m.hc_ffn_base, m.hc_ffn_scale, **kw)[0]
    assert (seen[1] - norm(hc_collapse(H1, own_pre))).abs().max() > 1e-3
    torch.testing.assert_close(pre_f, own_pre)  # returned for the *next* sublayer
    pa, post_a, C_a = hc_mix(H0, m.hc_attn_fn, m.hc_attn_base, m.hc_attn_scale, **kw)
    torch.testing.assert_close(pa, pre_a)
    torch.testing.assert_close(H1, hc_post(sub(norm(H0[:, 0])), H0, post_a, C_a))


def test_residual_interface_equals_hc_sublayer():
    """MhcResidual (what the reference model and blocks use) runs the same four steps."""
    from types import SimpleNamespace

    from sglang_dsv41.layers.mhc import MhcResidual
    from sglang_dsv41.layers.norm import RMSNorm

    S, d, T = 4, 6, 5
    cfg = SimpleNamespace(hc_mult=S, hc_sinkhorn_iters=20, hc_eps=EPS, rms_norm_eps=1e-6)
    g = torch.Generator().manual_seed(5)
    block = nn.Module()
    add_hc_params(block, "hc_attn", S, d)
    add_hc_params(block, "hc_ffn", S, d)
    block.attn_norm, block.ffn_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    res = MhcResidual(cfg)
    emb = torch.randn(T, d, generator=g)
    state = res.init(emb)
    kw = dict(iters=20, hc_eps=EPS, rms_eps=1e-6)
    H, pre = hc_expand(emb, S), None
    for _ in range(2):  # two blocks sharing parameters
        x = res.attn_input(state, block)
        state = res.attn_done(state, block, torch.tanh(x))
        x = res.ffn_input(state, block)
        state = res.ffn_done(state, block, x * 0.5)
        H, pre = hc_sublayer(block, "hc_attn", H, pre, block.attn_norm, torch.tanh, **kw)
        H, pre = hc_sublayer(block, "hc_ffn", H, pre, block.ffn_norm, lambda v: v * 0.5, **kw)
    torch.testing.assert_close(state[0], H)
    torch.testing.assert_close(state[1], pre)
    torch.testing.assert_close(res.final(state), hc_collapse(H, pre))
    sel = res.select(state, torch.tensor([4, 1]))
    torch.testing.assert_close(sel[0], H[[4, 1]])
