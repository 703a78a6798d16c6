"""The KV records are the bytes SGLang's own V4.1 writers produce.

Oracles (installed SGLang, read for facts): `sglang.test.kernels.deepseek_v4.
dsv41_kv_quant_reference` (V41 528 B and V41_FP4 288 B pages) and the index-K packer
`sglang.kernels.ops.quantization.fp4_indexer_quant.quantize_fp4_indexer_tensor(rne=True)` (the
V4.1 pool's rounding), a Triton kernel run here under TRITON_INTERPRET=1. Compared: our torch
codecs (`kv.records`) and our fused Triton store (`kernels.kv_store.triton`), on random tiles and
on edge tiles: zeros (+0 and -0), tiles below each scale floor, values that round to zero,
round-half ties, saturation, exact powers of two, and non-finite tiles.

The interpreted half runs this file as a script in a subprocess (TRITON_INTERPRET must be set
before triton is imported); nothing else imports it.
"""

import os
import subprocess
import sys

import pytest
import torch

from sglang_dsv41.kv.records import Layout, pack, pack_v41, pack_v41_fp4, unpack

NAN, INF = float("nan"), float("inf")
D, DI = 512, 128


def edge_rows(n_random: int = 24, seed: int = 0) -> torch.Tensor:
    """fp32 [n_random + 16, 512]: random rows with per-32-tile magnitudes 2^-30..2^20, then edge
    rows (each 32-value tile of an edge row is one case; a 512-row is four index-K rows)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-30, 21, (n_random, D // 32), generator=g).float())
    rand = torch.randn(n_random, D, generator=g) * mag.repeat_interleave(32, 1)
    e = torch.randn(16, D, generator=g)
    e[0] = 0.0
    e[1] = -0.0
    e[2] = torch.randn(D, generator=g) * 1e-3  # amax ~3e-3: below the V41 floor (448e-4)
    e[3] = torch.randn(D, generator=g) * 1e-5  # below both floors (V41 448e-4, index K 6e-4)
    e[4, :256] = 0.0447  # just below the V41 floor
    e[4, 256:] = 5.9e-4  # just below the index-K floor
    e[5] = -1e-9  # negative values that round to zero in every layout
    e[5, ::32] = 1.0  # ... next to a tile max of 1
    e[6] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]).repeat(D // 8)  # e2m1 ties
    e[6, 1::3] *= -1
    e[7] = 448.0 * torch.exp2(torch.randint(-20, 20, (D,), generator=g).float())  # powers of two
    e[8] = 6.0 * torch.exp2(torch.randint(-20, 20, (D,), generator=g).float())
    e[9] = torch.randn(D, generator=g) * 1e30  # huge scales
    e[10] = torch.randn(D, generator=g) * 3e3  # V41_FP4 scale saturates at 448
    e[11, :64] = 3e38
    e[11, 64:] = -0.0
    e[12, 40] = -(2.0**-20)  # a lone tiny negative in a normal tile
    e[13] = torch.randn(D, generator=g).to(torch.bfloat16).float()  # bf16-exact values
    e[14, 3] = INF  # non-finite tiles, compared separately (`finite_part`)
    e[14, 70] = -INF
    e[15, 200] = NAN
    return torch.cat((rand, e))


def sglang_v41(x: torch.Tensor) -> torch.Tensor:
    """SGLang's V41 oracle, pages of one slot: [T, 528] records."""
    ref = pytest.importorskip("sglang.test.kernels.deepseek_v4.dsv41_kv_quant_reference")
    pages = ref.quantize_k_cache_v41(x[:, None, :], page_bytes=528)  # [T, 528] block-split
    return torch.cat((pages[:, :D], pages[:, D:528]), dim=1)


def sglang_v41_fp4(x: torch.Tensor) -> torch.Tensor:
    """SGLang's V41_FP4 oracle, pages of one slot: [T, 288] records."""
    ref = pytest.importorskip("sglang.test.kernels.deepseek_v4.dsv41_kv_quant_reference")
    pages = ref.quantize_k_cache_v41_fp4(x[:, None, :], page_bytes=288)
    return torch.cat((pages[:, : D // 2], pages[:, D // 2 : 288]), dim=1)


def sglang_index_k(x: torch.Tensor) -> torch.Tensor:
    """SGLang's V4.1 index-K packer (RNE): x [n, 128] -> [n, 68] records (64 packed bytes, then
    the four UE8M0 bytes of the packed int32 scale, little-endian)."""
    from sglang.kernels.ops.quantization.fp4_indexer_quant import quantize_fp4_indexer_tensor

    fp4, sf = quantize_fp4_indexer_tensor(x.contiguous(), rne=True)
    return torch.cat((fp4.view(torch.uint8), sf.contiguous().view(torch.uint8).view(-1, 4)), 1)


def nan_sign_free(rec: torch.Tensor) -> torch.Tensor:
    """V41 records with the sign bit of NaN value codes (0x7F / 0xFF) cleared: SGLang's torch
    oracle takes it from the host's default NaN (x86: negative), the GPU writes 0x7F."""
    v = rec[:, :D]
    return torch.cat((torch.where((v & 0x7F) == 0x7F, 0x7F, v), rec[:, D:]), dim=1)


def mismatches(a: torch.Tensor, b: torch.Tensor) -> list:
    return (a != b).nonzero()[:8].tolist()


# ---------------------------------------------------------------- torch codecs, in process


def test_v41_codec_equals_sglang_oracle():
    x = edge_rows()
    ours, theirs = pack_v41(x), sglang_v41(x)
    assert mismatches(nan_sign_free(ours), nan_sign_free(theirs)) == []
    finite = torch.isfinite(x).all(1)
    assert torch.equal(ours[finite], theirs[finite])  # finite rows: every byte, sign included
    # the case that used to differ: an all-zero tile's scale byte is 114 (2^-13)
    assert ours[-16, D:].tolist() == [114] * 16


def test_v41_fp4_codec_equals_sglang_oracle():
    x = edge_rows()
    assert mismatches(pack_v41_fp4(x), sglang_v41_fp4(x)) == []


def test_floors_are_sglangs():
    """Below the floors the scale bytes are the floors' 2^-13 (byte 114), and index K writes +0
    for what rounds to zero; decoded values keep their sign in the other layouts."""
    x = torch.full((1, 128), -1e-7)
    assert pack(Layout.V41, x)[0, 128:].tolist() == [114] * 4
    rec = pack(Layout.INDEX_K, x)[0]
    assert rec.tolist() == [0] * 64 + [114] * 4
    assert not torch.signbit(unpack(Layout.INDEX_K, rec[None])).any()
    assert torch.signbit(unpack(Layout.V41_FP4, pack(Layout.V41_FP4, x))).all()


def test_split_page_store_equals_sglang_page_writer():
    """The torch store into split pages of 64 slots: SGLang's index-K page oracle's bytes."""
    common = pytest.importorskip("sglang.test.kernels.deepseek_v4.common")
    from sglang_dsv41.kernels.kv_store.ref import store_records_ref

    xi = edge_rows(n_random=8).view(-1, DI)
    rec = pack(Layout.INDEX_K, xi)
    loc = torch.randperm(3 * 64, generator=torch.Generator().manual_seed(2))[: xi.shape[0]]
    want = common.store_fp4_index_cache_ref(
        rec[:, :64], rec[:, 64:].contiguous().view(torch.int32).view(-1), loc, num_pages=3
    )
    pages = torch.zeros(3, 64 * 68, dtype=torch.uint8)
    store_records_ref(xi, pages, loc, Layout.INDEX_K, split_page=64)
    assert mismatches(pages, want) == []


# ---------------------------------------------------------------- interpreted (subprocess)


def interpreted_checks() -> None:
    """Run with TRITON_INTERPRET=1: SGLang's index-K packer against our codec, and our Triton
    store against all three oracles. Raises AssertionError naming the layout and the bytes."""
    from sglang_dsv41.kernels.kv_store import triton as tri

    x = edge_rows()
    xi = x.view(-1, DI)  # [4 T, 128]
    assert mismatches(pack(Layout.INDEX_K, xi), sglang_index_k(xi)) == [], "INDEX_K codec"
    for layout, fmt, rows, want in (
        (Layout.V41, tri.FMT_V41, x, nan_sign_free(sglang_v41(x))),
        (Layout.V41_FP4, tri.FMT_V41_FP4, x, sglang_v41_fp4(x)),
        (Layout.INDEX_K, tri.FMT_INDEX_K, xi, sglang_index_k(xi)),
    ):
        T = rows.shape[0]
        pool = torch.full((T + 3, want.shape[1]), 0xA5, dtype=torch.uint8)
        slots = torch.arange(T) + 3
        tri.store_records(rows, pool, slots, fmt)
        got = pool[3:]
        if layout is Layout.V41:
            got = nan_sign_free(got)
        assert mismatches(got, want) == [], f"Triton store {layout.name}"
        assert (pool[:3] == 0xA5).all()
    # index K into split pages of 64 slots: SGLang's page writer (its torch test oracle)
    common = pytest.importorskip("sglang.test.kernels.deepseek_v4.common")
    recs = sglang_index_k(xi)
    loc = torch.randperm(3 * 64, generator=torch.Generator().manual_seed(1))[: xi.shape[0]]
    fp4, sf = recs[:, :64], recs[:, 64:].contiguous().view(torch.int32).view(-1)
    want = common.store_fp4_index_cache_ref(fp4, sf, loc, num_pages=3)  # [3, 64 * 68]
    pages = torch.zeros(3, 64 * 68, dtype=torch.uint8)
    tri.store_records(xi, pages, loc, tri.FMT_INDEX_K, page=64)
    assert mismatches(pages, want) == [], "Triton store INDEX_K, split pages"
    print("INTERPRETED_OK")


def test_triton_store_and_index_k_packer_interpreted():
    pytest.importorskip("triton")
    pytest.importorskip("sglang.kernels.ops.quantization.fp4_indexer_quant")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "INTERPRETED_OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


if __name__ == "__main__":
    interpreted_checks()
