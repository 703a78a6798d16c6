"""Random paged indexer cases and tie-aware checks, shared by tests and benchmarks/bench_indexer.py.

A check accepts a selected id set when it has exactly as many ids as the reference (so -1
padding is exact), every id is allowed (visible, inside the pool) and unique, and every id in
the symmetric difference with the reference scores within `tol` of the reference's k-th score:
the ties-within-rounding allowance of the issue, with `tol` a bound on fp32 rounding computed
from the absolute values (see `rounding_bound`).
"""

import torch

from sglang_dsv41.kernels.args import PagedIndexK
from sglang_dsv41.kernels.indexer.ref import paged_scores
from sglang_dsv41.kv.records import Layout, fake_quant

NEG_INF = float("-inf")


def random_case(
    T, B, n_max, P, HI=32, DI=128, device="cpu", seed=0, lengths=None, n_visible=None, spare_pages=3
):
    """A paged pool holding B requests of up to n_max entries, and T queries over them.

    Pages of all requests are shuffled through one pool (slot order != entry order); unused
    page-table columns are -1. Records: random e2m1 codes, UE8M0 scale bytes in [120, 134].
    Returns dict(qI bf16 [T, HI, DI], w fp32 [T, HI], index_k uint8 [S, R], page_table int32
    [B, max_pages], req_ids int32 [T], n_visible int32 [T], P).
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    max_pages = -(-n_max // P)
    if lengths is None:
        lengths = torch.randint(0, n_max + 1, (B,), generator=g)
        lengths[0] = n_max
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    pages = (lengths + P - 1) // P
    n_pages = int(pages.sum()) + spare_pages
    perm = torch.randperm(n_pages, generator=g)
    page_table = torch.full((B, max_pages), -1, dtype=torch.int32)
    used = 0
    for b in range(B):
        page_table[b, : pages[b]] = perm[used : used + pages[b]].int()
        used += int(pages[b])
    R = DI // 2 + DI // 32
    gd = torch.Generator(device=device).manual_seed(seed + 1)
    index_k = torch.randint(
        0, 256, (n_pages * P, R), dtype=torch.uint8, device=device, generator=gd
    )
    index_k[:, DI // 2 :] = torch.randint(
        120, 135, (n_pages * P, DI // 32), dtype=torch.uint8, device=device, generator=gd
    )
    req_ids = torch.randint(0, B, (T,), generator=g).int()
    if n_visible is None:
        n_visible = (torch.rand(T, generator=g) * (lengths[req_ids.long()] + 1)).long()
        n_visible = torch.minimum(n_visible, lengths[req_ids.long()])
        n_visible[0] = lengths[req_ids[0]]
        if T >= 3:
            n_visible[-1] = 0  # a query that sees nothing: all -1
    n_visible = torch.as_tensor(n_visible).int()
    qI = fake_quant(Layout.INDEX_K, torch.randn(T, HI, DI, generator=g)).to(torch.bfloat16)
    w = torch.randn(T, HI, generator=g) * HI**-0.5
    to = dict(device=device)
    return dict(
        qI=qI.to(**to),
        w=w.to(**to),
        index_k=index_k,
        page_table=page_table.to(**to),
        req_ids=req_ids.to(**to),
        n_visible=n_visible.to(**to),
        P=P,
    )


def paged_view(c, index_k=None) -> PagedIndexK:
    """The case's index-K pool (or `index_k` [S, R] records in its place) as a PagedIndexK."""
    return PagedIndexK(
        index_k=c["index_k"] if index_k is None else index_k,
        page_table=c["page_table"],
        req_ids=c["req_ids"],
        n_visible=c["n_visible"],
        page_size=c["P"],
        split_pages=False,
    )


def split_view(c) -> PagedIndexK:
    """The case's pool rearranged into split pages of c["P"] slots (kv/split_pages.py), the
    layout of the SM100 path; the same records at the same slots."""
    from sglang_dsv41.kv.records import record_dim, value_bytes
    from sglang_dsv41.kv.split_pages import write_split_records

    rec, P = c["index_k"], c["P"]
    V = value_bytes(Layout.INDEX_K, record_dim(Layout.INDEX_K, rec.shape[1]))
    pages = torch.zeros(rec.shape[0] // P, P * rec.shape[1], dtype=torch.uint8, device=rec.device)
    write_split_records(pages, torch.arange(rec.shape[0], device=rec.device), rec, P, V)
    return PagedIndexK(pages, c["page_table"], c["req_ids"], c["n_visible"], P, split_pages=True)


def case_args(c):
    """(qI, w, PagedIndexK): the leading arguments of every indexer entry point."""
    return (c["qI"], c["w"], paged_view(c))


def rounding_bound(c, DI=128, HI=32):
    """fp32 [T]: 2 (DI + HI) 2^-24 max_s sum_h |w_h| sum_i |q_hi k_si|, a bound on the rounding
    of any score of query t in either the reference or the kernel."""
    rec = c["index_k"].clone()
    rec[:, : DI // 2] &= 0x77  # clear both sign bits of every byte: |k|
    a = paged_scores(c["qI"].float().abs(), c["w"].abs(), paged_view(c, rec))
    amax = torch.where(a > NEG_INF, a, torch.zeros_like(a)).amax(1)
    return 2 * (DI + HI) * 2.0**-24 * amax + 1e-30


def check_selection(ids, ref_ids, key, tol, what="ids"):
    """ids / ref_ids int [T, k] (-1 pad), key fp32 [T, M] reference scores of the selectable
    items (-inf = not selectable, +inf = forced), tol fp32 [T]. Raises AssertionError."""
    ids, ref_ids, key, tol = (x.cpu() for x in (ids, ref_ids, key, tol))
    for t in range(ids.shape[0]):
        a = ids[t][ids[t] >= 0].long()
        r = ref_ids[t][ref_ids[t] >= 0].long()
        assert (ids[t] >= -1).all(), f"{what}[{t}]: invalid sentinel"
        assert a.numel() == r.numel(), f"{what}[{t}]: {a.numel()} ids, reference {r.numel()}"
        assert a.unique().numel() == a.numel(), f"{what}[{t}]: duplicate ids"
        if a.numel() == 0:
            continue
        assert a.max() < key.shape[1], f"{what}[{t}]: id out of range"
        assert (key[t, a] > NEG_INF).all(), f"{what}[{t}]: selected a masked / invisible item"
        kth = key[t, r].min()
        diff = torch.tensor(sorted(set(a.tolist()) ^ set(r.tolist())), dtype=torch.long)
        if diff.numel():
            gap = (key[t, diff] - kth).abs().max()
            assert gap <= tol[t], f"{what}[{t}]: differs beyond ties (gap {gap} > tol {tol[t]})"


def block_key(scores, n_visible, block=8, force=True):
    """Block max of reference scores fp32 [T, N] -> [T, ceil(N/8)], newest block +inf."""
    T, N = scores.shape
    nb = -(-N // block)
    pad = torch.full((T, nb * block), NEG_INF, dtype=scores.dtype, device=scores.device)
    pad[:, :N] = scores
    key = pad.view(T, nb, block).amax(-1)
    if force:
        nv = n_visible.long()
        rows = torch.nonzero(nv > 0).flatten()
        key[rows, (nv[rows] - 1) // block] = float("inf")
    return key


def pool_key(scores, pool: torch.Tensor, block=8):
    """Reference scores masked to the pool: fp32 [T, N], -inf outside the pool blocks."""
    from sglang_dsv41.layers.index_math import pool_mask

    m = pool_mask(pool.long().cpu(), scores.shape[1], block).to(scores.device)
    return torch.where(m, scores, torch.full_like(scores, NEG_INF))
