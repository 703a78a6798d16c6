"""Whole-sequence global + SWA attention of one layer, no cache: the oracle's statement of CSA2.

`SharedState` carries what source layers hand to later layers within one forward (the seeds'
SharedAttentionRuntime): per kv source its main KV and index K, per index source its top-k, and
the candidate pool of the candidate source. A forward may be one pass of a prefix resume
(docs/design.md 2.8): its rows start at `start`, and the entries below `kept_below` are those of
the `prior` pass (the prefix cache's records), not recomputed.
"""

from dataclasses import dataclass, field

import torch

from sglang_dsv41.config import FULL
from sglang_dsv41.kv.pages import entries_visible
from sglang_dsv41.layers.index_math import (
    candidate_blocks,
    index_scores,
    pool_mask,
    topk_indices,
    visible_mask,
)
from sglang_dsv41.layers.protocols import Attention
from sglang_dsv41.layers.quant import quant_main_kv, quant_swa_kv
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.layers.window import swa_window


@dataclass
class SharedState:
    """main_kv / index_k: kv source -> fp32 [n, D] / [n, DI] record values; topk: index source
    -> int64 [T, TOPK], -1 padded; pool_mask: bool [T, n], the candidate pool of the decoder
    rows (None before the candidate source ran). start: position of the pass's first row (the
    Full layers' x_all starts there); prior / kept_below: the main KV and index K of entries at
    positions < kept_below are the prior pass's (None: the pass starts at 0)."""

    main_kv: dict[int, torch.Tensor] = field(default_factory=dict)
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)
    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    pool_mask: torch.Tensor | None = None
    start: int = 0
    prior: "SharedState | None" = None
    kept_below: int = 0


def swa_slots(pos: torch.Tensor, window: int, floor: int):
    """pos [T] (consecutive positions of the rows) -> (row ids [T, W] clamped, ok bool [T, W]).

    The window of layers.window.swa_window over rows that start at pos[0] (>= every floor here).
    """
    kpos, ok = swa_window(pos, window, floor)
    return (kpos - pos[0]).clamp_min(0), ok


def compress_full_layer(attn: Attention, x_all: torch.Tensor, state: SharedState) -> None:
    """A Full layer writes its main KV and index K from its attention input over all tokens.

    x_all [L - start, hidden] from position state.start. Entries j < L // r at positions j r;
    those below state.kept_below are the prior pass's (a prefix resume keeps the cached ones).
    """
    cfg, r, i = attn.cfg, attn.ratio, attn.layer_id
    skip = (-state.start) % r  # an entry's tokens start at a multiple of r
    first = (state.start + skip) // r
    latent = attn.compressor.latents(x_all[skip:])  # [n, D]
    entry_pos = (torch.arange(latent.shape[0]) + first) * r
    main = quant_main_kv(cfg, attn.main_kv(latent, entry_pos))
    keys = attn.indexer.keys(latent, entry_pos, attn.inv_freq)
    if state.prior is None:
        if first:
            raise ValueError(f"a pass from position {state.start} needs the prior entries")
    else:
        keep = state.kept_below // r
        if state.kept_below % r or keep < first:
            raise ValueError(f"kept_below {state.kept_below}: a multiple of {r}, >= the start")
        main = torch.cat([state.prior.main_kv[i][:keep], main[keep - first :]])
        keys = torch.cat([state.prior.index_k[i][:keep], keys[keep - first :]])
    state.main_kv[i], state.index_k[i] = main, keys


def select_topk(
    attn: Attention, x: torch.Tensor, q_lora: torch.Tensor, pos: torch.Tensor, state: SharedState
) -> torch.Tensor:
    """Run this layer's indexer (Full / Reindex) -> top-k int64 [T, TOPK], -1 padded."""
    cfg, i = attn.cfg, attn.layer_id
    k = state.index_k[cfg.source_layer_of(i)]
    n = k.shape[0]
    qI, w = attn.indexer.queries(q_lora, x, pos, attn.inv_freq)
    scores = index_scores(qI, w, k)  # [T, n]
    allowed = visible_mask(pos, attn.ratio, n)
    if cfg.uses_candidates(i):
        allowed = allowed & state.pool_mask
    if i == cfg.candidate_source_layer_id:
        visible = entries_visible(pos, attn.ratio)  # [T]
        blocks = candidate_blocks(
            scores, visible, cfg.candidate_block_size, cfg.candidate_topk_blocks
        )
        state.pool_mask = pool_mask(blocks, n, cfg.candidate_block_size)
    return topk_indices(scores, allowed, cfg.index_topk)


def attention_layer(
    attn: Attention,
    x: torch.Tensor,
    pos: torch.Tensor,
    swa_floor: int,
    state: SharedState,
    x_all: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention sublayer over consecutive rows.

    x [T, hidden] attention input of the rows at positions pos [T] (consecutive);
    swa_floor: no SWA key below this position (bounded replay); x_all [L, hidden] the attention
    input of every token from position 0 (Full layers only: the compressor runs over all).
    Returns [T, hidden].
    """
    cfg = attn.cfg
    q, q_lora = attn.query(x, pos)  # [T, H, D]
    kv = quant_swa_kv(attn.swa_kv(x, pos))  # [T, D]
    rows, swa_ok = swa_slots(pos, cfg.sliding_window, swa_floor)
    k_swa = kv[rows]  # [T, W, D]
    T = x.shape[0]
    if attn.ratio == 0:
        k_top = kv.new_zeros(T, 0, cfg.head_dim)
        top_ok = torch.zeros(T, 0, dtype=torch.bool)
    else:
        if attn.role == FULL:
            compress_full_layer(attn, x if x_all is None else x_all, state)
        if attn.indexer is not None:
            state.topk[attn.layer_id] = select_topk(attn, x, q_lora, pos, state)
        topk = state.topk[cfg.index_source_of(attn.layer_id)]  # [T, TOPK]
        main = state.main_kv[cfg.source_layer_of(attn.layer_id)]
        top_ok = topk >= 0
        k_top = (
            main[topk.clamp_min(0)]
            if main.shape[0]
            else kv.new_zeros(T, topk.shape[1], cfg.head_dim)
        )
    q = attn.attention_in(q)  # the attention's I/O dtype (MqaAttentionBase.attn_dtype)
    o = sparse_attention(q, k_swa, swa_ok, k_top, top_ok, attn.attn_sink, attn.scale)
    return attn.output(attn.attention_out(o), pos)
