"""Row-stable matrix products: a row's result must not depend on how many rows share the call.

CPU GEMM picks different kernels (and so different fp32 reduction orders) for small operands:
on the 2-core machine a product with 1-3, 5-7 or 9-11 rows, or with a single output column,
rounds differently from the same rows inside a larger product. Serving decodes a handful of
rows at a time while the oracle recomputes the whole sequence, and FP4/FP8 quantization or a
near-tie in top-k turns a 1e-7 difference into a different token. Padding both operands to at
least MIN_ROWS rows makes every row take the large-operand kernel on CPU, where the result per
row is independent of the row count (checked in tests/cpu/test_linear.py). Other devices are
left alone: their reduction order is the kernel author's business and the tolerances there are
stated per kernel.
"""

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 16


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    """t [M, K] -> [max(M, MIN_ROWS), K], zero rows appended (t itself when tall enough)."""
    if t.shape[0] >= MIN_ROWS:
        return t
    return torch.constant_pad_nd(t, (0, 0, 0, MIN_ROWS - t.shape[0]))


def stable_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K], w [N, K] -> x w^T [..., N], row-stable on CPU (see module docstring)."""
    flat = x.dim() == 2
    x2 = x if flat else x.reshape(-1, x.shape[-1])
    M, N = x2.shape[0], w.shape[0]
    if x2.device.type == "cpu" and M and N:
        y = F.linear(_pad_rows(x2), _pad_rows(w))
        if M < MIN_ROWS:
            y = y[:M]
        if N < MIN_ROWS:
            y = y[:, :N]
    else:
        y = F.linear(x2, w)
    return y if flat else y.reshape(*x.shape[:-1], N)


class Linear(nn.Linear):
    """nn.Linear without bias whose forward is `stable_linear` (same parameter names)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight)
