"""One attention sublayer of the training forward: `reference.attention.attention_layer` with
gradients, the records' quantization straight-through, and what the indexer is distilled from.

Two modes per layer:
    dense   every visible main-KV entry is attended (`dense_attention`); the indexer still
            scores every visible entry, and its scores are distilled towards the attention's
            mass over them (the dense warm-up);
    sparse  the oracle's selection: top-k of the index scores (inside the candidate pool for
            index sources after the candidate source), `sparse_attention` over SWA + top-k,
            and the indexer distilled over the selected slots only.
The indexer sees detached inputs (q_lora, x, the compressor latent), so its parameters learn
from the distillation alone and the model's from the language-model loss alone, as in
DeepSeek's lightning-indexer training. Reuse layers add their attention mass to the group of
the index source whose top-k they reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_dsv41.config import FULL
from sglang_dsv41.layers.index_math import (
    candidate_blocks,
    index_scores,
    pool_mask,
    topk_indices,
    visible_mask,
)
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.reference.attention import swa_slots
from sglang_dsv41.training.dense_attention import dense_attention, selected_probs
from sglang_dsv41.training.straight_through import ste_main_kv, ste_swa_kv


@dataclass
class DistillGroup:
    """One index source's slots: what its indexer scored and what its group attended.

    index_logits  fp32 [T, S] index scores of the slots (graph through the indexer only)
    ok            bool [T, S] slot holds an entry the rows may see
    mass          fp32 [T, S] attention mass on the slots, summed over heads and over the
                  layers that attend this index source's selection (no graph)
    S is the number of visible entries N (dense) or TOPK (sparse).
    """

    index_logits: torch.Tensor
    ok: torch.Tensor
    mass: torch.Tensor


@dataclass
class TrainState:
    """What source layers hand to later layers within one training forward (cf. SharedState).

    main_kv  kv source -> fp32 [N, D] record values (straight-through, with graph)
    index_k  kv source -> fp32 [N, DI] record values (indexer graph only)
    topk     index source -> int64 [T, TOPK], -1 padded (sparse layers)
    pool     bool [T, N] candidate pool of the decoder rows, or None
    groups   index source -> DistillGroup
    keep     layers whose attention probabilities are kept, with graph, in `kept`
    kept     layer -> fp32 [T, H, N] mass of each main-KV entry (training.supervision;
             sparse layers: 0 on the entries outside their top-k)
    """

    main_kv: dict = field(default_factory=dict)
    index_k: dict = field(default_factory=dict)
    topk: dict = field(default_factory=dict)
    pool: torch.Tensor | None = None
    groups: dict = field(default_factory=dict)
    keep: frozenset = frozenset()
    kept: dict = field(default_factory=dict)


def compress(attn, x_all: torch.Tensor, st: TrainState) -> None:
    """A Full layer's main KV (FP4/FP8 record values) and index K over all tokens x_all [L, hid]."""
    latent = attn.compressor.latents(x_all)  # [N, D]
    entry_pos = torch.arange(latent.shape[0], device=x_all.device) * attn.ratio
    st.main_kv[attn.layer_id] = ste_main_kv(attn.cfg, attn.main_kv(latent, entry_pos))
    st.index_k[attn.layer_id] = attn.indexer.keys(latent.detach(), entry_pos, attn.inv_freq)


def score(attn, x, q_lora, pos, st: TrainState, dense: bool) -> None:
    """Run this layer's indexer on detached inputs; in sparse mode select its top-k (and the
    candidate pool at the candidate source). Opens this layer's DistillGroup."""
    cfg, i = attn.cfg, attn.layer_id
    k = st.index_k[cfg.source_layer_of(i)]
    n = k.shape[0]
    qI, w = attn.indexer.queries(q_lora.detach(), x.detach(), pos, attn.inv_freq)
    scores = index_scores(qI, w, k)  # [T, N]
    allowed = visible_mask(pos, attn.ratio, n)
    if dense:
        st.groups[i] = DistillGroup(scores, allowed, torch.zeros_like(scores.detach()))
        return
    s = scores.detach()
    if cfg.uses_candidates(i):
        allowed = allowed & st.pool
    if i == cfg.candidate_source_layer_id:
        visible = (pos + 1) // attn.ratio
        blocks = candidate_blocks(s, visible, cfg.candidate_block_size, cfg.candidate_topk_blocks)
        st.pool = pool_mask(blocks, n, cfg.candidate_block_size)
    topk = topk_indices(s, allowed, cfg.index_topk)  # [T, TOPK]
    st.topk[i] = topk
    ok = topk >= 0
    logits = scores.gather(1, topk.clamp_min(0))  # [T, TOPK]
    st.groups[i] = DistillGroup(logits, ok, torch.zeros_like(logits.detach()))


def train_attention_layer(
    attn,
    x: torch.Tensor,
    pos: torch.Tensor,
    swa_floor: int,
    st: TrainState,
    dense: bool,
    x_all: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, hidden] attention input at positions pos [T] (consecutive); x_all [L, hidden] the
    input from position 0 (Full layers; None = x). Returns [T, hidden] with graph."""
    cfg = attn.cfg
    q, q_lora = attn.query(x, pos)  # [T, H, D]
    kv = ste_swa_kv(attn.swa_kv(x, pos))  # [T, D]
    rows, swa_ok = swa_slots(pos, cfg.sliding_window, swa_floor)
    k_swa = kv[rows]  # [T, W, D]
    T = x.shape[0]
    if attn.ratio == 0:
        empty = kv.new_zeros(T, 0, cfg.head_dim)
        ok0 = torch.zeros(T, 0, dtype=torch.bool, device=x.device)
        o = sparse_attention(q, k_swa, swa_ok, empty, ok0, attn.attn_sink, attn.scale)
        return attn.output(o, pos)
    if attn.role == FULL:
        compress(attn, x if x_all is None else x_all, st)
    isrc = cfg.index_source_of(attn.layer_id)
    if attn.indexer is not None:
        score(attn, x, q_lora, pos, st, dense)
    main = st.main_kv[cfg.source_layer_of(attn.layer_id)]
    group = st.groups[isrc]
    if dense:
        o, p_main = dense_attention(q, k_swa, swa_ok, main, group.ok, attn.attn_sink, attn.scale)
        group.mass += p_main.detach().sum(1)
        if attn.layer_id in st.keep:
            st.kept[attn.layer_id] = p_main
    else:
        topk = st.topk[isrc]
        top_ok = topk >= 0
        k_top = main[topk.clamp_min(0)]  # [T, TOPK, D]
        o = sparse_attention(q, k_swa, swa_ok, k_top, top_ok, attn.attn_sink, attn.scale)
        p = selected_probs(q, k_swa, swa_ok, k_top, top_ok, attn.attn_sink, attn.scale)
        group.mass += p.detach().sum(1)
        if attn.layer_id in st.keep:  # the same mass per main-KV entry, 0 off the selection
            n = main.shape[0]
            idx = topk.clamp_min(0)[:, None, :].expand(-1, p.shape[1], -1)
            st.kept[attn.layer_id] = p.new_zeros(T, p.shape[1], n).scatter_add(
                2, idx, p * top_ok[:, None, :]
            )
    return attn.output(o, pos)
