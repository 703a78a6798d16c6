"""KV store reference vs brute force, dispatch on CPU, and the Triton store under
TRITON_INTERPRET."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_dsv41.kernels.kv_store import rope_cos_sin, store_records
from sglang_dsv41.kernels.kv_store.ref import record_values, store_records_ref
from sglang_dsv41.kv.records import Layout, pack, record_bytes
from sglang_dsv41.layers.rope import apply_rope

POISON = 0xA5


def _brute_values(x, w, eps, pos, inv_freq):
    """Row by row, element by element, in float64 then rounded like the fp32 torch path."""
    T, D = x.shape
    R = 2 * inv_freq.numel()
    out = torch.empty(T, D)
    for t in range(T):
        row = x[t].double()
        if w is not None:
            ms = sum(float(v) ** 2 for v in row) / D
            row = row / (ms + eps) ** 0.5 * w.double()
        if inv_freq.numel():
            row = row.clone()
            for i in range(R // 2):
                a, b = row[D - R + 2 * i].item(), row[D - R + 2 * i + 1].item()
                ang = float(pos[t].float() * inv_freq[i])  # the fp32 angle, then fp64
                c, s = math.cos(ang), math.sin(ang)
                row[D - R + 2 * i], row[D - R + 2 * i + 1] = a * c - b * s, a * s + b * c
        out[t] = row.float()
    return out


@pytest.mark.parametrize("norm", [False, True])
def test_record_values_vs_brute_force(norm):
    T, D, R = 4, 64, 16
    x = torch.randn(T, D) * 3
    w = torch.rand(D) + 0.5 if norm else None
    pos = torch.randint(0, 5000, (T,))
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    cos, sin = rope_cos_sin(pos, inv)
    got = record_values(x, w, 1e-6, cos, sin)
    torch.testing.assert_close(got, _brute_values(x, w, 1e-6, pos, inv), rtol=1e-5, atol=1e-5)
    # the RoPE step is the layers' apply_rope, bit for bit
    torch.testing.assert_close(
        record_values(x, None, 0, cos, sin), apply_rope(x, pos, inv), rtol=0, atol=0
    )


@pytest.mark.parametrize(
    "layout,D", [(Layout.V41, 64), (Layout.V41_FP4, 64), (Layout.INDEX_K, 128)]
)
def test_store_ref_scatters_codec_bytes(layout, D):
    T, P = 5, 4
    x = torch.randn(T, D)
    B = record_bytes(layout, D)
    pool = torch.full((3, P, B), POISON, dtype=torch.uint8)  # [pages, P, B]
    slots = torch.tensor([7, -1, 0, 11, 2])
    store_records_ref(x, pool, slots, layout)
    flat = pool.view(-1, B)
    rec = pack(layout, x)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s], rec[t])
    untouched = [s for s in range(3 * P) if s not in slots.tolist()]
    assert (flat[untouched] == POISON).all()


def test_dispatch_on_cpu_is_reference():
    T, D, R = 3, 128, 64
    x = torch.randn(T, D).to(torch.bfloat16)
    w = torch.rand(D) + 0.5
    pos = torch.arange(T) * 7
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    B = record_bytes(Layout.INDEX_K, D)
    a = torch.full((T, B), POISON, dtype=torch.uint8)
    b = a.clone()
    slots = torch.arange(T)
    store_records(x, a, slots, Layout.INDEX_K, norm_weight=w, eps=1e-6, pos=pos, inv_freq=inv)
    cos, sin = rope_cos_sin(pos, inv)
    store_records_ref(x, b, slots, Layout.INDEX_K, w, 1e-6, cos, sin)
    assert torch.equal(a, b)
    # a cos/sin table read at pos gives the same bytes
    c = torch.full((T, B), POISON, dtype=torch.uint8)
    table = rope_cos_sin(torch.arange(64), inv)
    store_records(
        x, c, slots, Layout.INDEX_K, norm_weight=w, eps=1e-6, pos=pos, cos_sin_cache=table
    )
    assert torch.equal(a, c)


_INTERP = textwrap.dedent("""
    import torch
    from sglang_dsv41.kernels.kv_store import triton as tri
    from sglang_dsv41.kernels.kv_store.ref import store_records_ref, rope_cos_sin
    from sglang_dsv41.kv.records import Layout, record_bytes
    torch.manual_seed(0)
    bad = []
    for layout, D, fmt in [(Layout.V41, 64, 0), (Layout.V41_FP4, 64, 1), (Layout.INDEX_K, 128, 2)]:
        for dtype in (torch.float32, torch.bfloat16):
            for norm in (False, True):
                T, R = 5, 32
                x = (torch.randn(T, D) * torch.rand(T, 1) * 4).to(dtype)
                x[2, :32] = 0
                if dtype == torch.float32:
                    x[3, 5] = float("nan")
                w = torch.rand(D) + 0.5 if norm else None
                pos = torch.randint(0, 1000, (T,))
                inv = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
                cos, sin = rope_cos_sin(pos, inv)
                B = record_bytes(layout, D)
                slots = torch.tensor([3, -1, 0, 6, 2])
                ref = torch.full((8, B), 0xAB, dtype=torch.uint8)
                got = ref.clone()
                store_records_ref(x, ref, slots, layout, w, 1e-6, cos, sin)
                tri.store_records(x, got, slots, fmt, w, 1e-6, None, cos, sin, R)
                if not torch.equal(ref, got):
                    bad.append((layout.name, str(dtype), norm, int((ref != got).sum())))
    print("BAD", bad)
    assert not bad
""")


def test_triton_store_interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, "-c", _INTERP], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("case", ["slot0_kept", "some_skipped", "none_kept", "all_kept"])
def test_sync_free_row_write_equals_masked_write(case):
    """The CUDA branch's sync-free write equals the masked write, also when a kept row writes
    slot 0 (skipped rows once raced it there) and when every row is skipped."""
    from sglang_dsv41.kernels.kv_store.ref import write_rows_no_sync

    g = torch.Generator().manual_seed(len(case))
    S, T, B = 64, 40, 12
    slots = torch.randperm(S, generator=g)[:T]
    if case == "slot0_kept":
        slots[5] = 0
        slots[[1, 7, 30]] = -1
    elif case == "some_skipped":
        slots[::3] = -1
    elif case == "none_kept":
        slots[:] = -1
    flat = torch.randint(0, 256, (S, B), generator=g, dtype=torch.uint8)
    rec = torch.randint(0, 256, (T, B), generator=g, dtype=torch.uint8)
    want = flat.clone()
    keep = slots >= 0
    want[slots[keep]] = rec[keep]
    for _ in range(3):  # a duplicate-index race would show as a run-to-run difference
        got = flat.clone()
        write_rows_no_sync(got, slots, rec)
        assert torch.equal(got, want)
