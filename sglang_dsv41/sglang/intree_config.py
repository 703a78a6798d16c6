"""The private SGLang in-tree config and FP8 quant config the CUDA model is built from.

SGLang's `DeepseekV4ForCausalLM` reads its geometry off an in-tree V4.1 config object
(`sglang.srt.configs.deepseek_v41.DeepseekV41Config`) and its quantized linears off an
`Fp8Config`. Both are made here from this package's parsed `DeepseekV41Config` (the one home of
the checkpoint's values), never from SGLang's own config loading, which this plugin bypasses
(`hf_config.DeepseekV41HFConfig` withholds `quantization_config` and the RoPE fields from it).

Values set on purpose, because SGLang resolves them only for its own architecture name:
    topk_group = n_group      routing is ungrouped (sqrt-softplus over all experts)
    hc_pre_from_prev_sublayer the mHC input of a sublayer uses the previous sublayer's `pre`
                              (docs/design.md 2.6), which is this package's only residual scheme
    vision_n_layers = 0       text-only serving; vision tensors are skipped at load
    Fp8Config.is_fp4_experts  the routed experts are packed e2m1 (`expert_dtype: fp4`)
"""

from __future__ import annotations

from sglang_dsv41.config import ConfigError, DeepseekV41Config

INTREE_ARCH = "DeepseekV4ForCausalLM"
_NOT_PASSED = ("quantization_config", "torch_dtype", "extra")


def intree_config(cfg: DeepseekV41Config):
    """Our config -> SGLang's in-tree V4.1 config (`model_type deepseek_v41`)."""
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config as InTreeConfig

    values = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_PASSED}
    n_group = int(values.get("n_group", 8))
    values.update(
        architectures=[INTREE_ARCH],
        model_type="deepseek_v41",
        num_key_value_heads=1,
        n_group=n_group,
        topk_group=n_group,
        hc_pre_from_prev_sublayer=True,
        vision_n_layers=0,
    )
    return InTreeConfig(**values)


def intree_quant_config(cfg: DeepseekV41Config):
    """The release's `quantization_config` -> SGLang's Fp8Config with FP4 routed experts."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    q = dict(cfg.quantization_config or {})
    if q.get("quant_method") != "fp8":
        raise ConfigError(
            f"quantization_config.quant_method: {q.get('quant_method')!r}; the in-tree CUDA "
            "model serves the released FP8 format"
        )
    if "activation_scheme" not in q:
        raise ConfigError(
            "quantization_config.activation_scheme: missing; the released checkpoint declares "
            "'dynamic' (SGLang's Fp8Config needs it)"
        )
    out = Fp8Config.from_config(q)
    out.is_fp4_experts = out.is_dsv4_fp4_experts = q.get("expert_dtype") == "fp4"
    out.dequant_fp4_to_fp8 = False
    return out
