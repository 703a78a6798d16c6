"""Prefix resume: a radix hit whose SWA is gone, served by bounded replay (docs/design.md 2.8).

A cached prefix of M tokens keeps two lifetimes: its global KV (main KV and index K of the kv
sources, exact) until memory is needed for global records, its SWA only while the SWA pool has
room. A hit of M tokens whose SWA window is gone resumes there: the rows of the replay segment
[replay_floor(M), M) (`DeepseekV41Config.replay_floor`, the rule of decoder replay) run through
the layers ahead of the request's new rows, with SWA floored at replay_floor(M); they write
their SWA into the request's replay window (serving/buffers.py) and no global record, so the
prefix's shared records stay as they were. The oracle's counterpart is
`ReferenceModel.forward(..., resumes=(M,))`.

    window_resident   does an extend from M find the SWA it reads (every position of its window
                      mapped to an SWA slot)
    longest_resident  the longest page-aligned match whose window is resident
    HitPlan, plan_hit where a request's radix match stops and whether it resumes there (the one
                      rule the scheduler hook and the tests call)
    Fold, fold_batch  the replay rows in front of a batch's rows (SGLang schedules M..N; the
                      forward computes replay_floor(M)..N)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def window_start(match: int, window: int) -> int:
    """First prefix position the row at `match` reads from the SWA of the cached prefix."""
    return max(0, match - window + 1)


def window_resident(present: torch.Tensor, match: int, window: int) -> bool:
    """present bool [>= match]: position p of the prefix has its SWA (mapped to an SWA slot).
    True when every position the row at `match` reads is present (a resident hit)."""
    return bool(present[window_start(match, window) : match].all())


def longest_resident(present: torch.Tensor, match: int, window: int, page: int) -> int:
    """The largest page-aligned m <= match whose window is resident (0 always is)."""
    if match <= 0:
        return 0
    idx = torch.arange(match)
    missing = torch.where(~present[:match].bool(), idx, torch.full_like(idx, -1))
    last_missing = torch.cummax(missing, 0).values  # [match]: last missing position <= p
    ms = torch.arange(page, match + 1, page)
    if ms.numel() == 0:
        return 0
    ok = last_missing[ms - 1] < (ms - window + 1).clamp_min(0)
    good = ms[ok]
    return int(good[-1]) if good.numel() else 0


@dataclass(frozen=True)
class HitPlan:
    """match: the prefix the request keeps (at most the radix match; below it the scheduler
    matches again there); resume: 0 for an exact hit (its SWA window resident), else the
    prefix length it resumes at by a replay (== match)."""

    match: int
    resume: int = 0


def plan_hit(
    match: int,
    present: torch.Tensor,
    window: int,
    page: int,
    exact_cap: int | None = None,
    exact_only: bool = False,
    kept: int = 0,
) -> HitPlan:
    """Where a request's radix hit stops (docs/design.md 2.8).

    match: the radix match (page-aligned, global KV on the device); present bool [>= match]:
    the prefix positions whose SWA is mapped; exact_cap: the longest hit an exact continuation
    may take (the request's decoder replay floor: the decoder never reads cached decoder SWA;
    None = match, without decoder replay); exact_only: the request may not take a new
    approximation (a retracted request, prompt logprobs); kept: the resume point of the
    request's first prefill (0: it did not resume).

    Stop at min(match, exact_cap) when that window is resident: exact. Otherwise resume at the
    whole match: its last window is replayed, and those rows, from replay_floor(match) <= the
    decoder floor, also give the decoder its rows, so a full hit costs about one window. A
    retracted request prefills again as it did: from its kept resume point while the prefix
    still reaches it, else only as far as a resident window allows.
    """
    cap = match if exact_cap is None else min(match, exact_cap) // page * page
    if kept and match >= kept:
        return HitPlan(kept, kept)
    if exact_only:
        return HitPlan(longest_resident(present, cap, window, page))
    if cap and window_resident(present, cap, window):
        return HitPlan(cap)
    return HitPlan(match, match) if match else HitPlan(0)


@dataclass
class Fold:
    """The replay rows of one forward. input_ids int64 [T_fold]: SGLang's ids with each
    replaying request's segment ids in front of its rows; keep int64 [T]: where SGLang's batch
    rows sit among the folded rows (their hidden states are the forward's output)."""

    input_ids: torch.Tensor
    keep: torch.Tensor


def fold_batch(
    prefix: list,
    extend: list,
    slots: list,
    input_ids: torch.Tensor,
    out_loc: torch.Tensor,
    folds: dict,
    req_to_token: torch.Tensor,
):
    """Put each replaying request's segment in front of its rows.

    prefix, extend, slots: host lists [B] (SGLang's prefix lengths, extend lengths, request
    slots); input_ids int64 [T], out_loc int64 [T] (full slots of the rows); folds: request
    slot -> the segment's ids (its prefix [M - len, M)); req_to_token [R, ctx] the slot table.
    -> (prefix, extend, out_loc, Fold | None): the folded lengths, the folded rows' full slots
    (a segment row's is its cached slot, never written) and the fold (None when no request of
    the batch replays: the inputs come back unchanged).
    """
    reps = [len(folds.get(s, ())) for s in slots]
    if not any(reps):
        return prefix, extend, out_loc, None
    dev = input_ids.device
    ids, locs, keep = [], [], []
    off = folded = 0
    for p, n, s, r in zip(prefix, extend, slots, reps, strict=True):
        if r:
            ids.append(torch.tensor(folds[s], dtype=input_ids.dtype, device=dev))
            locs.append(req_to_token[s, p - r : p].to(out_loc.dtype))
        ids.append(input_ids[off : off + n])
        locs.append(out_loc[off : off + n])
        keep.append(torch.arange(folded + r, folded + r + n, device=dev))
        off, folded = off + n, folded + r + n
    new_prefix = [p - r for p, r in zip(prefix, reps, strict=True)]
    new_extend = [n + r for n, r in zip(extend, reps, strict=True)]
    fold = Fold(torch.cat(ids), torch.cat(keep))
    return new_prefix, new_extend, torch.cat(locs), fold
