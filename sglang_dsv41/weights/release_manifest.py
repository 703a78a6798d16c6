"""The released checkpoint's tensor manifest: every text tensor's name, stored dtype and shape.

Built from the dense manifest (`sglang_dsv41.manifest.tensor_manifest`, one name per logical
tensor) by the released quantization rules of docs/design.md 2.7:

    FP8 e4m3 + `.scale` UE8M0 per 32x32 block   attn.wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b,
                                                  shared experts (and a dense FFN), engram.wkv
    int8 packed e2m1 + `.scale` UE8M0 [N, K/32]   routed experts ffn.experts.{e}.w1/w2/w3
    FP8 e4m3 rows + `.scale` UE8M0 [R, D/32]      engram.embed
    FP32                                          attn_sink, ffn.gate.bias, ffn.gate.bias_vl,
                                                  hc_{attn,ffn}_{fn,base,scale}
    BF16                                          everything else (norms, gate.weight,
                                                  compressor, indexer.wk/k_norm/weights_proj,
                                                  engram.q_weight/k_weight, embed, head)

`ffn.gate.bias_vl` (the routing bias for image tokens) exists only in the release format; a
text-only model drops it. Tensors under SKIPPED_PREFIXES (vision tower, aligner, image
embeddings, the 3 MTP stages) are not part of the text model and are skipped at load.
"""

from __future__ import annotations

import re

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.weights.quant import fp4_packed_shape, fp8_block_scale_shape, group_scale_shape

SKIPPED_PREFIXES = ("vision.", "aligner.", "image_", "mtp.")
FP8, FP4, FP8_ROWS, BF16, FP32 = "fp8", "fp4", "fp8_rows", "bf16", "fp32"
E4M3, UE8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu

_FP8_BLOCK = re.compile(
    r"\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.(shared_experts\.)?w[123]"
    r"|engram\.wkv)\.weight$"
)
_FP4 = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")
_FP32 = re.compile(r"(\.attn\.attn_sink|\.ffn\.gate\.bias(_vl)?|\.hc_(attn|ffn)_(fn|base|scale))$")


def is_skipped(name: str) -> bool:
    """True for released tensors outside the text model (vision, aligner, image_*, mtp)."""
    return name.startswith(SKIPPED_PREFIXES)


def release_kind(name: str) -> str:
    """Storage kind of a dense tensor name: FP8, FP4, FP8_ROWS, BF16 or FP32."""
    if _FP4.search(name):
        return FP4
    if _FP8_BLOCK.search(name):
        return FP8
    if name.endswith(".engram.embed.weight"):
        return FP8_ROWS
    if _FP32.search(name):
        return FP32
    return BF16


def scale_name(weight_name: str) -> str:
    """`X.weight` -> `X.scale`."""
    return weight_name[: -len(".weight")] + ".scale"


def release_entries(name: str, shape: tuple, kind: str | None = None) -> dict:
    """Stored tensors for one dense tensor: {name: (shape, dtype)} (1 or 2 entries); `kind`
    defaults to release_kind(name)."""
    kind = kind or release_kind(name)
    if kind == FP8:
        return {name: (shape, E4M3), scale_name(name): (fp8_block_scale_shape(shape), UE8M0)}
    if kind == FP4:
        return {
            name: (fp4_packed_shape(shape), torch.int8),
            scale_name(name): (group_scale_shape(shape), UE8M0),
        }
    if kind == FP8_ROWS:
        return {name: (shape, E4M3), scale_name(name): (group_scale_shape(shape), UE8M0)}
    return {name: (shape, torch.float32 if kind == FP32 else torch.bfloat16)}


def release_manifest(cfg: DeepseekV41Config) -> dict:
    """name -> (shape tuple, torch dtype) of every text tensor the release stores for `cfg`.

    At V4.1-Flash widths this is the full-size manifest; at reduced widths (flash-mini) it
    has the same names, kinds and scale layouts. No tensor is allocated.
    """
    from sglang_dsv41.manifest import tensor_manifest

    out = {}
    for name, (shape, _) in tensor_manifest(cfg).items():
        shape = tuple(shape)
        out.update(release_entries(name, shape))
        if name.endswith(".ffn.gate.bias"):
            out[name + "_vl"] = (tuple(shape), torch.float32)
    return out


def manifest_bytes(manifest: dict) -> int:
    """Total bytes of a manifest (name -> (shape, dtype))."""
    total = 0
    for shape, dtype in manifest.values():
        n = 1
        for s in shape:
            n *= int(s)
        total += n * torch.empty((), dtype=dtype).element_size()
    return total
