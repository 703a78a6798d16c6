"""The cached serving path equals the oracle in float64 (tools/twin_check.py): chunked prefill at
an odd chunk (ratio-2 pending tokens), several requests in flight, greedy decode, replay on and
off, prompts past the window, top-k and candidate pool. In float64 no record value sits within
rounding of a quantization boundary, so every token must agree and logprobs to TOL."""

import torch

from sglang_dsv41.serving.toy import prompts, toy_model
from sglang_dsv41.tools import twin_check


def test_serving_path_equals_the_oracle_in_float64():
    model = toy_model().double()
    answers = {"prompts": prompts([1, 20, 41, 66, 131]), "new": 6}
    res = twin_check.run(model, answers, torch.device("cpu"), chunk=9, in_flight=3)
    bad = [(m, r) for m, rows in res["modes"].items() for r in rows if r["verdict"] != "equal"]
    assert res["passed"], bad
    assert len(res["modes"]["replay"]) == 5 and len(res["modes"]["full"]) == 5


def test_the_check_sees_a_replay_floor_one_token_off(monkeypatch):
    """The check can fail: the served steps against the oracle with every floor one token
    higher differ on every prompt."""
    model = toy_model().double()
    ps, new = prompts([41, 66]), 4
    served = twin_check.served_steps(model, ps, new, True, torch.device("cpu"), 9, 2)
    floor = model.replay_floor_for
    monkeypatch.setattr(model, "replay_floor_for", lambda n, replay: floor(n, replay) + 1)
    off = [twin_check.oracle_steps(model, p, new, True) for p in ps]
    verdicts = [twin_check.compare(g, w) for g, w in zip(served, off, strict=True)]
    assert all(v["verdict"] == "differs" for v in verdicts), verdicts
