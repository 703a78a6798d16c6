"""Seeded standard-normal-like values that are the same bits on every device.

`counter_normal(key, rows, cols, device)` draws element (r, c) of a [rows, cols] table from a
hash of its flat index and a 32-bit key, with integer arithmetic only, then maps it to fp32 with
one correctly rounded multiply. So the CPU and the GPU produce identical tensors for the same key
(torch's own generators differ across devices), any row range can be drawn on its own (a writer
can stream a large table in chunks) and the draw order does not matter.

    h(x)   a 32-bit integer hash (two multiply-xorshift rounds, multipliers below 2^31, so
           every product of a 32-bit value fits in int64 without overflow)
    a, b   h(h(2 i) xor key), h(h(2 i + 1) xor key) for flat index i = r * cols + c (h is a
           bijection of 32-bit values; hashing the index before the key is mixed in keeps keys
           that differ in low bits from merely permuting the indices)
    s      the sum of the four 16-bit halves of a and b, an integer in [0, 262140]
    x      (s - 131070) * (1 / 37837.2)     mean 0, variance 1 (Irwin-Hall of 4), |x| <= 3.47

Flat indices must stay below 2^31 (2^31 x 2 fits the 32-bit hash input): 2.1 G elements per
table, more than V4.1-Flash's largest (embed / head, 662 M).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_MUL1, _MUL2 = 0x7FEB352D, 0x2C1B3C6D  # odd, < 2^31
_MEAN = 2 * 0xFFFF  # 4 x 65535 / 2
_INV_STD = 1.0 / 37837.2  # 1 / sqrt(4 x (65536^2 - 1) / 12)
MAX_ELEMENTS = 2**31


def tensor_key(seed: int, name: str) -> int:
    """The 32-bit key of one tensor: sha256(f"{seed}:{name}")'s first four bytes."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


def hash32(x: Tensor) -> Tensor:
    """int64 [...] values in [0, 2^32) -> int64 [...] in [0, 2^32): the hash h above."""
    x = ((x ^ (x >> 16)) * _MUL1) & _M32
    x = ((x ^ (x >> 15)) * _MUL2) & _M32
    return x ^ (x >> 16)


def counter_normal(key: int, rows: int, cols: int, device, row_start: int = 0) -> Tensor:
    """fp32 [rows, cols]: rows row_start .. row_start + rows of the keyed [*, cols] table."""
    first = row_start * cols
    if (first + rows * cols) > MAX_ELEMENTS:
        raise ValueError(f"table of {first + rows * cols} elements exceeds {MAX_ELEMENTS}")
    i = torch.arange(first, first + rows * cols, dtype=torch.int64, device=device)  # [rows*cols]
    a = hash32(hash32(2 * i) ^ key)
    b = hash32(hash32(2 * i + 1) ^ key)
    s = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16)  # [rows*cols] in [0, 262140]
    return ((s - _MEAN).to(torch.float32) * _INV_STD).view(rows, cols)
