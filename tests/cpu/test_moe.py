"""V4.1 MoE (docs/design.md 2.6) against a brute-force per-token loop.

Routing: fp32 logits l; s = sqrt(softplus(l)); top-k of s + gate.bias; weights
s[idx] / sum(s[idx]) * routed_scaling; expert w2(silu(min(w1 x, lim)) * clamp(w3 x, -lim, lim));
shared expert the same, added unscaled.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from sglang_dsv41.config import preset
from sglang_dsv41.layers.ffn import MoE


def _cfg(**kw):
    cfg = preset("tiny")
    for k, v in {
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "hidden_size": 16,
        "moe_intermediate_size": 8,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "swiglu_limit": 10.0,
        **kw,
    }.items():
        setattr(cfg, k, v)
    return cfg


def _expert_loop(e, x, lim):
    """One token through one expert, element by element."""
    g = [
        sum(e.w1.weight[i, c].item() * x[c] for c in range(len(x))) for i in range(len(e.w1.weight))
    ]
    u = [
        sum(e.w3.weight[i, c].item() * x[c] for c in range(len(x))) for i in range(len(e.w3.weight))
    ]
    if lim > 0:
        g = [min(v, lim) for v in g]
        u = [min(max(v, -lim), lim) for v in u]
    a = [v / (1 + math.exp(-v)) * w for v, w in zip(g, u, strict=False)]
    return [
        sum(e.w2.weight[o, i].item() * a[i] for i in range(len(a))) for o in range(len(e.w2.weight))
    ]


def _brute_force(moe, x, cfg):
    out = []
    for t in range(x.shape[0]):
        xt = x[t].tolist()
        logits = [
            sum(moe.gate.weight[e, c].item() * xt[c] for c in range(len(xt)))
            for e in range(cfg.n_routed_experts)
        ]
        s = [math.sqrt(math.log1p(math.exp(v))) for v in logits]
        biased = [v + moe.gate.bias[e].item() for e, v in enumerate(s)]
        chosen = sorted(range(len(s)), key=lambda e: -biased[e])[: cfg.num_experts_per_tok]
        total = sum(s[e] for e in chosen)
        y = [0.0] * len(xt)
        for e in chosen:
            w = s[e] / total * cfg.routed_scaling_factor
            y = [
                a + w * b
                for a, b in zip(y, _expert_loop(moe.experts[e], xt, cfg.swiglu_limit), strict=False)
            ]
        sh = _expert_loop(moe.shared_experts, xt, cfg.swiglu_limit)
        out.append([a + b for a, b in zip(y, sh, strict=False)])
    return torch.tensor(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_moe_matches_brute_force(seed):
    cfg = _cfg()
    torch.manual_seed(seed)
    moe = MoE(cfg)
    with torch.no_grad():
        moe.gate.bias.copy_(torch.randn(8) * 0.3)
        for p in moe.parameters():
            if p.dim() == 2:
                p.mul_(6.0)  # large activations so the swiglu clamp at 10 engages
    x = torch.randn(5, 16) * 2
    got = moe(x)
    torch.testing.assert_close(got, _brute_force(moe, x, cfg), atol=2e-4, rtol=2e-4)
    g = torch.cat([e.w1(x) for e in moe.experts])
    u = torch.cat([e.w3(x) for e in moe.experts])
    assert (g > 10).any() and (u > 10).any() and (u < -10).any()  # the clamps engaged


def test_bias_changes_selection_not_weights():
    cfg = _cfg()
    torch.manual_seed(2)
    moe = MoE(cfg)
    x = torch.randn(6, 16)
    s = F.softplus(F.linear(x, moe.gate.weight)).sqrt()
    with torch.no_grad():
        moe.gate.bias.zero_()
        w0, i0 = moe.gate(x)
        moe.gate.bias[3] = 100.0  # expert 3 always selected, scored by s alone
        w1, i1 = moe.gate(x)
    assert (i1 == 3).any(-1).all() and not torch.equal(i0.sort(-1).values, i1.sort(-1).values)
    for w, i in ((w0, i0), (w1, i1)):
        want = s.gather(1, i) / s.gather(1, i).sum(-1, keepdim=True) * 1.5
        torch.testing.assert_close(w, want)
        torch.testing.assert_close(w.sum(-1), torch.full((6,), 1.5))
    # the weight of expert 3 is its score share, not inflated by the bias
    slot = (i1 == 3).float().argmax(-1)
    w3 = w1.gather(1, slot[:, None])[:, 0]
    assert (w3 < 1.5).all()
