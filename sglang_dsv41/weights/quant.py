"""Weight quantization formats of the released checkpoint (docs/design.md 2.7), bit-exact.

FP8 linears: `X.weight` float8_e4m3fn [N, K] with `X.scale` UE8M0 [ceil(N/32), ceil(K/32)],
    one scale per 32 x 32 block: W[n, k] = e4m3(w[n, k]) * scale[n // 32, k // 32].
FP4 routed experts: `X.weight` int8 [N, K/2], byte j of a row holding e2m1 codes of columns 2j
    (low nibble) and 2j + 1 (high nibble), with `X.scale` UE8M0 [N, K/32], one per row per 32
    columns: W[n, k] = e2m1(code[n, k]) * scale[n, k // 32].
FP8 rows (Engram table): `embed.weight` float8_e4m3fn [R, D] with `embed.scale` UE8M0 [R, D/32].

UE8M0 scales are stored as torch.float8_e8m0fnu (safetensors F8_E8M0); uint8 bytes are accepted
too. Byte b decodes to 2^(b - 127). The encoders (used to write synthetic checkpoints) pick
scale = 2^ceil(log2(amax / fmax)), amax floored as in kv/fp.py, and round to nearest even.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kv.fp import (
    E2M1_MAX,
    E4M3_MAX,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    pack_nibbles,
    ue8m0_decode,
    ue8m0_scale,
    unpack_nibbles,
)

BLOCK = 32  # FP8 block edge and FP4/row-FP8 group width


def _scale_bytes(scale: Tensor) -> Tensor:
    if scale.dtype in (torch.float8_e8m0fnu, torch.int8):
        return scale.view(torch.uint8)
    if scale.dtype != torch.uint8:
        raise TypeError(f"UE8M0 scales must be float8_e8m0fnu or uint8, got {scale.dtype}")
    return scale


def _ue8m0(byte: Tensor) -> Tensor:
    return byte.view(torch.float8_e8m0fnu)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fp8_block_scale_shape(shape) -> tuple:
    """Scale shape of an FP8 32x32-block weight of `shape` [N, K]."""
    return (_cdiv(shape[0], BLOCK), _cdiv(shape[1], BLOCK))


def fp4_packed_shape(shape) -> tuple:
    """Stored int8 shape of a packed-e2m1 weight of logical `shape` [N, K] (K % 32 == 0)."""
    return (shape[0], shape[1] // 2)


def group_scale_shape(shape) -> tuple:
    """Scale shape for one UE8M0 per row per 32 columns of a logical [N, K] weight."""
    return (shape[0], shape[1] // BLOCK)


def dequant_fp8_block(weight: Tensor, scale: Tensor) -> Tensor:
    """float8_e4m3fn [N, K] + UE8M0 [ceil(N/32), ceil(K/32)] -> fp32 [N, K]."""
    N, K = weight.shape
    if tuple(scale.shape) != fp8_block_scale_shape((N, K)):
        raise ValueError(
            f"FP8 block scale shape {tuple(scale.shape)} != "
            f"{fp8_block_scale_shape((N, K))} for weight {(N, K)}"
        )
    s = ue8m0_decode(_scale_bytes(scale))
    s = s.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)[:, :K]  # [N, K]
    return e4m3_decode(weight.view(torch.uint8)) * s


def quant_fp8_block(w: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 [N, K] -> (float8_e4m3fn [N, K], float8_e8m0fnu [ceil(N/32), ceil(K/32)])."""
    w = w.float()
    N, K = w.shape
    nb, kb = fp8_block_scale_shape((N, K))
    padded = torch.zeros(nb * BLOCK, kb * BLOCK, device=w.device)
    padded[:N, :K] = w
    amax = padded.view(nb, BLOCK, kb, BLOCK).abs().amax(dim=(1, 3))  # [nb, kb]
    scale, byte = ue8m0_scale(amax, E4M3_MAX)
    s = scale.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)[:, :K]
    codes = e4m3_encode(w / s)
    return codes.view(torch.float8_e4m3fn), _ue8m0(byte)


def dequant_fp8_rows(weight: Tensor, scale: Tensor) -> Tensor:
    """float8_e4m3fn [R, D] + UE8M0 [R, D/32] -> fp32 [R, D] (the Engram table format)."""
    R, D = weight.shape
    if tuple(scale.shape) != group_scale_shape((R, D)):
        raise ValueError(f"FP8 row scale shape {tuple(scale.shape)} != {group_scale_shape((R, D))}")
    s = ue8m0_decode(_scale_bytes(scale)).repeat_interleave(BLOCK, 1)  # [R, D]
    return e4m3_decode(weight.view(torch.uint8)) * s


def quant_fp8_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 [R, D] (D % 32 == 0) -> (float8_e4m3fn [R, D], float8_e8m0fnu [R, D/32])."""
    w = w.float()
    R, D = w.shape
    amax = w.view(R, D // BLOCK, BLOCK).abs().amax(-1)
    scale, byte = ue8m0_scale(amax, E4M3_MAX)
    codes = e4m3_encode(w / scale.repeat_interleave(BLOCK, 1))
    return codes.view(torch.float8_e4m3fn), _ue8m0(byte)


def dequant_fp4_packed(weight: Tensor, scale: Tensor) -> Tensor:
    """int8 [N, K/2] (packed e2m1, even column low nibble) + UE8M0 [N, K/32] -> fp32 [N, K]."""
    N, half = weight.shape
    K = 2 * half
    if tuple(scale.shape) != group_scale_shape((N, K)):
        raise ValueError(f"FP4 scale shape {tuple(scale.shape)} != {group_scale_shape((N, K))}")
    values = e2m1_decode(unpack_nibbles(weight.view(torch.uint8)))  # [N, K]
    return values * ue8m0_decode(_scale_bytes(scale)).repeat_interleave(BLOCK, 1)


def quant_fp4_packed(w: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 [N, K] (K % 32 == 0) -> (int8 [N, K/2], float8_e8m0fnu [N, K/32])."""
    w = w.float()
    N, K = w.shape
    if K % BLOCK:
        raise ValueError(f"FP4 weights need K % {BLOCK} == 0, got {K}")
    amax = w.view(N, K // BLOCK, BLOCK).abs().amax(-1)
    scale, byte = ue8m0_scale(amax, E2M1_MAX)
    codes = e2m1_encode(w / scale.repeat_interleave(BLOCK, 1))
    return pack_nibbles(codes).view(torch.int8), _ue8m0(byte)
