"""The HTTP process's first look at a request, before FastAPI reads its body (ASGI middleware).

    every route        a body over the byte cap (request_limits.request_bytes_cap) is answered
                       413 before it is read: from its Content-Length, or, for a body of unknown
                       length, as soon as more than the cap has arrived
    embedding routes   /encode, /classify, /v1/embeddings, /v1/rerank, /v1/classify: 400, this
                       is a generation model (unread)
    BODY_CHECKS        routes whose body is judged here (read, then handed on unchanged):
                       /parse_function_call and /separate_reasoning name a known parser (SGLang
                       raises past its own 400 for an unknown one, a 500); /v1/completions and
                       /v1/chat/completions carry no non-token input (their request models drop
                       unknown fields, so `positional_embed_overrides` would be ignored);
                       /detokenize and /v1/detokenize take token ids in the vocabulary (the
                       tokenizer would answer an unknown id with an empty string)
Installed by guard_hooks on SGLang's app when DeepseekV41ForCausalLM is served; SGLang's API-key
middleware, added after it, runs first.
"""

from __future__ import annotations

import orjson

from sglang_dsv41.request_limits import (
    NON_TOKEN_INPUTS,
    BodyTooLarge,
    check_body_size,
    check_parser_name,
    check_token_inputs_only,
    embedding_route_message,
)
from sglang_dsv41.request_rules import RequestRejected, check_token_ids


def tool_parser_names() -> set:
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ADAPTER_OUTPUT_PARSERS
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    adapters = {n for names in ADAPTER_OUTPUT_PARSERS.values() for n in names}
    return set(FunctionCallParser.ToolCallParserEnum) | adapters


def reasoning_parser_names() -> set:
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ADAPTER_OUTPUT_PARSERS
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    adapters = {n for names in ADAPTER_OUTPUT_PARSERS.values() for n in names}
    return set(ReasoningParser.DetectorMap) | adapters


def _parser_check(field: str, known: set, lower: bool = False):
    def check(body: dict) -> None:
        name = body.get(field)
        check_parser_name(name.lower() if lower and isinstance(name, str) else name, known, field)

    return check


def _no_embedding_inputs(body: dict) -> None:
    check_token_inputs_only(body, NON_TOKEN_INPUTS)


def _detokenize_ids(vocab: int):
    def check(body: dict) -> None:
        tokens = body.get("tokens")
        if isinstance(tokens, list) and tokens and isinstance(tokens[0], list):
            for i, ids in enumerate(tokens):
                check_token_ids(ids, vocab, f"tokens[{i}]")
        elif tokens is not None:
            check_token_ids(tokens, vocab, "tokens")

    return check


# path -> (check of the decoded body, byte strings of which one must occur for it to run)
def body_checks(vocab: int | None = None) -> dict:
    """vocab: the served model's vocabulary size (None: token ids are not checked)."""
    keys = tuple(f'"{name}"'.encode() for name in NON_TOKEN_INPUTS)
    detokenize = {} if vocab is None else {p: (_detokenize_ids(vocab), None) for p in _DETOKENIZE}
    return detokenize | {
        "/parse_function_call": (_parser_check("tool_call_parser", tool_parser_names()), None),
        "/separate_reasoning": (
            _parser_check("reasoning_parser", reasoning_parser_names(), lower=True),
            None,
        ),
        "/v1/completions": (_no_embedding_inputs, keys),
        "/v1/chat/completions": (_no_embedding_inputs, keys),
    }


async def answer(send, status: int, message: str) -> None:
    """An error answer in SGLang's OpenAI error shape."""
    kind = "RequestEntityTooLarge" if status == 413 else "BadRequest"
    body = orjson.dumps({"object": "error", "message": message, "type": kind, "code": status})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive, cap: int) -> bytes:
    """The whole body, refused (BodyTooLarge) as soon as more than `cap` bytes arrived."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        check_body_size(size, cap, complete=False)
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def replay(body: bytes, receive):
    """A receive that hands the app `body` first, then the connection's own messages (so a
    client disconnect still reaches a streaming response)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


_DETOKENIZE = ("/detokenize", "/v1/detokenize")


class RequestGate:
    def __init__(self, app, cap_bytes: int, vocab: int | None = None, checks: dict | None = None):
        self.app, self.cap = app, int(cap_bytes)
        self.checks = body_checks(vocab) if checks is None else checks

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        refusal = embedding_route_message(path)
        if refusal is not None:
            return await answer(send, 400, refusal)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        check, needles = self.checks.get(path, (None, None))
        try:
            if length is not None and length.isdigit():
                check_body_size(int(length), self.cap)
            if check is not None or (chunked and length is None):
                body = await read_body(receive, self.cap)
                if check is not None and (needles is None or any(n in body for n in needles)):
                    self._judge(check, body)
                receive = replay(body, receive)
        except BodyTooLarge as e:
            return await answer(send, 413, str(e))
        except RequestRejected as e:
            return await answer(send, 400, str(e))
        return await self.app(scope, receive, send)

    @staticmethod
    def _judge(check, body: bytes) -> None:
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError:
            return  # FastAPI answers it (guard_hooks' validation handler names the field)
        if isinstance(decoded, dict):
            check(decoded)
