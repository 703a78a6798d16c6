"""Where request_rules' checks run: HookRegistry hooks on SGLang's request path.

    http_server.serve_generate_request       /generate, streamed or not, before a stream starts
                                             (so a bad request gets a 400, not an error event
                                             inside a 200 stream); SGLang's own request checks
                                             run there too, on a copy
    OpenAIServingCompletion / OpenAIServingChat._convert_to_internal_request
                                             /v1/completions, /v1/chat/completions: the
                                             converted request, named with the route's fields;
                                             a ValueError there is SGLang's own 400
    TokenizerManager._validate_one_request   every route once its prompt is tokenized (chat
                                             templates, text prompts, the Engine API)
    OpenAIServingScore._convert_to_internal_request
                                             /v1/score: no embedding overrides
    api_contract.generate_contract_error     /generate's schema errors name the field
    managers.utils.validate_input_length     the scheduler's admission check: a last line, so
                                             a request that got past the others is aborted with
                                             a message instead of ending the scheduler
    http_server.set_global_state             FastAPI's validation errors answered without the
                                             server's file paths (SGLang's message quotes the
                                             endpoint's source file and line; a body that is
                                             not JSON names the field of its NaN / Infinity),
                                             and request_gate.RequestGate on the app (the body
                                             cap, embedding routes, parser names)
Before any prompt is tokenized: n and the batch (prompts x n <= --dsv41-max-n), seeds, stop
patterns, non-token inputs, and a text prompt's length from its probe (request_limits.probe_of).
Every hook passes through untouched unless DeepseekV41ForCausalLM is served. The HTTP-side hooks
are registered in the launcher process only (the one that serves HTTP and tokenizes), so the
scheduler and detokenizer processes do not import the HTTP server.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dsv41.request_limits import (
    SCORE_EMBEDDING_INPUTS,
    check_probe,
    check_stop_regex,
    check_token_inputs_only,
    json_error_message,
    probe_of,
    request_bytes_cap,
)
from sglang_dsv41.request_rules import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    Limits,
    Names,
    Prompt,
    RequestRejected,
    check_count,
    check_fanout,
    check_openai_limits,
    check_prompt,
    check_seed,
    check_seeded_sampling,
    check_token_ids,
    n_of_generate,
    prompts_of_generate,
)
from sglang_dsv41.sglang.deterministic import deterministic_on
from sglang_dsv41.sglang.hf_config import ARCH
from sglang_dsv41.sglang.options import served
from sglang_dsv41.sglang.server_flags import server_caps

logger = logging.getLogger(__name__)

_HTTP = "sglang.srt.entrypoints.http_server"
_SERVE_GENERATE = f"{_HTTP}.serve_generate_request"
_SET_STATE = f"{_HTTP}.set_global_state"
_COMPLETIONS = (
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
    "._convert_to_internal_request"
)
_CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request"
_SCORE = (
    "sglang.srt.entrypoints.openai.serving_score.OpenAIServingScore._convert_to_internal_request"
)
_VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
_CONTRACT = "sglang.srt.entrypoints.api_contract.generate_contract_error"
_ADMIT = "sglang.srt.managers.utils.validate_input_length"

# Only a prompt this many bytes short of the context can be too long (a token covers at least
# one byte; the margin covers the special tokens a tokenizer adds).
_BYTES_MARGIN = 8


def _serves_dsv41(model_config) -> bool:
    archs = getattr(getattr(model_config, "hf_config", None), "architectures", None) or []
    return bool(archs) and archs[0] == ARCH


def limits_of(tokenizer_manager) -> Limits | None:
    """The served model's limits as the tokenizer manager knows them; None if not this model."""
    mc = tokenizer_manager.model_config
    if not _serves_dsv41(mc):
        return None
    return Limits(
        vocab_size=int(mc.vocab_size),
        context_len=int(tokenizer_manager.context_len),
        reserved=int(getattr(tokenizer_manager, "num_reserved_tokens", 0) or 0),
        auto_truncate=bool(getattr(tokenizer_manager, "allow_auto_truncate", False)),
        caps=server_caps(),
    )


def check_before_stream(obj, tokenizer_manager, names: Names) -> None:
    """Every prompt of a GenerateReqInput (not yet normalized), its fan-out, seeds, stop
    patterns and non-token inputs, then SGLang's own checks of it on a copy, so they too answer
    400 before a stream starts (and before any prompt is tokenized or fanned out). A text prompt
    is tokenized here only in part (its probe), or, for a stream, whole when its length alone
    could exceed the context (else the tokenizer manager's own check answers before any byte is
    sent)."""
    limits = limits_of(tokenizer_manager)
    if limits is None:
        return
    check_token_inputs_only(obj)
    prompts = prompts_of_generate(obj)
    check_fanout(len(prompts), n_of_generate(obj), limits.caps, names)
    sets = obj.sampling_params if isinstance(obj.sampling_params, list) else [obj.sampling_params]
    for sp in sets:
        if isinstance(sp, dict):
            check_seed(sp.get("sampling_seed"), deterministic_on(), names.seed)
            check_stop_regex(sp.get("stop_regex"), names.stop_regex)
    for p in prompts:
        if p.ids is None and isinstance(p.text, str):
            p.ids = _tokenized_if_long(p, tokenizer_manager, limits, obj.stream, names)
        check_prompt(p, limits, names)
    _sglang_checks(obj, tokenizer_manager, limits)


def _tokenized_if_long(p: Prompt, tokenizer_manager, limits: Limits, stream: bool, names: Names):
    """A text prompt's ids when its length must be judged here: refused from its probe when
    that alone reaches the context; tokenized whole for a stream that could exceed it."""
    if limits.auto_truncate:
        return None
    encode = tokenizer_manager.tokenizer.encode
    probe = probe_of(p.text, limits.context_len)
    if probe is not None:
        check_probe(len(encode(probe)), len(probe), limits.context_len, names.text + p.index)
    if stream and len(p.text.encode()) + _BYTES_MARGIN >= limits.context_len:
        return list(encode(p.text))
    return None


def check_chat_text(request, tokenizer_manager) -> None:
    """A chat request's message texts, judged by their probe before the chat template
    tokenizes them whole."""
    limits = limits_of(tokenizer_manager)
    if limits is None or limits.auto_truncate:
        return
    parts = []
    for m in getattr(request, "messages", None) or []:
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for c in content:
                text = c.get("text") if isinstance(c, dict) else getattr(c, "text", None)
                if isinstance(text, str):
                    parts.append(text)
    probe = probe_of("\n".join(parts), limits.context_len)
    if probe is not None:
        n = len(tokenizer_manager.tokenizer.encode(probe))
        check_probe(n, len(probe), limits.context_len, "messages")


def _sglang_checks(obj, tokenizer_manager, limits: Limits) -> None:
    """What SGLang checks once the request is under way: its normalization (a shallow copy: it
    only reassigns fields) and each sampling-parameter set (an unknown key is a TypeError
    there, a 500; here a 400)."""
    probe = copy.copy(obj)
    probe.normalize_batch_and_arguments()
    sets = (
        probe.sampling_params
        if isinstance(probe.sampling_params, list)
        else [probe.sampling_params]
    )
    preferred = getattr(tokenizer_manager, "preferred_sampling_params", None) or {}
    for sp in sets:
        try:
            params = tokenizer_manager.sampling_params_class(**{**preferred, **(sp or {})})
        except TypeError as e:
            raise RequestRejected(f"sampling_params: {e}") from None
        params.normalize(tokenizer_manager.tokenizer)
        params.verify(limits.vocab_size)
        check_seeded_sampling(params.min_p, deterministic_on())


async def _serve_generate(original, obj, request, *args, **kwargs):
    from sglang.srt.entrypoints.http_server import get_global_state

    try:
        check_before_stream(obj, get_global_state().tokenizer_manager, GENERATE)
    except ValueError as e:  # RequestRejected, or SGLang's own (its HTTP layer's 400 too)
        from fastapi.responses import ORJSONResponse

        return ORJSONResponse({"error": {"message": str(e)}}, status_code=400)
    return await original(obj, request, *args, **kwargs)


def _openai_names(names: Names):
    def around(original, serving, request, *args, **kwargs):
        if limits_of(serving.tokenizer_manager) is None:
            return original(serving, request, *args, **kwargs)
        check_openai_limits(request)
        if names is CHAT:
            check_chat_text(request, serving.tokenizer_manager)
        result = original(serving, request, *args, **kwargs)
        adapted = result[0]
        if hasattr(adapted, "sampling_params"):  # a GenerateReqInput
            check_before_stream(adapted, serving.tokenizer_manager, names)
        return result

    return around


def _score(result, serving, request, *args, **kwargs):
    if limits_of(serving.tokenizer_manager) is not None:
        check_token_inputs_only(request, SCORE_EMBEDDING_INPUTS)
    return result


def _validate_one(tokenizer_manager, obj, input_ids, *args, **kwargs):
    limits = limits_of(tokenizer_manager)
    if limits is None or not hasattr(obj, "return_logprob"):  # not ours, or an embedding
        return None
    sp = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
    p = Prompt(
        ids=list(input_ids) if input_ids is not None else None,
        text=obj.text if obj.input_ids is None else None,
        max_new_tokens=sp.get("max_new_tokens"),
        return_logprob=bool(obj.return_logprob),
        logprob_start_len=obj.logprob_start_len,
        top_logprobs_num=obj.top_logprobs_num,
        stop_token_ids=sp.get("stop_token_ids"),
    )
    check_prompt(p, limits, GENERATE)
    return None


def admission_error(req, vocab_size: int, deterministic: bool = False) -> str | None:
    """The scheduler's last check of a Req: token ids, top-logprob count, stop ids, and min_p
    under deterministic inference."""
    try:
        check_seeded_sampling(getattr(req.sampling_params, "min_p", 0.0), deterministic)
        check_token_ids(req.origin_input_ids, vocab_size, "input_ids")
        n = getattr(getattr(req, "logprob", None), "top_logprobs_num", 0)  # Req.logprob
        check_count(n, vocab_size, "top_logprobs_num", "the vocabulary size")
        stop = getattr(getattr(req, "sampling_params", None), "stop_token_ids", None)
        if stop:
            check_token_ids(list(stop), vocab_size, "stop_token_ids")
    except RequestRejected as e:
        return str(e)
    return None


def _admit(result, req, *args, **kwargs):
    options = served()
    if result is not None or options is None:
        return result
    return admission_error(req, options.cfg.vocab_size, deterministic_on())


def validation_message(errors, body=None) -> str:
    """FastAPI/pydantic validation errors -> 'field: message (got value)', no source paths; a
    body that is not JSON (body: its bytes) -> request_limits.json_error_message."""
    parts = []
    for err in errors or []:
        loc = [x for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            pos = loc[0] if loc and isinstance(loc[0], int) else 0
            parts.append(json_error_message(body, pos, (err.get("ctx") or {}).get("error", "")))
            continue
        msg = str(err.get("msg", "invalid value")).strip()
        value = err.get("input")
        got = repr(value)
        if value is not None and not isinstance(value, dict | list) and len(got) <= 80:
            msg = f"{msg} (got {got})"
        where = ".".join(str(x) for x in loc)
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request"


_SERDE_TYPES = {"i64": "an integer", "u64": "a non-negative integer", "f64": "a number"}


def contract_field(body, error: str, check) -> str:
    """SGLang's /generate schema error (serde's text, no field) with the field that causes
    it: the first key (or sampling_params key) whose removal clears it; check(body) -> the
    error or None."""
    for raw, words in _SERDE_TYPES.items():
        error = error.replace(f"expected {raw}", f"expected {words}")
    if not isinstance(body, dict):
        return error
    for key, value in body.items():
        if check({k: v for k, v in body.items() if k != key}) is not None:
            continue
        if key == "sampling_params" and isinstance(value, dict):
            for sub in value:
                inner = {k: v for k, v in value.items() if k != sub}
                if check({**body, key: inner}) is None:
                    return f"{key}.{sub}: {error}"
        return f"{key}: {error}"
    return error


def _contract(original, body, *args, **kwargs):
    from sglang.srt.entrypoints.http_server import get_global_state

    error = original(body, *args, **kwargs)
    if error is None or limits_of(get_global_state().tokenizer_manager) is None:
        return error
    return contract_field(body, error, lambda b: original(b, *args, **kwargs))


def _set_state(result, global_state, *args, **kwargs):
    tokenizer_manager = global_state.tokenizer_manager
    if not _serves_dsv41(getattr(tokenizer_manager, "model_config", None)):
        return result
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints.http_server import app

    from sglang_dsv41.sglang.request_gate import RequestGate

    stock = app.exception_handlers.get(RequestValidationError)

    async def handler(request, exc):
        path = request.url.path
        if stock is not None and (path.startswith("/v1/messages") or path == "/v1/systemone"):
            return await stock(request, exc)  # these already answer without source paths
        message = validation_message(exc.errors(), getattr(exc, "body", None))
        if path.startswith("/v1/responses"):
            body = {"error": {"message": message, "type": "Bad Request", "code": 400}}
        else:
            body = {"object": "error", "message": message, "type": "Bad Request", "code": 400}
        return ORJSONResponse(body, status_code=400)

    app.add_exception_handler(RequestValidationError, handler)
    caps = server_caps()
    cap_bytes = request_bytes_cap(caps, tokenizer_manager.context_len)
    vocab = int(tokenizer_manager.model_config.vocab_size)
    app.add_middleware(RequestGate, cap_bytes=cap_bytes, vocab=vocab)
    logger.info(
        "sglang_dsv41: per request at most %d sequences (prompts x n, --dsv41-max-n), %d top "
        "logprobs per token (--dsv41-max-top-logprobs), %d body bytes "
        "(--dsv41-max-request-bytes)",
        caps.max_n,
        caps.max_top_logprobs,
        cap_bytes,
    )
    return result


def register_guards() -> None:
    """These hooks, and with them access.py's (keys redacted in every process) and
    server_flags.py's (the launcher parses the flags)."""
    from sglang_dsv41.sglang.access import register_access
    from sglang_dsv41.sglang.server_flags import register_server_flags

    register_access()
    HookRegistry.register(_ADMIT, _admit, HookType.AFTER)
    if multiprocessing.parent_process() is not None:
        return  # a scheduler / detokenizer subprocess: no HTTP, no tokenizer manager
    register_server_flags()
    HookRegistry.register(_SERVE_GENERATE, _serve_generate, HookType.AROUND)
    HookRegistry.register(_COMPLETIONS, _openai_names(COMPLETIONS), HookType.AROUND)
    HookRegistry.register(_CHAT, _openai_names(CHAT), HookType.AROUND)
    HookRegistry.register(_SCORE, _score, HookType.AFTER)
    HookRegistry.register(_VALIDATE_ONE, _validate_one, HookType.BEFORE)
    HookRegistry.register(_CONTRACT, _contract, HookType.AROUND)
    HookRegistry.register(_SET_STATE, _set_state, HookType.AFTER)
