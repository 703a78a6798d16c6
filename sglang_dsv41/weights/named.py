"""Load checkpoint tensors into the serving model by checkpoint name, strictly.

Every parameter must arrive exactly once with its shape; names the model does not have are an
error. The message names the tensors (first few of each kind) and the checkpoint directory.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightLoadError(ValueError):
    pass


def load_named(model: nn.Module, weights, where: str = "checkpoint") -> set:
    """weights: iterable of (name, tensor). Copies into model parameters/buffers of the same
    name (dtype converted to the parameter's); raises WeightLoadError on missing, unexpected or
    mis-shaped tensors. Returns the set of loaded names."""
    params = dict(model.named_parameters())
    loaded, unexpected, bad_shape = set(), [], []
    for name, t in weights:
        p = params.get(name)
        if p is None:
            unexpected.append(name)
            continue
        if tuple(t.shape) != tuple(p.shape):
            bad_shape.append(f"{name}: shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            continue
        with torch.no_grad():
            p.data.copy_(t.to(p.dtype))
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    problems = []
    for label, items in (
        ("mis-shaped", bad_shape),
        ("missing", missing),
        ("unexpected", sorted(unexpected)),
    ):
        if items:
            more = f" (+{len(items) - 8} more)" if len(items) > 8 else ""
            problems.append(f"{label} tensors: {items[:8]}{more}")
    if problems:
        raise WeightLoadError(f"{where}: " + "; ".join(problems))
    return loaded
