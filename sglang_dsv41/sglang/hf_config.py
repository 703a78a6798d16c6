"""The transformers config class SGLang loads for `model_type: deepseek_v41`.

SGLang's in-tree class rewrites the architecture to `DeepseekV4ForCausalLM`; this one keeps
`DeepseekV41ForCausalLM` so the plugin's model class is chosen. It flattens `text_config` onto
the top level (as released checkpoints nest it), validates through `DeepseekV41Config` and sets
the few attributes SGLang reads off any config of this model type.
Module-level so it pickles into SGLang's subprocesses.
"""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from sglang_dsv41.config import DeepseekV41Config

ARCH = "DeepseekV41ForCausalLM"
MODEL_TYPE = "deepseek_v41"


def flatten_text_config(values: dict) -> dict:
    """Released config.json -> flat dict: `text_config` fields on top, vision config dropped."""
    values = dict(values)
    text = values.pop("text_config", None)
    values.pop("vision_config", None)
    if text is not None:
        text = text.to_dict() if isinstance(text, PretrainedConfig) else dict(text)
        text.pop("model_type", None)
        text.pop("architectures", None)
        values = {**text, **values}
    return values


class DeepseekV41HFConfig(PretrainedConfig):
    """`config.json` of a V4.1 checkpoint as SGLang sees it (flat, text-only, MQA with one KV head).

    The checkpoint's own values are kept verbatim in `dsv41_values` and parsed by
    `DeepseekV41Config`; the RoPE fields are withheld from transformers (whose RoPE
    standardization rewrites them) and from SGLang (which would rescale the context length), and
    so is `quantization_config` (the released FP8/FP4 weights are dequantized by this package's
    loader; SGLang must not set up its own FP8 linear layers for them).
    """

    model_type = MODEL_TYPE
    # (values, config) of the last `dsv41()`: a slot, so that transformers' `to_dict`, `__eq__`
    # and JSON serialization (which walk `__dict__`) never see it
    __slots__ = ("_dsv41_parsed",)

    def __init__(self, **kwargs):
        values = kwargs.pop("dsv41_values", None)
        kwargs = flatten_text_config(kwargs)
        if values is None:
            values = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        kwargs.pop("model_type", None)
        for key in _WITHHELD:
            kwargs.pop(key, None)
        kwargs.setdefault("architectures", [ARCH])
        super().__init__(**kwargs)
        self.dsv41_values = values
        # SGLang reads these off every deepseek_v41 config; this plugin serves text only.
        self.vision_n_layers = 0
        self.num_key_value_heads = 1
        # SWA records live in SGLang's window-bounded hybrid SWA pool (sglang/pool.py); the
        # window is `sliding_window`.
        self.is_hybrid_swa = True

    def dsv41(self) -> DeepseekV41Config:
        """The validated core config (raises ConfigError naming field and layer). Core fields
        set on this object after loading (SGLang's --json-model-override-args) take precedence
        over the checkpoint's values. Parsed once per distinct set of values: every caller gets
        the same object until a core field changes (treat it as read-only)."""
        values = dict(self.dsv41_values)
        for name in _CORE_FIELDS:
            if name in self.__dict__ and name not in _WITHHELD:
                values[name] = self.__dict__[name]
        parsed = getattr(self, "_dsv41_parsed", None)
        if parsed is None or parsed[0] != values:
            parsed = self._dsv41_parsed = (values, DeepseekV41Config.from_dict(values))
        return parsed[1]


_CORE_FIELDS = tuple(
    f.name for f in dataclasses.fields(DeepseekV41Config) if f.name not in ("extra", "torch_dtype")
)
_WITHHELD = (
    "rope_scaling",
    "rope_parameters",
    "rope_theta",
    "compress_rope_theta",
    "quantization_config",
)
