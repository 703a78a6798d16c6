"""The sliding window of one query: which SWA key positions it sees (docs/design.md 2.2, step 7).

A query at position p sees the keys at [max(floor, p - W + 1), p]: its own layer's SWA keys of
the last W positions, floored at the first replayed position under decoder bounded replay
(docs/design.md 2.5; floor 0 otherwise). Every path states the window through this function.
"""

import torch


def swa_window(pos: torch.Tensor, window: int, floor: torch.Tensor | int | None = None):
    """pos int [T] -> (kpos int64 [T, W] key positions, oldest first; ok bool [T, W] visible).

    floor: int, int [T] or None (= 0), the lowest visible key position of each query.
    Entries with ok False carry positions below the floor (possibly negative): never read them.
    """
    pos = pos.long()
    kpos = pos[:, None] - window + 1 + torch.arange(window, device=pos.device)[None, :]  # [T, W]
    if floor is None:
        lo = torch.zeros_like(pos)
    elif isinstance(floor, int):
        lo = torch.full_like(pos, max(floor, 0))
    else:
        lo = floor.long().to(pos.device).clamp_min(0)
    return kpos, kpos >= lo[:, None]
