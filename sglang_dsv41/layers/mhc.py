"""mHC: manifold-constrained hyper-connections, the V4.1 residual (docs/design.md 2.6).

The residual is S = hc_mult parallel streams per token, H [T, S, d] (d = hidden). Each sublayer
(attention, then FFN) is wrapped in one hyper-connection with parameters
    fn    fp32 [(2 + S) * S, S * d]   (24 x 20480 at V4.1-Flash)
    base  fp32 [(2 + S) * S]
    scale fp32 [3]
and runs four steps:

1. mix:      m = (flatten(H) fn^T) * rsqrt(mean(flatten(H)^2) + rms_eps)       [T, (2+S)*S]
             pre  = sigmoid(m[:S] scale0 + base[:S]) + hc_eps                   [T, S]
             post = 2 sigmoid(m[S:2S] scale1 + base[S:2S])                      [T, S]
             C    = sinkhorn(m[2S:].view(S, S) scale2 + base[2S:])              [T, S, S]
2. collapse: x = RMSNorm(sum_j pre_prev[j] H_j), with the *previous* hyper-connection's pre
             (the delayed pre); the very first sublayer of the model reads stream 0 alone,
             i.e. pre_prev = [1, 0, ..., 0].
3. sublayer: y = f(x)                                                           [T, d]
4. post:     H'_i = post_i y + sum_j C[j, i] H_j                                [T, S, d]

The embedding is broadcast to the S streams (`hc_expand`); after the last layer the model reads
`hc_collapse(H, pre)` with the last FFN's pre, then `norm` and `head`.

Sinkhorn (as the reference kernel): row softmax, + hc_eps, column-normalize; then
(iters - 1) x (row-normalize, column-normalize); every normalization divides by (sum + hc_eps).
With hc_mult = 1 none of this is used: the plain pre-norm residual is the dense fallback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.layers.linear import stable_linear


def mix_width(hc_mult: int) -> int:
    """Number of mixing values per token: S pre + S post + S*S comb (24 at S = 4)."""
    return (2 + hc_mult) * hc_mult


def sinkhorn(logits: Tensor, iters: int, eps: float) -> Tensor:
    """Sinkhorn-normalized mixing matrix C from logits.

    logits: fp32 [T, S, S] (row j = source stream, column i = target stream).
    Returns fp32 [T, S, S], approximately doubly stochastic (rows and columns sum to ~1).
    """
    c = torch.softmax(upcast(logits), dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def hc_mix(
    H: Tensor,
    fn: Tensor,
    base: Tensor,
    scale: Tensor,
    *,
    iters: int,
    hc_eps: float,
    rms_eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Step 1: the (pre, post, C) triplet of one hyper-connection from the streams.

    H: [T, S, d] (any float dtype; computed in fp32). fn fp32 [(2+S)*S, S*d], base fp32
    [(2+S)*S], scale fp32 [3]. Returns pre fp32 [T, S], post fp32 [T, S], C fp32 [T, S, S].
    """
    T, S, d = H.shape
    x = upcast(H.reshape(T, S * d))  # [T, S*d]
    rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + rms_eps)  # [T, 1]
    m = stable_linear(x, upcast(fn)) * rstd  # [T, (2+S)*S]
    b, s = upcast(base), upcast(scale)
    pre = torch.sigmoid(m[:, :S] * s[0] + b[:S]) + hc_eps
    post = 2.0 * torch.sigmoid(m[:, S : 2 * S] * s[1] + b[S : 2 * S])
    logits = (m[:, 2 * S :] * s[2] + b[2 * S :]).view(T, S, S)  # [T, S, S]
    return pre, post, sinkhorn(logits, iters, hc_eps)


def hc_expand(h: Tensor, hc_mult: int) -> Tensor:
    """The embedding broadcast to the streams: h [T, d] -> [T, S, d] (a copy)."""
    return h.unsqueeze(1).expand(-1, hc_mult, -1).contiguous()


def hc_collapse(H: Tensor, pre: Tensor | None) -> Tensor:
    """Step 2 before the norm: sum_j pre[j] H_j. H [T, S, d]; pre fp32 [T, S] or None (= stream
    0 alone, the first sublayer's [1, 0, ..., 0]). Returns fp32 [T, d]."""
    if pre is None:
        return upcast(H[:, 0])
    return (pre.unsqueeze(-1) * upcast(H)).sum(dim=1)


def hc_post(y: Tensor, H: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """Step 4: H'_i = post_i y + sum_j C[j, i] H_j.

    y [T, d], H [T, S, d], post [T, S], comb [T, S, S]. Returns fp32 [T, S, d].
    """
    mixed = torch.einsum("tji,tjd->tid", upcast(comb), upcast(H))  # [T, S, d]
    return post.unsqueeze(-1) * upcast(y).unsqueeze(1) + mixed


def add_hc_params(module: nn.Module, name: str, hc_mult: int, hidden: int) -> None:
    """Register `{name}_fn`, `{name}_base`, `{name}_scale` (fp32, checkpoint names such as
    `layers.{i}.hc_attn_fn`) on `module`, zero-initialized."""
    w = mix_width(hc_mult)
    module.register_parameter(f"{name}_fn", nn.Parameter(torch.zeros(w, hc_mult * hidden)))
    module.register_parameter(f"{name}_base", nn.Parameter(torch.zeros(w)))
    module.register_parameter(f"{name}_scale", nn.Parameter(torch.zeros(3)))


def hc_sublayer(
    module: nn.Module,
    name: str,
    H: Tensor,
    pre_prev: Tensor | None,
    norm: Callable[[Tensor], Tensor],
    sublayer: Callable[[Tensor], Tensor],
    *,
    iters: int,
    hc_eps: float,
    rms_eps: float,
) -> tuple[Tensor, Tensor]:
    """One hyper-connection around `sublayer` (steps 1-4).

    module holds `{name}_fn/_base/_scale` (see add_hc_params). H [T, S, d]; pre_prev fp32 [T, S]
    from the previous hyper-connection, or None for the model's first sublayer.
    Returns (H' fp32 [T, S, d], pre fp32 [T, S]): this hyper-connection's pre is what the *next*
    sublayer's collapse uses (the delayed pre).
    """
    fn, base = getattr(module, f"{name}_fn"), getattr(module, f"{name}_base")
    pre, post, comb = hc_mix(
        H, fn, base, getattr(module, f"{name}_scale"), iters=iters, hc_eps=hc_eps, rms_eps=rms_eps
    )
    y = sublayer(norm(hc_collapse(H, pre_prev)))  # [T, d]
    return hc_post(y, H, post, comb), pre


class MhcResidual:
    """The mHC residual behind the interface of `layers.residual.PlainResidual`
    (`layers.protocols.Residual`).

    State: (H [T, S, d] in the embedding's dtype, pre fp32 [T, S] or None). A block holds
    `hc_attn_*` and `hc_ffn_*` (add_hc_params) beside `attn_norm` / `ffn_norm`. The sublayer
    input uses the pre carried in the state (the previous hyper-connection's); `*_done` mixes
    from the same H (step 1 does not depend on y) and carries this hyper-connection's pre on.
    """

    def __init__(self, cfg: DeepseekV41Config):
        self.S = cfg.hc_mult
        self.kw = dict(iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps, rms_eps=cfg.rms_norm_eps)

    def init(self, emb: Tensor):
        """emb [T, d] -> state with the embedding in every stream and no pre yet."""
        return hc_expand(emb, self.S), None

    def select(self, state, rows: Tensor):
        H, pre = state
        return H[rows], None if pre is None else pre[rows]

    def inject(self, state, fn: Callable[[Tensor], Tensor]):
        """Replace the streams by fn(H) (Engram); the pre weights streams, so it survives."""
        H, pre = state
        return fn(H).to(H.dtype), pre

    def _input(self, state, norm) -> Tensor:
        H, pre = state
        return norm(hc_collapse(H, pre).to(H.dtype))

    def _done(self, state, block, name: str, y: Tensor):
        H, _ = state
        pre, post, comb = hc_mix(
            H,
            getattr(block, f"{name}_fn"),
            getattr(block, f"{name}_base"),
            getattr(block, f"{name}_scale"),
            **self.kw,
        )
        return hc_post(y, H, post, comb).to(H.dtype), pre

    def attn_input(self, state, block) -> Tensor:
        return self._input(state, block.attn_norm)

    def attn_done(self, state, block, y: Tensor):
        return self._done(state, block, "hc_attn", y)

    def ffn_input(self, state, block) -> Tensor:
        return self._input(state, block.ffn_norm)

    def ffn_done(self, state, block, y: Tensor):
        return self._done(state, block, "hc_ffn", y)

    def final(self, state) -> Tensor:
        """[T, d]: the streams collapsed with the last FFN's pre (before `norm`, `head`)."""
        H, pre = state
        return hc_collapse(H, pre).to(H.dtype)
