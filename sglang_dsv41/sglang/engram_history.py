"""Engram n-gram windows for a served batch: each row's last `max_ngram` token ids.

A row at position p needs tokens p, p-1, ..., p-(n-1). Tokens of this forward come from its
input ids; earlier ones from a per-request history of the last n-1 ids this request processed
(kept by request slot, valid while the same request continues at the next position), or, after
a radix hit or a retraction, from the request's own prompt / output token lists.
"""

from __future__ import annotations

import torch


class EngramHistory:
    def __init__(self, max_ngram: int):
        self.n = max_ngram
        self._last = {}  # request slot -> (rid, next position, list of the last n-1 ids)

    def windows(self, rows, input_ids: torch.Tensor, req_pool: list, rids: list, lookup):
        """rows: batch Rows; input_ids int64 [T]; lookup(rid, positions) -> ids.
        Returns (tokens int64 [T, n], blocked bool [T, n]) as layers.engram.ngram_windows."""
        n, k = self.n, self.n - 1
        tokens = torch.zeros(rows.n, n, dtype=torch.int64)
        blocked = torch.zeros(rows.n, n, dtype=torch.bool)
        ids = input_ids.tolist()
        for b, (st, cnt) in enumerate(rows.spans):
            if cnt == 0:
                continue
            rp, rid, p0 = int(req_pool[b]), rids[b], int(rows.pos[st])
            last = self._last.get(rp)
            if last is not None and last[0] == rid and last[1] == p0:
                prev = last[2]
            else:
                want = list(range(max(0, p0 - k), p0))
                prev = lookup(rid, want) if want else []
            seq = prev + ids[st : st + cnt]
            for t in range(cnt):
                p = p0 + t
                for s in range(n):
                    if p - s < 0:
                        blocked[st + t, s] = True
                    else:
                        tokens[st + t, s] = seq[len(prev) + t - s]
            self._last[rp] = (rid, p0 + cnt, seq[-k:] if k else [])
        return tokens, blocked
