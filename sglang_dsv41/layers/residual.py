"""Residual wiring around the two sublayers of a block, kept apart from the sublayer math.

`PlainResidual` is the pre-norm residual of a dense transformer (hc_mult = 1):
    x = attn_norm(h); h = h + attn(x); x = ffn_norm(h); h = h + ffn(x); final: h.
The state is a tensor whose first dim is tokens, so callers may keep a subset of rows
(`select`), as bounded replay does for the decoder tail. The released model's mHC streams
provide the same interface.
"""
import torch


class PlainResidual:
    def init(self, emb: torch.Tensor):
        """emb [T, hidden] -> state."""
        return emb

    def select(self, state, rows: torch.Tensor):
        return state[rows]

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


def build_residual(cfg):
    if cfg.hc_mult == 1:
        return PlainResidual()
    raise NotImplementedError("hc_mult > 1 (mHC) is not wired yet")
