"""RMSNorm with fp32 statistics (float64 in a float64 model: layers/dtypes.py)."""

import torch
from torch import nn

from sglang_dsv41.layers.dtypes import upcast


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., C] any float dtype, weight [C] -> [..., C] in x's dtype; statistics in fp32."""
    xf = upcast(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * upcast(weight)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
