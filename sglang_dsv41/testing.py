"""Checks the test suites share (CPU and GPU alike: core only, no SGLang)."""

from __future__ import annotations

import torch


def assert_pools_equal(a, b, tag) -> None:
    """Two KV pools hold the same tensors, bit for bit: the `main`, `index_k`, `pending` and
    `ring` dicts (past request slot 0 for `ring` and `pending`: the padding sink, written by every
    row that stores nothing, in any order) and the `swa` list. `tag` starts each failure message.
    """
    for name in ("main", "index_k", "pending", "ring"):
        for k, t in getattr(a, name).items():
            u = getattr(b, name)[k]
            if name in ("ring", "pending"):
                t, u = t[1:], u[1:]
            if not torch.equal(t, u):
                raise AssertionError((tag, name, k))
    for x, y in zip(a.swa, b.swa, strict=True):
        if not ((x is None and y is None) or torch.equal(x, y)):
            raise AssertionError(tag)
