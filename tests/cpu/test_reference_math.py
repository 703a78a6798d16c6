"""Each piece of the oracle against a brute-force loop or a hand-computed case."""

import math

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.attention import MqaAttentionBase
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.index_math import (
    candidate_blocks,
    index_scores,
    pool_mask,
    topk_indices,
    visible_mask,
)
from sglang_dsv41.layers.rope import apply_rope, rope_inv_freq, yarn_inv_freq
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.presets import tiny


@pytest.fixture
def cfg():
    return DeepseekV41Config.from_dict(tiny())


def test_compressor_ratio2_pairs_by_channel_softmax(cfg):
    comp = Compressor(cfg, 1)
    x = torch.randn(7, cfg.hidden_size)
    lat = comp.latents(x)
    assert lat.shape == (3, cfg.head_dim)  # the 7th token (pos 6) waits: (6 + 1) // 2 = 3
    c, z = x @ comp.wkv.weight.T, x @ comp.wgate.weight.T
    for j in range(3):
        a, b = z[2 * j], z[2 * j + 1]
        wa = torch.exp(a) / (torch.exp(a) + torch.exp(b))
        pooled = wa * c[2 * j] + (1 - wa) * c[2 * j + 1]
        want = pooled / torch.sqrt(pooled.pow(2).mean() + cfg.rms_norm_eps) * comp.norm.weight
        torch.testing.assert_close(lat[j], want, rtol=1e-5, atol=1e-5)


def test_compressor_ratio1_is_norm_of_projection(cfg):
    comp = Compressor(cfg, 6)
    assert comp.wgate is None
    x = torch.randn(5, cfg.hidden_size)
    torch.testing.assert_close(comp.latents(x), comp.norm(x @ comp.wkv.weight.T))


def test_index_scores_brute_force():
    T, HI, DI, N = 5, 3, 8, 11
    q, w, k = torch.randn(T, HI, DI), torch.randn(T, HI), torch.randn(N, DI)
    got = index_scores(q, w, k)
    for t in range(T):
        for s in range(N):
            want = sum(w[t, h] * max(0.0, float(q[t, h] @ k[s])) for h in range(HI))
            assert abs(got[t, s] - want) < 1e-4


def test_visibility_and_topk_brute_force():
    N, TOPK = 13, 4
    pos = torch.arange(0, 26)
    scores = torch.randn(26, N)
    scores[3, :] = 0.0  # a row of exact ties: lower index wins
    allowed = visible_mask(pos, 2, N)
    got = topk_indices(scores, allowed, TOPK)
    for t in range(26):
        vis = (int(pos[t]) + 1) // 2
        assert allowed[t].sum() == min(vis, N)
        order = sorted(range(min(vis, N)), key=lambda s: (-float(scores[t, s]), s))[:TOPK]
        want = order + [-1] * (TOPK - len(order))
        assert got[t].tolist() == want


def _brute_blocks(row, visible, block, n_blocks):
    nb = -(-len(row) // block)
    n_vis_blocks = -(-visible // block)
    newest = (visible - 1) // block
    bs = []
    for b in range(n_vis_blocks):
        vals = [float(row[s]) for s in range(b * block, min((b + 1) * block, visible))]
        bs.append((math.inf if b == newest else max(vals), b))
    chosen = [b for _, b in sorted(bs, key=lambda p: (-p[0], p[1]))[:n_blocks]]
    assert nb >= n_vis_blocks
    return chosen + [-1] * (n_blocks - len(chosen))


@pytest.mark.parametrize("N, block, n_blocks", [(40, 4, 3), (40, 4, 12), (33, 8, 2), (5, 4, 9)])
def test_candidate_blocks_brute_force_and_forced_newest(N, block, n_blocks):
    T = 30
    scores = torch.randn(T, N)
    visible = torch.randint(1, N + 1, (T,))
    got = candidate_blocks(scores, visible, block, n_blocks)
    for t in range(T):
        v = int(visible[t])
        assert got[t].tolist() == _brute_blocks(scores[t], v, block, n_blocks)
        assert (v - 1) // block in got[t].tolist()
    mask = pool_mask(got, N, block)
    for t in range(T):
        want = {s for s in range(N) if s // block in set(got[t].tolist())}
        assert set(torch.nonzero(mask[t]).flatten().tolist()) == want


def test_pool_contains_source_topk_when_blocks_exceed_topk():
    T, N, block, n_blocks, TOPK = 50, 200, 4, 12, 8
    scores = torch.randn(T, N)
    visible = torch.randint(1, N + 1, (T,))
    allowed = torch.arange(N)[None, :] < visible[:, None]
    top = topk_indices(scores, allowed, TOPK)
    pool = pool_mask(candidate_blocks(scores, visible, block, n_blocks), N, block)
    for t in range(T):
        sel = [s for s in top[t].tolist() if s >= 0]
        assert all(pool[t, s] for s in sel)


def test_pool_is_everything_when_blocks_fit():
    scores = torch.randn(4, 20)
    visible = torch.tensor([20, 17, 9, 1])
    pool = pool_mask(candidate_blocks(scores, visible, 4, 5), 20, 4)
    for t, v in enumerate(visible.tolist()):
        assert pool[t, :v].all()


def test_sink_softmax_hand_computed():
    q = torch.tensor([[[1.0, 0.0]]])  # [T=1, H=1, D=2]
    k_swa = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])
    k_top = torch.tensor([[[1.0, 1.0], [9.0, 9.0]]])
    ok_top = torch.tensor([[True, False]])
    sink = torch.tensor([0.5])
    o = sparse_attention(q, k_swa, torch.ones(1, 2, dtype=torch.bool), k_top, ok_top, sink, 0.5)
    logits = torch.tensor([1.0, 0.0, 0.5])  # q.k * 0.5 for the three valid keys
    e = torch.exp(logits)
    den = e.sum() + math.exp(0.5)  # the sink adds to the denominator only
    want = (e[0] * k_swa[0, 0] + e[1] * k_swa[0, 1] + e[2] * k_top[0, 0]) / den
    torch.testing.assert_close(o[0, 0], want)
    empty = sparse_attention(
        q,
        k_swa,
        torch.zeros(1, 2, dtype=torch.bool),
        k_top,
        torch.zeros(1, 2, dtype=torch.bool),
        sink,
        0.5,
    )
    assert torch.all(empty == 0)


def test_grouped_output_projection_loop(cfg):
    attn = MqaAttentionBase(cfg, 0)
    T = 3
    o = torch.randn(T, cfg.num_attention_heads, cfg.head_dim)
    pos = torch.tensor([0, 5, 9])
    got = attn.output(o, pos)
    o_derot = apply_rope(o, pos, attn.inv_freq, inverse=True).reshape(T, -1)
    G, R = cfg.o_groups, cfg.o_lora_rank
    width = o_derot.shape[1] // G
    parts = [
        o_derot[:, g * width : (g + 1) * width] @ attn.wo_a.weight[g * R : (g + 1) * R].T
        for g in range(G)
    ]
    want = torch.cat(parts, 1) @ attn.wo_b.weight.T
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_rope_interleaved_pairs_and_inverse(cfg):
    inv = rope_inv_freq(cfg, 0)
    x = torch.randn(6, 4, cfg.head_dim)
    pos = torch.tensor([0, 1, 2, 7, 100, 4095])
    y = apply_rope(x, pos, inv)
    assert torch.equal(y[..., : -cfg.qk_rope_head_dim], x[..., : -cfg.qk_rope_head_dim])
    R = cfg.qk_rope_head_dim
    xc = torch.view_as_complex(x[..., -R:].double().reshape(6, 4, R // 2, 2).contiguous())
    ang = (pos[:, None].float() * inv[None, :]).double()  # fp32 angles, the rest in fp64
    rot = torch.polar(torch.ones(6, R // 2).double(), ang)
    want = torch.view_as_real(xc * rot[:, None, :]).flatten(-2).float()
    torch.testing.assert_close(y[..., -R:], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope(y, pos, inv, inverse=True), x, rtol=1e-5, atol=1e-5)


def test_yarn_tables():
    dim, base = 64, 160000.0
    plain = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    same = yarn_inv_freq(dim, base, 1.0, 65536, 32, 1)
    torch.testing.assert_close(same, plain.float())
    y = yarn_inv_freq(dim, base, 16.0, 65536, 32, 1)

    def corr(n_rot):
        return dim * math.log(65536 / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
    for i in range(dim // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        want = plain[i] / 16 * ramp + plain[i] * (1 - ramp)
        assert abs(float(y[i]) - want) <= 1e-6 * want
    assert float(y[0]) == pytest.approx(float(plain[0]), rel=1e-6)  # fast dims untouched
    assert float(y[-1]) == pytest.approx(float(plain[-1]) / 16, rel=1e-6)  # slow dims / factor
    cfgd = tiny()
    c = DeepseekV41Config.from_dict(cfgd)
    assert not torch.equal(rope_inv_freq(c, 1), rope_inv_freq(c, 0))
