"""e4m3 / e2m1 / UE8M0 scalar codecs against brute-force searches and hand-written codes."""

import math

import pytest
import torch

from sglang_dsv41.kv.fp import (
    AMAX_FLOOR,
    E2M1_GRID,
    E2M1_MAX,
    E4M3_MAX,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    pack_nibbles,
    ue8m0_ceil,
    ue8m0_decode,
    ue8m0_scale,
    unpack_nibbles,
)

NAN = float("nan")
INF = float("inf")


def e4m3_value(code: int) -> float:
    """float8_e4m3fn by its definition (no torch): bias 7, subnormals, 0x7F / 0xFF NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return NAN
    if exp == 0:
        return sign * man * 2.0**-9
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def nearest_code(value: float, magnitudes: list[float]) -> int:
    """Index of the nearest magnitude to |value|, ties to the even index, saturating at the top."""
    a = abs(value)
    if a >= magnitudes[-1]:  # also keeps huge values off float ties in the distances below
        return len(magnitudes) - 1
    return min(range(len(magnitudes)), key=lambda i: (abs(magnitudes[i] - a), i % 2))


def fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def probe_values(magnitudes: list[float], seed: int) -> torch.Tensor:
    """Grid points, exact midpoints, their fp32 neighbours, random values and out-of-range ones."""
    mids = [(a + b) / 2 for a, b in zip(magnitudes, magnitudes[1:], strict=False)]
    base = fp32(magnitudes + mids)
    up = torch.nextafter(base, fp32(INF))
    down = torch.nextafter(base, fp32(0.0))
    g = torch.Generator().manual_seed(seed)
    top = magnitudes[-1]
    rand = torch.rand(2000, generator=g) * top * 1.2
    logs = torch.exp2(torch.rand(500, generator=g) * 40 - 30)
    big = fp32([top * 1.01, top * 1.5, 1e30, 3e38])
    pos = torch.cat((base, up, down, rand, logs, big))
    return torch.cat((pos, -pos))


# ---------------------------------------------------------------- e4m3


def test_e4m3_decode_all_codes():
    codes = torch.arange(256, dtype=torch.uint8)
    got = e4m3_decode(codes)
    want = fp32([e4m3_value(c) for c in range(256)])
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32))  # -0.0 included
    assert e4m3_decode(torch.tensor([0x7E], dtype=torch.uint8)).item() == E4M3_MAX


def test_e4m3_encode_matches_brute_force_rne():
    magnitudes = [e4m3_value(c) for c in range(0x7F)]  # codes 0x00..0x7E, increasing
    x = probe_values(magnitudes, seed=0)
    got = e4m3_encode(x)
    want = [
        nearest_code(v, magnitudes) | (0x80 if math.copysign(1.0, v) < 0 else 0) for v in x.tolist()
    ]
    assert got.tolist() == want


def test_e4m3_encode_special_values():
    x = fp32([0.0, -0.0, INF, -INF, NAN, -NAN, 2.0**-10, 3 * 2.0**-11, 464.0, 1e-30])
    # 2^-10 is the tie between 0 and the smallest subnormal: to even (0); 3*2^-11 rounds up to 2^-9
    assert e4m3_encode(x).tolist() == [0x00, 0x80, 0x7E, 0xFE, 0x7F, 0x7F, 0x00, 0x01, 0x7E, 0x00]


# ---------------------------------------------------------------- e2m1


def test_e2m1_decode_table():
    got = e2m1_decode(torch.arange(16, dtype=torch.uint8))
    want = fp32(list(E2M1_GRID) + [-v for v in E2M1_GRID])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert e2m1_decode(torch.tensor([0b0001, 0b0111, 0b1000], dtype=torch.uint8)).tolist() == [
        0.5,
        6.0,
        -0.0,
    ]
    assert torch.signbit(e2m1_decode(torch.tensor([8], dtype=torch.uint8))).item()


def test_e2m1_rne_ties_from_the_brief():
    x = fp32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(x)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_decode(e2m1_encode(-x)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_e2m1_encode_matches_brute_force_rne():
    magnitudes = list(E2M1_GRID)
    x = probe_values(magnitudes, seed=1)
    got = e2m1_encode(x)
    want = [
        nearest_code(v, magnitudes) | (8 if math.copysign(1.0, v) < 0 else 0) for v in x.tolist()
    ]
    assert got.tolist() == want
    assert got.dtype == torch.uint8


def test_e2m1_encode_special_values():
    x = fp32([0.0, -0.0, -0.1, INF, -INF, 7.0, NAN, -NAN])
    # negative values that round to zero keep their sign; NaN -> 0 whatever its sign bit
    assert e2m1_encode(x).tolist() == [0, 8, 8, 7, 15, 7, 0, 0]


# ---------------------------------------------------------------- UE8M0


def ceil_log2(y: float) -> int:
    m, e = math.frexp(y)  # y = m 2^e, 0.5 <= m < 1
    return e - 1 if m == 0.5 else e


def test_ue8m0_decode_all_bytes():
    got = ue8m0_decode(torch.arange(256, dtype=torch.uint8))
    assert math.isnan(got[255].item())
    assert got[:255].tolist() == [math.ldexp(1.0, b - 127) for b in range(255)]  # 0 -> 2^-127


@pytest.mark.parametrize("fmax", [E4M3_MAX, E2M1_MAX])
def test_ue8m0_scale_matches_ceil_log2(fmax):
    g = torch.Generator().manual_seed(2)
    amax = torch.exp2(torch.rand(3000, generator=g) * 120 - 40)  # 2^-40 .. 2^80
    powers = fmax * torch.exp2(torch.arange(-20, 60, dtype=torch.float32))
    amax = torch.cat((amax, powers, torch.nextafter(powers, fp32(INF)), fp32([0.0, 3e38])))
    scale, byte = ue8m0_scale(amax, fmax)
    for a, s, b in zip(amax.tolist(), scale.tolist(), byte.tolist(), strict=False):
        y = float(fp32(max(a, AMAX_FLOOR)) / fmax)  # the fp32 division of the docstring
        k = ceil_log2(y)
        assert b == k + 127 and s == math.ldexp(1.0, k), (a, s, b)
        assert s * fmax >= max(a, AMAX_FLOOR) * (1 - 2**-23)  # covers amax up to fp32 rounding


def test_ue8m0_scale_edges():
    amax = fp32([448.0, 448.0 * 2.0**-10, 449.0, 0.0, 1e-30, INF, NAN])
    scale, byte = ue8m0_scale(amax, E4M3_MAX)
    assert byte.tolist() == [127, 117, 128, 105, 105, 255, 255]  # zero/tiny: floor 1e-4 -> 2^-22
    assert scale[:5].tolist() == [1.0, 2.0**-10, 2.0, 2.0**-22, 2.0**-22]
    assert torch.isnan(scale[5:]).all()
    _, byte6 = ue8m0_scale(fp32([0.0, 3.0, 3.0000002, 6.0]), E2M1_MAX)
    assert byte6.tolist() == [112, 126, 127, 127]  # floor for fmax 6 -> 2^-15


def test_ue8m0_ceil_rounding_and_clamps():
    y = fp32([1.0, 1.0000001, 0.75, 2.0**-13, 1e-4, 2.0**126 * 1.5, INF, NAN])
    _, byte = ue8m0_ceil(y)
    # exact powers stay, anything above rounds up; inf -> 255, NaN -> 256 -> 255 (the NaN byte)
    assert byte.tolist() == [127, 128, 127, 114, 114, 254, 255, 255]
    scale, byte = ue8m0_ceil(y, lo=1, hi=254)  # the index-K clamp
    assert byte.tolist() == [127, 128, 127, 114, 114, 254, 254, 254]
    assert scale[-1].item() == 2.0**127
    assert ue8m0_ceil(fp32([2.0**-140]), lo=1)[1].tolist() == [1]  # subnormal y: clamped up


# ---------------------------------------------------------------- nibbles


def test_nibble_order_even_index_low():
    codes = torch.tensor([0x1, 0x2, 0x3, 0x4, 0xF, 0x0, 0x0, 0x8], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [0x21, 0x43, 0x0F, 0x80]
    assert unpack_nibbles(torch.tensor([0x21, 0x43, 0x0F, 0x80], dtype=torch.uint8)).tolist() == (
        codes.tolist()
    )


def test_nibbles_round_trip_random():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (5, 3, 64), generator=g, dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (5, 3, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_nibbles(packed), codes)
    assert torch.equal(packed & 0xF, codes[..., 0::2])
    with pytest.raises(ValueError):
        pack_nibbles(codes[..., :3])
