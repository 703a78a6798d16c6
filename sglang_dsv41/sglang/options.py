"""ServingOptions: the served model's switches, built once from the config and SGLang's flags.

    replay   decoder SWA bounded replay (server flag --enable-decoder-swa-bounded-replay, default
             on; --no-enable-decoder-swa-bounded-replay turns it off), where the config supports
             it (`DeepseekV41Config.replay_error`, docs/design.md 2.5)
    prefix_replay   a radix hit whose SWA is gone resumes by bounded replay (docs/design.md
             2.8): environment variable SGLANG_DSV41_PREFIX_REPLAY = on / off; unset, it follows
             decoder replay (both approximate; with replay off the served path stays exact).
             Only where the model's own layer loop runs the forward (the torch model)
    attn_dtype   the sparse attention's queries and output (`MqaAttentionBase.attn_dtype`):
             environment variable SGLANG_DSV41_ATTN_DTYPE = fp32 (None: the exact path) or
             bf16 (the bf16 kernels, as SGLang's V4 attention); unset, the model's default:
             bf16 for the in-tree CUDA model (released checkpoints on GPUs), fp32 for the
             pure-torch model (CPU serving, the oracle's twin)

The model builds its options once (`model.options`); the pool sizing and the pool read them
off the model SGLang loaded before them, and the backend off the pool. SGLang's scheduler hooks
(the radix-match cap on a `Req`) run in the same process but see only the request, so the
model also registers its options here; that registration is the only module-level state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.attention import ATTN_DTYPES

ATTN_DTYPE_ENV = "SGLANG_DSV41_ATTN_DTYPE"
PREFIX_REPLAY_ENV = "SGLANG_DSV41_PREFIX_REPLAY"
INTREE_ATTN_DEFAULT = "bf16"  # the in-tree CUDA model's mode when the environment names none


@dataclass(frozen=True)
class ServingOptions:
    cfg: DeepseekV41Config
    replay: bool
    attn_dtype: torch.dtype | None = None
    prefix_replay: bool = False

    @classmethod
    def from_server(
        cls, cfg: DeepseekV41Config, attn_default: str = "fp32", folds: bool = True
    ) -> ServingOptions:
        """attn_default: the model's attention I/O mode when the environment names none;
        folds: the model's forward runs a prefix replay's rows (serving.prefix_replay.Fold)."""
        replay = replay_flag() and cfg.replay_error() is None
        prefix = folds and prefix_replay_flag(replay)
        return cls(cfg, replay, attn_dtype(attn_default), prefix)

    @property
    def attn_mode(self) -> str:
        """attn_dtype by name (fp32 / bf16)."""
        return attn_mode_name(self.attn_dtype)

    def replay_floor(self, prompt_len: int, wants_prompt_logprobs: bool = False) -> int:
        """Decoder SWA floor of a request: `DeepseekV41Config.replay_floor` with replay, else 0.
        Requests that ask for prompt logprobs run the full forward (every prompt row gets its
        exact logits); output logprobs do not change the floor."""
        if not self.replay or wants_prompt_logprobs:
            return 0
        return self.cfg.replay_floor(prompt_len)

    def floor_of(self, req) -> int:
        """Replay floor of an SGLang scheduler `Req`."""
        prompt = len(req.origin_input_ids)
        start = getattr(req, "logprob_start_len", -1)
        wants = bool(getattr(req, "return_logprob", False)) and 0 <= start < prompt
        return self.replay_floor(prompt, wants)


def replay_flag() -> bool:
    """SGLang's decoder replay switch: None (unset) = on."""
    try:
        from sglang.srt.runtime_context import get_exec

        value = get_exec().features.enable_decoder_swa_bounded_replay
    except Exception:  # no runtime context (unit tests): the default
        value = None
    return value is not False


def prefix_replay_flag(replay: bool, env=os.environ) -> bool:
    """SGLANG_DSV41_PREFIX_REPLAY: on / off (1 / 0, true / false); unset or empty: `replay`
    (decoder replay's switch). Any other value is an error naming the variable."""
    text = env.get(PREFIX_REPLAY_ENV, "").strip().lower()
    if not text:
        return replay
    if text in ("on", "1", "true"):
        return True
    if text in ("off", "0", "false"):
        return False
    raise ValueError(f"{PREFIX_REPLAY_ENV}={env.get(PREFIX_REPLAY_ENV)!r}: on or off")


def attn_dtype(default: str = "fp32", env=os.environ) -> torch.dtype | None:
    """The attention I/O dtype SGLANG_DSV41_ATTN_DTYPE names (fp32 -> None, bf16), or the
    default's when unset or empty; any other value is an error naming the variable."""
    name = env.get(ATTN_DTYPE_ENV, "").strip().lower() or default
    if name not in ATTN_DTYPES:
        raise ValueError(
            f"{ATTN_DTYPE_ENV}={env.get(ATTN_DTYPE_ENV)!r}: one of {', '.join(ATTN_DTYPES)}"
        )
    return ATTN_DTYPES[name]


def attn_mode_name(dtype: torch.dtype | None) -> str:
    """An attention I/O dtype by its name in ATTN_DTYPES (None -> fp32, bf16)."""
    return next(k for k, v in ATTN_DTYPES.items() if v == dtype)


_SERVED: ServingOptions | None = None


def register_served(options: ServingOptions) -> None:
    global _SERVED
    _SERVED = options


def served() -> ServingOptions | None:
    """The options of this process's served model (None until it is built)."""
    return _SERVED
