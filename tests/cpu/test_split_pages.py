"""Split pages (kv/split_pages.py): byte positions against a hand-written layout, round trips,
and SGLang's own index-K page writer (its torch test oracle, 64-slot pages)."""

import pytest
import torch

from sglang_dsv41.kv.records import pack_index_k
from sglang_dsv41.kv.split_pages import read_split_records, write_split_records


def test_byte_positions_by_hand():
    P, R, V = 4, 6, 4  # records of 4 value bytes + 2 scale bytes
    pages = torch.zeros(3, P * R, dtype=torch.uint8)
    rec = torch.arange(1, 13, dtype=torch.uint8).view(2, R)  # [[1..6], [7..12]]
    write_split_records(pages, torch.tensor([5, -1]), rec, P, V)  # slot 5: page 1, offset 1
    want = torch.zeros(3, P * R, dtype=torch.uint8)
    want[1, 4:8] = torch.tensor([1, 2, 3, 4])  # values of offset 1 after offset 0's
    want[1, 16 + 2 : 16 + 4] = torch.tensor([5, 6])  # scales after the 4 value parts
    assert torch.equal(pages, want)
    got = read_split_records(pages, torch.tensor([[5, -1], [0, 5]]), P, V)
    assert got[0, 0].tolist() == [1, 2, 3, 4, 5, 6] and not got[0, 1].any()
    assert not got[1, 0].any() and got[1, 1].tolist() == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("P", [1, 8, 128])
def test_round_trip_and_page_of_one(P):
    g = torch.Generator().manual_seed(P)
    n_pages = 3
    rec = pack_index_k(torch.randn(n_pages * P, 128, generator=g))  # [S, 68]
    slots = torch.randperm(n_pages * P, generator=g)
    pages = torch.zeros(n_pages, P * 68, dtype=torch.uint8)
    write_split_records(pages, slots, rec, P, 64)
    assert torch.equal(read_split_records(pages, slots, P, 64), rec)
    if P == 1:  # a split page of one slot is the plain record
        assert torch.equal(pages[slots], rec)


def test_equals_sglang_index_k_page_writer():
    common = pytest.importorskip("sglang.test.kernels.deepseek_v4.common")
    g = torch.Generator().manual_seed(0)
    n, P = 150, 64
    x = torch.randn(n, 128, generator=g)
    rec = pack_index_k(x)
    loc = torch.randperm(3 * P, generator=g)[:n]
    fp4 = rec[:, :64]
    sf = rec[:, 64:].contiguous().view(torch.int32).view(-1)  # four UE8M0 bytes, little-endian
    theirs = common.store_fp4_index_cache_ref(fp4, sf, loc, num_pages=3)  # [3, 64 * 68]
    ours = torch.zeros(3, P * 68, dtype=torch.uint8)
    write_split_records(ours, loc, rec, P, 64)
    assert torch.equal(ours, theirs)
