"""The released checkpoint layout (`release_checkpoint --preset flash-mini`): 40 layers with every
role, mHC streams, Engram on layers 1 and 14, FP8/FP4 weights with scales, vision/MTP tensors to
skip. Served with the default replay on (`--dtype float32` to compare with the fp32 reference);
requests one at a time (see docs/serving.md on fp32 batch-shape effects); a hit whose SWA is
gone resumes by prefix replay, and the reference is given the same resume point."""

from __future__ import annotations

import pytest
import torch
from e2e.conftest import oracle_tokens
from e2e.server import Server

from sglang_dsv41.tools.serve import write_checkpoint

NEW = 5


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "flash-mini"
    return write_checkpoint(
        out, "flash-mini", tool="release_checkpoint", capture_output=True, timeout=300
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory, release_dir):
    log = tmp_path_factory.mktemp("logs") / "release.log"
    s = Server(release_dir, str(log), ("--dtype", "float32"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ref(release_dir):
    from sglang_dsv41.reference import load_reference

    return load_reference(release_dir)


def test_release_checkpoint_served_equal_to_reference(server, ref):
    log = server.log()
    assert "skipped" in log and "outside the text model" in log
    assert "decoder SWA bounded replay on" in log
    g = torch.Generator().manual_seed(3)
    base = torch.randint(2, ref.cfg.vocab_size, (120,), generator=g).tolist()
    for p in (base[:7], base + [5, 6, 7], base + [8, 9], base[:77] + [10, 11, 12, 13]):
        before = server.log()
        out = server.generate(p, NEW)
        cached = out["meta_info"]["cached_tokens"]
        assert out["output_ids"] == oracle_tokens(ref, server, before, p, NEW, cached), len(p)
        if len(p) == 122:
            assert out["meta_info"]["cached_tokens"] > 0
