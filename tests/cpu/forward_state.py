"""Snapshots of a forward's cross-layer state (`serving.context.ForwardShared`) for probes that
run one attention call several times on copies of the same state."""

from __future__ import annotations

import torch

from sglang_dsv41.serving.context import ForwardShared


def snapshot(shared: ForwardShared) -> ForwardShared:
    """A copy whose top-k dict is its own (the tensors are never written in place)."""
    return ForwardShared(dict(shared.topk), shared.candidates, shared.page_table)


def same(a: ForwardShared, b: ForwardShared) -> bool:
    """Equal layers in the top-k dict, equal tensors everywhere."""

    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return (
        a.topk.keys() == b.topk.keys()
        and all(torch.equal(a.topk[k], b.topk[k]) for k in a.topk)
        and eq(a.candidates, b.candidates)
        and eq(a.page_table, b.page_table)
    )
