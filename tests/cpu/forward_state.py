"""Snapshots of a forward's cross-layer state (`serving.context.ForwardShared`) for probes that
run one attention call several times on copies of the same state."""

from __future__ import annotations

import dataclasses

import torch

from sglang_dsv41.serving.context import ForwardShared


def snapshot(shared: ForwardShared) -> ForwardShared:
    """A copy whose dicts and parts are its own (the tensors are never written in place)."""
    return dataclasses.replace(
        shared,
        topk=dict(shared.topk),
        topk_slots=dict(shared.topk_slots),
        encoder=dataclasses.replace(shared.encoder),
        decoder=dataclasses.replace(shared.decoder),
    )


def same(a: ForwardShared, b: ForwardShared) -> bool:
    """Equal layers in the top-k dicts, equal tensors everywhere."""

    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    def eq_dict(x: dict, y: dict) -> bool:
        return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)

    return (
        eq_dict(a.topk, b.topk)
        and eq_dict(a.topk_slots, b.topk_slots)
        and eq(a.candidates, b.candidates)
        and eq(a.page_table, b.page_table)
    )
