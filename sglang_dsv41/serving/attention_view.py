"""Attention views: the served attention's interface over weights held elsewhere.

The cached attention path (`serving.attention.attention_layer`) reads its `attn` through the
`layers.protocols.Attention` protocol (with `CompressorPart` / `IndexerPart` for the role
parts). `AttentionView` implements it with the formulas taken from `layers/` unchanged (its
methods *are* `MqaAttentionBase.query/attention_in/attention_out/swa_kv/main_kv/output`,
`Compressor.project/pool/latents`, `Indexer.queries/keys`), over projections that are any
callables `x -> x W^T`: a dense weight here (`Dense`), SGLang's quantized parallel linears in
`serving/intree_adapter.py`.

Tensor parallelism by heads (`local_heads`): rank r of `tp` owns heads `head_slice(H, tp, r)`
(H / tp consecutive heads, their sink logits and their wq_b rows) and output groups
`group_slice(G, tp, r)` (their wo_a rows and the matching wo_b input columns), so its output is
a partial sum that an all-reduce completes. The SWA KV, the compressor and the indexer are
replicated: every rank writes the same records and selects the same top-k.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import FULL, DeepseekV41Config
from sglang_dsv41.layers.attention import MqaAttentionBase
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.indexer import Indexer
from sglang_dsv41.layers.linear import stable_linear
from sglang_dsv41.layers.norm import rms_norm


class Dense:
    """x [..., K] -> x W^T [..., N] with a dense weight [N, K] (row-stable, layers/linear.py)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight)


class Norm:
    """RMSNorm over a weight held elsewhere: fp32 statistics, result in x's dtype."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class CompressorView:
    """A Full layer's compressor: wkv, wgate (None at ratio 1) projections, norm."""

    project = Compressor.project
    pool = Compressor.pool
    latents = Compressor.latents

    def __init__(self, ratio: int, wkv, wgate, norm: Norm):
        self.ratio, self.wkv, self.wgate, self.norm = ratio, wkv, wgate, norm


class IndexerView:
    """An index source's indexer: wq_b, weights_proj; wk, k_norm on Full layers (else None)."""

    queries = Indexer.queries
    keys = Indexer.keys

    def __init__(
        self, cfg: DeepseekV41Config, wq_b, weights_proj, wk=None, k_norm: Norm | None = None
    ):
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b, self.weights_proj, self.wk, self.k_norm = wq_b, weights_proj, wk, k_norm
        self.w_scale = cfg.index_weight_scale


class AttentionView:
    """One layer's attention over external projections (module docstring).

    n_heads / o_groups are the heads and output groups this view computes (all of them, or a
    tensor-parallel rank's share); attn_sink fp32 [n_heads]; wo_a.weight [o_groups * o_lora_rank,
    H * D / G]; wo_b maps [T, o_groups * o_lora_rank] to [T, hidden] (a partial sum under TP).
    """

    compute_dtype = torch.float32  # the float64 twin check runs the torch model, not a view
    query = MqaAttentionBase.query
    attention_in = MqaAttentionBase.attention_in
    attention_out = MqaAttentionBase.attention_out
    swa_kv = MqaAttentionBase.swa_kv
    main_kv = MqaAttentionBase.main_kv
    output = MqaAttentionBase.output

    def __init__(
        self,
        cfg: DeepseekV41Config,
        layer: int,
        *,
        n_heads: int,
        o_groups: int,
        wq_a,
        q_norm: Norm,
        wq_b,
        wkv,
        kv_norm: Norm,
        attn_sink: torch.Tensor,
        wo_a: Dense,
        wo_b,
        inv_freq: torch.Tensor,
        compressor: CompressorView | None = None,
        indexer: IndexerView | None = None,
        attn_dtype: torch.dtype | None = None,
    ):
        self.cfg, self.layer_id = cfg, layer
        self.attn_dtype = attn_dtype
        self.role, self.ratio = cfg.role(layer), cfg.ratio(layer)
        self.n_heads, self.head_dim = n_heads, cfg.head_dim
        self.o_groups, self.o_lora_rank = o_groups, cfg.o_lora_rank
        self.scale = cfg.softmax_scale
        self.wq_a, self.q_norm, self.wq_b = wq_a, q_norm, wq_b
        self.wkv, self.kv_norm = wkv, kv_norm
        self.attn_sink, self.wo_a, self.wo_b = attn_sink, wo_a, wo_b
        self.inv_freq = inv_freq
        self.compressor, self.indexer = compressor, indexer
        if (compressor is not None) != (self.role == FULL):
            raise ValueError(f"layer {layer}: role {self.role} and compressor {compressor}")
        if attn_sink.shape != (n_heads,):
            raise ValueError(
                f"layer {layer}: attn_sink {tuple(attn_sink.shape)}, n_heads {n_heads}"
            )


def head_slice(n_heads: int, tp: int, rank: int) -> slice:
    """The heads of rank `rank` of `tp` (consecutive; SGLang's column-parallel wq_b split)."""
    if n_heads % tp:
        raise ValueError(f"num_attention_heads {n_heads} is not divisible by attention TP {tp}")
    h = n_heads // tp
    return slice(rank * h, (rank + 1) * h)


def group_slice(o_groups: int, tp: int, rank: int) -> slice:
    """The output groups of rank `rank` of `tp` (wo_a rows / wo_b input columns)."""
    if o_groups % tp:
        raise ValueError(f"o_groups {o_groups} is not divisible by attention TP {tp}")
    g = o_groups // tp
    return slice(rank * g, (rank + 1) * g)


def full_view(attn: MqaAttentionBase) -> AttentionView:
    """All heads of one of our layers, as a view (equals `attn` itself; the tp = 1 case)."""
    return local_heads(attn, 1, 0)


def local_heads(attn: MqaAttentionBase, tp: int, rank: int, reduce=None) -> AttentionView:
    """Rank `rank`'s share of `attn` under tensor parallelism by heads (module docstring).

    reduce: applied to the partial wo_b output (e.g. an all-reduce); None leaves it partial.
    """
    cfg, i = attn.cfg, attn.layer_id
    D, R = cfg.head_dim, cfg.o_lora_rank
    hs, gs = head_slice(cfg.num_attention_heads, tp, rank), group_slice(cfg.o_groups, tp, rank)
    wo_b_cols = attn.wo_b.weight[:, gs.start * R : gs.stop * R]
    wo_b = Dense(wo_b_cols)
    if reduce is not None:
        dense = wo_b

        def wo_b(z):
            return reduce(dense(z))

    comp = attn.compressor
    ix = attn.indexer
    return AttentionView(
        cfg,
        i,
        n_heads=hs.stop - hs.start,
        o_groups=gs.stop - gs.start,
        wq_a=attn.wq_a,
        q_norm=attn.q_norm,
        wq_b=Dense(attn.wq_b.weight[hs.start * D : hs.stop * D]),
        wkv=attn.wkv,
        kv_norm=attn.kv_norm,
        attn_sink=attn.attn_sink[hs],
        wo_a=Dense(attn.wo_a.weight[gs.start * R : gs.stop * R]),
        wo_b=wo_b,
        inv_freq=attn.inv_freq,
        compressor=None
        if comp is None
        else CompressorView(comp.ratio, comp.wkv, comp.wgate, comp.norm),
        indexer=None
        if ix is None
        else IndexerView(cfg, ix.wq_b, ix.weights_proj, ix.wk, ix.k_norm),
        attn_dtype=attn.attn_dtype,
    )
