"""Slot lists of an extend batch for the shared-window tests (tests/cpu/test_window_share.py,
tests/gpu/test_sparse_attn.py): requests of consecutive query positions, as a prefill makes."""

import torch

from sglang_dsv41.kernels.sparse_attn import swa_window_slots


def prefill_lists(lengths, W, ctx=200, floors=(), shuffle=0, seed=0):
    """Slot lists of an extend batch: request b's lengths[b] tokens at consecutive positions
    ending at ctx - 1 (the first one's window starts before its prompt: -1 entries), request
    b's bounded-replay floor floors[b] (0 if absent), and `shuffle` tokens swapped with a
    random other token (their lists are then no longer windows of their neighbours)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    req_to_slot = torch.randperm(B * ctx, generator=g).view(B, ctx).to(torch.int32)
    req_index = torch.cat([torch.full((n,), b) for b, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(ctx - n, ctx) for n in lengths])
    pos[: lengths[0]] -= ctx - lengths[0]  # request 0 is a fresh prompt: positions 0 ..
    floor = torch.tensor([floors[b] if b < len(floors) else 0 for b in req_index.tolist()])
    sw = swa_window_slots(req_to_slot, req_index, pos, W, floor)
    for _ in range(shuffle):
        a, b = torch.randint(0, sw.shape[0], (2,), generator=g).tolist()
        sw[[a, b]] = sw[[b, a]]
    return sw.contiguous(), req_to_slot.numel()
