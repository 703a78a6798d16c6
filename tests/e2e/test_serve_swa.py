"""SWA records in SGLang's window-bounded hybrid SWA pool: a long decode keeps a window of SWA
slots, prefix hits are exact whether the cached window survived or was evicted, and many short
requests leave no SWA slot behind.

One server with replay off (every layer's SWA in the pool), a small SWA pool (two running
requests: the pool holds their windows and the prefill chunks in flight), eviction every 8 tokens
(SGLang's default amortizes over 128) and Prometheus metrics, whose `sglang:swa_used_tokens`
gauge counts the SWA slots live requests hold.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from e2e.conftest import MAX_NEW

CHUNK, PAGE, INTERVAL = 64, 2, 8
LONG = 2000  # decode tokens: 125 windows of the tiny model (minutes on a CPU server)


SERVER = (
    "swa",
    (
        "--no-enable-decoder-swa-bounded-replay",
        "--enable-metrics",
        "--max-running-requests",
        "2",
        "--chunked-prefill-size",
        str(CHUNK),
    ),
    {"SGLANG_SWA_EVICTION_INTERVAL": str(INTERVAL)},
)


def metric(server, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^sglang:{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    assert m, f"sglang:{name} not in /metrics"
    return float(m.group(1))


def test_long_decode_keeps_a_window_of_swa_slots(server, oracle, prompts):
    W = oracle.model.cfg.sliding_window
    p = prompts[6]
    peak, done = [0.0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], metric(server, "swa_used_tokens"))
            time.sleep(0.2)

    t = threading.Thread(target=watch)
    t.start()
    try:
        out = server.generate(p, LONG, timeout=1200)
    finally:
        done.set()
        t.join()
    assert len(out["output_ids"]) == LONG
    assert out["output_ids"][:MAX_NEW] == oracle.generate(p, MAX_NEW, replay=False)
    full_used = len(p) + LONG
    assert full_used > 3 * (W + INTERVAL + PAGE + CHUNK)
    # a window, the tokens SGLang lets slide out before it evicts, a page, one chunk
    assert 0 < peak[0] <= W + INTERVAL + PAGE + CHUNK, (peak[0], full_used)
    assert re.search(r"dsv41 KV pool: \d+ full slots", server.log())


def test_prefix_hit_with_live_window_is_exact(server, oracle, prompts):
    base = prompts[-1][:300]
    a, b = base + [7, 8, 9], base[:200] + [11, 12]
    assert server.generate(a, MAX_NEW)["output_ids"] == oracle.generate(a, MAX_NEW)
    out = server.generate(b, MAX_NEW)
    assert out["meta_info"]["cached_tokens"] >= 190
    assert out["output_ids"] == oracle.generate(b, MAX_NEW)


def test_prefix_hit_after_window_eviction_recomputes_exactly(server, oracle, prompts):
    """Other long prompts push the cached prefix's windows out of the small SWA pool (its full
    KV stays); the next hit on that prefix stops where the window is gone and recomputes."""
    base = prompts[-2][:240]
    a, b = base + [5, 6], base[:230] + [9, 10, 11]
    assert server.generate(a, MAX_NEW)["output_ids"] == oracle.generate(a, MAX_NEW)
    for p in prompts[-6:]:
        server.generate(p[::-1], 2)  # reversed: no shared prefix, fresh SWA slots
    out = server.generate(b, MAX_NEW)
    assert out["output_ids"] == oracle.generate(b, MAX_NEW)
    assert out["meta_info"]["cached_tokens"] < 220, out["meta_info"]


def test_short_requests_leave_no_swa_slots(server, prompts):
    """The gauge is refreshed when the scheduler logs its stats (it may still show the previous
    test's last batch when this one starts); once the server idles it must read 0."""
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda p: server.generate(p[:9], 3), prompts * 3))
    deadline = time.time() + 60  # the scheduler frees slots after the last response is sent
    while metric(server, "swa_used_tokens") != 0 and time.time() < deadline:
        time.sleep(0.5)
    assert metric(server, "swa_used_tokens") == 0
