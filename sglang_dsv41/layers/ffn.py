"""Feed-forward blocks: a SwiGLU expert, the V4.1 MoE router and a dense fallback
(docs/design.md 2.6).

MoE: router logits l = x W_gate^T in fp32; scores s = score_fn(l) with score_fn one of
softmax / sigmoid / sqrtsoftplus (sqrt(softplus(l))); experts chosen by top-k of s + gate.bias
(the bias steers selection only); weights = s[idx] (/ sum s[idx] when norm_topk_prob) *
routed_scaling_factor. Expert: w2(silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit)), no clamp
when swiglu_limit = 0. Shared experts are added unscaled.
"""

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import compute_dtype, upcast
from sglang_dsv41.layers.linear import Linear, stable_linear


class Expert(nn.Module):
    def __init__(self, hidden: int, inter: int, limit: float):
        super().__init__()
        self.w1 = Linear(hidden, inter)
        self.w2 = Linear(inter, hidden)
        self.w3 = Linear(hidden, inter)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        g, u = self.w1(x), self.w3(x)
        if self.limit > 0:
            g, u = g.clamp(max=self.limit), u.clamp(-self.limit, self.limit)
        return self.w2(F.silu(g) * u)


def router_scores(logits: torch.Tensor, func: str) -> torch.Tensor:
    """logits fp32 [T, E] -> scores fp32 [T, E]."""
    if func == "softmax":
        return logits.softmax(-1)
    if func == "sigmoid":
        return logits.sigmoid()
    if func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    raise ValueError(f"scoring_func: unknown {func!r}")


class Gate(nn.Module):
    def __init__(self, cfg: DeepseekV41Config):
        super().__init__()
        self.weight = nn.Parameter(
            torch.randn(cfg.n_routed_experts, cfg.hidden_size) * cfg.hidden_size**-0.5
        )
        self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.topk, self.func = cfg.num_experts_per_tok, cfg.scoring_func
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor):
        """x [T, hidden] -> (weights fp32 [T, k], expert ids int64 [T, k])."""
        s = router_scores(stable_linear(upcast(x), upcast(self.weight)), self.func)  # [T, E]
        idx = torch.topk(s + upcast(self.bias), self.topk, dim=-1).indices  # [T, k]
        w = s.gather(1, idx)
        if self.norm:
            w = w / w.sum(-1, keepdim=True)
        return w * self.scaling, idx


class MoE(nn.Module):
    def __init__(self, cfg: DeepseekV41Config):
        super().__init__()
        hid, inter = cfg.hidden_size, cfg.moe_intermediate_size
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(
            Expert(hid, inter, cfg.swiglu_limit) for _ in range(cfg.n_routed_experts)
        )
        self.shared_experts = (
            Expert(hid, inter * cfg.n_shared_experts, cfg.swiglu_limit)
            if cfg.n_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden].

        On CPU each expert runs on its own tokens. Elsewhere every expert runs on every token with
        the unselected ones weighted zero: no host sync, so a CUDA graph can hold it (the served
        CUDA model uses SGLang's fused MoE; this is the test models' path)."""
        w, idx = self.gate(x)
        out = torch.zeros(x.shape, dtype=compute_dtype(x), device=x.device)
        if x.device.type != "cpu":
            for e, expert in enumerate(self.experts):
                we = (w * (idx == e)).sum(-1, keepdim=True)  # [T, 1], 0 where not selected
                out += upcast(expert(x)) * we
        for e in torch.unique(idx).tolist() if x.device.type == "cpu" else []:
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            y = upcast(self.experts[e](x[tok])) * w[tok, slot, None]
            out.index_add_(0, tok, y)
        if self.shared_experts is not None:
            out += upcast(self.shared_experts(x))
        return out.to(x.dtype)


def build_ffn(cfg: DeepseekV41Config, layer: int) -> nn.Module:
    if cfg.n_routed_experts and layer >= cfg.first_k_dense_replace:
        return MoE(cfg)
    return Expert(cfg.hidden_size, cfg.intermediate_size, cfg.swiglu_limit)
