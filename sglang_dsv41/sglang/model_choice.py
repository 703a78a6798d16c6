"""The class registered as `DeepseekV41ForCausalLM`: one name, the implementation by device.

    CUDA device and a released-format (FP8 / FP4) checkpoint
        cuda_model.DeepseekV41ForCausalLM: SGLang's in-tree V4 skeleton (quantized parallel
        linears, FusedMoE, TP / EP / DP-attention) with this package's attention
    otherwise (CPU, or a dense checkpoint such as the tiny / small presets)
        model.DeepseekV41ForCausalLM: the pure-torch model (weights dequantized at load)
SGLang instantiates the registered class; `__new__` returns an instance of the chosen one (so
that one's `__init__` runs, not this class's). SGLang also reads two class-level facts before
building: the expert count for expert-parallel placement (answered for the in-tree model only)
and the shared-experts fusion hooks (absent: no fusion).
"""

from __future__ import annotations

from torch import nn

from sglang_dsv41.weights.checkpoint import is_release_format


def served_device() -> str | None:
    """The server's device ('cuda', 'cpu', ...) from SGLang's published config, else None."""
    try:
        from sglang.srt.runtime_context import get_device

        return get_device().device
    except Exception:
        return None


def uses_intree_model(hf_config) -> bool:
    return served_device() == "cuda" and is_release_format(hf_config.dsv41())


class DeepseekV41ForCausalLM(nn.Module):
    served_by = "sglang_dsv41"

    def __new__(cls, config, quant_config=None, prefix: str = "", **kwargs):
        if uses_intree_model(config):
            from sglang_dsv41.sglang.cuda_model import DeepseekV41ForCausalLM as chosen
        else:
            from sglang_dsv41.sglang.model import DeepseekV41ForCausalLM as chosen
        return chosen(config, quant_config=quant_config, prefix=prefix)

    @classmethod
    def get_model_config_for_expert_location(cls, config):
        if not uses_intree_model(config):
            return None
        from sglang.srt.eplb.expert_location import ModelConfigForExpertLocation

        cfg = config.dsv41()
        return ModelConfigForExpertLocation(
            num_layers=cfg.num_hidden_layers, num_logical_experts=cfg.n_routed_experts
        )
