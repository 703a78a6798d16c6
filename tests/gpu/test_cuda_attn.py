"""The CUDA sparse-attention kernels (`cuda_decode.cu`, `cuda_wg64.cu`, NVRTC) on the GPU against
the fp32 torch reference, under the bar and pools of test_sparse_attn.py: each build the plan
chooses, at the head counts where it chooses it (blocks of 8, 16 or 64 heads, and partial
blocks: 1, 5, 9, 12, 24 heads), split and unsplit, bf16 and fp32 q and out, windows and top-k
lists of any length, q rows apart; the default plan's CUDA choices and their CUDA-graph replay;
and a build broken on purpose (a real NVRTC error), which drops only its own variant."""

import logging

import pytest
import torch
from test_sparse_attn import DEV, EXACT_BOUND, _check, _cuda_or_skip, _exact_err, make_case

from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.dispatch import device_capability
from sglang_dsv41.kernels.sparse_attn import (
    cuda_decode,
    cuda_jit,
    sparse_attention,
    sparse_attention_ref,
)
from sglang_dsv41.kernels.sparse_attn import plan as plan_mod
from sglang_dsv41.kernels.sparse_attn.variants import SPECS, Build, Cuda, Variant
from sglang_dsv41.kv.records import Layout

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or device_capability(torch.device("cuda")) < (9, 0),
    reason="needs an SM90+ GPU",
)


def _cuda_cases(heads, exact: bool) -> list:
    """(variant, H): one variant per build (defines) the plan chooses at each of `heads`."""
    seen, cases = set(), []
    for H in heads:
        for v in plan_mod.variants_at(H, exact):
            spec = SPECS[v]
            if isinstance(spec, Cuda):
                key = cuda_decode.defines_for(spec.build, H, exact)
                if (key, H) not in seen:
                    seen.add((key, H))
                    cases.append((v, H))
    return cases


@pytest.mark.parametrize("variant, H", _cuda_cases((1, 5, 8, 9, 16, 24, 64, 128), False))
@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("T", [1, 5, 40, 300])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_cuda_kernel_against_the_reference(layout, H, T, num_splits, variant):
    """Each build at one and several blocks of heads, split and unsplit, fp32 and bf16 out
    (split: bf16 partials in the 64-head kernel, within the 2x rule; unsplit: the fp32 rows'
    rounding only); a token that sees only the sink gets zeros."""
    _cuda_or_skip()
    q, swa, sw, kv, tk, sink = make_case(T, H, 512, 128, 512, layout, floor_every=3)
    launch = dict(variant=variant, num_splits=num_splits)
    out, _, err_bf = _check(q, swa, sw, kv, tk, layout, sink, **launch)
    if T > 2:
        assert (out[2] == 0).all()
    skv = SparseKV(swa, sw, kv, tk, layout)
    bf = sparse_attention(q, skv, sink, **launch).float()  # bf16 out
    ref = sparse_attention_ref(q, skv, sink, None, torch.float32)
    assert ((bf - ref).norm() / ref.norm()).item() <= 2 * err_bf + 1e-6
    if T > 2:
        assert (bf[2] == 0).all()
    if num_splits == 1:
        torch.testing.assert_close(bf, out, rtol=2**-8, atol=1e-5)  # out's rounding only


@pytest.mark.parametrize("variant, H", _cuda_cases((8, 16, 64), False))
@pytest.mark.parametrize("num_splits", [None, 1])
@pytest.mark.parametrize("start", [0, 4])
def test_cuda_kernel_q_rows_apart(variant, H, num_splits, start):
    """q rows 1040 bytes apart, on 16 bytes (start 0: the 64-head kernel's bulk copy a row
    instead of one for all rows) or off them (start 4: its 2-byte loads) give the contiguous
    q's output exactly."""
    _cuda_or_skip()
    q, swa, sw, kv, tk, sink = make_case(40, H, 512, 128, 512, Layout.V41_FP4, floor_every=3)
    wide = torch.zeros(40, H, 520, dtype=q.dtype, device=DEV)
    wide[:, :, start : start + 512] = q
    apart = wide[:, :, start : start + 512]
    assert apart.stride(1) == 520 and (apart.data_ptr() % 16 == 0) == (start == 0)
    skv = SparseKV(swa, sw, kv, tk, Layout.V41_FP4)
    launch = dict(variant=variant, num_splits=num_splits)
    want = sparse_attention(q, skv, sink, **launch)
    assert torch.equal(sparse_attention(apart, skv, sink, **launch), want)


@pytest.mark.parametrize("variant, H", _cuda_cases((8, 16, 64), False))
@pytest.mark.parametrize("W, TOPK", [(7, 40), (128, 0), (0, 100), (19, 5), (40, 17)])
def test_cuda_kernel_segment_lengths(W, TOPK, variant, H):
    """Windows and top-k lists that are no multiple of the kernel's tiles, or empty."""
    _cuda_or_skip()
    q, swa, sw, kv, tk, sink = make_case(40, H, 512, max(W, 1), max(TOPK, 1), Layout.V41_FP4)
    sw, tk = sw[:, :W].contiguous(), tk[:, :TOPK].contiguous()
    for ns in (None, 1):
        _check(q, swa, sw, kv, tk, Layout.V41_FP4, sink, variant=variant, num_splits=ns)


def test_cuda_kernel_graph_capture_and_default_plan():
    """Where the CUDA kernel is the plan's first choice it runs (every build loads here); it
    replays from a CUDA graph; arguments it cannot take (a cache off a 16-byte boundary) run
    the shape's next choice."""
    _cuda_or_skip()
    shapes = ((64, 8, False), (300, 16, False), (1, 8, False), (7, 16, False), (1, 8, True),
              (64, 8, True), (64, 64, True), (8, 64, False), (1, 32, False), (4, 32, False),
              (1, 64, False), (1100, 8, False))  # fmt: skip
    for T, H, exact in shapes:
        first = plan_mod.choices(T, H, 512, exact)[0]
        assert isinstance(SPECS[first], Cuda)
        assert plan_mod.plan_for(T, H, 512, DEV, exact).variant is first, (T, H, exact)
    for T, H in ((64, 8), (200, 16), (8, 64), (1100, 8), (40, 64), (16, 64), (50, 32), (3, 16),
                 (1, 64)):  # fmt: skip
        q, swa, sw, kv, tk, sink = make_case(T, H, 512, 128, 512, Layout.V41_FP4)
        skv = SparseKV(swa, sw, kv, tk, Layout.V41_FP4)
        out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
        sparse_attention(q, skv, attn_sink=sink, out=out)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            sparse_attention(q, skv, attn_sink=sink, out=out)
        q.copy_(torch.randn_like(q))
        g.replay()
        assert torch.equal(out, sparse_attention(q, skv, attn_sink=sink))
    # a cache that does not start on 16 bytes: the default plan runs the next choice
    raw = torch.empty(swa.numel() + 8, dtype=torch.uint8, device=DEV)
    odd = raw[8:].view(swa.shape)
    odd.copy_(swa)
    with pytest.raises(ValueError, match="16-byte"):
        cuda_decode.check_args(q, odd, sw, kv, tk, True)
    _check(q, odd, sw, kv, tk, Layout.V41_FP4, sink)


@pytest.mark.parametrize("variant, H", _cuda_cases((1, 5, 8, 12, 64), True))
@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("T", [1, 40, 300])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_cuda_kernel_exact_mode(layout, H, T, num_splits, variant):
    """fp32 q (the served layer's exact path): the CUDA kernel with q and P in three exact bf16
    parts, in blocks of 8 heads, is the fp32 reference up to the order of the sums."""
    _cuda_or_skip()
    err = _exact_err(T, H, 512, layout, variant=variant, num_splits=num_splits)
    assert err < EXACT_BOUND


def test_a_broken_build_drops_only_its_variant(monkeypatch, caplog):
    """The 16-head slim build (cuda_slim_x2's, 9-16 bf16 heads) given a source that NVRTC
    refuses: its shapes run their next choice (logged once, within the 2x rule), every other
    shape keeps its CUDA variant, and asking for the broken variant by name raises."""
    _cuda_or_skip()
    broken = cuda_decode.defines_for(Build.SLIM, 16, False)
    load = cuda_decode._load

    def load_broken(defines, index):
        if defines == broken:
            path, name = cuda_decode.source(defines)
            src = cuda_jit.load_source(path) + '\n#error "broken on purpose"\n'
            cuda_jit.Kernel(src, name, "sm_90a", defines).function(index)
        load(defines, index)

    monkeypatch.setattr(cuda_decode, "_ERRORS", {})
    monkeypatch.setattr(cuda_decode, "_load", load_broken)
    dispatch.log_once.cache_clear()
    caplog.set_level(logging.WARNING, logger="sglang_dsv41.kernels")
    for T, want in ((64, Variant.DIRECT_N32_PF_X2), (1100, Variant.WS_DIRECT_N64)):
        assert plan_mod.choices(T, 16, 512, False)[0] is Variant.CUDA_SLIM_X2
        assert plan_mod.plan_for(T, 16, 512, DEV, False).variant is want
        q, swa, sw, kv, tk, sink = make_case(T, 16, 512, 128, 512, Layout.V41_FP4)
        _check(q, swa, sw, kv, tk, Layout.V41_FP4, sink)
    for T, H in ((8, 16), (1, 16), (64, 8), (300, 8), (8, 64)):
        first = plan_mod.choices(T, H, 512, False)[0]
        assert plan_mod.plan_for(T, H, 512, DEV, False).variant is first, (T, H)
    warned = [r.getMessage() for r in caplog.records if "broken on purpose" in r.getMessage()]
    assert len(warned) == 1 and " ".join(broken) in warned[0]
    with pytest.raises(cuda_jit.CudaJitError, match="cuda_slim_x2 cannot run here"):
        sparse_attention(q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4), sink, variant="cuda_slim_x2")
    dispatch.log_once.cache_clear()
