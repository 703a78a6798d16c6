"""`--enable-deterministic-inference` with the dsv41 backend: seeded sampling that reproduces.

SGLang's sampler reads a request's seed (`seed` on /v1, `sampling_seed` on /generate) only in
deterministic mode, which accepts the attention backends listed in
DETERMINISTIC_ATTENTION_BACKEND_CHOICES; this plugin adds `dsv41` there (its extension point).
Deterministic mode also switches on SGLang's batch-invariant aten ops, which exist for
accelerators only (on CPU they raise); the CPU path of this plugin is batch-invariant by
construction (layers/linear.py pads matmuls to 16 rows), so there the switch is skipped.
The seeded sampler draws Gumbel noise from a MurmurHash3 of (seed, position, token); SGLang
computes that hash with sgl_kernel on CPU, which has no CPU build here, so on CPU this module
computes the same hash in torch (`murmur3_32`, the standard MurmurHash3_x86_32 of the 16 bytes
seed, position, token id) and takes the same Gumbel argmax.
SGLang keeps the radix cache off in this mode for backends it has not been told are
radix-safe, and so does this plugin (the CUDA path's batch invariance is not shown yet).
A request with n > 1 is fanned out by SGLang's tokenizer manager into n copies that share one
SamplingParams, so one seed: n identical choices. The launcher's hook on `_send_one_request`
gives the k-th copy request_rules.choice_seed(seed, k) (choice 0 keeps the request's seed, so
it equals the same request with n = 1). Without this mode seeds are refused at the request
(request_rules.check_seed).
"""

from __future__ import annotations

import logging

from sglang_dsv41.sglang.hf_config import ARCH

logger = logging.getLogger(__name__)

_BATCH_INVARIANT = (
    "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"
)
_SEEDED = "sglang.srt.layers.sampler.multinomial_with_seed"
_SEND_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request"
_M32 = 0xFFFFFFFF
DEFAULT_SEED = 42  # SGLang's seed for a request that names none (SamplingBatchInfo)


def _mul32(a, c: int):
    """(a * c) mod 2^32 for int64 tensors a in [0, 2^32), in 16-bit halves (no overflow)."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _rotl32(x, r: int):
    return ((x << r) | (x >> (32 - r))) & _M32


def _block(h, k):
    k = _mul32(_rotl32(_mul32(k, 0xCC9E2D51), 15), 0x1B873593)
    return (_mul32(_rotl32(h ^ k, 13), 5) + 0xE6546B64) & _M32


def murmur3_32(seed, positions, cols):
    """MurmurHash3_x86_32 (hash seed 0) of the 16 little-endian bytes
    [seed low 32 bits, seed high 32 bits, position, column] for every row and column.
    seed, positions int64 [B]; cols int64 [V] -> int64 [B, V] in [0, 2^32)."""
    h = seed.new_zeros(seed.shape).view(-1, 1)  # [B, 1]
    h = _block(h, (seed & _M32).view(-1, 1))
    h = _block(h, ((seed >> 32) & _M32).view(-1, 1))
    h = _block(h, (positions & _M32).view(-1, 1))
    h = _block(h, (cols & _M32).view(1, -1))  # [B, V]
    h = h ^ 16
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def gumbel_argmax(logprobs, seed, positions):
    """One token per row: argmax(logprobs + Gumbel noise), the noise from murmur3_32 as a
    uniform u in [0, 1]: g = -log(-log u), with log u capped at -2^-32 (u = 1 would give +inf).
    logprobs float [B, V]; seed, positions int64 [B] -> int64 [B, 1]."""
    import torch

    cols = torch.arange(logprobs.shape[1], device=logprobs.device)
    u = murmur3_32(seed.long(), positions.long(), cols).double() / _M32
    g = -torch.log(-torch.log(u).clamp(min=torch.finfo(torch.float64).min, max=-(2.0**-32)))
    return torch.argmax(logprobs.double() + g, dim=1, keepdim=True)


def deterministic_on() -> bool:
    """The server's --enable-deterministic-inference (False where no config is published)."""
    try:
        from sglang.srt.runtime_context import get_exec

        return bool(get_exec().deterministic.enable_deterministic_inference)
    except Exception:
        return False


def _batch_invariant(original, runner, *args, **kwargs):
    archs = getattr(runner.model_config.hf_config, "architectures", None) or []
    if str(runner.device) == "cpu" and archs[:1] == [ARCH]:
        if deterministic_on():
            logger.info("sglang_dsv41: deterministic inference on CPU (batch-invariant path)")
        return None
    return original(runner, *args, **kwargs)


def _seeded(original, logprobs, seed, positions, *args, **kwargs):
    from sglang_dsv41.sglang.options import served

    if logprobs.device.type == "cpu" and served() is not None:
        return gumbel_argmax(logprobs, seed, positions)
    return original(logprobs, seed, positions, *args, **kwargs)


# id(SamplingParams shared by a fan-out's copies) -> (that object, copies sent so far). An entry
# leaves when its n-th copy is sent; a fan-out cut short leaves one, so the table is bounded.
_fanouts: dict = {}
_FANOUTS_KEPT = 1024


def next_choice(sp) -> int:
    """The choice index of the next copy sent with SamplingParams `sp` (0, 1, .., n - 1)."""
    sent = _fanouts.pop(id(sp), (None, 0))
    k = sent[1] if sent[0] is sp else 0
    if k + 1 < sp.n:
        _fanouts[id(sp)] = (sp, k + 1)
        while len(_fanouts) > _FANOUTS_KEPT:
            del _fanouts[next(iter(_fanouts))]
    return k


def _choice_seeds(tokenizer_manager, tokenized_obj, *args, **kwargs):
    sp = getattr(tokenized_obj, "sampling_params", None)
    if sp is None or (sp.n or 1) <= 1 or sp.max_new_tokens == 0 or not deterministic_on():
        return None  # one choice, or the fan-out's prefix-caching request (0 new tokens)
    archs = getattr(tokenizer_manager.model_config.hf_config, "architectures", None) or []
    if archs[:1] != [ARCH]:
        return None
    import msgspec

    from sglang_dsv41.request_rules import choice_seed

    k = next_choice(sp)
    if k > 0:
        seed = DEFAULT_SEED if sp.sampling_seed is None else sp.sampling_seed
        seeded = msgspec.structs.replace(sp, sampling_seed=choice_seed(seed, k))
        tokenized_obj.sampling_params = seeded
    return None


def register_deterministic(backend_name: str) -> None:
    import multiprocessing

    from sglang.srt.arg_groups.choices import (
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
        add_deterministic_attention_backend_choices,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if backend_name not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
        add_deterministic_attention_backend_choices([backend_name])
    if multiprocessing.parent_process() is not None:  # the scheduler builds the model runner
        HookRegistry.register(_BATCH_INVARIANT, _batch_invariant, HookType.AROUND)
        HookRegistry.register(_SEEDED, _seeded, HookType.AROUND)
    else:  # the launcher's tokenizer manager fans out n
        HookRegistry.register(_SEND_ONE, _choice_seeds, HookType.BEFORE)
