"""The compute dtype of the layer math: fp32, or float64 in a float64 model.

V4.1's layers compute norms, mixing, routing, pooling and attention in fp32 whatever the weights'
dtype. A float64 model (the twin check, tools/twin_check.py) keeps float64 instead, so that no
fp32 rounding outside the cache records separates two implementations; record values are rounded
to fp32 before quantization either way (layers/quant.py).
"""

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x as fp32, or unchanged when it is float64."""
    return x if x.dtype == torch.float64 else x.float()


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32, or float64 for float64 x."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32
