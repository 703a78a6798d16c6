"""Faults during a prefix replay (docs/design.md 2.8), the fault tests' part for it: a request
aborted while it replays, and a replaying request retracted (SGLang's SGLANG_TEST_RETRACT
retracts running decode requests every 3 forwards), leave the pool as it was (SGLang's used KV
tokens return to where they started) and the next request on that prefix equals the oracle with
its resume point; a retracted replay prefills again from the same resume point, so its own
tokens are the oracle's too.

One server, decoder replay on, prefill chunks of 64 (a long extend after the replay takes many
forwards, so an abort lands in the middle of it).
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from e2e.conftest import MAX_NEW, RETRACT_ENV, RETRACTED, start_server
from e2e.server import post
from e2e.test_faults import wait_idle


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    s = start_server(
        tmp_path_factory, tiny_dir, "faults-replay", "--chunked-prefill-size", "64", env=RETRACT_ENV
    )
    yield s
    s.stop()


def fresh(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 512, (n,), generator=g).tolist()


def replays(server, m: int) -> int:
    return server.log().count(f"dsv41 prefix replay: a hit of {m} cached tokens")


def test_request_aborted_during_its_replay(server, oracle):
    a = fresh(400, 31)
    server.generate(a, 1)
    start = wait_idle(server)
    body = {
        "input_ids": a[:300] + fresh(1500, 32),
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        "rid": "replay-cut",
    }
    seen = replays(server, 300)
    t = threading.Thread(target=post, args=(server.url + "/generate", body, 600))
    t.start()
    deadline = time.time() + 120
    while replays(server, 300) == seen:  # its first chunk (the replay) has run
        assert time.time() < deadline, server.log()[-2000:]
        time.sleep(0.05)
    status, out = post(server.url + "/abort_request", {"rid": "replay-cut"})
    assert status == 200, out
    t.join(timeout=600)
    end = wait_idle(server)
    assert end["num_used_tokens"] == start["num_used_tokens"], (start, end)
    nxt = a[:300] + fresh(30, 33)
    out = server.generate(nxt, MAX_NEW)
    assert out["meta_info"]["cached_tokens"] == 300
    assert out["output_ids"] == oracle.generate(nxt, MAX_NEW, replay=True, resumes=(300,))


def test_replay_retracted_and_prefilled_again(server, oracle):
    """Three replaying requests decode together (SGLang keeps one, so retraction needs two)."""
    b = fresh(300, 41)
    server.generate(b, 1)
    start = wait_idle(server)
    retracted, seen = len(re.findall(RETRACTED, server.log())), replays(server, 250)
    asks = [b[:250] + [200 + k] + fresh(30, 42 + k) for k in range(3)]
    with ThreadPoolExecutor(3) as ex:
        outs = list(ex.map(lambda q: server.generate(q, 16), asks))
    assert len(re.findall(RETRACTED, server.log())) > retracted
    assert replays(server, 250) > seen + len(asks)  # a retracted one replayed again
    for q, out in zip(asks, outs, strict=True):
        assert out["output_ids"] == oracle.generate(q, 16, replay=True, resumes=(250,))
    assert wait_idle(server)["num_used_tokens"] == start["num_used_tokens"]
    nxt = b[:250] + fresh(20, 49)
    out = server.generate(nxt, MAX_NEW)
    assert out["output_ids"] == oracle.generate(nxt, MAX_NEW, replay=True, resumes=(250,))
