"""The hostile set: requests that once killed the server, stalled it for everyone, answered 500
or misled, each sent while a fixed greedy request measures what every other client waits.

    python tests/e2e/hostile.py --url http://127.0.0.1:30000 [--only NAME] [--json]

(against `bash scripts/serve.sh`, the tiny model). For each case the hostile request starts,
and DELAY_S later the fixed request (/generate, 31 prompt tokens, 4 new, greedy) is sent; its
latency is the figure. A case passes when the hostile request gets its status (a 4xx whose
message names the field, or a 200 for a request at a cap, AT_CAPS) and the fixed request
answers 200 within LIMIT_S (AT_CAPS: see there). tests/e2e/test_faults.py runs the same cases
and also holds the fixed request's tokens to the oracle.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

LIMIT_S = 2.0  # the fixed request's latency during any hostile one (2-core CPU machine)
DELAY_S = 0.3  # hostile request in flight before the fixed one is sent
SLACK_S = 1.0  # beyond a heavy request's own time (its prefill runs before a later arrival's)
VOCAB = 512  # the tiny preset's
CONTEXT = 4096
FIXED_IDS = [(7 * i + 3) % (VOCAB - 2) + 2 for i in range(31)]
FIXED_NEW = 4


@dataclass(frozen=True)
class Case:
    """One hostile request: path, body (a JSON-able value, raw bytes, or a callable making
    either), the status it must get (400, 413 or 200), a text its answer must hold, and the
    fixed request's latency limit (None: at most the hostile request's own time + SLACK_S)."""

    name: str
    path: str
    body: object
    status: int
    names: str | None = None
    limit_s: float | None = LIMIT_S
    timeout: float = 120.0

    def payload(self) -> bytes:
        body = self.body() if callable(self.body) else self.body
        return body if isinstance(body, bytes) else json.dumps(body).encode()


def _gen(ids=None, text=None, **extra):
    body = {"sampling_params": {"max_new_tokens": 2, "temperature": 0}, **extra}
    if ids is not None:
        body["input_ids"] = ids
    if text is not None:
        body["text"] = text
    return body


def _sp(**params):
    return {"max_new_tokens": 2, "temperature": 0, **params}


def _cmp(prompt, **extra):
    return {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}


def _chat(content="Hello there", **extra):
    msgs = [{"role": "user", "content": content}]
    return {"model": "tiny", "messages": msgs, "max_tokens": 2, "temperature": 0, **extra}


def _long_ids(n: int = 4000) -> list:
    return [(11 * i + 5) % (VOCAB - 2) + 2 for i in range(n)]


def _text(n_bytes: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
    out, size, i = [], 0, 0
    while size < n_bytes:
        w = words[i % len(words)] + str(i % 97)
        out.append(w)
        size += len(w) + 1
        i += 1
    return " ".join(out)[:n_bytes]


MB10 = 10 * 2**20
UNDER_CAP = 900 * 2**10  # below the 1 MiB body cap: judged by the prompt's probe

# fmt: off
HOSTILE = [
    # once ended every server process
    Case("pos-overrides-dict", "/generate", _gen([5, 6], positional_embed_overrides={"a": 1}),
         400, "positional_embed_overrides"),
    Case("pos-overrides-list", "/generate", _gen([5, 6], positional_embed_overrides=[1, 2]),
         400, "positional_embed_overrides"),
    Case("pos-overrides-str", "/generate", _gen([5, 6], positional_embed_overrides="x"),
         400, "positional_embed_overrides"),
    Case("pos-overrides-batch", "/generate",
         _gen([[5, 6], [7]], positional_embed_overrides=[None, {"a": 1}]),
         400, "positional_embed_overrides"),
    Case("pos-overrides-completions", "/v1/completions",
         _cmp([5, 6], positional_embed_overrides={"a": 1}), 400, "positional_embed_overrides"),
    Case("input-embeds", "/generate", {"input_embeds": [[0.0] * 8], "sampling_params": _sp()},
         400, "input_embeds"),
    Case("score-embed-overrides", "/v1/score",
         {"model": "tiny", "query": [5, 6, 7], "items": [[8], [9]], "label_token_ids": [3, 4],
          "embed_override_token_id": 5, "query_embed_overrides": [[0.1] * 64]},
         400, "embed_override_token_id"),
    Case("score-query-overrides", "/v1/score",
         {"model": "tiny", "query": [5, 6, 7], "items": [[8]], "label_token_ids": [3],
          "query_embed_overrides": [[0.1] * 3]},
         400, "query_embed_overrides"),
    # stalled the server for everyone
    Case("n-100000-generate", "/generate", _gen([5, 6], sampling_params=_sp(n=100000)),
         400, "sampling_params.n = 100000"),
    Case("n-100000-completions", "/v1/completions", _cmp("Hello", n=100000), 400, "n = 100000"),
    Case("n-100000-chat", "/v1/chat/completions", _chat(n=100000), 400, "n = 100000"),
    Case("batch-20000", "/generate", {"input_ids": [[5, 6]] * 20000, "sampling_params": _sp()},
         400, "20000 prompts"),
    Case("batch-x-n", "/generate", {"input_ids": [[5, 6]] * 16, "sampling_params": _sp(n=8)},
         400, "16 prompts x sampling_params.n = 8"),
    Case("text-10MB-generate", "/generate", lambda: _gen(text=_text(MB10)),
         413, "--dsv41-max-request-bytes"),
    Case("text-10MB-completions", "/v1/completions", lambda: _cmp(_text(MB10)),
         413, "--dsv41-max-request-bytes"),
    Case("text-10MB-chat", "/v1/chat/completions", lambda: _chat(_text(MB10)),
         413, "--dsv41-max-request-bytes"),
    Case("text-900KB-generate", "/generate", lambda: _gen(text=_text(UNDER_CAP)),
         400, "context length"),
    Case("text-900KB-stream", "/generate", lambda: _gen(text=_text(UNDER_CAP), stream=True),
         400, "context length"),
    Case("text-900KB-completions", "/v1/completions", lambda: _cmp(_text(UNDER_CAP)),
         400, "prompt: its first"),
    Case("text-900KB-chat", "/v1/chat/completions", lambda: _chat(_text(UNDER_CAP)),
         400, "messages: its first"),
    Case("echo-logprobs-512", "/v1/completions",
         lambda: _cmp(_long_ids(), echo=True, logprobs=512, max_tokens=1),
         400, "logprobs = 512"),
    Case("top-logprobs-512-chat", "/v1/chat/completions",
         _chat(logprobs=True, top_logprobs=512), 400, "top_logprobs = 512"),
    Case("top-logprobs-num-512", "/generate",
         lambda: _gen(_long_ids(), return_logprob=True, logprob_start_len=0,
                      top_logprobs_num=512),
         400, "top_logprobs_num = 512"),
    # 500 where the client sent something wrong
    Case("batch-fewer-params", "/generate",
         {"input_ids": [[5, 6], [7, 8], [9]], "sampling_params": [_sp(), _sp()]},
         400, "sampling_params has 2 entries for a batch of 3"),
    Case("single-params-list", "/generate", {"input_ids": [5, 6], "sampling_params": [_sp()]},
         400, "sampling_params is a list"),
    Case("classify", "/classify", {"text": "hello"}, 400, "/classify"),
    Case("encode", "/encode", {"text": "hello"}, 400, "/encode"),
    Case("embeddings", "/v1/embeddings", {"model": "tiny", "input": "hello"},
         400, "/v1/embeddings"),
    Case("unknown-tool-parser", "/parse_function_call",
         {"text": "hi", "tool_call_parser": "nope", "tools": []}, 400, "tool_call_parser"),
    Case("no-tool-parser", "/parse_function_call", {"text": "hi", "tools": []},
         400, "tool_call_parser"),
    Case("unknown-reasoning-parser", "/separate_reasoning",
         {"text": "hi", "reasoning_parser": "nope"}, 400, "reasoning_parser"),
    Case("tool-name-as-reasoning-parser", "/separate_reasoning",
         {"text": "hi", "reasoning_parser": "llama3"}, 400, "reasoning_parser"),
    Case("nan-temperature", "/generate",
         b'{"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "temperature": NaN}}',
         400, "temperature = NaN"),
    Case("inf-completions", "/v1/completions",
         b'{"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": Infinity}',
         400, "temperature = Infinity"),
    Case("minus-inf-chat", "/v1/chat/completions",
         b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
         b' "top_p": -Infinity}',
         400, "top_p = -Infinity"),
    Case("n-0-completions", "/v1/completions", _cmp("Hello", n=0), 400, "n = 0"),
    Case("n-0-chat", "/v1/chat/completions", _chat(n=0), 400, "n = 0"),
    Case("n-0-generate", "/generate", _gen([5], sampling_params=_sp(n=0)),
         400, "sampling_params.n = 0"),
    Case("string-max-new-tokens", "/generate",
         {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": "4"}},
         400, "sampling_params.max_new_tokens"),
    Case("string-token-id", "/generate", {"input_ids": [5, "6"]}, 400, "input_ids"),
    Case("bad-stop-regex", "/generate", _gen([5, 6], sampling_params=_sp(stop_regex="(")),
         400, "sampling_params.stop_regex = '('"),
    Case("bad-stop-regex-chat", "/v1/chat/completions", _chat(stop_regex=["a", "[b"]),
         400, "stop_regex[1]"),
    Case("image-data", "/generate", _gen(text="hi", image_data="x.png"), 400, "image_data"),
    # seeds: this server runs without --enable-deterministic-inference
    Case("seed-generate", "/generate",
         _gen([5, 6], sampling_params=_sp(sampling_seed=7, temperature=1.0)),
         400, "sampling_params.sampling_seed = 7"),
    Case("seed-completions", "/v1/completions", _cmp("Hello", seed=7, temperature=1.0),
         400, "seed = 7"),
    Case("seed-chat", "/v1/chat/completions", _chat(seed=7, temperature=1.0), 400, "seed = 7"),
    Case("detokenize-out-of-vocab", "/v1/detokenize", {"tokens": [5, 10**9]}, 400,
         "tokens[1] = 1000000000"),
]
# fmt: on


# Requests at the caps, served. A fan-out at the cap shares its decode steps with the others
# (LIMIT_S holds). A prompt near the context that asks for prompt logprobs runs the full forward
# (no bounded replay for it) as one prefill chunk, which SGLang's scheduler finishes before it
# admits a later request: the fixed request waits for it (about 0.5 ms per prompt token on the
# 2-core machine, twice that with prompt logprobs), so its limit is the heavy request's own time.
AT_CAPS = [
    Case(
        "n-at-cap",
        "/generate",
        _gen([5, 6, 7], sampling_params=_sp(n=64, max_new_tokens=16, temperature=0.8)),
        200,
    ),
    Case(
        "n-at-cap-long",
        "/generate",
        _gen([5, 6, 7], sampling_params=_sp(n=64, max_new_tokens=128, temperature=0.8)),
        200,
    ),
    Case(
        "echo-logprobs-at-cap",
        "/v1/completions",
        lambda: _cmp(_long_ids(), echo=True, logprobs=20, max_tokens=1),
        200,
        limit_s=None,
    ),
    Case(
        "prompt-logprobs-at-cap",
        "/generate",
        lambda: _gen(_long_ids(), return_logprob=True, logprob_start_len=0, top_logprobs_num=20),
        200,
        limit_s=None,
    ),
]


def ask(host: str, port: int, path: str, payload: bytes, timeout: float = 120.0):
    """POST -> (status, parsed JSON or text). A server that answers before reading the whole
    body (413) may close the connection under the sender: the answer is read all the same."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.request("POST", path, payload, {"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def fixed_request(host: str, port: int, timeout: float = 60.0):
    """(latency s, status, output_ids, cached prompt tokens) of the fixed greedy request."""
    body = {
        "input_ids": FIXED_IDS,
        "sampling_params": {"max_new_tokens": FIXED_NEW, "temperature": 0, "ignore_eos": True},
    }
    t0 = time.perf_counter()
    status, out = ask(host, port, "/generate", json.dumps(body).encode(), timeout)
    dt = time.perf_counter() - t0
    ids = out.get("output_ids") if isinstance(out, dict) else None
    cached = out.get("meta_info", {}).get("cached_tokens", 0) if isinstance(out, dict) else 0
    return dt, status, ids, cached


@dataclass
class Result:
    name: str
    status: int
    answer: str
    hostile_s: float
    fixed_s: float
    fixed_status: int
    fixed_ids: list | None
    fixed_cached: int
    problems: list


def run_case(host: str, port: int, case: Case) -> Result:
    payload = case.payload()
    got = {}

    def hostile():
        t0 = time.perf_counter()
        try:
            got["answer"] = ask(host, port, case.path, payload, case.timeout)
        except Exception as e:  # the server went away: reported below
            got["answer"] = (0, f"{type(e).__name__}: {e}")
        got["s"] = time.perf_counter() - t0

    t = threading.Thread(target=hostile)
    t.start()
    time.sleep(DELAY_S)
    try:
        fixed_s, fixed_status, fixed_ids, fixed_cached = fixed_request(host, port)
    except Exception as e:
        fixed_s, fixed_status, fixed_ids = float("inf"), 0, f"{type(e).__name__}: {e}"
        fixed_cached = 0
    t.join(case.timeout + 10)
    status, out = got.get("answer", (0, "no answer"))
    text = out if isinstance(out, str) else json.dumps(out)
    problems = []
    if case.status == 200:
        if status != 200:
            problems.append(f"status {status}, expected 200: {text[:300]}")
    elif not (400 <= status < 500) or status != case.status:
        problems.append(f"status {status}, expected {case.status}: {text[:300]}")
    if case.names and case.names not in text:
        problems.append(f"{case.names!r} not in the answer: {text[:300]}")
    if fixed_status != 200:
        problems.append(f"the fixed request got {fixed_status}: {fixed_ids}")
    else:
        limit = case.limit_s if case.limit_s is not None else got.get("s", 0.0) + SLACK_S
        if fixed_s > limit:
            problems.append(f"the fixed request took {fixed_s:.2f} s (limit {limit:.2f} s)")
    return Result(
        case.name,
        status,
        text[:200],
        got.get("s", float("inf")),
        fixed_s,
        fixed_status,
        fixed_ids,
        fixed_cached,
        problems,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--only", action="append", help="run only these cases (by name)")
    ap.add_argument("--json", action="store_true", help="one JSON object per case")
    args = ap.parse_args(argv)
    u = urlparse(args.url)
    host, port = u.hostname, u.port or 80
    base = [fixed_request(host, port)[0] for _ in range(3)]
    print(f"fixed request alone: {', '.join(f'{b:.3f}' for b in base)} s", file=sys.stderr)
    failed = 0
    for case in HOSTILE + AT_CAPS:
        if args.only and case.name not in args.only:
            continue
        r = run_case(host, port, case)
        failed += bool(r.problems)
        if args.json:
            print(json.dumps(r.__dict__))
        else:
            verdict = "ok" if not r.problems else "FAIL " + "; ".join(r.problems)
            print(
                f"{r.name:32} {r.status:>3} hostile {r.hostile_s:7.3f} s  fixed "
                f"{r.fixed_s:6.3f} s  {verdict}"
            )
    print(f"{failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
