"""Torch intra-op threads of the scheduler that serves DeepseekV41ForCausalLM on CPU.

SGLang sets one thread on accelerators and leaves torch's default on CPU (one per core). A
narrow model's matmuls are too small to split: on a shared 2-core machine, two threads made the
served tiny model several times slower under other load (benchmarks/RESULTS.md). The rule is the
reference CLI's (`python -m sglang_dsv41.reference --threads`): one thread for models narrower
than 1024, torch's default otherwise. Overrides, read when the model is loaded:
    DSV41_CPU_THREADS=N   N threads; 0 leaves torch's default
    OMP_NUM_THREADS=N     honoured as torch honours it (the plugin then sets nothing)
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

NARROW_HIDDEN = 1024
ENV = "DSV41_CPU_THREADS"
_LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def choose_threads(hidden_size: int, env=os.environ) -> int | None:
    """Threads to set (None = leave torch's default)."""
    value = env.get(ENV, "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"{ENV}={value!r}: give a number of threads (0 = torch's default)")
        return n or None
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    return 1 if hidden_size < NARROW_HIDDEN else None


def apply(hidden_size: int, env=os.environ) -> None:
    import torch

    n = choose_threads(hidden_size, env)
    if n is not None:
        torch.set_num_threads(n)
    logger.info("sglang_dsv41: %d torch CPU thread(s) (%s to change)", torch.get_num_threads(), ENV)


def _after_load_model(result, runner, *args, **kwargs):
    from sglang_dsv41.sglang.hf_config import ARCH

    archs = getattr(runner.model_config.hf_config, "architectures", None) or []
    if str(runner.device) == "cpu" and archs[:1] == [ARCH]:
        apply(int(runner.model_config.hf_config.hidden_size))
    return result


def register_cpu_threads() -> None:
    """In SGLang's subprocesses only: the scheduler loads the model; the launcher never does."""
    import multiprocessing

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if multiprocessing.parent_process() is not None:
        HookRegistry.register(_LOAD_MODEL, _after_load_model, HookType.AFTER)
