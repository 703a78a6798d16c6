"""Paged-pool math against plain Python loops."""

import pytest
import torch

from sglang_dsv41.kv.pages import (
    entries_visible,
    entry_of,
    entry_written_at,
    page_and_offset,
    pages_needed,
    slot_of,
    slots_of_request,
)


def test_pages_needed_int_and_tensor():
    assert [pages_needed(n, 4) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert pages_needed(64, 64) == 1 and pages_needed(65, 64) == 2
    n = torch.arange(0, 300)
    assert pages_needed(n, 7).tolist() == [-(-i // 7) for i in range(300)]
    with pytest.raises(ValueError):
        pages_needed(3, 0)


@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_entries_visible_and_written(ratio):
    written = 0
    for pos in range(40):
        assert entry_of(pos, ratio) == pos // ratio
        if (pos + 1) % ratio == 0:  # this token completes entry pos // ratio
            assert entry_written_at(pos, ratio)
            written += 1
        else:
            assert not entry_written_at(pos, ratio)
        assert entries_visible(pos, ratio) == written  # exactly the entries written so far
    pos = torch.arange(40)
    assert entries_visible(pos, ratio).tolist() == [(p + 1) // ratio for p in range(40)]
    assert entry_written_at(pos, ratio).tolist() == [(p + 1) % ratio == 0 for p in range(40)]
    with pytest.raises(ValueError):
        entries_visible(3, 0)


def test_slot_of_matches_loop():
    g = torch.Generator().manual_seed(0)
    P, B, max_pages = 4, 3, 5
    page_table = torch.randperm(40, generator=g)[: B * max_pages].view(B, max_pages).to(torch.int32)
    page_table[2, 3:] = -1  # request 2 holds only 3 pages
    T = 200
    req_idx = torch.randint(0, B, (T,), generator=g)
    positions = torch.randint(-1, max_pages * P, (T,), generator=g)
    slots = slot_of(page_table, positions, req_idx, P)
    assert slots.dtype == torch.int64 and slots.shape == (T,)
    want = []
    for p, b in zip(positions.tolist(), req_idx.tolist(), strict=False):
        page = page_table[b, p // P].item() if p >= 0 else -1
        want.append(page * P + p % P if page >= 0 else -1)
    assert slots.tolist() == want
    assert (slots == -1).any() and (slots >= 0).any()


def test_page_and_offset_inverts_slot_of():
    page_table = torch.tensor([[7, 2, -1], [0, 5, 1]], dtype=torch.int32)
    positions = torch.tensor([0, 3, 4, 9, -1, 0, 5, 11, 8])
    req = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 0])
    slots = slot_of(page_table, positions, req, 4)
    assert slots.tolist() == [28, 31, 8, -1, -1, 0, 21, 7, -1]
    page, offset = page_and_offset(slots, 4)
    assert page.tolist() == [7, 7, 2, -1, -1, 0, 5, 1, -1]
    assert offset.tolist() == [0, 3, 0, -1, -1, 0, 1, 3, -1]


def test_slots_of_request():
    row = torch.tensor([3, 0, -1], dtype=torch.int32)
    assert slots_of_request(row, 10, 4).tolist() == [12, 13, 14, 15, 0, 1, 2, 3, -1, -1]
    assert slots_of_request(row, 0, 4).tolist() == []
