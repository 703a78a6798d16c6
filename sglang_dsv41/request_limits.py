"""The rules of a request's envelope and of what it carries besides token ids (pure, no SGLang).

body size          at most Caps.max_request_bytes bytes (--dsv41-max-request-bytes); by
                   default 16 bytes per token of context, at least 1 MiB (tiny: 1 MiB,
                   V4.1-Flash at 1M tokens: 16 MiB). Read, JSON-decoded and tokenized in the
                   HTTP process's event loop, a body is work every other client waits for;
                   answered 413 before it is read
text length        a text prompt whose first PROBE_CHARS_PER_TOKEN x context characters
                   (cut at a space) already tokenize to the context length is refused
                   without tokenizing the rest: tokenizing a 10 MB prompt takes seconds
JSON numbers       NaN and Infinity are not JSON: the message names the field that held one
parser names       /parse_function_call's tool_call_parser and /separate_reasoning's
                   reasoning_parser name a parser SGLang has
embedding routes   /encode, /classify, /v1/embeddings, /v1/rerank, /v1/classify serve
                   embedding and reward models; this is a generation model
non-token inputs   positional_embed_overrides, input_embeds, image / video / audio data and
                   /v1/score's embedding overrides are refused: the model reads token ids
                   only
stop_regex         each a Python regular expression
"""

from __future__ import annotations

import re

from sglang_dsv41.request_rules import Caps, RequestRejected

MIB = 2**20
REQUEST_BYTES_PER_TOKEN = 16
MIN_REQUEST_BYTES = MIB
PROBE_CHARS_PER_TOKEN = 8


class BodyTooLarge(RequestRejected):
    """A body over the byte cap: answered 413."""


def default_request_bytes(context_len: int) -> int:
    """The body cap when the operator sets none: 16 B per token of context, at least 1 MiB."""
    return max(MIN_REQUEST_BYTES, REQUEST_BYTES_PER_TOKEN * int(context_len))


def request_bytes_cap(caps: Caps, context_len: int) -> int:
    return caps.max_request_bytes or default_request_bytes(context_len)


def check_body_size(n_bytes: int, cap: int, complete: bool = True) -> None:
    """n_bytes: the body's length (Content-Length), or with complete=False what has arrived so
    far of a body of unknown length."""
    if n_bytes > cap:
        size = f"{n_bytes} bytes" if complete else f"more than {cap} bytes"
        raise BodyTooLarge(
            f"the request body has {size}; this server reads at most {cap} bytes per request "
            "(--dsv41-max-request-bytes)"
        )


def probe_of(text: str, context_len: int) -> str | None:
    """The prefix of `text` a length check tokenizes: its first PROBE_CHARS_PER_TOKEN x
    context_len characters, cut back to the last whitespace in their second half (so the
    prefix ends where a word ends: its pre-tokens are the whole text's, and its token count is
    at most the whole's). None when the text is no longer than that."""
    n = PROBE_CHARS_PER_TOKEN * int(context_len)
    if len(text) <= n:
        return None
    cut = max(text.rfind(" ", n // 2, n), text.rfind("\n", n // 2, n))
    return text[: cut if cut > 0 else n]


def check_probe(tokens: int, probe_chars: int, context_len: int, field: str) -> None:
    """tokens: the token count of a text's probe (probe_of), probe_chars its length."""
    if tokens >= context_len:
        raise RequestRejected(
            f"{field}: its first {probe_chars} characters alone are {tokens} tokens; the "
            f"context length is {context_len}, so a prompt must have fewer tokens than that"
        )


_KEY_BEFORE = re.compile(rb'"((?:[^"\\]|\\.){1,80})"\s*:\s*(?:\[\s*(?:[^\[\]{}]*,\s*)?)?$')
_NON_NUMBERS = (b"NaN", b"-Infinity", b"+Infinity", b"Infinity", b"-inf", b"inf", b"nan")


def json_error_message(doc, pos: int, error: str) -> str:
    """The message for a body that is not JSON: doc the body (bytes or str), pos the byte at
    which the decoder stopped, error its reason. A NaN or Infinity is named with its field."""
    raw = doc.encode(errors="replace") if isinstance(doc, str) else bytes(doc or b"")
    pos = max(0, min(int(pos or 0), len(raw)))
    if pos > 0 and raw[pos - 1 : pos] in (b"-", b"+"):  # orjson stops after a sign
        pos -= 1
    at = next((w for w in _NON_NUMBERS if raw[pos : pos + 10].startswith(w)), None)
    key = _KEY_BEFORE.search(raw[max(0, pos - 4096) : pos])
    field = key.group(1).decode(errors="replace") if key else None
    if at is not None:
        where = f"{field} = {at.decode()}" if field else f"{at.decode()} at byte {pos}"
        return f"{where} is not a JSON number (JSON has no NaN or Infinity): send a finite number"
    near = f" (in {field})" if field else ""
    return f"the body is not valid JSON at byte {pos}{near}: {error}"


def check_parser_name(name, known, field: str) -> None:
    """name: a parser's name as the request gives it; known: the names SGLang has."""
    known = sorted(known)
    if name not in known:
        raise RequestRejected(
            f"{field} = {name!r} is not a parser this server has; known: {', '.join(known)}"
        )


EMBEDDING_ROUTES = ("/encode", "/classify", "/v1/embeddings", "/v1/rerank", "/v1/classify")


def embedding_route_message(path: str) -> str | None:
    """The refusal of an embedding / reward route on this generation model, or None."""
    if path.rstrip("/") not in EMBEDDING_ROUTES:
        return None
    return (
        f"{path} serves embedding and reward models; DeepseekV41ForCausalLM is a generation "
        "model (use /generate, /v1/completions or /v1/chat/completions)"
    )


# Inputs that bypass the token ids: the torch model reads token ids only (its forward takes no
# input embeddings; vision and audio are not served), so these are refused by name rather than
# ignored or passed on.
NON_TOKEN_INPUTS = (
    "input_embeds",
    "positional_embed_overrides",
    "image_data",
    "video_data",
    "audio_data",
)
SCORE_EMBEDDING_INPUTS = (
    "embed_override_token_id",
    "query_embed_overrides",
    "item_embed_overrides",
)


def check_token_inputs_only(obj, fields=NON_TOKEN_INPUTS) -> None:
    """Each of `fields` unset (None) on obj (a request object or a dict of its extra fields)."""
    for name in fields:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            raise RequestRejected(
                f"{name} is not supported: DeepseekV41ForCausalLM reads token ids only "
                "(leave it out; send text or input_ids)"
            )


def check_stop_regex(patterns, field: str) -> None:
    """stop_regex (a pattern or a list of them, None = unset): each a Python regular expression
    (SGLang parses them with `re`'s parser, outside its own error handling)."""
    if patterns is None:
        return
    many = isinstance(patterns, list)
    for i, pattern in enumerate(patterns if many else [patterns]):
        where = f"{field}[{i}]" if many else field
        if not isinstance(pattern, str):
            raise RequestRejected(f"{where} = {pattern!r} must be a regular expression (a string)")
        try:
            re.compile(pattern)
        except re.error as e:
            raise RequestRejected(
                f"{where} = {pattern!r} is not a regular expression: {e}"
            ) from None
