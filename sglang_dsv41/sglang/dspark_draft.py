"""The DSpark draft of a V4.1 checkpoint: SGLang's own `DeepseekV4ForCausalLMDSpark`.

SGLang serves a bundled DSpark head (`dspark_*` keys in the target's config, `mtp.*` tensors) by
building the draft runner's model config from the target checkpoint with `is_draft_model` and
renaming its architecture to `DeepseekV4ForCausalLMDSpark` (`ModelConfig._config_draft_model`),
but only when the architecture is `DeepseekV4ForCausalLM`, the name SGLang's own V4.1 config
gives the model. This package keeps `DeepseekV41ForCausalLM` (its model class is chosen by that
name), so two hooks make SGLang treat it as V4 where the draft side asks:

    ModelConfig._config_draft_model   (AFTER) a draft model config of our architecture whose
                                      checkpoint bundles a head, under DSPARK (or no algorithm,
                                      as SGLang's own rule), becomes SGLang's in-tree V4.1 config
                                      (`intree_config`, the one conversion of our parsed config)
                                      with the DSpark draft architecture and the release's
                                      `quantization_config`; everything SGLang derives from it
                                      afterwards (V4 model shapes, hybrid SWA, FP8 / FP4 experts,
                                      the DSV4 pool, the draft's stage count) is its own V4 path
    dspark_config.draft_is_deepseek_v4  (AROUND) also True when the draft checkpoint is ours
                                      with a head: the worker then gives the draft runner
                                      SGLang's `dsv4` attention backend and its MoE draft layout
                                      (without it: "Falling back to 'flashinfer'")
The target stays this package's model; the draft runner's pool and backend are SGLang's
(hooks.py routes by the runner's architecture; docs/speculative.md lists every check).
"""

from __future__ import annotations

import json
import logging

from sglang_dsv41.dspark_defaults import DSPARK
from sglang_dsv41.sglang.hf_config import ARCH
from sglang_dsv41.sglang.hooks import is_ours

logger = logging.getLogger(__name__)

DRAFT_ARCH = "DeepseekV4ForCausalLMDSpark"
DRAFT_BACKEND = "dsv4"  # SGLang's dspark_config.DSV4_DRAFT_ATTENTION_BACKEND

_CONFIG_DRAFT = "sglang.srt.configs.model_config.ModelConfig._config_draft_model"
_DRAFT_IS_V4 = "sglang.srt.speculative.dspark_components.dspark_config.draft_is_deepseek_v4"


def drafts_with_dspark(hf_config, algorithm) -> bool:
    """True when a draft model config read from `hf_config` is SGLang's DSpark draft: our
    architecture, a bundled head (SGLang's `checkpoint_bundles_dspark_draft`), and the
    algorithm DSPARK or none (SGLang's own rule for its V4 name)."""
    from sglang.srt.speculative.dspark_components.dspark_config import (
        checkpoint_bundles_dspark_draft,
    )

    name = getattr(algorithm, "name", algorithm)  # a SpeculativeAlgorithm or its string
    return (
        is_ours(hf_config)
        and checkpoint_bundles_dspark_draft(hf_config)
        and (name is None or str(name).upper() in (DSPARK, "NONE"))
    )


def draft_hf_config(hf_config):
    """Our `DeepseekV41HFConfig` -> the draft's config: SGLang's in-tree V4.1 config of the same
    values, architecture `DeepseekV4ForCausalLMDSpark`, with the checkpoint's
    `quantization_config` and `torch_dtype` (which our config withholds from SGLang, and which
    SGLang's loader reads to build the draft's FP8 linears and FP4 experts as it does for its
    own V4.1)."""
    from sglang_dsv41.sglang.intree_config import intree_config

    cfg = hf_config.dsv41()
    out = intree_config(cfg)
    out.architectures = [DRAFT_ARCH]
    if cfg.quantization_config:
        out.quantization_config = dict(cfg.quantization_config)
    out.torch_dtype = cfg.torch_dtype
    name = getattr(hf_config, "_name_or_path", None)
    if name:
        out._name_or_path = name
    return out


def _config_draft_model(result, model_config, *args, **kwargs):
    """AFTER ModelConfig._config_draft_model: our draft model config -> SGLang's DSpark draft."""
    if not model_config.is_draft_model or not drafts_with_dspark(
        model_config.hf_config, model_config.speculative_algorithm
    ):
        return result
    model_config.hf_config = draft_hf_config(model_config.hf_config)
    model_config.hf_text_config = model_config.hf_config
    logger.info(
        "sglang_dsv41: the draft of %s is SGLang's %s (the checkpoint bundles a DSpark head); "
        "its pool and attention backend are SGLang's",
        ARCH,
        DRAFT_ARCH,
    )
    return result


def draft_checkpoint_config():
    """The draft checkpoint's config as SGLang reads it for `draft_is_deepseek_v4` (its
    `get_config` with the server's own arguments), or None without a draft path."""
    from sglang.srt.runtime_context import get_model, get_spec
    from sglang.srt.utils.hf_transformers_utils import get_config

    spec, model = get_spec(), get_model()
    if not spec.speculative_draft_model_path:
        return None
    return get_config(
        spec.speculative_draft_model_path,
        trust_remote_code=model.trust_remote_code,
        revision=spec.speculative_draft_model_revision,
        model_override_args=json.loads(model.json_model_override_args),
        model_config_parser=model.model_config_parser,
    )


def _draft_is_deepseek_v4(original, *args, **kwargs) -> bool:
    """AROUND dspark_config.draft_is_deepseek_v4: SGLang's answer, or our checkpoint with a
    head (whose draft `_config_draft_model` makes SGLang's DSpark V4 draft)."""
    if original(*args, **kwargs):
        return True
    from sglang.srt.runtime_context import get_spec

    hf = draft_checkpoint_config()
    return hf is not None and drafts_with_dspark(hf, get_spec().speculative_algorithm)


def register_dspark_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_CONFIG_DRAFT, _config_draft_model, HookType.AFTER)
    HookRegistry.register(_DRAFT_IS_V4, _draft_is_deepseek_v4, HookType.AROUND)
