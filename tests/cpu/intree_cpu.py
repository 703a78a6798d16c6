"""What it takes to build SGLang's in-tree V4 model (and our CUDA subclass) on a CPU, for tests.

The model is meant for CUDA, but its constructor and `load_weights` run on a CPU given:
  1. SGLang's parallel state for one rank: torch.distributed on gloo (world 1), the server
     config published for that rank (`publish(ServerArgs(...))`: layers read their TP / DP
     sizes and the device from it; the tokenizer path feeds the Engram hasher), and the model-
     parallel groups (`initialize_model_parallel(backend="gloo")`);
  2. two construction-time shims, only while building: RoPE's non-CUDA branch imports
     `vllm._custom_ops.rotary_embedding` (stubbed: never called), and DeepSeek's YaRN RoPE asks
     `get_device()` for an accelerator (answered "cpu");
  3. `_mhc_prewarmed_at_load = True` before `load_weights` (the mHC kernel prewarm is CUDA-only).
The forward is not run here (its kernels are CUDA-only).
"""

from __future__ import annotations

import json
import os
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import torch


def init_sglang_cpu(tokenizer_dir: str, port: int = 29731) -> None:
    """One rank of SGLang's parallel state on gloo (idempotent within a process)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if not torch.distributed.is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo"
        )
    reset_context()
    publish(
        ServerArgs(model_path="dummy", tokenizer_path=str(tokenizer_dir), tp_size=1),
        role="test",
        ranks=SpawnRanks(world_rank=0),
    )
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="gloo")
    else:  # built by an earlier call; the context just published does not name them yet
        groups = {name: getattr(parallel_state, attr, None) for name, attr in _GROUPS.items()}
        get_parallel().override_permanently(**{k: g for k, g in groups.items() if g is not None})


_GROUPS = {
    "tp_group": "_TP",
    "pp_group": "_PP",
    "moe_ep_group": "_MOE_EP",
    "moe_dp_group": "_MOE_DP",
    "moe_tp_group": "_MOE_TP",
    "attn_tp_group": "_ATTN_TP",
    "attn_cp_group": "_ATTN_CP",
    "shared_experts_tp_group": "_SHARED_EXPERTS_TP",
    "dcp_group": "_DCP",
}
"""Context name -> parallel_state global of the groups `initialize_model_parallel` stamps."""


@contextmanager
def cpu_build_shims():
    """The two construction-time shims of the module docstring, undone on exit."""
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant

    def _never(*args, **kwargs):
        raise RuntimeError("vllm stub: not callable in CPU tests")

    vllm, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding, vllm._custom_ops = _never, ops
    saved = {k: sys.modules.get(k) for k in ("vllm", "vllm._custom_ops")}
    sys.modules.update({"vllm": vllm, "vllm._custom_ops": ops})
    get_device = rope_variant.get_device
    rope_variant.get_device = lambda *a, **k: "cpu"
    try:
        yield
    finally:
        rope_variant.get_device = get_device
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def hf_config(ckpt: Path):
    from sglang_dsv41.sglang.hf_config import DeepseekV41HFConfig

    raw = json.loads((Path(ckpt) / "config.json").read_text())
    return DeepseekV41HFConfig(**raw, _name_or_path=str(ckpt))


def build_cuda_model(ckpt: Path):
    """Our CUDA DeepseekV41ForCausalLM for checkpoint `ckpt`, built on CPU in bf16."""
    from sglang_dsv41.sglang.cuda_model import DeepseekV41ForCausalLM

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with cpu_build_shims():
            return DeepseekV41ForCausalLM(hf_config(ckpt))
    finally:
        torch.set_default_dtype(dtype)


def released_tensors(ckpt: Path):
    """(name, tensor) of every stored tensor of the checkpoint, as SGLang's loader yields them."""
    from safetensors.torch import load_file

    for f in sorted(Path(ckpt).glob("*.safetensors")):
        yield from load_file(str(f)).items()


def load(model, ckpt: Path) -> None:
    model._mhc_prewarmed_at_load = True
    model.load_weights(released_tensors(ckpt))
