"""Residual wiring around the two sublayers of a block, kept apart from the sublayer math.

`PlainResidual` is the pre-norm residual of a dense transformer (hc_mult = 1):
    x = attn_norm(h); h = h + attn(x); x = ffn_norm(h); h = h + ffn(x); final: h.
The state is a tensor whose first dim is tokens, so callers may keep a subset of rows
(`select`), as bounded replay does for the decoder tail. The released model's mHC streams
(hc_mult > 1, `layers.mhc.MhcResidual`) provide the same interface, `layers.protocols.Residual`.
`inject` lets an Engram layer rewrite the streams before the layer's attention mixing
([T, S, d] with S = 1 here).
"""

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.protocols import Residual


class PlainResidual:
    def init(self, emb: torch.Tensor):
        """emb [T, hidden] -> state."""
        return emb

    def select(self, state, rows: torch.Tensor):
        return state[rows]

    def inject(self, state, fn):
        """fn: [T, 1, hidden] -> [T, 1, hidden] (Engram on a single stream)."""
        return fn(state.unsqueeze(1)).squeeze(1).to(state.dtype)

    def attn_input(self, state, block) -> torch.Tensor:
        return block.attn_norm(state)

    def attn_done(self, state, block, y: torch.Tensor):
        return state + y.to(state.dtype)

    def ffn_input(self, state, block) -> torch.Tensor:
        return block.ffn_norm(state)

    def ffn_done(self, state, block, y: torch.Tensor):
        return state + y.to(state.dtype)

    def final(self, state) -> torch.Tensor:
        return state


def build_residual(cfg: DeepseekV41Config) -> Residual:
    if cfg.hc_mult == 1:
        return PlainResidual()
    from sglang_dsv41.layers.mhc import MhcResidual

    return MhcResidual(cfg)
