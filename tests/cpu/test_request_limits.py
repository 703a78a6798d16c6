"""request_limits' envelope rules, the request gate (an ASGI middleware driven here without a
server), the plugin's server flags, the API keys' redaction and the per-choice seeds of a
fan-out: each refusal names the field, good requests pass unchanged."""

from __future__ import annotations

import argparse
import asyncio
import json
from types import SimpleNamespace

import pytest

from sglang_dsv41.request_limits import (
    MIB,
    BodyTooLarge,
    check_body_size,
    check_parser_name,
    check_probe,
    default_request_bytes,
    embedding_route_message,
    json_error_message,
    probe_of,
)
from sglang_dsv41.request_rules import Caps, RequestRejected


def test_default_request_bytes_follow_the_context():
    assert default_request_bytes(4096) == MIB  # tiny: the 1 MiB floor
    assert default_request_bytes(2**20) == 16 * MIB  # a 1M-token context


def test_body_size():
    check_body_size(MIB, MIB)
    with pytest.raises(BodyTooLarge, match=r"has 1048577 bytes; .* at most 1048576 .*request-b"):
        check_body_size(MIB + 1, MIB)
    with pytest.raises(BodyTooLarge, match=r"has more than 1048576 bytes"):
        check_body_size(MIB + 5, MIB, complete=False)


def test_probe_cuts_at_a_word_end():
    assert probe_of("short text", 4096) is None
    text = "word " * 20000
    probe = probe_of(text, 4096)
    assert len(probe) <= 8 * 4096 and text.startswith(probe) and probe.endswith("word")
    blob = "x" * 100000  # no space: the plain cut
    assert probe_of(blob, 4096) == "x" * (8 * 4096)


def test_probe_check():
    check_probe(4095, 32768, 4096, "text")
    with pytest.raises(RequestRejected, match=r"text\[1\]: its first 32768 characters alone"):
        check_probe(4096, 32768, 4096, "text[1]")


@pytest.mark.parametrize(
    "doc,want",
    [
        ('{"a": 1, "temperature": NaN}', "temperature = NaN is not a JSON number"),
        (b'{"x": {"top_p": Infinity}}', "top_p = Infinity is not"),
        (b'{"logit_bias": {"5": -Infinity}}', "5 = -Infinity is not"),
        (b"NaN", "NaN at byte 0 is not a JSON number"),
        (b'{"a": [1, 2', "the body is not valid JSON at byte 11: eof"),
    ],
)
def test_json_error_message(doc, want):
    import orjson

    with pytest.raises(orjson.JSONDecodeError) as e:  # SGLang's request decoder
        orjson.loads(doc)
    assert json_error_message(doc, e.value.pos, "eof").startswith(want)


def test_parser_names_and_embedding_routes():
    check_parser_name("qwen", {"qwen", "llama3"}, "tool_call_parser")
    with pytest.raises(RequestRejected, match=r"tool_call_parser = 'nope' .* known: llama3, qwen"):
        check_parser_name("nope", {"qwen", "llama3"}, "tool_call_parser")
    with pytest.raises(RequestRejected, match=r"reasoning_parser = None"):
        check_parser_name(None, {"qwen3"}, "reasoning_parser")
    for path in ("/encode", "/classify", "/v1/embeddings", "/v1/rerank", "/v1/classify"):
        assert path in embedding_route_message(path)
    assert embedding_route_message("/generate") is None


# --- the request gate ------------------------------------------------------------------------


class App:
    """A stand-in ASGI app: answers 200 with the body it read."""

    def __init__(self):
        self.bodies = []

    async def __call__(self, scope, receive, send):
        parts = []
        while True:
            m = await receive()
            parts.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        self.bodies.append(b"".join(parts))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(gate, path, body: bytes, chunks: int = 1, length: bool = True):
    """Drive gate with one POST -> (status, decoded answer)."""
    headers = [(b"content-type", b"application/json")]
    if length:
        headers.append((b"content-length", str(len(body)).encode()))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    step = max(1, -(-len(body) // chunks))
    pieces = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    queue = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
    sent = []

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (payload if status == 200 else json.loads(payload))


def _gate(cap=1000, vocab=None):
    from sglang_dsv41.sglang.request_gate import RequestGate

    app = App()
    return RequestGate(app, cap, vocab), app


def test_gate_refuses_a_large_body_before_reading_it():
    gate, app = _gate()
    status, out = call(gate, "/generate", b"x" * 1001)
    assert status == 413 and "--dsv41-max-request-bytes" in out["message"], out
    assert app.bodies == []
    status, out = call(gate, "/generate", b"x" * 5000, chunks=10, length=False)
    assert status == 413 and "more than 1000 bytes" in out["message"]
    assert app.bodies == []


def test_gate_hands_on_bodies_unchanged():
    gate, app = _gate()
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode()
    assert call(gate, "/generate", body) == (200, b"ok")
    assert call(gate, "/generate", body, chunks=3, length=False) == (200, b"ok")
    tricky = json.dumps({"model": "m", "prompt": 'say "positional_embed_overrides"'}).encode()
    assert call(gate, "/v1/completions", tricky, chunks=2) == (200, b"ok")
    assert app.bodies == [body, body, tricky]


def test_gate_refuses_embedding_routes_and_inputs():
    gate, app = _gate()
    status, out = call(gate, "/encode", b'{"text": "hi"}')
    assert status == 400 and "generation model" in out["message"]
    body = json.dumps({"model": "m", "prompt": "a", "positional_embed_overrides": {"a": 1}})
    for path in ("/v1/completions", "/v1/chat/completions"):
        status, out = call(gate, path, body.encode())
        assert status == 400 and "positional_embed_overrides is not" in out["message"]
    assert app.bodies == []


def test_gate_checks_parser_names():
    gate, app = _gate(cap=10**6)
    for path, field, bad in [
        ("/parse_function_call", "tool_call_parser", "nope"),
        ("/parse_function_call", "tool_call_parser", None),
        ("/separate_reasoning", "reasoning_parser", "llama3"),  # a tool parser's name
    ]:
        status, out = call(gate, path, json.dumps({"text": "x", field: bad}).encode())
        assert status == 400 and f"{field} = {bad!r}" in out["message"], out
    good = [
        ("/parse_function_call", {"text": "x", "tool_call_parser": "qwen", "tools": []}),
        ("/separate_reasoning", {"text": "x", "reasoning_parser": "DeepSeek-R1"}),
    ]
    for path, body in good:
        assert call(gate, path, json.dumps(body).encode()) == (200, b"ok")
    assert call(gate, "/separate_reasoning", b"{not json")[0] == 200  # FastAPI answers it


def test_gate_checks_detokenize_ids():
    gate, app = _gate(cap=10**6, vocab=100)
    for path in ("/detokenize", "/v1/detokenize"):
        for tokens, field in [([1, 100], "tokens[1] = 100"), ([[3], [2, -1]], "tokens[1][1] = -1")]:
            status, out = call(gate, path, json.dumps({"tokens": tokens}).encode())
            assert status == 400 and field in out["message"], out
        for tokens in ([0, 99], [[5], [6, 7]], []):
            assert call(gate, path, json.dumps({"tokens": tokens}).encode()) == (200, b"ok")
    gate, app = _gate(cap=10**6)  # no vocabulary known: handed on
    assert call(gate, "/detokenize", b'{"tokens": [100000]}') == (200, b"ok")


# --- server flags ----------------------------------------------------------------------------


def test_caps_from_the_environment():
    from sglang_dsv41.sglang.server_flags import caps_from_env

    assert caps_from_env({}) == Caps()
    env = {"SGLANG_DSV41_MAX_N": "8", "SGLANG_DSV41_MAX_REQUEST_BYTES": "4096"}
    assert caps_from_env(env) == Caps(max_n=8, max_request_bytes=4096)
    with pytest.raises(ValueError, match=r"SGLANG_DSV41_MAX_TOP_LOGPROBS \(or --dsv41-max-top"):
        caps_from_env({"SGLANG_DSV41_MAX_TOP_LOGPROBS": "0"})


def test_flags_parse_into_the_environment(monkeypatch):
    from sglang_dsv41.sglang import server_flags

    for _, var, _ in server_flags.FLAGS.values():
        monkeypatch.setenv(var, "1")  # recorded, so the values written below are undone too
        monkeypatch.delenv(var)
    parser = argparse.ArgumentParser()
    server_flags._add_flags(None, parser)
    args = parser.parse_args(["--dsv41-max-n", "8", "--dsv41-max-top-logprobs", "5"])
    server_flags._flags_to_env("result", object, args)
    assert server_flags.caps_from_env() == Caps(max_n=8, max_top_logprobs=5)
    with pytest.raises(SystemExit):
        parser.parse_args(["--dsv41-max-n", "0"])


def test_sglang_parser_takes_the_flags():
    """SGLang's own parser, with the hook applied by hand, accepts the flags and its
    ServerArgs ignores them (they live in the environment)."""
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.sglang.server_flags import _add_flags

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    _add_flags(None, parser)
    args = parser.parse_args(["--model-path", "x", "--dsv41-max-request-bytes", "123"])
    assert args.dsv41_max_request_bytes == 123


# --- keys ------------------------------------------------------------------------------------


def test_keys_redacted_and_exposure_named():
    from sglang_dsv41.sglang.access import (
        exposure_warning,
        is_loopback,
        redact_argv,
        redact_fields,
    )

    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "127.0.0.9", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.2", "", None, "example.com"]))
    info = {"api_key": "s3cret", "admin_api_key": None, "port": 1}
    assert redact_fields(info) == {"api_key": "<redacted>", "admin_api_key": None, "port": 1}
    assert redact_fields([1]) == [1]
    argv = ["--api-key", "s3cret", "--port", "1", "--admin-api-key=adm", "--x"]
    assert redact_argv(argv) == ["--api-key", "<redacted>", "--port", "1",
                                 "--admin-api-key=<redacted>", "--x"]  # fmt: skip
    assert exposure_warning("127.0.0.1", None, None) is None
    assert exposure_warning("0.0.0.0", "k", None) is None
    assert "/pause_generation" in exposure_warning("0.0.0.0", None, None)
    assert "/pause_generation" not in exposure_warning("0.0.0.0", None, "adm")


def test_sglang_redaction_hooks_cover_the_keys():
    """The two SGLang functions the hooks wrap return what the hooks then redact."""
    from sglang.srt.sampling.watermarking.core import (
        redact_watermark_command_line,
        redact_watermark_secrets,
    )

    from sglang_dsv41.sglang.access import _redact, _redact_argv

    info = {"api_key": "s3cret", "port": 1}
    assert _redact(redact_watermark_secrets(info), info)["api_key"] == "<redacted>"
    line = _redact_argv(redact_watermark_command_line, ["--api-key", "s3cret"], None)
    assert "s3cret" not in line and "--api-key <redacted>" in line


# --- per-choice seeds ------------------------------------------------------------------------


def test_each_copy_of_a_fanout_gets_its_choice_seed(monkeypatch):
    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_dsv41.request_rules import choice_seed
    from sglang_dsv41.sglang import deterministic

    monkeypatch.setattr(deterministic, "deterministic_on", lambda: True)
    tm = SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(architectures=["DeepseekV41ForCausalLM"])
        )
    )

    def fan_out(sp):
        warmup = SimpleNamespace(sampling_params=SamplingParams(n=sp.n, max_new_tokens=0))
        deterministic._choice_seeds(tm, warmup)
        copies = [SimpleNamespace(sampling_params=sp) for _ in range(sp.n)]
        for c in copies:
            deterministic._choice_seeds(tm, c)
        return [c.sampling_params.sampling_seed for c in copies]

    sp = SamplingParams(n=3, max_new_tokens=4, sampling_seed=7)
    assert fan_out(sp) == [7, choice_seed(7, 1), choice_seed(7, 2)]
    assert sp.sampling_seed == 7  # the shared object is not changed
    assert fan_out(sp) == [7, choice_seed(7, 1), choice_seed(7, 2)]  # the next request
    unseeded = SamplingParams(n=2, max_new_tokens=4)
    assert fan_out(unseeded) == [None, choice_seed(deterministic.DEFAULT_SEED, 1)]
    single = SimpleNamespace(sampling_params=SamplingParams(n=1, sampling_seed=5))
    deterministic._choice_seeds(tm, single)
    assert single.sampling_params.sampling_seed == 5
    assert deterministic._fanouts == {}
