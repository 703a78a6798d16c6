"""Replay off, chunked prefill forced small (38 tokens; SGLang needs a multiple of the page size),
mixed batches (`--enable-mixed-chunk`: prefill chunks share forwards with decodes) and forced
retraction (SGLANG_TEST_RETRACT): same outputs as the reference."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from e2e.conftest import MAX_NEW, RETRACT_ENV, RETRACTED

SERVER = (
    "chunked",
    (
        "--no-enable-decoder-swa-bounded-replay",
        "--chunked-prefill-size",
        "38",
        "--enable-mixed-chunk",
    ),
    RETRACT_ENV,
)


def test_chunked_prefill_equals_reference(server, oracle, prompts):
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda p: server.generate(p, MAX_NEW)["output_ids"], prompts))
    for p, got in zip(prompts, outs, strict=False):
        assert got == oracle.generate(p, MAX_NEW, replay=False), f"prompt of {len(p)} tokens"
    log = server.log()
    assert "chunked_prefill_size': 38" in log and "'enable_mixed_chunk': True" in log
    # at least one prefill forward ran while other requests were decoding (a mixed batch)
    assert re.search(r"Prefill batch.*#running-req: [1-9]", log)
    assert re.search(RETRACTED, log)
