"""Activation fake-quantization of SGLang's FP8 linears for the released weight format.

SGLang's `Fp8LinearMethod` serves the release's 32x32 UE8M0-block FP8 weights with quantized
activations on SM90 and SM100 alike (read from sglang 0.5.23):
    SM90   DeepGEMM / Triton block-FP8 GEMM (or its BF16 expansion for >= 64 rows, which keeps
           the activation quantization): `sglang_per_token_group_quant_fp8(x, 32,
           scale_ue8m0=True)`;
    SM100  the same weights viewed as MXFP8 (`flashinfer_mxfp8_quantize`, 1 x 32 groups, E8M0).
Both quantize each token's activations in groups of 32 consecutive input features:
    amax = max(max |x_g|, 1e-10);  e = ceil(log2(amax / 448));  x_g ~ e4m3(x_g * 2^-e) * 2^e
(e4m3 round-to-nearest-even). The two differ only for an all-zero group (its values are zero
either way). `fake_quant_act_fp8` returns the dequantized value, so a dense linear of it equals
the quantized GEMM up to accumulation order.
"""

import torch

from sglang_dsv41.kv.fp import E4M3_MAX, e4m3_decode, e4m3_encode

ACT_GROUP = 32
ACT_AMAX_FLOOR = 1e-10


def act_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """amax fp32 [...] (> 0) -> int32 [...] e = ceil(log2(amax / 448)), exact from the bits."""
    y = (amax.float() / E4M3_MAX).contiguous()
    bits = y.view(torch.int32)
    return ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def fake_quant_act_fp8(x: torch.Tensor, group: int = ACT_GROUP) -> torch.Tensor:
    """x [..., K] (K % group == 0) -> same shape and dtype: per token and group of `group`
    features, e4m3 with a power-of-two scale (module docstring)."""
    K = x.shape[-1]
    if K % group:
        raise ValueError(f"fake_quant_act_fp8: last dim {K} is not a multiple of {group}")
    xg = x.float().reshape(*x.shape[:-1], K // group, group)  # [..., G, group]
    amax = xg.abs().amax(-1, keepdim=True).clamp(min=ACT_AMAX_FLOOR)  # [..., G, 1]
    scale = torch.ldexp(torch.ones_like(amax), act_scale_exponent(amax))
    q = e4m3_decode(e4m3_encode(xg / scale)) * scale
    return q.reshape(x.shape).to(x.dtype)
