"""Reading a released-format checkpoint: headers, validation, dequantization to dense tensors.

`scan_checkpoint(dir)` reads only the safetensors headers (no tensor data), so the full-size
manifest can be checked against a real 475 GiB checkpoint in seconds. `validate_release`
compares those headers with `release_manifest(cfg)` and raises one `WeightFormatError` naming
every tensor whose name, dtype or shape is wrong. `load_release_state(dir, cfg)` returns dense
tensors under the dense names (`X.weight` dequantized with its `X.scale`), for the reference
model and the CPU serving path; vision/aligner/image/MTP tensors are skipped with one log line
and `ffn.gate.bias_vl` (image-token routing) is dropped.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import struct

import torch

from sglang_dsv41.weights.quant import dequant_fp4_packed, dequant_fp8_block, dequant_fp8_rows
from sglang_dsv41.weights.release_manifest import (
    FP4,
    FP8,
    FP8_ROWS,
    FP32,
    is_skipped,
    release_kind,
    release_manifest,
    scale_name,
)

logger = logging.getLogger(__name__)

SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


class WeightFormatError(ValueError):
    """A checkpoint whose tensors do not match the expected manifest; names every offender."""


def read_header(path: str) -> dict:
    """name -> (shape tuple, torch dtype) from one .safetensors file's header (no data read)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise WeightFormatError(f"{name}: unsupported safetensors dtype {info['dtype']}")
        out[name] = (tuple(info["shape"]), dtype)
    return out


def checkpoint_files(path: str) -> list:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise WeightFormatError(f"{path}: no *.safetensors files")
    return files


def scan_checkpoint(path: str) -> tuple[dict, dict]:
    """(name -> (shape, dtype), name -> file) over every shard of a checkpoint directory."""
    found, where = {}, {}
    for f in checkpoint_files(path):
        for name, entry in read_header(f).items():
            if name in found:
                raise WeightFormatError(f"{name}: present in {where[name]} and {f}")
            found[name], where[name] = entry, f
    return found, where


def manifest_problems(found: dict, expected: dict) -> list:
    """Messages for every missing, unexpected, wrongly typed or wrongly shaped tensor."""
    problems = []
    for name in sorted(set(expected) - set(found)):
        shape, dtype = expected[name]
        problems.append(f"{name}: missing (expected {dtype} {list(shape)})")
    for name in sorted(set(found) - set(expected)):
        if not is_skipped(name):
            problems.append(f"{name}: unexpected tensor {found[name][1]} {list(found[name][0])}")
    for name in sorted(set(found) & set(expected)):
        (fs, fd), (es, ed) = found[name], expected[name]
        if fd != ed:
            problems.append(f"{name}: dtype {fd}, expected {ed}")
        if tuple(fs) != tuple(es):
            problems.append(f"{name}: shape {list(fs)}, expected {list(es)}")
    return problems


def validate_release(found: dict, cfg, source: str = "checkpoint", limit: int = 50) -> int:
    """Raise WeightFormatError naming each bad tensor (the first `limit` of them); return the
    number of skipped tensors."""
    problems = manifest_problems(found, release_manifest(cfg))
    if problems:
        shown = problems[:limit] + (
            [f"... and {len(problems) - limit} more"] if len(problems) > limit else []
        )
        raise WeightFormatError(
            f"{source}: {len(problems)} tensor problem(s):\n  " + "\n  ".join(shown)
        )
    return sum(1 for n in found if is_skipped(n))


def is_release_format(cfg) -> bool:
    """True when the config declares the released FP8/FP4 quantization."""
    q = cfg.quantization_config or {}
    return q.get("quant_method") == "fp8"


def dense_from_release(name: str, get) -> torch.Tensor:
    """The dense fp32 tensor for dense `name`; `get(stored_name)` returns a stored tensor."""
    kind = release_kind(name)
    if kind == FP8:
        return dequant_fp8_block(get(name), get(scale_name(name)))
    if kind == FP4:
        return dequant_fp4_packed(get(name), get(scale_name(name)))
    if kind == FP8_ROWS:
        return dequant_fp8_rows(get(name), get(scale_name(name)))
    return get(name).float()


def dense_weights_from_release(weights, cfg, where: str = "checkpoint"):
    """Stream form of load_release_state for a loader that yields (stored name, tensor) pairs
    (SGLang's `load_weights`): yields (dense name, fp32 tensor) once a weight and its scale
    have both arrived. Validates names, dtypes and shapes against release_manifest(cfg) first
    (raises WeightFormatError naming each bad tensor); skips vision/aligner/image/MTP tensors
    with one log line and drops `ffn.gate.bias_vl`. Holds tensors until the stream ends."""
    stored = {}
    for name, t in weights:
        if name in stored:
            raise WeightFormatError(f"{where}: {name} appears twice")
        stored[name] = t
    skipped = validate_release(
        {n: (tuple(t.shape), t.dtype) for n, t in stored.items()}, cfg, where
    )
    if skipped:
        logger.info(
            "%s: skipped %d tensors outside the text model (vision.*, aligner.*, image_*, mtp.*)",
            where,
            skipped,
        )
    for name in release_manifest(cfg):
        if not name.endswith((".scale", ".gate.bias_vl")):
            yield name, dense_from_release(name, stored.__getitem__)


def shard_reader(where: dict[str, str]):
    """stored name -> tensor, reading from the shard `where[name]` (scan_checkpoint's second
    value); each shard is opened once, on first use."""
    from safetensors import safe_open

    handles = {}

    def get(stored: str) -> torch.Tensor:
        f = where[stored]
        if f not in handles:
            handles[f] = safe_open(f, framework="pt")
        return handles[f].get_tensor(stored)

    return get


def load_release_state(path: str, cfg, dtype=torch.float32) -> dict:
    """Dense name -> tensor (dequantized on CPU, cast to `dtype`; fp32 tensors stay fp32)."""
    found, where = scan_checkpoint(path)
    skipped = validate_release(found, cfg, path)
    if skipped:
        logger.info(
            "%s: skipped %d tensors outside the text model (vision.*, aligner.*, image_*, mtp.*)",
            path,
            skipped,
        )
    get = shard_reader(where)
    out = {}
    for name in release_manifest(cfg):
        if name.endswith((".scale", ".gate.bias_vl")):  # scales ride with their weight
            continue
        t = dense_from_release(name, get)
        out[name] = t.float() if release_kind(name) == FP32 else t.to(dtype)
    return out
