"""Replay off: the served model reproduces the reference's full forward, through every endpoint.

One server (`--no-enable-decoder-swa-bounded-replay`) for the whole module.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e.conftest import MAX_NEW, start_server
from e2e.server import post, post_stream


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    s = start_server(tmp_path_factory, tiny_dir, "full", "--no-enable-decoder-swa-bounded-replay")
    yield s
    s.stop()


def test_plugin_classes_served(server):
    log = server.log()
    assert "sglang_dsv41: DeepseekV41ForCausalLM" in log
    assert "decoder SWA bounded replay off" in log
    assert "dsv41 KV pool:" in log
    assert "type=DeepseekV41ForCausalLM" in log
    with urllib.request.urlopen(server.url + "/server_info", timeout=30) as r:
        info = json.loads(r.read())
    assert info["attention_backend"] == "dsv41"
    assert info["page_size"] == 2


def test_greedy_equals_reference_16_in_flight(server, oracle, prompts):
    """20 prompts (beyond window, top-k and candidate pool), 16 requests in flight at once."""
    with ThreadPoolExecutor(16) as ex:
        outs = list(ex.map(lambda p: server.generate(p, MAX_NEW)["output_ids"], prompts))
    for p, got in zip(prompts, outs, strict=False):
        assert got == oracle.generate(p, MAX_NEW, replay=False), f"prompt of {len(p)} tokens"
    assert "#running-req: 1" in server.log()


def test_radix_prefix_hit(server, oracle, prompts):
    base = prompts[-1][:300]
    a, b = base + [7, 8, 9, 10], base + [11, 12, 13]
    out_a = server.generate(a, MAX_NEW)
    out_b = server.generate(b, MAX_NEW)
    assert out_b["meta_info"]["cached_tokens"] >= 290
    assert out_a["output_ids"] == oracle.generate(a, MAX_NEW, replay=False)
    assert out_b["output_ids"] == oracle.generate(b, MAX_NEW, replay=False)


def test_openai_completions_and_chat(server, oracle, prompts):
    p = prompts[12]
    ref = oracle.generate(p, 8, replay=False)
    body = {"model": "tiny", "prompt": p, "max_tokens": 8, "temperature": 0}
    status, out = post(server.url + "/v1/completions", body)
    assert status == 200, out
    text = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == len(ref) or out["choices"][0]["finish_reason"]
    status, gen = post(
        server.url + "/generate",
        {"input_ids": p, "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
    )
    assert gen["output_ids"] == ref[: len(gen["output_ids"])]
    assert text == gen["text"]
    events = post_stream(server.url + "/v1/completions", {**body, "stream": True})
    assert "".join(e["choices"][0].get("text") or "" for e in events) == text

    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello there, how are you?"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    status, out = post(server.url + "/v1/chat/completions", chat)
    assert status == 200, out
    content = out["choices"][0]["message"]["content"] or ""
    events = post_stream(server.url + "/v1/chat/completions", {**chat, "stream": True})
    streamed = "".join(
        (e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices")
    )
    assert streamed == content
    assert out["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "url,body",
    [
        ("/generate", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
        ("/v1/completions", {"model": "tiny", "prompt": "", "max_tokens": 4}),
        ("/generate", {"input_ids": [5] * 5000, "sampling_params": {"max_new_tokens": 4}}),
        (
            "/generate",
            {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "temperature": -1}},
        ),
        (
            "/generate",
            {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "top_p": 2}},
        ),
        ("/v1/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": -3}),
        ("/v1/chat/completions", b"{not json"),
    ],
)
def test_malformed_requests_get_4xx(server, oracle, prompts, url, body):
    raw = isinstance(body, bytes)
    status, out = post(server.url + url, body, raw=raw)
    assert 400 <= status < 500, (status, out)
    p = prompts[5]
    assert server.generate(p, 4)["output_ids"] == oracle.generate(p, MAX_NEW, replay=False)[:4]
