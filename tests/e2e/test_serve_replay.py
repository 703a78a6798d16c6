"""Default server: decoder SWA bounded replay on; outputs equal the reference with replay, also
when requests are retracted and re-prefilled (SGLANG_TEST_RETRACT), and a radix hit never reuses
decoder state written by a replay."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e.conftest import MAX_NEW, RETRACT_ENV, RETRACTED, resumes_of, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    s = start_server(tmp_path_factory, tiny_dir, "replay", env=RETRACT_ENV)
    yield s
    s.stop()


def test_replay_is_default(server):
    assert "decoder SWA bounded replay on" in server.log()


def test_replay_equals_reference_with_replay(server, oracle, prompts):
    chosen = prompts[::2]
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda p: server.generate(p, MAX_NEW)["output_ids"], chosen))
    for p, got in zip(chosen, outs, strict=False):
        assert got == oracle.generate(p, MAX_NEW, replay=True), f"prompt of {len(p)} tokens"
    assert re.search(RETRACTED, server.log())
    # The approximation shows on these prompts, so a server that ignored replay would fail.
    assert any(
        oracle.generate(p, MAX_NEW, replay=True) != oracle.generate(p, MAX_NEW, replay=False)
        for p in chosen
    )


def test_replay_radix_hit(server, oracle, prompts):
    """b hits a's prefix: an exact hit stops at b's decoder floor (decoder state written by a
    replay is never reused); with prefix replay (on with decoder replay) a hit past it resumes
    at the whole match, its last window replayed (docs/design.md 2.8)."""
    base = prompts[-2][:256]  # served whole by the test before: a hits it too
    a, b = base + [7, 8, 9, 10, 11], base + [12, 13, 14]
    before = server.log()
    out_a = server.generate(a, MAX_NEW)
    resumes_a = resumes_of(server, before, out_a["meta_info"]["cached_tokens"])
    before = server.log()
    out_b = server.generate(b, MAX_NEW)
    window = oracle.model.cfg.sliding_window
    cached = out_b["meta_info"]["cached_tokens"]
    resumes = resumes_of(server, before, cached)
    assert cached >= len(b) - window - 2
    assert cached <= len(b) - window or resumes
    assert out_a["output_ids"] == oracle.generate(a, MAX_NEW, replay=True, resumes=resumes_a)
    assert out_b["output_ids"] == oracle.generate(b, MAX_NEW, replay=True, resumes=resumes)


def test_output_logprobs_keep_replay(server, oracle, prompts):
    """Asking for output logprobs only (SGLang then sets logprob_start_len = len(prompt)) keeps
    the replay: same tokens as without logprobs, and the first token's logprob is the replayed
    oracle's. Prompt logprobs (a start inside the prompt) run the full forward."""
    import torch
    from e2e.server import post

    chosen = [
        p
        for p in prompts[-6:]
        if oracle.generate(p, MAX_NEW, replay=True) != oracle.generate(p, MAX_NEW, replay=False)
    ]
    assert chosen, "no prompt where replay changes the output: the test could not fail"
    p = chosen[-1]
    body = {
        "input_ids": p,
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
    }
    status, out = post(server.url + "/generate", {**body, "return_logprob": True})
    assert status == 200, out
    assert out["output_ids"] == oracle.generate(p, MAX_NEW, replay=True)
    before = server.log()
    again = server.generate(p, MAX_NEW)  # a full hit: exact, or a resume of one window
    resumes = resumes_of(server, before, again["meta_info"]["cached_tokens"])
    assert again["output_ids"] == oracle.generate(p, MAX_NEW, replay=True, resumes=resumes)
    lp = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lp] == out["output_ids"]
    floor = oracle.model.replay_floor_for(len(p), True)
    logits = oracle.model(torch.tensor(p), replay_floor=floor)[-1]
    want = torch.log_softmax(logits.double(), -1)[out["output_ids"][0]].item()
    assert abs(lp[0][0] - want) < 1e-4, (lp[0][0], want)

    status, full = post(
        server.url + "/generate", {**body, "return_logprob": True, "logprob_start_len": 0}
    )
    assert status == 200, full
    assert full["output_ids"] == oracle.generate(p, MAX_NEW, replay=False)
    assert len(full["meta_info"]["input_token_logprobs"]) == len(p)
