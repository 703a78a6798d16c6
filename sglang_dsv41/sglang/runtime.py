"""Process-wide serving state of this plugin (one model per SGLang scheduler process).

Set when DeepseekV41ForCausalLM is built; read by the scheduler hooks (radix prefix cap,
per-request replay floors), which must act only when this package's model is served.
    replay   decoder SWA bounded replay on (server flag --enable-decoder-swa-bounded-replay,
             default on; --no-enable-decoder-swa-bounded-replay turns it off)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _State:
    cfg: object | None = None
    replay: bool = True


STATE = _State()


def replay_flag() -> bool:
    """The server's decoder replay switch: None (unset) = on."""
    try:
        from sglang.srt.runtime_context import get_exec

        value = get_exec().features.enable_decoder_swa_bounded_replay
    except Exception:
        value = None
    return value is not False


def replay_supported(cfg) -> bool:
    """Replay needs every decoder kv source at the first decoder layer (DESIGN.md 5)."""
    return all(s <= cfg.decoder_start for s in cfg.kv_source_layer_ids)


def activate(cfg) -> None:
    STATE.cfg = cfg
    STATE.replay = replay_flag() and replay_supported(cfg)


def active() -> bool:
    return STATE.cfg is not None


def replay_floor(prompt_len: int, wants_prompt_logprobs: bool = False) -> int:
    """Decoder SWA floor of a request: max(0, prompt - window) with replay, else 0. Requests
    that ask for prompt logprobs run the full forward (every prompt row gets real logits)."""
    if not active() or not STATE.replay or wants_prompt_logprobs:
        return 0
    return max(0, prompt_len - STATE.cfg.sliding_window)


_FLOORS: OrderedDict[str, int] = OrderedDict()
_FLOORS_KEPT = 1 << 16


def remember_floor(rid: str, floor: int) -> None:
    """Record a request's replay floor (bounded: the oldest entries are dropped)."""
    _FLOORS[rid] = floor
    _FLOORS.move_to_end(rid)
    while len(_FLOORS) > _FLOORS_KEPT:
        _FLOORS.popitem(last=False)


def floors_of(rids) -> list:
    """Replay floors of a batch's requests (0 where unknown: the full forward)."""
    return [_FLOORS.get(r, 0) for r in rids]


_TOKENS: OrderedDict[str, tuple] = OrderedDict()


def remember_tokens(rid: str, prompt, output) -> None:
    """Keep references to a request's prompt and output token lists (Engram history)."""
    _TOKENS[rid] = (prompt, output)
    _TOKENS.move_to_end(rid)
    while len(_TOKENS) > _FLOORS_KEPT:
        _TOKENS.popitem(last=False)


def tokens_at(rid: str, positions) -> list:
    """Token ids of request `rid` at absolute positions (prompt, then output)."""
    prompt, output = _TOKENS[rid]
    n = len(prompt)
    return [int(prompt[p]) if p < n else int(output[p - n]) for p in positions]
