"""Replay off, chunked prefill forced small (odd, so chunks end mid ratio-2 pair): same outputs."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from e2e.conftest import MAX_NEW, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    s = start_server(tmp_path_factory, tiny_dir, "chunked", "--no-enable-decoder-swa-bounded-replay",
                     "--chunked-prefill-size", "38")
    yield s
    s.stop()


def test_chunked_prefill_equals_reference(server, oracle, prompts):
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda p: server.generate(p, MAX_NEW)["output_ids"], prompts))
    for p, got in zip(prompts, outs):
        assert got == oracle.generate(p, MAX_NEW, replay=False), f"prompt of {len(p)} tokens"
    assert "chunked_prefill_size': 38" in server.log()
