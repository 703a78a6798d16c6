"""DeepseekV41ForCausalLM on CUDA: SGLang's in-tree V4 skeleton with this package's attention.

A subclass of SGLang's `DeepseekV4ForCausalLM`, built from a private in-tree V4.1 config and an
`Fp8Config` made from our parsed `DeepseekV41Config` (`intree_config`). SGLang's own quantized
parallel linears, FusedMoE with the packed-FP4 routed experts, mHC, Engram (TP-sharded tables),
logits, TP / EP / DP-attention and `load_weights` are reused unchanged. Each decoder layer's
attention is `cuda_attention.DSV41CudaAttention` (the in-tree MQALayer with our cached path as
`forward`), put in through the layer's `_build_self_attn` factory: SGLang's model reads its
decoder-layer class through the module global `DeepseekV4DecoderLayer` while it builds, so
that global is rebound to a subclass only for the duration of our constructor.

Couplings honoured:
  - decoder SWA bounded replay: SGLang resolves its flag only for its own architecture name, so
    it is set explicitly (our `ServingOptions.replay`, registered as the served options) while
    the model builds; with it on, the in-tree layer loop asks the backend for the replay-tail
    members (`replay_tail.py`), which the `dsv41` backend must carry (it reads the switch from
    the pool's options); `model.decoder_replay_tail` (the prefill-graph tail runner) is None;
  - prefill CUDA graphs stay off (`cuda_defaults.py`).
Chosen for a released-format checkpoint on a CUDA device (`model_choice.py`); elsewhere the
served model is the pure-torch `model.DeepseekV41ForCausalLM`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from sglang.srt.models import deepseek_v4 as intree
from sglang.srt.runtime_context import get_exec

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.sglang.cuda_attention import DSV41CudaAttention
from sglang_dsv41.sglang.intree_config import intree_config, intree_quant_config
from sglang_dsv41.sglang.options import (
    ATTN_DTYPE_ENV,
    INTREE_ATTN_DEFAULT,
    ServingOptions,
    register_served,
)

logger = logging.getLogger(__name__)


def decoder_layer_class(
    base: type, cfg: DeepseekV41Config, attn_dtype: torch.dtype | None = None
) -> type:
    """`base` (SGLang's decoder-layer class) whose attention is DSV41CudaAttention for `cfg`,
    its sparse attention's I/O in `attn_dtype` (None = fp32)."""

    def _build_self_attn(self, **kwargs):
        return DSV41CudaAttention(dsv41_cfg=cfg, attn_dtype=attn_dtype, **kwargs)

    return type("DSV41DecoderLayer", (base,), {"_build_self_attn": _build_self_attn})


@contextmanager
def build_scope(cfg: DeepseekV41Config, options: ServingOptions):
    """While the in-tree model builds: our decoder-layer class and the replay flag."""
    base = intree.DeepseekV4DecoderLayer
    intree.DeepseekV4DecoderLayer = decoder_layer_class(base, cfg, options.attn_dtype)
    try:
        with get_exec().features.override(enable_decoder_swa_bounded_replay=options.replay):
            yield
    finally:
        intree.DeepseekV4DecoderLayer = base


class DeepseekV41ForCausalLM(intree.DeepseekV4ForCausalLM):
    served_by = "sglang_dsv41"

    @property
    def uses_late_layer_tail(self) -> bool:
        """The in-tree layer loop asks the backend for the replay tail (replay_tail.py)."""
        return self.model.late_layer_start is not None

    def __init__(self, config, quant_config=None, prefix: str = ""):
        cfg = config.dsv41()
        options = ServingOptions.from_server(cfg, attn_default=INTREE_ATTN_DEFAULT, folds=False)
        replay = options.replay
        # SGLang's in-tree layer loop starts the replay tail at the last kv source
        if replay and (err := cfg.replay_error(tail_at_last_kv_source=True)):
            raise err
        with build_scope(cfg, options):
            super().__init__(intree_config(cfg), intree_quant_config(cfg), prefix)
        self.dsv41_cfg, self.dsv41_hf_config, self.options = cfg, config, options
        register_served(options)
        self.model.decoder_replay_tail = None
        logger.info(
            "sglang_dsv41: in-tree DeepseekV4 skeleton with dsv41 attention, roles %s, "
            "decoder SWA bounded replay %s, attention queries and output %s (%s=fp32 for the "
            "exact path)",
            cfg.roles(),
            "on" if replay else "off",
            options.attn_mode,
            ATTN_DTYPE_ENV,
        )
