"""Our attention interface over one layer of SGLang's in-tree V4 model (`MQALayer` modules).

`adapt(layer, cfg)` returns a `serving.attention_view.AttentionView` whose projections are the
in-tree layer's own modules, so the served cached path (`serving.attention`) runs our
attention on SGLang's quantized, tensor-parallel weights:

    ours                  in-tree (self_attn.*)                      on the device
    wq_a, wkv             wqkv_a rows [:q_lora] / [q_lora:]          FP8 GEMM, one call for both
                          (or wq_a, wkv)
    q_norm, kv_norm       q_norm.weight, kv_norm.weight              our RMSNorm (fp32 stats)
    wq_b                  wq_b (column-parallel: local heads)        FP8 GEMM
    attn_sink             attn_sink[head_slice(H, tp, rank)]         -
    wo_a                  wo_a.weight (local groups, BF16 at load)   our grouped product
    wo_b                  wo_b via `_project_wo_b` (row-parallel)    FP8 GEMM; the all-reduce is
                                                                     deferred when SGLang asks
    compressor.wkv/wgate  compressor.wkv / wgate (or wkv_gate rows)  BF16 dense (replicated)
    indexer.wq_b          indexer.wq_b                               FP8 GEMM (replicated)
    indexer.weights_proj, wk, k_norm                                 BF16 dense (replicated)

`dense=True` dequantizes every projection to fp32 instead (the CPU test's mode: the adapter
then computes exactly what our own layer computes on the dequantized checkpoint).
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.rope import rope_inv_freq
from sglang_dsv41.serving.attention_view import (
    AttentionView,
    CompressorView,
    Dense,
    IndexerView,
    Norm,
    head_slice,
)
from sglang_dsv41.weights.intree import dequant_block


class InTreeLinear:
    """x -> y through an in-tree (quantized, maybe parallel) linear module."""

    def __init__(self, module):
        self.module = module
        self.weight = module.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)[0]


class FusedRows:
    """Parts of one fused in-tree projection (rows split by `sizes`), computed once per input:
    `part(k)(x)` is rows k of module(x); the product is dropped once every part was read."""

    def __init__(self, project, sizes: list):
        self.project, self.sizes = project, sizes
        self._x = self._parts = None
        self._left = set()

    def part(self, k: int):
        def call(x: torch.Tensor) -> torch.Tensor:
            if self._x is not x:
                self._x, self._parts = x, self.project(x).split(self.sizes, -1)
                self._left = set(range(len(self.sizes)))
            y = self._parts[k]
            self._left.discard(k)
            if not self._left:
                self._x = self._parts = None
            return y

        return call


class WoB:
    """The row-parallel wo_b of an in-tree layer; `defer` (set per forward) leaves the
    all-reduce to SGLang's residual boundary, as the in-tree forward does."""

    def __init__(self, layer):
        self.layer, self.defer = layer, False

    def __call__(self, z: torch.Tensor):
        return self.layer._project_wo_b(z, self.defer)


def _dense(module) -> Dense:
    """fp32 dense weight of an in-tree linear (FP8 blocks dequantized, BF16 upcast)."""
    w = module.weight
    if w.dtype == torch.float8_e4m3fn:
        return Dense(dequant_block(w, module.weight_scale_inv))
    return Dense(w.float())


def _norm(module, eps: float, dense: bool) -> Norm:
    return Norm(module.weight.float() if dense else module.weight, eps)


def adapt(layer, cfg: DeepseekV41Config, dense: bool = False) -> AttentionView:
    """AttentionView over in-tree `layer` (an MQALayer built from cfg; see the module docstring).

    The layer's attention-TP rank and size pick its heads and output groups; KV, compressor and
    indexer are replicated; the layer's `attn_dtype` (DSV41CudaAttention: the served option) is
    the view's. dense=True: fp32 dequantized projections (CPU checks).
    """
    i, eps = layer.layer_id, cfg.rms_norm_eps
    lin = _dense if dense else InTreeLinear
    tp, rank = layer.attn_tp_size, layer.attn_tp_rank
    heads = head_slice(cfg.num_attention_heads, tp, rank)
    if hasattr(layer, "wqkv_a"):
        if dense:
            w = _dense(layer.wqkv_a).weight
            wq_a, wkv = Dense(w[: cfg.q_lora_rank]), Dense(w[cfg.q_lora_rank :])
        else:
            fused = FusedRows(InTreeLinear(layer.wqkv_a), [cfg.q_lora_rank, cfg.head_dim])
            wq_a, wkv = fused.part(0), fused.part(1)
    else:
        wq_a, wkv = lin(layer.wq_a), lin(layer.wkv)
    wo_a = layer.wo_a.weight
    if wo_a.dtype == torch.float8_e4m3fn:
        wo_a = dequant_block(wo_a, layer.wo_a.weight_scale_inv).to(torch.bfloat16)
    wo_b = _dense(layer.wo_b) if dense else WoB(layer)
    dev = layer.attn_sink.device
    comp = None
    if layer.compressor is not None:
        c = layer.compressor
        if hasattr(c, "wkv_gate"):
            kv, gate = c.wkv_gate.weight.chunk(2)
            wkv_c, wgate = Dense(kv), Dense(gate)
        else:
            wkv_c = Dense(c.wkv.weight)
            wgate = Dense(c.wgate.weight) if hasattr(c, "wgate") else None
        if dense:
            wkv_c = Dense(wkv_c.weight.float())
            wgate = None if wgate is None else Dense(wgate.weight.float())
        comp = CompressorView(cfg.ratio(i), wkv_c, wgate, _norm(c.norm, eps, dense))
    ix = None
    if layer.indexer is not None:
        x = layer.indexer
        owns = hasattr(x, "wk")
        wk = None
        if owns:
            wk = Dense(x.wk.weight.float() if dense else x.wk.weight)
        w_proj = x.weights_proj.weight
        ix = IndexerView(
            cfg,
            lin(x.wq_b),
            Dense(w_proj.float() if dense else w_proj),
            wk,
            _norm(x.k_norm, eps, dense) if owns else None,
        )
    sink = layer.attn_sink[heads]
    return AttentionView(
        cfg,
        i,
        n_heads=heads.stop - heads.start,
        o_groups=layer.n_local_groups,
        wq_a=wq_a,
        q_norm=_norm(layer.q_norm, eps, dense),
        wq_b=lin(layer.wq_b),
        wkv=wkv,
        kv_norm=_norm(layer.kv_norm, eps, dense),
        attn_sink=sink.float() if dense else sink,
        wo_a=Dense(wo_a.float() if dense else wo_a),
        wo_b=wo_b,
        inv_freq=rope_inv_freq(cfg, cfg.ratio(i)).to(dev),
        compressor=comp,
        indexer=ix,
        attn_dtype=getattr(layer, "attn_dtype", None),
    )
