"""FP8 32x32-block, packed-FP4 and FP8-row weight formats against hand-built blocks."""

import pytest
import torch

from sglang_dsv41.weights.quant import (
    dequant_fp4_packed,
    dequant_fp8_block,
    dequant_fp8_rows,
    fp8_block_scale_shape,
    quant_fp4_packed,
    quant_fp8_block,
    quant_fp8_rows,
)


def _e8m0(byte_values):
    return torch.tensor(byte_values, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_fp8_block_hand_built():
    """A [40, 70] weight: 2 x 3 blocks (the last ones partial). e4m3 0x38 = 1.0, 0x40 = 2.0,
    0xC4 = -3.0; scale bytes 127 = 1, 128 = 2, 125 = 1/4, 130 = 8."""
    codes = torch.full((40, 70), 0x38, dtype=torch.uint8)
    codes[0, 0], codes[33, 65], codes[5, 40] = 0x40, 0xC4, 0x00
    scale = _e8m0([[127, 128, 125], [130, 127, 128]])
    w = dequant_fp8_block(codes.view(torch.float8_e4m3fn), scale)
    want = torch.ones(40, 70)
    want[:32, 32:64] = 2.0
    want[:32, 64:] = 0.25
    want[32:, :32] = 8.0
    want[32:, 64:] = 2.0
    want[0, 0] = 2.0
    want[33, 65] = -6.0
    want[5, 40] = 0.0
    assert torch.equal(w, want)


def test_fp8_block_scale_shape_checked():
    with pytest.raises(ValueError, match="scale shape"):
        dequant_fp8_block(torch.zeros(64, 64, dtype=torch.float8_e4m3fn), _e8m0([[127]]))
    assert fp8_block_scale_shape((8192, 4096)) == (256, 128)
    assert fp8_block_scale_shape((33, 1)) == (2, 1)


def test_fp4_packed_hand_built():
    """Byte 0x21: column 0 = code 1 (0.5, low nibble), column 1 = code 2 (1.0); 0xF9: column 0
    = code 9 (-0.5), column 1 = code 15 (-6.0). Scales per row per 32 columns."""
    packed = torch.zeros(2, 32, dtype=torch.uint8)  # logical [2, 64]
    packed[0, 0], packed[0, 16], packed[1, 31] = 0x21, 0xF9, 0x7A
    scale = _e8m0([[127, 129], [126, 127]])  # [1, 4], [1/2, 1]
    w = dequant_fp4_packed(packed.view(torch.int8), scale)
    want = torch.zeros(2, 64)
    want[0, 0], want[0, 1] = 0.5, 1.0
    want[0, 32], want[0, 33] = -0.5 * 4, -6.0 * 4
    want[1, 62], want[1, 63] = -1.0, 6.0  # 0x7A: low nibble 0xA = -1.0, high 0x7 = 6.0
    assert torch.equal(w, want)


def test_fp8_rows_hand_built():
    codes = torch.full((3, 64), 0x38, dtype=torch.uint8)  # 1.0
    scale = _e8m0([[127, 128], [120, 127], [127, 134]])
    w = dequant_fp8_rows(codes.view(torch.float8_e4m3fn), scale)
    want = torch.ones(3, 64)
    want[0, 32:] = 2.0
    want[1, :32] = 2.0**-7
    want[2, 32:] = 128.0
    assert torch.equal(w, want)


@pytest.mark.parametrize("shape", [(64, 96), (40, 70), (5, 33)])
def test_fp8_block_round_trip(shape):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * torch.logspace(-3, 2, shape[1])
    q, s = quant_fp8_block(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert tuple(s.shape) == fp8_block_scale_shape(shape)
    back = dequant_fp8_block(q, s)
    # per block: |err| <= half an e4m3 ulp at the block's scale: 2^-4 relative to 448 * scale
    sc = s.view(torch.uint8).float().sub(127).exp2()
    bound = sc.repeat_interleave(32, 0)[: shape[0]].repeat_interleave(32, 1)[:, : shape[1]]
    assert ((back - w).abs() <= bound * 16 + 1e-30).all()
    assert ((back - w).abs() <= w.abs() * 2**-4 + bound * 2**-9).all()


def test_fp4_round_trip_and_grid():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 64, generator=g)
    q, s = quant_fp4_packed(w)
    assert q.shape == (8, 32) and q.dtype == torch.int8 and s.shape == (8, 2)
    back = dequant_fp4_packed(q, s)
    sc = s.view(torch.uint8).float().sub(127).exp2().repeat_interleave(32, 1)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    mags = (back / sc).abs()
    assert torch.isin(mags, grid).all()  # every value on the e2m1 grid
    assert ((back - w).abs() <= sc * 1.0 + 1e-7).all()  # half the widest grid gap (2)
    assert (
        w.abs().view(8, 2, 32).amax(-1) <= 6 * s.view(torch.uint8).float().sub(127).exp2()
    ).all()


def test_fp8_rows_round_trip():
    w = torch.randn(4, 64) * 3
    q, s = quant_fp8_rows(w)
    back = dequant_fp8_rows(q, s)
    assert ((back - w).abs() <= w.abs() * 2**-4 + 1e-6).all()
