"""V41 / V41_FP4 / index-K records: sizes, hand-built bytes, brute-force round trips, specials."""

import math
import subprocess
import sys

import pytest
import torch

from sglang_dsv41.kv.fp import E2M1_GRID, SCALE_FLOOR, e4m3_decode
from sglang_dsv41.kv.records import (
    Layout,
    fake_quant,
    pack,
    pack_index_k,
    pack_v41,
    pack_v41_fp4,
    record_bytes,
    record_dim,
    scale_tile,
    unpack,
    unpack_index_k,
    unpack_v41,
    unpack_v41_fp4,
    value_bytes,
)

NAN = float("nan")
INF = float("inf")
TILE = {Layout.V41: 32, Layout.V41_FP4: 16, Layout.INDEX_K: 32}  # written out, not imported


def u8(values) -> list[int]:
    return torch.tensor(values, dtype=torch.uint8).tolist()


def padded(values, dim) -> torch.Tensor:
    x = torch.zeros(dim, dtype=torch.float32)
    x[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (-0.0 != 0.0), NaN positions equal whatever their payload."""
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    return torch.equal(a[~na].view(torch.int32), b[~nb].view(torch.int32))


# ---------------------------------------------------------------- sizes


def test_record_sizes_at_flash_dims():
    assert record_bytes(Layout.V41, 512) == 528
    assert record_bytes(Layout.V41_FP4, 512) == 288
    assert record_bytes(Layout.INDEX_K, 128) == 68
    assert record_bytes(Layout.V41, 64) == 66
    assert record_bytes(Layout.V41_FP4, 64) == 36
    assert record_bytes(Layout.INDEX_K, 32) == 17
    assert [value_bytes(layout, 512) for layout in Layout] == [512, 256, 256]
    assert [scale_tile(layout) for layout in Layout] == [32, 16, 32]
    for layout in Layout:
        for dim in (32, 64, 128, 512, 1024):
            assert record_dim(layout, record_bytes(layout, dim)) == dim
    with pytest.raises(ValueError):
        record_bytes(Layout.V41, 48)
    with pytest.raises(ValueError):
        record_dim(Layout.V41_FP4, 100)


def test_kv_imports_without_sglang():
    code = (
        "import sys; sys.modules['sglang'] = None; import sglang_dsv41.kv as kv; "
        "print(kv.record_bytes(kv.Layout.V41_FP4, 512))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "288"


@pytest.mark.parametrize("layout", list(Layout))
def test_flash_records_and_layout_views(layout):
    dim = 128 if layout is Layout.INDEX_K else 512
    g = torch.Generator().manual_seed(11)
    x = torch.randn(dim, 6, generator=g).t()  # non-contiguous [6, dim]
    rec = pack(layout, x)
    assert rec.shape == (6, {Layout.V41: 528, Layout.V41_FP4: 288, Layout.INDEX_K: 68}[layout])
    assert torch.equal(rec, pack(layout, x.contiguous()))
    assert torch.equal(rec[4], pack(layout, x[4]))  # a record depends on its own row only
    assert torch.equal(rec.view(2, 3, -1), pack(layout, x.reshape(2, 3, dim)))
    assert unpack(layout, rec).shape == (6, dim)


@pytest.mark.parametrize("layout", list(Layout))
def test_pack_shapes_and_dtypes(layout):
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    rec = pack(layout, x)
    assert rec.shape == (2, 3, record_bytes(layout, 64)) and rec.dtype == torch.uint8
    y = unpack(layout, rec)
    assert y.shape == (2, 3, 64) and y.dtype == torch.float32
    with pytest.raises(ValueError):
        pack(layout, torch.randn(4, 40))
    with pytest.raises(TypeError):
        unpack(layout, rec.to(torch.int32))


# ---------------------------------------------------------------- hand-built bytes


def test_v41_hand_built_bytes():
    # amax 2 -> 2^ceil(log2(2/448)) = 2^-7, byte 120; values are x * 128 in e4m3
    x = padded([2.0, 1.0, -0.5, 0.01, -0.0, 3e-5, 1.0625 / 128, 1.1875 / 128], 32)
    # 256 -> 0x78, 128 -> 0x70, -64 -> 0xE8, 1.28 -> 1.25 = 0x3A, -0 -> 0x80,
    # 0.00384 -> subnormal 2 * 2^-9 = 0x02, tie 1.0625 -> 1.0 = 0x38, tie 1.1875 -> 1.25 = 0x3A
    want = [0x78, 0x70, 0xE8, 0x3A, 0x80, 0x02, 0x38, 0x3A] + [0] * 24 + [120]
    rec = pack_v41(x)
    assert rec.tolist() == u8(want)
    y = unpack_v41(rec)
    assert y[:8].tolist() == [2.0, 1.0, -0.5, 1.25 / 128, -0.0, 2.0**-15, 1.0 / 128, 1.25 / 128]
    assert torch.signbit(y[4]).item() and not y[8:].any()


def test_v41_two_tiles_d64():
    # tile 0: amax 448 -> scale 1 (byte 127); tile 1: amax 0.75 -> 2^ceil(log2(0.75/448)) = 2^-9
    x = padded([448.0, -3.0, 0.1] + [0.0] * 29 + [0.75, 0.0, -(2.0**-20)], 64)
    rec = pack_v41(x)
    # 448 -> 0x7E, -3 -> 0xC4, 0.1 -> 0.1015625 = 0x1D; 0.75 * 512 = 384 -> 0x7C;
    # -2^-20 * 2^9 = -2^-11: below half the smallest subnormal (2^-10) -> -0 = 0x80
    want = [0x7E, 0xC4, 0x1D] + [0] * 29 + [0x7C, 0x00, 0x80] + [0] * 29 + [127, 118]
    assert rec.tolist() == u8(want)


def test_v41_fp4_hand_built_bytes():
    # tile 0: amax 6 -> scale e4m3(1.0) = 0x38, values unchanged
    t0 = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.3, -5.9, 0.0, -0.0, 0.5, 1.5, 3.0, 4.0]
    # codes: 0 2 2 4 4 6 6 7 9 F 0 8 1 3 5 6 -> bytes (even index low nibble)
    b0 = [0x20, 0x42, 0x64, 0x76, 0xF9, 0x80, 0x31, 0x65]
    # tile 1: amax 0.9 -> 0.15 -> e4m3 rounds to 0.15625 = 1.25 * 2^-3 = 0x22
    s = 0.15625
    t1 = [0.9, -0.9, s, 0.5 * s, 0.25 * s, 0.75 * s] + [0.0] * 10
    # 5.76 -> 6 (7), -6 (F), 1 (2), 0.5 (1), tie 0.25 -> 0 (0), tie 0.75 -> 1 (2)
    b1 = [0xF7, 0x12, 0x20] + [0] * 5
    x = torch.tensor(t0 + t1, dtype=torch.float32)
    rec = pack_v41_fp4(x)
    assert rec.tolist() == u8(b0 + b1 + [0x38, 0x22])
    y = unpack_v41_fp4(rec)
    assert y[:16].tolist() == [0, 1, 1, 2, 2, 4, 4, 6, -0.5, -6, 0, -0.0, 0.5, 1.5, 3, 4]
    assert y[16:22].tolist() == [6 * s, -6 * s, s, 0.5 * s, 0.0, s]


def test_index_k_hand_built_bytes():
    # amax 3 -> 3/6 = 0.5 exactly, a power of two: scale 0.5, byte 126; values are 2x
    x = padded([3.0, -1.5, 0.125, 0.375, 1.25, 1.75, 2.5, 0.2], 32)
    x[31] = -0.0
    # 6 (7), -3 (D), tie 0.25 -> 0, tie 0.75 -> 1 (2), tie 2.5 -> 2 (4), tie 3.5 -> 4 (6),
    # tie 5 -> 4 (6), 0.4 -> 0.5 (1); last pair (0, -0) -> 0x00: index K writes +0 for zeros
    want = [0xD7, 0x20, 0x64, 0x16] + [0] * 11 + [0x00, 126]
    rec = pack_index_k(x)
    assert rec.tolist() == u8(want)
    y = unpack_index_k(rec)
    assert y[:8].tolist() == [3.0, -1.5, 0.0, 0.5, 1.0, 2.0, 2.0, 0.25]
    # just above a power of two -> next scale (1.0): 3.0000002 -> 3.0 (code 5)
    rec2 = pack_index_k(padded([3.0000002], 32))
    assert rec2.tolist() == u8([0x05] + [0] * 15 + [127])


# ---------------------------------------------------------------- brute-force round trips


def nearest_on(grid: list[float], v: float) -> float:
    """Nearest grid magnitude to |v| with ties to the even index, saturating; sign of v."""
    a = abs(v)
    if a >= grid[-1]:
        m = grid[-1]
    else:
        m = grid[min(range(len(grid)), key=lambda i: (abs(grid[i] - a), i % 2))]
    return math.copysign(m, v)


E4M3_GRID = [e4m3_decode(torch.tensor([c], dtype=torch.uint8)).item() for c in range(0x7F)]


def brute_force_decode(layout: Layout, x: torch.Tensor) -> torch.Tensor:
    """Per tile, per value, with Python floats: the scale rule, then nearest-with-ties on the
    grid (index K: +0 for what rounds to zero)."""
    out = []
    tile = TILE[layout]
    for row in x.reshape(-1, tile).tolist():
        amax = max(abs(v) for v in row)
        if layout is Layout.V41_FP4:
            s = float(torch.tensor(amax, dtype=torch.float32) / 6.0)
            scale = nearest_on(E4M3_GRID, min(max(s, 2.0**-9), 448.0))
        else:
            fmax = 448.0 if layout is Layout.V41 else 6.0
            y = float(torch.tensor(amax, dtype=torch.float32) / fmax)  # the fp32 division
            y = max(y, float(torch.tensor(SCALE_FLOOR, dtype=torch.float32)))
            m, e = math.frexp(y)
            scale = math.ldexp(1.0, e - 1 if m == 0.5 else e)
        grid = E4M3_GRID if layout is Layout.V41 else list(E2M1_GRID)
        q = torch.tensor(row, dtype=torch.float32) / scale  # the fp32 division
        vals = [nearest_on(grid, v) for v in q.tolist()]
        if layout is Layout.INDEX_K:
            vals = [v if v != 0 else 0.0 for v in vals]  # -0.0 == 0 -> +0.0
        out.extend(v * scale for v in vals)
    return torch.tensor(out, dtype=torch.float32).reshape(x.shape)


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("magnitude", [1e-5, 0.03, 1.0, 700.0, 1e8])
def test_round_trip_equals_brute_force(layout, magnitude):
    g = torch.Generator().manual_seed(int(magnitude * 1000) % 997 + len(layout.value))
    x = torch.randn(3, 64, generator=g) * magnitude
    x[0, :32] *= torch.exp2(torch.randint(-6, 6, (32,), generator=g).float())  # uneven tiles
    x[1, 5] = 0.0
    x[2, :16] = 0.0  # an all-zero tile in every layout
    y = unpack(layout, pack(layout, x))
    assert same_bits(y, brute_force_decode(layout, x))


# ---------------------------------------------------------------- fake_quant


@pytest.mark.parametrize("layout", list(Layout))
def test_fake_quant_bit_identical(layout):
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(8, 4, 128, generator=g) * m for m in (1e-7, 1e-3, 1.0, 30.0, 1e5, 1e30)]
    x = torch.cat(xs)
    x[0, 0, :32] = 0.0
    x[1, 0, :32] = -0.0
    x[2, 1, 3] = NAN
    x[3, 1, 40] = INF
    x[4, 2, 100] = -INF
    assert same_bits(fake_quant(layout, x), unpack(layout, pack(layout, x)))
    xb = x.to(torch.bfloat16)
    assert same_bits(fake_quant(layout, xb), unpack(layout, pack(layout, xb)))


# ---------------------------------------------------------------- special tiles


ZERO_SCALE = {Layout.V41: 114, Layout.V41_FP4: 0x01, Layout.INDEX_K: 114}
NEG_ZERO = {Layout.V41: 0x80, Layout.V41_FP4: 0x88, Layout.INDEX_K: 0x00}  # index K drops the sign


@pytest.mark.parametrize("layout", list(Layout))
def test_all_zero_tiles(layout):
    x = torch.zeros(2, 64)
    x[1] = -0.0
    rec = pack(layout, x)
    nv = value_bytes(layout, 64)
    n_scales = 64 // TILE[layout]
    assert rec[0].tolist() == [0] * nv + [ZERO_SCALE[layout]] * n_scales
    assert rec[1].tolist() == [NEG_ZERO[layout]] * nv + [ZERO_SCALE[layout]] * n_scales
    y = unpack(layout, rec)
    assert not y.any() and not torch.signbit(y[0]).any()
    assert torch.signbit(y[1]).all() == (layout is not Layout.INDEX_K)


def _bad_tiles(layout, bad):
    """For every 5th position `where` of tile 1: (where, x, t), x fp32 [64] (seeded by `where`)
    with `bad` at that position, t the tile's slice."""
    tile = TILE[layout]
    for where in range(0, tile, 5):
        x = torch.randn(64, generator=torch.Generator().manual_seed(where))
        x[tile + where] = bad
        yield where, x, slice(tile, 2 * tile)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_v41_non_finite_poisons_only_its_tile(bad):
    for _where, x, t in _bad_tiles(Layout.V41, bad):
        rec = pack_v41(x)
        assert rec[64:].tolist()[1] == 0xFF and 0xFF not in rec[64:].tolist()[::2]
        if math.isnan(bad):
            assert rec[t].tolist() == [0x7F] * 32
        else:  # SGLang's writer divides by amax / 448 = inf: finite values -> +-0, inf -> NaN
            want = [0x7F if not math.isfinite(v) else (0x80 if v < 0 else 0) for v in x[t].tolist()]
            assert rec[t].tolist() == want
        y = unpack_v41(rec)
        assert torch.isnan(y[t]).all() and torch.isfinite(y[:32]).all()
        assert same_bits(fake_quant(Layout.V41, x), y)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_v41_fp4_non_finite_tile(bad):
    for where, x, t in _bad_tiles(Layout.V41_FP4, bad):
        rec = pack_v41_fp4(x)
        scales = rec[32:].tolist()
        y = unpack_v41_fp4(rec)
        if math.isnan(bad):  # the NaN scale 0x7F, codes 0: the tile decodes to NaN
            assert scales[1] == 0x7F and 0x7F not in scales[:1] + scales[2:]
            assert rec[8:16].tolist() == [0] * 8 and torch.isnan(y[t]).all()
        else:  # inf saturates: scale 448 (0x7E), the inf value at +-6 * 448
            assert scales[1] == 0x7E
            assert y[16 + where].item() == math.copysign(2688.0, bad) and torch.isfinite(y).all()
        assert torch.isfinite(y[:16]).all() and torch.isfinite(y[32:]).all()
        assert same_bits(fake_quant(Layout.V41_FP4, x), y)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_index_k_non_finite_tile(bad):
    for where, x, _t in _bad_tiles(Layout.INDEX_K, bad):
        rec = pack_index_k(x)
        y = unpack_index_k(rec)
        rest = torch.cat((x[:32], x[64:]))
        assert same_bits(torch.cat((y[:32], y[64:])), fake_quant(Layout.INDEX_K, rest))
        if math.isnan(bad):  # written as +6; the scale comes from the tile's other values
            clean = x.clone()
            clean[32 + where] = 0.0
            assert rec[33].item() == pack_index_k(clean)[33].item()
            assert y[32 + where].item() == 6 * 2.0 ** (rec[33].item() - 127)
        else:  # inf: byte 254 (scale 2^127), inf -> +-6 -> +-inf; the tile's rest rounds to +0
            assert rec[33].item() == 254 and y[32 + where].item() == bad
            others = torch.cat((y[32 : 32 + where], y[33 + where : 64]))
            assert not others.any() and not torch.signbit(others).any()
        assert same_bits(fake_quant(Layout.INDEX_K, x), y)


@pytest.mark.parametrize("layout", [Layout.V41, Layout.INDEX_K])
def test_largest_finite_values_stay_finite(layout):
    x = torch.tensor([1.7e38, -1.6e38, 1e38] + [1.0] * 61)  # amax below 2^127: no overflow
    y = unpack(layout, pack(layout, x))
    assert torch.isfinite(y).all()
    rel = ((y[:3] - x[:3]) / x[:3]).abs().max().item()
    assert rel < 0.5  # within one e2m1 step at the top of the scale
    # documented corner: with amax >= 2^127 rounding up to the next grid value overflows fp32
    y = unpack(layout, pack(layout, torch.tensor([-3.4e38] + [0.0] * 63)))
    assert y[0].item() == -INF


def test_tiny_tiles():
    tiny = torch.full((32,), 1e-6)
    # UE8M0 layouts floor amax / fmax at 1e-4 (scale 2^-13): V41 keeps 1e-6 as an e4m3
    # subnormal (1e-6 / 2^-13 = 0.0082 = 4.19 * 2^-9 -> 4 * 2^-9)
    assert unpack_v41(pack_v41(tiny)).unique().tolist() == [4 * 2.0**-22]
    # index K (scale 2^-13): 1e-6 / 2^-13 = 0.0082 -> flushed to zero
    assert not unpack_index_k(pack_index_k(tiny)).any()
    # V41_FP4 floors the scale at 2^-9 (e4m3 byte 0x01): 1e-3 / 2^-9 = 0.512 -> 0.5
    rec = pack_v41_fp4(torch.full((32,), 1e-3))
    assert rec[16:].tolist() == [0x01, 0x01]
    assert unpack_v41_fp4(rec).unique().tolist() == [2.0**-10]


def test_fp4_scale_saturates_at_448():
    x = padded([6000.0, 100.0], 32)  # 6000 / 6 = 1000 -> clamp 448 (0x7E); 6000/448 -> 6
    rec = pack_v41_fp4(x)
    assert rec[16:].tolist() == [0x7E, 0x01]
    assert unpack_v41_fp4(rec)[:2].tolist() == [6 * 448.0, 0.0]  # 100 / 448 = 0.22 -> 0
    # V41_FP4 saturates at 6 * 448 = 2688, however large the finite input
    y = unpack_v41_fp4(pack_v41_fp4(padded([3e38, -1e10, 1.0], 32)))
    assert y[:3].tolist() == [2688.0, -2688.0, 0.0]
