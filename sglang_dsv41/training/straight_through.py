"""The records' quantization inside training: forward = the codec, backward = identity.

A served model reads its SWA KV, main KV and index K back from byte records (`layers.quant`),
so the training forward passes every such tensor through the same fake-quant
(`kv.records.fake_quant`: encode then decode) and lets the gradient through unchanged
(straight-through estimator):

    y = x + (fake_quant(x) - x).detach()          value: fake_quant(x); dy/dx = 1

`straight_through(fn)` wraps one of `layers.quant`'s functions that way. The indexer's
queries and keys are quantized inside `layers.indexer.Indexer`; `indexer_straight_through()`
points that module's `quant_index` at the straight-through version for the duration of a
training forward, so the indexer's own code runs unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

from sglang_dsv41.layers import indexer as indexer_module
from sglang_dsv41.layers.quant import quant_index, quant_main_kv, quant_swa_kv


def straight_through(fn):
    """fn: float tensor [..., C] -> fp32 [..., C] (non-differentiable) -> the same values,
    identity gradient. Extra positional arguments (the config of quant_main_kv) come first."""

    def ste(*args):
        *head, x = args
        xf = x.float()
        return xf + (fn(*head, xf.detach()) - xf).detach()

    ste.__name__ = f"{fn.__name__}_ste"
    return ste


ste_swa_kv = straight_through(quant_swa_kv)
"""x [T, D] -> V41 (FP8) record values, identity gradient."""
ste_main_kv = straight_through(quant_main_kv)
"""(cfg, x [n, D]) -> V41_FP4 (or V41) record values, identity gradient."""
ste_index = straight_through(quant_index)
"""x [..., DI] -> index-K (FP4) record values, identity gradient."""


@contextmanager
def indexer_straight_through():
    """Within the block, `Indexer.queries` / `Indexer.keys` quantize with `ste_index`."""
    saved = indexer_module.quant_index
    indexer_module.quant_index = ste_index
    try:
        yield
    finally:
        indexer_module.quant_index = saved
