"""ServingOptions: the served model's switches, built once from the config and SGLang's flags.

    replay   decoder SWA bounded replay (server flag --enable-decoder-swa-bounded-replay, default
             on; --no-enable-decoder-swa-bounded-replay turns it off), where the config supports
             it (every kv source at or before the first decoder layer, docs/design.md 2.5)

The model builds its options and hands them to the pool and backend. SGLang's scheduler hooks
(the radix-match cap on a `Req`) run in the same process but see only the request, so the
model also registers its options here; that registration is the only module-level state.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv41.config import DeepseekV41Config


@dataclass(frozen=True)
class ServingOptions:
    cfg: DeepseekV41Config
    replay: bool

    @classmethod
    def from_server(cls, cfg: DeepseekV41Config) -> ServingOptions:
        return cls(cfg, replay_flag() and replay_supported(cfg))

    def replay_floor(self, prompt_len: int, wants_prompt_logprobs: bool = False) -> int:
        """Decoder SWA floor of a request: max(0, prompt - window) with replay, else 0.
        Requests that ask for prompt logprobs run the full forward (every prompt row gets its
        exact logits); output logprobs do not change the floor."""
        if not self.replay or wants_prompt_logprobs:
            return 0
        return max(0, prompt_len - self.cfg.sliding_window)

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


def replay_supported(cfg: DeepseekV41Config) -> bool:
    """Replay needs every decoder kv source at the first decoder layer (docs/design.md 2.5)."""
    return all(s <= cfg.decoder_start for s in cfg.kv_source_layer_ids)


_SERVED: ServingOptions | None = None


def register_served(options: ServingOptions) -> None:
    global _SERVED
    _SERVED = options


def served() -> ServingOptions | None:
    """The options of this process's served model (None until it is built)."""
    return _SERVED
