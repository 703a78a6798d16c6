"""Entry point `sglang.srt.plugins: dsv41 = sglang_dsv41.sglang.plugin:register`.

SGLang calls `register()` in every process (launcher, scheduler, detokenizer) before it parses
server arguments. It wires this package into SGLang through extension points only:
  - the config registry and AutoConfig: `model_type deepseek_v41` -> DeepseekV41HFConfig, which
    keeps the architecture `DeepseekV41ForCausalLM` (the in-tree class renames it to V4);
  - ModelRegistry: `DeepseekV41ForCausalLM` -> this package's model class (model_choice.py:
    the in-tree CUDA skeleton for a released-format checkpoint on CUDA, else pure torch);
  - the attention-backend registry and the `--attention-backend` choices: `dsv41` (also
    accepted by `--enable-deterministic-inference`, see deterministic.py);
  - a per-architecture override: attention backend `dsv41` and CPU-friendly defaults;
  - HookRegistry hooks for the KV pool and the scheduler (see hooks.py), and for SGLang's
    DSpark draft of a checkpoint that bundles a head (see dspark_draft.py);
  - request checks on every route that reaches the model (see guard_hooks.py);
  - the CPU scheduler's torch threads (see cpu_threads.py).

`SGLANG_DSV41_PLUGIN=off` (or 0 / false / no) in the environment of one launch leaves all of it
out: `register()` returns at once in every process of that launch, so the server is stock
SGLang's own (its in-tree `deepseek_v41` for a released V4.1 checkpoint) with the package still
installed. SGLang's `SGLANG_PLUGINS` allow-list does the same for every plugin at once.
"""

from __future__ import annotations

import logging
import os

from sglang_dsv41.plugin_switch import SWITCH_ENV, plugin_enabled

logger = logging.getLogger(__name__)

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    if not plugin_enabled():
        logger.warning("sglang_dsv41: %s=%s, plugin left out", SWITCH_ENV, os.environ[SWITCH_ENV])
        return
    _register_config()
    _register_model()
    _register_backend()
    _register_overrides()
    _register_hooks()
    _register_guards()
    _register_cpu_threads()
    logger.info("sglang_dsv41: registered deepseek_v41 config, model, backend 'dsv41'")


def _register_config() -> None:
    from sglang.srt.utils.hf_transformers import common
    from transformers import AutoConfig

    from sglang_dsv41.sglang.hf_config import MODEL_TYPE, DeepseekV41HFConfig

    common._CONFIG_REGISTRY[MODEL_TYPE] = DeepseekV41HFConfig
    AutoConfig.register(MODEL_TYPE, DeepseekV41HFConfig, exist_ok=True)


def _register_model() -> None:
    from sglang.srt.models.registry import ModelRegistry

    from sglang_dsv41.sglang.hf_config import ARCH
    from sglang_dsv41.sglang.model_choice import DeepseekV41ForCausalLM

    ModelRegistry.models[ARCH] = DeepseekV41ForCausalLM


def _register_backend() -> None:
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    from sglang_dsv41.sglang.backend import BACKEND_NAME
    from sglang_dsv41.sglang.replay_tail import create_backend

    register_attention_backend(BACKEND_NAME)(create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    from sglang_dsv41.sglang.deterministic import register_deterministic

    register_deterministic(BACKEND_NAME)


def _register_overrides() -> None:
    from sglang.srt.arg_groups.model_override_base import register_model_override

    from sglang_dsv41.sglang.hf_config import ARCH
    from sglang_dsv41.sglang.server_defaults import server_defaults

    register_model_override(ARCH)(server_defaults)


def _register_hooks() -> None:
    from sglang_dsv41.sglang.dspark_draft import register_dspark_hooks
    from sglang_dsv41.sglang.hooks import register_hooks

    register_hooks()
    register_dspark_hooks()


def _register_guards() -> None:
    from sglang_dsv41.sglang.guard_hooks import register_guards

    register_guards()


def _register_cpu_threads() -> None:
    from sglang_dsv41.sglang.cpu_threads import register_cpu_threads

    register_cpu_threads()
