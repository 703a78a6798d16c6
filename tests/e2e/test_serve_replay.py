"""Default server: decoder SWA bounded replay on; outputs equal the reference with replay, also
when requests are retracted and re-prefilled (SGLANG_TEST_RETRACT), and a radix hit never reuses
decoder state written by a replay."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e.conftest import MAX_NEW, RETRACT_ENV, RETRACTED, start_server


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
    base = prompts[-2][:256]
    a, b = base + [7, 8, 9, 10, 11], base + [12, 13, 14]
    out_a = server.generate(a, MAX_NEW)
    out_b = server.generate(b, MAX_NEW)
    window = oracle.model.cfg.sliding_window
    assert out_b["meta_info"]["cached_tokens"] >= len(b) - window - 2
    assert out_b["meta_info"]["cached_tokens"] <= len(b) - window
    assert out_a["output_ids"] == oracle.generate(a, MAX_NEW, replay=True)
    assert out_b["output_ids"] == oracle.generate(b, MAX_NEW, replay=True)
