"""Triton KV stores on the GPU: bytes equal to the CPU codecs (kv.records) via the torch
reference."""

import pytest
import torch

from sglang_dsv41.kernels.dispatch import Path, device_capability, device_paths
from sglang_dsv41.kernels.kv_store import rope_cos_sin, store_records
from sglang_dsv41.kernels.kv_store.ref import store_records_ref
from sglang_dsv41.kv.records import Layout, record_bytes

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or device_capability(torch.device("cuda")) < (9, 0),
    reason="needs an SM90+ GPU",
)

DEV = torch.device("cuda")
POISON = 0xFF  # NaN bytes in every format: an unwritten slot that is read shows up


def _rows(T, D, dtype, nan):
    x = torch.randn(T, D, device=DEV) * torch.rand(T, 1, device=DEV).mul(8).exp2()
    x[1, :32] = 0  # an all-zero tile
    x[2, 7] = -0.0
    if nan:
        x[3, 5] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize(
    "layout,D,R",
    [
        (Layout.V41, 512, 64),
        (Layout.V41_FP4, 512, 64),
        (Layout.INDEX_K, 128, 64),
        (Layout.V41, 64, 16),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rope", ["none", "inv_freq", "table"])
def test_store_bytes_equal_codec(layout, D, R, dtype, norm, rope):
    assert Path.TRITON in device_paths(DEV)
    T, P, pages = 333, 64, 8
    x = _rows(T, D, dtype, nan=dtype == torch.float32)
    w = torch.rand(D, device=DEV) + 0.5 if norm else None
    pos = torch.randint(0, 1 << 16, (T,), device=DEV)
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2, device=DEV).float() / R))
    B = record_bytes(layout, D)
    slots = torch.randperm(pages * P, device=DEV)[:T]
    slots[::11] = -1
    got = torch.full((pages, P, B), POISON, dtype=torch.uint8, device=DEV)
    want = got.clone()
    kw = {}
    cos = sin = None
    if rope == "inv_freq":
        kw = dict(pos=pos, inv_freq=inv)
        cos, sin = rope_cos_sin(pos, inv)
    elif rope == "table":
        table = rope_cos_sin(torch.arange(1 << 16, device=DEV), inv)
        kw = dict(pos=pos, cos_sin_cache=table)
        cos, sin = table[0][pos], table[1][pos]
    store_records(x, got, slots, layout, norm_weight=w, eps=1e-6, **kw)
    store_records_ref(x, want, slots, layout, w, 1e-6, cos, sin)
    diff = (got != want).float().mean().item()
    if norm:
        # the RMS statistic is a sum whose order differs from torch's: a 1-ulp change may move
        # a value across a rounding boundary, very rarely
        assert diff < 1e-4, diff
    else:
        assert diff == 0, diff
    flat = got.view(-1, B)
    unwritten = torch.ones(pages * P, dtype=torch.bool, device=DEV)
    unwritten[slots[slots >= 0]] = False
    assert (flat[unwritten] == POISON).all()


def test_store_graph_capturable():
    T, D = 16, 512
    x = torch.randn(T, D, device=DEV)
    pool = torch.full((T, 528), POISON, dtype=torch.uint8, device=DEV)
    slots = torch.arange(T, device=DEV)
    pos = torch.arange(T, device=DEV)
    w = torch.rand(D, device=DEV)
    inv = torch.rand(32, device=DEV)
    store_records(x, pool, slots, Layout.V41, norm_weight=w, pos=pos, inv_freq=inv)  # compile
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        store_records(x, pool, slots, Layout.V41, norm_weight=w, pos=pos, inv_freq=inv)
    x.copy_(torch.randn(T, D, device=DEV))
    g.replay()
    want = torch.empty_like(pool)
    store_records(x, want, slots, Layout.V41, norm_weight=w, pos=pos, inv_freq=inv)
    assert torch.equal(pool, want)


@pytest.mark.parametrize("P", [64, 128])
def test_index_k_into_split_pages(P):
    """Split pages (SGLang's index-K page, what DeepGEMM reads on SM100): the bytes of the torch
    store, unwritten slots untouched."""
    pages = 8
    T = min(700, pages * P)
    x = _rows(T, 128, torch.float32, nan=True)
    slots = torch.randperm(pages * P, device=DEV)[:T]
    slots[::13] = -1
    got = torch.full((pages, P * 68), POISON, dtype=torch.uint8, device=DEV)
    want = got.clone()
    store_records(x, got, slots, Layout.INDEX_K, split_page=P)
    store_records_ref(x, want, slots, Layout.INDEX_K, split_page=P)
    assert torch.equal(got, want)
