"""Engram n-gram windows of a served batch, from the rows' ids and each request's tail.

A row at position p needs tokens p, p-1, ..., p-(n-1) (`layers.engram.ngram_windows` states the
window of a whole sequence; this is the same window for rows that continue a request). Tokens of
this forward come from its input ids; earlier ones from the request slot's tail in the pool
(`RecordBuffers.engram_tail`: the n - 1 ids before the request's next position), which the
scheduler hook writes when a request (re)starts prefilling (after a radix hit or a retraction
too) and `advance_tails` moves forward after every forward. No host syncs.
"""

from __future__ import annotations

import torch

from sglang_dsv41.serving.context import Rows


def windows(rows: Rows, input_ids: torch.Tensor, tails: torch.Tensor, max_ngram: int):
    """rows: the batch rows; input_ids int64 [T]; tails int64 [B, n - 1] of the batch's requests
    -> (tokens int64 [T, n], blocked bool [T, n]) as layers.engram.ngram_windows."""
    dev = rows.pos.device
    t = torch.arange(rows.n, device=dev)
    first = rows.first_of_request()
    p0 = rows.pos[first]
    s = torch.arange(max_ngram, device=dev)
    q = rows.pos[:, None] - s  # [T, n]
    tokens = _gather(q, t, rows.pos, p0, input_ids, tails[rows.req])
    blocked = q < 0
    return tokens.masked_fill(blocked, 0), blocked


def advance_tails(rows: Rows, input_ids: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
    """The batch's tails after this forward: int64 [B, n - 1], each request's last n - 1 ids up
    to its last row (positions below 0 stay -1)."""
    n1 = tails.shape[1]
    dev = rows.pos.device
    last = rows.last_of_request()
    t = torch.arange(rows.n, device=dev)[last]
    p0 = rows.pos[rows.first_of_request()][last]
    pl = rows.pos[last]
    q = pl[:, None] - (n1 - 1) + torch.arange(n1, device=dev)  # [B, n - 1]
    new = _gather(q, t, pl, p0, input_ids, tails[rows.req[last]])
    out = tails.clone()
    out[rows.req[last]] = torch.where(q >= 0, new, torch.full_like(new, -1))
    return out


def _gather(q, t, pos, p0, input_ids, tail_rows):
    """Token ids at positions q int64 [T, k] for rows t [T] at positions pos [T] whose request's
    first row in this forward sits at p0 [T]; earlier positions come from tail_rows [T, n - 1]
    (the n - 1 ids before p0)."""
    n1 = tail_rows.shape[1]
    fwd = input_ids[(t[:, None] - (pos[:, None] - q)).clamp(0, input_ids.numel() - 1)]
    old = tail_rows.gather(1, (n1 - p0[:, None] + q).clamp(0, n1 - 1))
    return torch.where(q >= p0[:, None], fwd, old)
