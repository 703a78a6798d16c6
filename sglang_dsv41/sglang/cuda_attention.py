"""DSV41CudaAttention: SGLang's in-tree V4 attention layer with this package's attention.

Derived from the in-tree `MQALayer` (itself an `MqaAttentionBase`), whose constructor builds the
weights with SGLang's quantized, tensor-parallel linears (wq_b and wo_a column-parallel, wo_b
row-parallel, KV / compressor / indexer replicated). Only `forward` is replaced: it runs the
served cached path (`serving.attention.attention_layer`, the same path as on CPU) through an adapter
over this layer's modules (`intree_adapter.adapt`; its sparse attention's queries and output in
`attn_dtype`, the served option), reading the batch from the `dsv41` backend:

    rows, ctx     forward_batch.dsv41_context (BatchContext), or the replay tail's rows while
                  the backend is inside the late-layer tail (`replay_tail.LateLayerTailMixin`)
    pool          the backend's token_to_kv_pool (DSV41KVPool)
    floor         decoder layers: each row's request floor (bounded replay); encoder layers: 0
    x_all         the decoder kv source's attention input over every row, handed over by
                  `write_tail_source_kv` (its compressor runs over all rows, its attention over
                  the tail)
The two input-format predicates also answer False, so SGLang's residual boundary hands this
layer a plain activation (not a pre-quantized MXFP8 tuple). The per-layer RoPE table of the
in-tree class (max_position_embeddings x rope_dim/2 complex64) is dropped: our path keeps its
own inverse frequencies.
"""

from __future__ import annotations

import torch
from sglang.srt.model_executor.forward_context import get_attn_backend
from sglang.srt.models.deepseek_v4 import MQALayer

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.serving.attention import attention_layer
from sglang_dsv41.serving.attention_view import AttentionView
from sglang_dsv41.serving.intree_adapter import WoB, adapt


class DSV41CudaAttention(MQALayer):
    served_by = "sglang_dsv41"

    def __init__(
        self,
        *args,
        dsv41_cfg: DeepseekV41Config,
        attn_dtype: torch.dtype | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.dsv41_cfg, self.attn_dtype = dsv41_cfg, attn_dtype
        self.freqs_cis = self.freqs_cis[:0].clone()  # a view would keep the table alive
        self._view = None

    def view(self) -> AttentionView:
        """The adapter over this layer's modules (built on first use, after weights load)."""
        if self._view is None:
            self._view = adapt(self, self.dsv41_cfg)
        return self._view

    def accepts_mxfp8_swizzled_input(self) -> bool:
        return False

    def accepts_deepgemm_mxfp8_input(self) -> bool:
        return False

    def forward(self, x, positions, forward_batch, x_quant=None, defer_all_reduce=False):
        """x [T, hidden] (this layer's rows, after input_layernorm) -> [T, hidden], or SGLang's
        deferred-all-reduce output when defer_all_reduce (as the in-tree forward)."""
        cfg, i = self.dsv41_cfg, self.layer_id
        backend = get_attn_backend()
        ctx = getattr(forward_batch, "dsv41_context", None)
        if ctx is None:  # an idle batch (DP attention): no rows, nothing to attend
            if x.shape[0]:
                raise RuntimeError(f"dsv41 layer {i}: {x.shape[0]} rows but no batch context")
            return x
        tail = getattr(backend, "late_tail", None)
        rows, x_all, rows_all = ctx.rows, None, None
        if tail is not None:
            rows = tail.rows
            if tail.source_layer == i:
                x_all, rows_all = tail.take_source()
        if x.shape[0] != rows.n:
            raise RuntimeError(
                f"dsv41 layer {i}: {x.shape[0]} input rows, the batch context has {rows.n}"
            )
        if rows.n == 0 and x_all is None:
            return x
        if cfg.is_decoder(i):
            floor = ctx.row_floors(rows)
        else:
            floor = torch.zeros(rows.n, dtype=torch.int64, device=rows.req.device)
        view = self.view()
        if isinstance(view.wo_b, WoB):
            view.wo_b.defer = defer_all_reduce
        y = attention_layer(view, x, rows, ctx, backend.token_to_kv_pool, floor, x_all, rows_all)
        return x if rows.n == 0 else y
