"""The training forward of a `ReferenceModel`: `ReferenceModel.forward` with gradients.

Same modules, same residual wiring, same decoder bounded replay: the encoder runs on all L
tokens, the decoder's Full layer compresses its input over all L tokens, and the decoder runs
on the rows at positions >= `floor` with SWA floored there (floor 0 = the full forward). Only
the rows whose logits are asked for (`rows`, all >= floor) go through the head. Every global
layer's attention is `training.attention.train_attention_layer`, dense or sparse per half of
the stack (`Modes`). Plain residual and no Engram only (the retrieval model has neither).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dsv41.layers.dtypes import upcast
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.training.attention import TrainState, train_attention_layer
from sglang_dsv41.training.straight_through import indexer_straight_through


@dataclass(frozen=True)
class Modes:
    """Which halves of the stack attend densely (every visible entry) rather than top-k."""

    encoder_dense: bool
    decoder_dense: bool

    def dense(self, cfg, layer: int) -> bool:
        return self.decoder_dense if cfg.is_decoder(layer) else self.encoder_dense


SPARSE = Modes(False, False)


def check_trainable(model: ReferenceModel) -> None:
    cfg = model.cfg
    if cfg.hc_mult != 1 or cfg.engram_layer_ids:
        raise ValueError("training forward: hc_mult must be 1 and engram_layer_ids empty")


def train_forward(
    model: ReferenceModel,
    input_ids: torch.Tensor,
    rows: torch.Tensor,
    floor: int = 0,
    modes: Modes = SPARSE,
    keep: frozenset = frozenset(),
):
    """input_ids int64 [L], rows int64 [R] (positions >= floor whose next token is predicted)
    -> (logits fp32 [R, vocab] with graph, TrainState holding the distillation groups and, for
    the dense layers in `keep`, their attention probabilities over the rows >= floor)."""
    cfg, L = model.cfg, input_ids.shape[0]
    if int(rows.min()) < floor:
        raise ValueError(f"rows start at {int(rows.min())}, below the replay floor {floor}")
    device = input_ids.device
    pos_all = torch.arange(L, device=device)
    state = model.residual.init(model.embed(input_ids))
    st = TrainState(keep=frozenset(keep))
    pos, swa_floor = pos_all, 0
    with indexer_straight_through():
        for i, block in enumerate(model.layers):
            x_all = None
            if i == cfg.decoder_start and floor > 0:
                x_all = model.residual.attn_input(state, block)
                state = model.residual.select(state, pos_all[floor:])
                pos, swa_floor = pos_all[floor:], floor
            x = model.residual.attn_input(state, block)
            y = train_attention_layer(
                block.attn, x, pos, swa_floor, st, modes.dense(cfg, i), x_all=x_all
            )
            state = model.residual.attn_done(state, block, y)
            state = model.residual.ffn_done(
                state, block, block.ffn(model.residual.ffn_input(state, block))
            )
    h = model.norm(model.residual.final(state[rows - pos[0]]))
    return upcast(model.head(h)), st
