"""A CUDA build that fails drops only the variants built from it, on the CPU: the build step
(`cuda_decode._load`, NVRTC and the driver on a GPU) is replaced by a recorder that fails for
one build, the device checks say "an SM90 GPU", and the plan is asked for every shape of its
table. tests/gpu/test_cuda_attn.py::test_a_broken_build_drops_only_its_variant is the same
check with a real NVRTC failure on the H200."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton")

from sglang_dsv41.kernels import dispatch  # noqa: E402
from sglang_dsv41.kernels.sparse_attn import cuda_decode  # noqa: E402
from sglang_dsv41.kernels.sparse_attn import plan as plan_mod  # noqa: E402
from sglang_dsv41.kernels.sparse_attn.cuda_jit import CudaJitError  # noqa: E402
from sglang_dsv41.kernels.sparse_attn.variants import SPECS, Build, Cuda, Variant  # noqa: E402

GPU = torch.device("cuda", 0)  # never touched: the device checks are stubbed
BROKEN = cuda_decode.defines_for(Build.SLIM, 16, False)  # cuda_slim_x2's build (9-16 heads)


@pytest.fixture
def fake_sm90(monkeypatch):
    """An SM90 device with flash_mla whose builds load except BROKEN; yields the builds tried."""
    tried = []

    def load(defines, index):
        tried.append(defines)
        if defines == BROKEN:
            raise CudaJitError("NVRTC could not compile sparse_decode_h16:\nerror: injected")

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(cuda_decode, "_ERRORS", {})
    monkeypatch.setattr(cuda_decode, "_load", load)
    monkeypatch.setattr(cuda_decode, "why_unavailable", lambda device: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(plan_mod, "_flashmla_ok", lambda device: True)
    dispatch.log_once.cache_clear()
    yield tried
    dispatch.log_once.cache_clear()


def _build(v: Variant, H: int, exact: bool):
    spec = SPECS[v]
    return cuda_decode.defines_for(spec.build, H, exact) if isinstance(spec, Cuda) else None


def test_builds_are_made_at_first_use(fake_sm90):
    assert plan_mod.plan_for(8, 16, 512, GPU, False).variant is Variant.CUDA32_X2
    assert fake_sm90 == [cuda_decode.defines_for(Build.TILES32, 16, False)]
    plan_mod.plan_for(9, 16, 512, GPU, False)  # the same build: not tried again
    assert len(fake_sm90) == 1


def test_a_broken_build_drops_only_its_variant(fake_sm90, caplog):
    caplog.set_level(logging.WARNING, logger="sglang_dsv41.kernels")
    dropped = set()
    for H in plan_mod.HEADS:
        for exact in (False, True):
            for t0, t1, c in plan_mod.table(H, exact):
                live = [v for v in c if not isinstance(SPECS[v], Cuda) or _build(v, H, exact)
                        != BROKEN]  # fmt: skip
                dropped |= set(c) - set(live)
                for T in (t0, t1):
                    got = plan_mod.plan_for(T, H, 512, GPU, exact).variant
                    assert got is live[0], (T, H, exact, c)
    assert dropped == {Variant.CUDA_SLIM_X2}
    assert fake_sm90.count(BROKEN) == 1  # tried once per process and device
    assert plan_mod.plan_for(64, 16, 512, GPU, False).variant is Variant.DIRECT_N32_PF_X2
    assert plan_mod.plan_for(2048, 16, 512, GPU, False).variant is Variant.WS_DIRECT_N64
    assert plan_mod.plan_for(64, 8, 512, GPU, False).variant is Variant.CUDA_SLIM_X3
    warned = [r.getMessage() for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(warned) == 1 and " ".join(BROKEN) in warned[0] and "injected" in warned[0]
    assert "injected" in cuda_decode.build_error(BROKEN, GPU)


def test_a_capture_runs_the_next_choice_until_an_eager_call_built_it(fake_sm90, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert plan_mod.plan_for(64, 8, 512, GPU, False).variant is Variant.DIRECT_N32_PF_X2
    assert fake_sm90 == []  # nothing built inside the capture, nothing remembered
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert plan_mod.plan_for(64, 8, 512, GPU, False).variant is Variant.CUDA_SLIM_X3
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert plan_mod.plan_for(64, 8, 512, GPU, False).variant is Variant.CUDA_SLIM_X3
