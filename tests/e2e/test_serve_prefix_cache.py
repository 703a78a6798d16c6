"""The prefix cache with two lifetimes through `launch_server` (docs/design.md 2.8): hits whose
SWA window is resident are exact, hits whose SWA is gone resume by bounded replay and equal the
oracle with the same resume point (`resumes=(M,)`), also when they end mid-window and when
several run at once on one prefix; the startup line states both rooms.

One server, decoder replay on (prefix replay with it), a 20000-token global room and an SWA room
of 5 % of it (--swa-full-tokens-ratio 0.05), prefill chunks of 64. SGLang frees a request's SWA
outside its window as its prefill chunks complete, so a cached prompt keeps only its last window
resident; a hit before that resumes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from e2e.conftest import MAX_NEW, resumes_of

SERVER = (
    "prefix-cache",
    (
        "--max-total-tokens",
        "20000",
        "--swa-full-tokens-ratio",
        "0.05",
        "--chunked-prefill-size",
        "64",
    ),
    {},
)


def fresh(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 512, (n,), generator=g).tolist()


def served(server, oracle, ids, n=MAX_NEW):
    """(output ids, cached tokens, resumes) of a greedy request, and the oracle's tokens for the
    resume the server logged."""
    before = server.log()
    out = server.generate(ids, n)
    cached = out["meta_info"]["cached_tokens"]
    resumes = resumes_of(server, before, cached)
    return out["output_ids"], cached, resumes, oracle.generate(ids, n, replay=True, resumes=resumes)


def test_startup_states_both_rooms(server):
    log = server.log()
    assert "global room 20000 full slots" in log
    assert "SWA room 1000 slots" in log and "--swa-full-tokens-ratio 0.05" in log
    assert "prefix replay on" in log


def test_hit_with_its_window_resident_is_exact(server, oracle):
    a = fresh(303, 1)
    got, _, resumes, want = served(server, oracle, a)
    assert got == want and not resumes
    b = a[:302] + fresh(40, 2)  # a's last window is still resident
    got, cached, resumes, want = served(server, oracle, b)
    assert cached == 302 and not resumes
    assert got == want == oracle.generate(b, MAX_NEW, replay=True)


def test_hit_without_its_window_resumes_like_the_oracle(server, oracle):
    a = fresh(320, 3)
    server.generate(a, 2)
    c = a[:250] + fresh(30, 4)
    got, cached, resumes, want = served(server, oracle, c)
    assert cached == 250 and resumes == (250,)
    assert got == want
    assert want != oracle.generate(
        c, MAX_NEW, replay=True
    )  # the replay shows: a test that can fail


def test_hit_ending_mid_window(server, oracle):
    """Fewer new tokens than a window: the decode steps read the replayed segment too."""
    a = fresh(330, 5)
    server.generate(a, 2)
    d = a[:296] + fresh(5, 6)
    got, cached, resumes, want = served(server, oracle, d, 12)
    assert cached == 296 and resumes == (296,)
    assert got == want


def test_full_hit(server, oracle):
    """The same prompt again: exact at the decoder floor if that window is resident, else a
    resume of the last window; twice in a row the same tokens."""
    a = fresh(280, 7)
    first = server.generate(a, MAX_NEW)["output_ids"]
    assert first == oracle.generate(a, MAX_NEW, replay=True)
    for _ in range(2):
        got, cached, _, want = served(server, oracle, a)
        assert cached >= len(a) - 16 and got == want


def test_concurrent_hits_on_one_prefix(server, oracle):
    a = fresh(300, 8)
    server.generate(a, 2)
    asks = [a[:200] + [100 + k] + fresh(20, 20 + k) for k in range(4)]
    before = server.log()
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda p: server.generate(p, MAX_NEW), asks))
    assert server.log().count("a hit of 200 cached tokens") - before.count(
        "a hit of 200 cached tokens"
    ) == len(asks)
    for p, out in zip(asks, outs, strict=True):
        assert out["meta_info"]["cached_tokens"] == 200
        assert out["output_ids"] == oracle.generate(p, MAX_NEW, replay=True, resumes=(200,))
