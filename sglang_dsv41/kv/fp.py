"""Scalar number formats of the KV records: e4m3, e2m1 and UE8M0, bit-exact.

Every function here is elementwise, vectorized torch, and defined so that a GPU kernel can
reproduce its bytes exactly (see docs/kv_records.md). Rules shared by all encoders:

- Inputs are fp32 (callers cast bf16/fp16 first; that cast is exact).
- Rounding is round-to-nearest-even (RNE) on the target grid; finite values and +-inf beyond the
  largest magnitude saturate to it (e4m3: 448, e2m1: 6).
- The sign bit of the code is the IEEE sign bit of the input, so -0.0 and negative values that
  round to zero encode as negative zero (e4m3 0x80, e2m1 0b1000) and decode to -0.0 (the index-K
  record drops that sign, see records.py).
- NaN encodes to one fixed code: e4m3 0x7F, e2m1 0b0000 (e2m1 has no NaN; a NaN-carrying tile is
  marked by its scale instead, see records.py).

UE8M0 bytes encode 2^(byte - 127); byte 0xFF is NaN (OCP MX convention). ``ue8m0_ceil`` is the
one rounding rule (2^ceil(log2 y) on the IEEE bits); the KV records floor y = amax / fmax at
``SCALE_FLOOR`` (SGLang's V4.1 writers), the weight encoders floor amax itself (``ue8m0_scale``).
"""

from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# Floor on a weight block's amax before its UE8M0 scale is derived, as in DeepSeek's act_quant
# (weights/quant.py). An all-zero block then gets 2^-22 (fmax 448) or 2^-15 (fmax 6).
AMAX_FLOOR = 1e-4
# Floor on amax / fmax in the KV records' UE8M0 scales (V41, INDEX_K), as SGLang's V4.1 writers
# and test oracles apply it: every scale is at least 2^-13 (byte 114).
SCALE_FLOOR = 1e-4
UE8M0_NAN = 0xFF
E4M3_NAN = 0x7F

# e2m1 magnitudes by code bits 0-2 (OCP MX FP4): 0b0001 = 0.5, 0b0111 = 6; bit 3 is the sign.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_VALUES = torch.tensor(list(E2M1_GRID) + [-v for v in E2M1_GRID], dtype=torch.float32)


def _ue8m0_bits(byte: Tensor) -> Tensor:
    """The UE8M0 rule on bits: 2^(byte - 127) as fp32; 0 -> 2^-127 (subnormal), 0xFF -> NaN."""
    b = byte.to(torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)  # 2^-127 is subnormal
    scale = bits.view(torch.float32)
    return torch.where(b == UE8M0_NAN, torch.full_like(scale, float("nan")), scale)


# Byte -> value tables, built once from the rules above: a decode is then one gather.
_UE8M0_VALUES = _ue8m0_bits(torch.arange(256, dtype=torch.int32))  # [256]
_CODES = torch.arange(256, dtype=torch.int64)
_E2M1_PAIRS = torch.stack((_E2M1_VALUES[_CODES & 0xF], _E2M1_VALUES[_CODES >> 4]), -1)  # [256, 2]
_TABLES_ON: dict = {}


_HOST_TABLES = {"e2m1": _E2M1_VALUES, "ue8m0": _UE8M0_VALUES, "e2m1_pairs": _E2M1_PAIRS}


def _device_key(device: torch.device) -> torch.device:
    """cuda and cuda:<current> are one device for the tables."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _table(name: str, host: Tensor, device: torch.device) -> Tensor:
    """A decode table on `device`, copied there once. A copy from host memory cannot happen
    inside a CUDA graph capture: whoever captures calls `warm_tables` first."""
    key = (name, _device_key(device))
    table = _TABLES_ON.get(key)
    if table is None:
        table = _TABLES_ON[key] = host.to(key[1])
    return table


def warm_tables(device: torch.device) -> None:
    """Put every decode table on `device` now (before a CUDA graph capture)."""
    for name, host in _HOST_TABLES.items():
        _table(name, host, device)


def _e2m1_values(device: torch.device) -> torch.Tensor:
    return _table("e2m1", _E2M1_VALUES, device)


def ue8m0_decode(byte: Tensor) -> Tensor:
    """UE8M0 byte -> fp32 scale 2^(byte - 127); 0 -> 2^-127 (subnormal), 0xFF -> NaN.

    byte: uint8 [...]. Returns fp32 [...], exact (a gather from the table `_ue8m0_bits` built).
    """
    return _table("ue8m0", _UE8M0_VALUES, byte.device)[byte.to(torch.long)]


def ue8m0_ceil(y: Tensor, lo: int = 0, hi: int = UE8M0_NAN) -> tuple[Tensor, Tensor]:
    """Power-of-two scale at or above y: byte = clamp(127 + ceil(log2 y), lo, hi).

    y: fp32 [...] positive normal floats, or NaN / +inf. Returns (scale fp32 [...], byte uint8
    [...]) with scale == ue8m0_decode(byte). Exact, no log2 call: byte = biased_exponent(y) +
    (mantissa_bits(y) != 0), clamped; a NaN or +inf y gives 255 (256 for NaN) before the clamp,
    so with the default hi it is the NaN byte 0xFF.
    """
    bits = y.to(torch.float32).view(torch.int32)
    exp_field = (bits >> 23) & 0xFF
    round_up = ((bits & 0x7FFFFF) != 0).to(torch.int32)
    byte = (exp_field + round_up).clamp(lo, hi).to(torch.uint8)
    return ue8m0_decode(byte), byte


def ue8m0_scale(amax: Tensor, fmax: float) -> tuple[Tensor, Tensor]:
    """Weight-block scale covering ``amax``: 2^ceil(log2(max(amax, AMAX_FLOOR) / fmax)).

    amax: fp32 [...] (non-negative, e.g. ``x.abs().amax(-1)``; it must propagate NaN).
    fmax: largest magnitude of the element format (E4M3_MAX or E2M1_MAX).
    Returns (scale fp32 [...], byte uint8 [...]) with scale == ue8m0_decode(byte).
    y = max(amax, AMAX_FLOOR) / fmax is an fp32 division, then ``ue8m0_ceil(y)``; a NaN or +inf
    amax gives byte 0xFF (NaN scale): the whole block decodes to NaN. The KV records use
    SCALE_FLOOR on amax / fmax instead (records.py).
    """
    a = amax.to(torch.float32).clamp(min=AMAX_FLOOR)  # torch.clamp keeps NaN (tested)
    return ue8m0_ceil(a / fmax)


def e4m3_encode(x: Tensor) -> Tensor:
    """fp32 [...] -> uint8 [...] bit patterns of float8_e4m3fn (RNE, saturating at +-448).

    Exact formula: clamp(x, -448, 448) cast to torch.float8_e4m3fn (RNE, subnormals kept);
    NaN -> 0x7F (sign dropped). Tests check it against a brute-force search of all 256 codes.
    """
    x = x.to(torch.float32)
    # Out-of-range casts differ across torch versions and devices (NaN or saturation): clamp first.
    codes = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(codes, E4M3_NAN), codes)


def e4m3_decode(codes: Tensor) -> Tensor:
    """uint8 [...] float8_e4m3fn bit patterns -> fp32 [...] (exact; 0x7F/0xFF -> NaN)."""
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e2m1_encode(x: Tensor) -> Tensor:
    """fp32 [...] -> uint8 codes 0..15 [...]: bit 3 = sign, bits 0-2 index E2M1_GRID.

    RNE on the grid, saturating at 6; the magnitude index is a sum of comparisons against the
    midpoints, strict (>) where the tie goes down to an even index, >= where it goes up:
        m = (a > 0.25) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5)
    with a = |x|. So 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    NaN -> code 0 (all comparisons are false; the sign is dropped); +-inf -> +-6.
    """
    x = x.to(torch.float32)
    a = x.abs()
    mag = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    )
    sign = torch.signbit(x) & ~torch.isnan(x)
    return mag | (sign.to(torch.uint8) << 3)


def e2m1_decode(codes: Tensor) -> Tensor:
    """uint8 codes [...] (0..15) -> fp32 [...]; code 8 is -0.0."""
    return _e2m1_values(codes.device)[codes.to(torch.long)]


def pack_nibbles(codes: Tensor) -> Tensor:
    """uint8 [..., n] (values 0..15, n even) -> uint8 [..., n // 2].

    Byte i holds codes[2i] in its low nibble and codes[2i + 1] in its high nibble.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dim, got {codes.shape[-1]}")
    c = codes.to(torch.uint8).unflatten(-1, (-1, 2))  # [..., n // 2, 2]
    return (c[..., 0] & 0xF) | ((c[..., 1] & 0xF) << 4)


def e2m1_decode_packed(packed: Tensor) -> Tensor:
    """uint8 [..., n // 2] packed codes (pack_nibbles) -> fp32 [..., n]:
    e2m1_decode(unpack_nibbles(packed)), as one gather from a byte -> value-pair table."""
    pairs = _table("e2m1_pairs", _E2M1_PAIRS, packed.device)[packed.to(torch.long)]
    return pairs.flatten(-2)  # [..., n // 2, 2] -> [..., n]


def unpack_nibbles(packed: Tensor) -> Tensor:
    """uint8 [..., n // 2] -> uint8 [..., n]; inverse of pack_nibbles (even index = low nibble)."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)  # [..., n]
