"""The `dsv41` backend with the in-tree replay-tail members mixed in (what the plugin registers).

`DSV41TailBackend` = `replay_tail.LateLayerTailMixin` over `backend.DSV41AttnBackend`: the base
builds the batch context, the mixin the replay tail, but only when the served model runs
SGLang's in-tree layer loop (`cuda_model.DeepseekV41ForCausalLM.uses_late_layer_tail`); the
pure-torch model replays in its own loop and pays nothing.
"""

from __future__ import annotations

from sglang_dsv41.sglang.backend import DSV41AttnBackend
from sglang_dsv41.sglang.replay_tail import LateLayerTailMixin


class DSV41TailBackend(LateLayerTailMixin, DSV41AttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        model = getattr(model_runner, "model", None)
        self.wants_late_layer_tail = bool(getattr(model, "uses_late_layer_tail", False))


def create_backend(model_runner):
    return DSV41TailBackend(model_runner)
