"""What a request must satisfy before it reaches DeepseekV41ForCausalLM (pure checks, no SGLang).

Stock SGLang 0.5.23 does not range-check prompt token ids, top-logprob counts or stop token ids:
an id outside [0, vocab) reaches the embedding lookup and a count above the vocabulary reaches
`torch.topk`, both inside the scheduler, whose exception ends every server process. A request
that breaks a rule here is answered 400 with a message naming the field, its position and the
value; guard_hooks.py runs these checks on each route (see there for where).

Rules (one `Prompt` = one prompt of a request, whatever the route):
    token ids          ints in [0, vocab); at least one; fewer than the context length
                       (unless --allow-auto-truncate)
    text               not empty; not given together with input_ids (/generate)
    top logprobs       0 <= n <= min(vocab, Caps.max_top_logprobs)
    logprob_start_len  -1 (no prompt logprobs) or in [0, prompt length]
    stop_token_ids     ints in [0, vocab)
    max new tokens     at least 1 on every route; 0 only for a /generate logprob request
                       (return_logprob: prompt scoring or next-token logprobs), which is how
                       SGLang's own scoring API uses it; the OpenAI routes require >= 1
    min_p              0 under --enable-deterministic-inference (SGLang's seeded sampler
                       asserts it away inside the scheduler)
Rules of a whole request:
    n                  an int >= 1; prompts x n <= Caps.max_n (the sequences one request fans
                       out to, each a scheduler request)
    batch lists        a per-prompt list (sampling_params, return_logprob, ...) has one entry
                       per prompt; a single prompt takes one sampling_params object
    seed               an int64; only with --enable-deterministic-inference (without it SGLang's
                       sampler ignores seeds, so a seeded request is refused rather than
                       answered unseeded); choice k of n samples with choice_seed(seed, k)
The limits of Caps (server flags, sglang/server_flags.py), what a request may carry besides
token ids (non-token inputs, stop patterns) and the rules of its envelope (body size, parser
names, JSON numbers) are in request_limits.py.
"""

from __future__ import annotations

from dataclasses import dataclass


class RequestRejected(ValueError):
    """A request this server refuses. SGLang's HTTP layer answers a ValueError with 400."""


DEFAULT_MAX_N = 64
DEFAULT_MAX_TOP_LOGPROBS = 20  # OpenAI's own cap on top_logprobs


@dataclass(frozen=True)
class Caps:
    """What one request may ask for on this server, so that no request stalls the others
    (server flags in sglang/server_flags.py; request_limits.py has the byte limit's default).

    max_n              sequences one request fans out to: prompts x n
    max_top_logprobs   top logprobs per token (/generate top_logprobs_num, /v1/completions
                       logprobs, /v1/chat/completions top_logprobs)
    max_request_bytes  request body bytes read before any rule runs; 0 = the default for the
                       served context length (request_limits.default_request_bytes)
    """

    max_n: int = DEFAULT_MAX_N
    max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS
    max_request_bytes: int = 0


@dataclass(frozen=True)
class Limits:
    """What the served model accepts. `reserved` = tokens SGLang reserves per request;
    `auto_truncate` = SGLang's --allow-auto-truncate (long prompts are cut, not refused);
    `caps` = the server's per-request caps."""

    vocab_size: int
    context_len: int
    reserved: int = 0
    auto_truncate: bool = False
    caps: Caps = Caps()


@dataclass(frozen=True)
class Names:
    """The user-facing field names of one route, so a message names what the client sent."""

    prompt: str = "input_ids"
    top_logprobs: str = "top_logprobs_num"
    max_tokens: str = "sampling_params.max_new_tokens"
    stop_ids: str = "sampling_params.stop_token_ids"
    zero_tokens_for_logprobs: bool = True  # /generate: 0 new tokens with return_logprob
    n: str = "sampling_params.n"
    seed: str = "sampling_params.sampling_seed"
    text: str = "text"
    stop_regex: str = "sampling_params.stop_regex"


GENERATE = Names()
COMPLETIONS = Names(
    prompt="prompt",
    top_logprobs="logprobs",
    max_tokens="max_tokens",
    stop_ids="stop_token_ids",
    zero_tokens_for_logprobs=False,
    n="n",
    seed="seed",
    text="prompt",
    stop_regex="stop_regex",
)
CHAT = Names(
    top_logprobs="top_logprobs",
    max_tokens="max_tokens",
    stop_ids="stop_token_ids",
    zero_tokens_for_logprobs=False,
    n="n",
    seed="seed",
    text="messages",
    stop_regex="stop_regex",
)


@dataclass
class Prompt:
    """One prompt's fields. ids None = text not tokenized yet (the id rules wait for it)."""

    ids: list | None = None
    text: str | None = None
    max_new_tokens: int | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = -1
    top_logprobs_num: int | None = 0
    stop_token_ids: list | None = None
    index: str = ""  # "[i]" for the i-th prompt of a batch, so a message names it


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_token_ids(ids, vocab: int, field: str) -> None:
    """ids: a sequence of ints, every one in [0, vocab); else RequestRejected naming field[i]."""
    if isinstance(ids, str | bytes | dict) or not hasattr(ids, "__len__"):
        raise RequestRejected(f"{field} must be a list of token ids")
    if all(type(t) is int for t in ids) and (not ids or (min(ids) >= 0 and max(ids) < vocab)):
        return  # the common case, at C speed
    for i, t in enumerate(ids):
        if not _is_int(t):
            raise RequestRejected(f"{field}[{i}] = {t!r} is not an integer token id")
        if not 0 <= t < vocab:
            raise RequestRejected(
                f"{field}[{i}] = {t} is outside the vocabulary: token ids are in [0, {vocab})"
            )


def check_count(n, upper: int, field: str, what: str) -> None:
    """n: an int in [0, upper] (None = unset)."""
    if n is None:
        return
    if not _is_int(n) or not 0 <= n <= upper:
        raise RequestRejected(f"{field} = {n!r} must be an integer in [0, {upper}] ({what})")


def check_top_logprobs(n, limits: Limits, field: str) -> None:
    """n: top logprobs per token, in [0, min(vocab, caps.max_top_logprobs)] (None = unset)."""
    cap = limits.caps.max_top_logprobs
    if cap < limits.vocab_size:
        check_count(n, cap, field, "this server's --dsv41-max-top-logprobs")
    else:
        check_count(n, limits.vocab_size, field, "the vocabulary size")


def check_prompt(p: Prompt, limits: Limits, names: Names = GENERATE) -> None:
    """All rules of the module docstring for one prompt; raises RequestRejected."""
    if p.text is not None and p.text == "":
        raise RequestRejected(
            f"{names.text}{p.index} is empty: give a prompt of at least one character"
        )
    if p.ids is not None:
        field = names.prompt + p.index
        if len(p.ids) == 0:
            raise RequestRejected(f"{field} is empty: give at least one token id")
        check_token_ids(p.ids, limits.vocab_size, field)
        n = len(p.ids) + limits.reserved
        if n >= limits.context_len and not limits.auto_truncate:
            raise RequestRejected(
                f"the prompt{p.index} has {n} tokens; the context length is {limits.context_len}, "
                "so a prompt must have fewer tokens than that"
            )
    check_top_logprobs(p.top_logprobs_num, limits, names.top_logprobs)
    if p.stop_token_ids is not None:
        check_token_ids(p.stop_token_ids, limits.vocab_size, names.stop_ids)
    start = p.logprob_start_len
    if p.return_logprob and start is not None:  # SGLang ignores it without return_logprob
        upper = len(p.ids) if p.ids is not None else limits.context_len
        if not _is_int(start) or not -1 <= start <= upper:
            raise RequestRejected(
                f"logprob_start_len = {start!r} must be -1 (no prompt logprobs) or in "
                f"[0, {upper}] (the prompt length)"
            )
    _check_max_new_tokens(p, names)


def _check_max_new_tokens(p: Prompt, names: Names) -> None:
    n = p.max_new_tokens
    if n is None:
        return
    if not _is_int(n) or n < 0:
        raise RequestRejected(f"{names.max_tokens} = {n!r} must be a positive integer")
    if n == 0 and not (names.zero_tokens_for_logprobs and p.return_logprob):
        hint = (
            " (0 is accepted only with return_logprob, to score a prompt)"
            if names.zero_tokens_for_logprobs
            else ""
        )
        raise RequestRejected(f"{names.max_tokens} = 0 must be at least 1{hint}")


def prompts_of_generate(obj) -> list[Prompt]:
    """Split a /generate body (a GenerateReqInput before SGLang normalizes it: one prompt or a
    batch) into Prompts. Raises RequestRejected for fields that contradict each other."""
    text, ids = obj.text, obj.input_ids
    if text is not None and ids is not None:
        raise RequestRejected("give either text or input_ids, not both")
    if isinstance(text, list):
        prompts = [Prompt(text=t) for t in text]
        batch = True
    elif ids is not None and len(ids) > 0 and isinstance(ids[0], list):
        prompts = [Prompt(ids=list(x)) for x in ids]
        batch = True
    else:
        prompts = [Prompt(ids=list(ids) if ids is not None else None, text=text)]
        batch = False
    if batch and not prompts:
        raise RequestRejected("the batch is empty: give at least one prompt")
    check_batch_lists(obj, len(prompts) if batch else None)

    def at(value, i, default):
        if batch and isinstance(value, list):
            return value[i] if i < len(value) else default
        return default if value is None else value

    params = obj.sampling_params
    for i, p in enumerate(prompts):
        p.index = f"[{i}]" if batch else ""
        sp = at(params, i, {}) if not isinstance(params, dict) else params
        sp = sp if isinstance(sp, dict) else {}
        p.max_new_tokens = sp.get("max_new_tokens")
        p.stop_token_ids = sp.get("stop_token_ids")
        p.return_logprob = bool(at(obj.return_logprob, i, False))
        p.logprob_start_len = at(obj.logprob_start_len, i, -1)
        p.top_logprobs_num = at(obj.top_logprobs_num, i, 0)
    return prompts


# A /generate field that holds one entry per prompt when it is a list (GenerateReqInput's
# per-prompt fields; token_ids_logprob only as a list of lists).
BATCH_FIELDS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_sampling_mask",
    "sampling_logprobs_mode",
    "return_hidden_states",
    "rid",
    "lora_path",
    "custom_logit_processor",
)


def check_batch_lists(obj, batch: int | None) -> None:
    """batch: the number of prompts of a batch, None for one prompt. In a batch every list in
    BATCH_FIELDS has one entry per prompt (SGLang indexes them per prompt); one prompt takes
    one sampling_params object, not a list."""
    if batch is None:
        if isinstance(obj.sampling_params, list):
            raise RequestRejected(
                "sampling_params is a list for a single prompt: give one object (a list holds "
                "one object per prompt of a batch)"
            )
        return
    for name in BATCH_FIELDS:
        value = getattr(obj, name, None)
        if isinstance(value, list) and len(value) != batch:
            raise RequestRejected(
                f"{name} has {len(value)} entries for a batch of {batch} prompts: give one "
                "per prompt, or one value (not a list) for all"
            )
    t = getattr(obj, "token_ids_logprob", None)
    if isinstance(t, list) and t and isinstance(t[0], list) and len(t) != batch:
        raise RequestRejected(
            f"token_ids_logprob has {len(t)} lists for a batch of {batch} prompts: give one "
            "per prompt, or one flat list for all"
        )


def n_of_generate(obj):
    """The n of a /generate body (SGLang reads it from the first sampling_params of a list)."""
    sp = obj.sampling_params
    if isinstance(sp, list):
        sp = sp[0] if sp else None
    return sp.get("n", 1) if isinstance(sp, dict) else 1


def check_fanout(prompts: int, n, caps: Caps, names: Names) -> None:
    """n: choices per prompt, an int >= 1; prompts x n: the sequences one request fans out to,
    at most caps.max_n (each is a scheduler request: an unbounded fan-out queues ahead of
    every other client's request)."""
    if n is None:
        n = 1
    if not _is_int(n) or n < 1:
        raise RequestRejected(f"{names.n} = {n!r} must be an integer >= 1 (choices per prompt)")
    if prompts * n > caps.max_n:
        what = f"{names.n} = {n}" if prompts == 1 else f"{prompts} prompts x {names.n} = {n}"
        raise RequestRejected(
            f"{what} asks for {prompts * n} sequences; this server answers at most "
            f"{caps.max_n} per request (--dsv41-max-n)"
        )


INT64 = 2**63


def check_seed(seed, deterministic: bool, field: str) -> None:
    """A seed (None = unset) is an int64, honoured only under --enable-deterministic-inference;
    without it SGLang's sampler ignores seeds, so a seeded request is refused, not answered
    with unseeded text."""
    if seed is None:
        return
    if not _is_int(seed) or not -INT64 <= seed < INT64:
        raise RequestRejected(f"{field} = {seed!r} must be an integer in [-2^63, 2^63)")
    if not deterministic:
        raise RequestRejected(
            f"{field} = {seed}: seeds are honoured only when the server runs with "
            "--enable-deterministic-inference; this one samples unseeded (leave the seed out)"
        )


_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: consecutive choices' seeds far apart


def choice_seed(seed: int, k: int) -> int:
    """The seed choice k of n samples with: the request's seed for k = 0 (so n = 1 and choice
    0 of n give the same text), seed + k * golden (mod 2^64, as an int64) after that."""
    if k == 0:
        return seed
    x = (seed + k * _GOLDEN) % 2**64
    return x - 2**64 if x >= INT64 else x


def check_openai_limits(request) -> None:
    """The OpenAI fields SGLang folds away before its own checks: `max_completion_tokens: 0`
    (or `max_tokens: 0` on chat) would mean "no limit" after its `a or b`."""
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, field, None)
        if value is not None and (not _is_int(value) or value < 1):
            raise RequestRejected(f"{field} = {value!r} must be at least 1")


def check_seeded_sampling(min_p, deterministic: bool) -> None:
    """SGLang's seeded sampler (deterministic inference) has no min_p: it asserts, in the
    scheduler, that no row of the batch asks for it."""
    if deterministic and min_p:
        raise RequestRejected(
            f"min_p = {min_p!r}: min_p sampling is not available with "
            "--enable-deterministic-inference (leave it at 0)"
        )
