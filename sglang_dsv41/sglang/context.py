"""Per-forward batch metadata of the `dsv41` backend: which rows belong to which request.

A forward batch (extend, decode or mixed) is a list of B requests; request b contributes rows
at consecutive positions [prefix_b, seq_b). `Rows` is a subset of the batch's rows (bounded
replay drops decoder rows below a request's floor); `ids` points back at the batch rows so state
shared between layers (top-k, candidate pools) can be looked up from any subset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Rows:
    """ids int64 [T] batch row ids; pos int64 [T]; req int64 [T] request index in the batch.
    Rows of one request are consecutive and in position order."""

    ids: torch.Tensor
    pos: torch.Tensor
    req: torch.Tensor
    spans: list  # per request b: (start, count) into these rows

    @property
    def n(self) -> int:
        return int(self.ids.numel())

    def select(self, keep: torch.Tensor) -> Rows:
        """keep bool [T] (per request a suffix of its rows) -> the kept rows."""
        idx = keep.nonzero().flatten()
        req = self.req[idx]
        counts = torch.bincount(req, minlength=len(self.spans)).tolist()
        spans, start = [], 0
        for c in counts:
            spans.append((start, c))
            start += c
        return Rows(self.ids[idx], self.pos[idx], req, spans)


@dataclass
class BatchContext:
    """Everything the serving attention needs about one forward batch.

    req_pool int64 [B] request slots; req_to_token int32 [R, ctx] SGLang's slot table;
    seq_lens list[int] [B] lengths after this forward; floors list[int] [B] decoder SWA floor
    (bounded replay; 0 = full forward); out_loc int64 [T] slots of the batch rows.
    `shared` carries what source layers hand to consumers within this forward.
    """

    rows: Rows
    req_pool: torch.Tensor
    req_to_token: torch.Tensor
    seq_lens: list
    floors: list
    out_loc: torch.Tensor
    engram: tuple | None = None  # (tokens int64 [T, n], blocked bool [T, n]) n-gram windows
    shared: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    def slots(self, b: int, positions: torch.Tensor) -> torch.Tensor:
        """Slots int64 [...] of request b's tokens at `positions` (int64 [...], all < seq_len)."""
        return self.req_to_token[self.req_pool[b], positions].long()

    def row_floors(self, rows: Rows) -> torch.Tensor:
        return torch.tensor(self.floors, dtype=torch.int64, device=rows.req.device)[rows.req]


def build_rows(prefix_lens: list, extend_lens: list) -> Rows:
    """Rows of a batch whose request b covers positions [prefix_b, prefix_b + extend_b)."""
    pos, req, spans, start = [], [], [], 0
    for b, (p, n) in enumerate(zip(prefix_lens, extend_lens, strict=False)):
        pos.append(torch.arange(p, p + n, dtype=torch.int64))
        req.append(torch.full((n,), b, dtype=torch.int64))
        spans.append((start, n))
        start += n
    pos_t = torch.cat(pos) if pos else torch.zeros(0, dtype=torch.int64)
    req_t = torch.cat(req) if req else torch.zeros(0, dtype=torch.int64)
    return Rows(torch.arange(start, dtype=torch.int64), pos_t, req_t, spans)
