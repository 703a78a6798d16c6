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
    managers.utils.validate_input_length     the scheduler's admission check: a last line, so
                                             a request that got past the others is aborted with
                                             a message instead of ending the scheduler
    http_server.set_global_state             FastAPI's validation errors answered without the
                                             server's file paths (SGLang's message quotes the
                                             endpoint's source file and line)
Every hook passes through untouched unless DeepseekV41ForCausalLM is served. The HTTP-side hooks
are registered in the launcher process only (the one that serves HTTP and tokenizes), so the
scheduler and detokenizer processes do not import the HTTP server.
"""

from __future__ import annotations

import copy
import multiprocessing

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dsv41.request_rules import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    Limits,
    Names,
    Prompt,
    RequestRejected,
    check_count,
    check_openai_limits,
    check_prompt,
    check_seeded_sampling,
    check_token_ids,
    prompts_of_generate,
)
from sglang_dsv41.sglang.deterministic import deterministic_on
from sglang_dsv41.sglang.hf_config import ARCH
from sglang_dsv41.sglang.options import served

_HTTP = "sglang.srt.entrypoints.http_server"
_SERVE_GENERATE = f"{_HTTP}.serve_generate_request"
_SET_STATE = f"{_HTTP}.set_global_state"
_COMPLETIONS = (
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
    "._convert_to_internal_request"
)
_CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request"
_VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
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
    )


def check_before_stream(obj, tokenizer_manager, names: Names) -> None:
    """Every prompt of a GenerateReqInput (not yet normalized), then SGLang's own checks of it on
    a copy, so they too answer 400 before a stream starts. A text prompt is tokenized here only
    when its length alone could exceed the context, and only for a stream (else the tokenizer
    manager's own check answers before any byte is sent)."""
    limits = limits_of(tokenizer_manager)
    if limits is None:
        return
    for p in prompts_of_generate(obj):
        if p.ids is None and obj.stream and isinstance(p.text, str):
            if len(p.text.encode()) + _BYTES_MARGIN >= limits.context_len:
                p.ids = list(tokenizer_manager.tokenizer.encode(p.text))
        check_prompt(p, limits, names)
    _sglang_checks(obj, tokenizer_manager, limits)


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
    def after(result, serving, request, *args, **kwargs):
        if limits_of(serving.tokenizer_manager) is None:
            return result
        check_openai_limits(request)
        adapted = result[0]
        if hasattr(adapted, "sampling_params"):  # a GenerateReqInput
            check_before_stream(adapted, serving.tokenizer_manager, names)
        return result

    return after


def _validate_one(tokenizer_manager, obj, input_ids, *args, **kwargs):
    limits = limits_of(tokenizer_manager)
    if limits is None or not hasattr(obj, "sampling_params"):  # not ours, or an embedding
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


def validation_message(errors) -> str:
    """FastAPI/pydantic validation errors -> 'field: message (got value)', no source paths."""
    parts = []
    for err in errors or []:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = str(err.get("msg", "invalid value")).strip()
        value = err.get("input")
        got = repr(value)
        if value is not None and not isinstance(value, dict | list) and len(got) <= 80:
            msg = f"{msg} (got {got})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def _set_state(result, global_state, *args, **kwargs):
    if not _serves_dsv41(getattr(global_state.tokenizer_manager, "model_config", None)):
        return result
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints.http_server import app

    stock = app.exception_handlers.get(RequestValidationError)

    async def handler(request, exc):
        path = request.url.path
        if stock is not None and (path.startswith("/v1/messages") or path == "/v1/systemone"):
            return await stock(request, exc)  # these already answer without source paths
        message = validation_message(exc.errors())
        if path.startswith("/v1/responses"):
            body = {"error": {"message": message, "type": "Bad Request", "code": 400}}
        else:
            body = {"object": "error", "message": message, "type": "Bad Request", "code": 400}
        return ORJSONResponse(body, status_code=400)

    app.add_exception_handler(RequestValidationError, handler)
    return result


def register_guards() -> None:
    HookRegistry.register(_ADMIT, _admit, HookType.AFTER)
    if multiprocessing.parent_process() is not None:
        return  # a scheduler / detokenizer subprocess: no HTTP, no tokenizer manager
    HookRegistry.register(_SERVE_GENERATE, _serve_generate, HookType.AROUND)
    HookRegistry.register(_COMPLETIONS, _openai_names(COMPLETIONS), HookType.AFTER)
    HookRegistry.register(_CHAT, _openai_names(CHAT), HookType.AFTER)
    HookRegistry.register(_VALIDATE_ONE, _validate_one, HookType.BEFORE)
    HookRegistry.register(_SET_STATE, _set_state, HookType.AFTER)
