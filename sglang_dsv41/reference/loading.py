"""Strict checkpoint loading for the dense format: every expected tensor present, nothing extra,
shapes equal; errors name the tensor. Tensors outside the text model (the DSpark head's `mtp.*`,
vision) are skipped, as in the released format."""

import glob
import os

import torch

from sglang_dsv41.weights.release_manifest import is_skipped


class CheckpointError(ValueError):
    pass


def read_safetensors(path: str) -> dict:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def load_state(path: str, expected: dict, dtype) -> dict:
    """expected: name -> tensor (meta ok) from the model; returns name -> tensor in `dtype`
    (fp32 kept for fp32 parameters such as attn_sink and the router bias)."""
    got = {k: v for k, v in read_safetensors(path).items() if not is_skipped(k)}
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensors: {missing[:8]}"
            + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        )
    if unexpected:
        raise CheckpointError(
            f"{path}: unexpected tensors: {unexpected[:8]}"
            + (f" (+{len(unexpected) - 8} more)" if len(unexpected) > 8 else "")
        )
    out = {}
    for name, ref in expected.items():
        t = got[name]
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{name}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        keep32 = ref.dtype == torch.float32 and name.endswith(("attn_sink", "gate.bias"))
        out[name] = t.to(torch.float32 if keep32 else dtype)
    return out
