"""Paged indexer references (kernels/indexer/ref.py) against brute force, the candidate-pool
property, and the Triton kernels under TRITON_INTERPRET=1 on tiny shapes (in a subprocess, so the
interpreter setting does not leak into other tests)."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ref
from sglang_dsv41.kernels.indexer import testing as tt
from sglang_dsv41.kv.records import Layout, pack_index_k, unpack_index_k


def _brute_scores(c):
    """Entry by entry: slot from the page table, decode the record, sum of weighted ReLUs."""
    T = c["qI"].shape[0]
    n = c["page_table"].shape[1] * c["P"]
    out = torch.full((T, n), float("-inf"))
    for t in range(T):
        b = int(c["req_ids"][t])
        for s in range(int(c["n_visible"][t])):
            slot = int(c["page_table"][b, s // c["P"]]) * c["P"] + s % c["P"]
            k = unpack_index_k(c["index_k"][slot])
            dots = c["qI"][t].float() @ k  # [HI]
            out[t, s] = (c["w"][t] * dots.clamp_min(0)).sum()
    return out


def _brute_topk(key, k):
    """Descending by score, ties -> lower id; -inf never selected."""
    out = torch.full((key.shape[0], k), -1, dtype=torch.int32)
    for t in range(key.shape[0]):
        order = sorted(range(key.shape[1]), key=lambda s: (-key[t, s].item(), s))
        keep = [s for s in order if key[t, s] > float("-inf")][:k]
        out[t, : len(keep)] = torch.tensor(keep, dtype=torch.int32)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_paged_scores_and_topk_match_brute_force(seed):
    c = tt.random_case(T=4, B=3, n_max=90, P=8, seed=seed)
    a = tt.case_args(c)
    brute = _brute_scores(c)
    s = ref.paged_scores(*a)
    assert torch.equal(torch.isinf(s), torch.isinf(brute))
    fin = torch.isfinite(brute)
    assert torch.allclose(s[fin], brute[fin], rtol=1e-5, atol=1e-3)
    ids = ref.full_topk_ref(*a, IndexerGeometry(topk=16, pool_blocks=0, block=8))
    assert torch.equal(ids, _brute_topk(s, 16))
    tt.check_selection(ids, _brute_topk(brute, 16), brute, tt.rounding_bound(c))


def test_candidate_source_brute_force_and_pool_property():
    c = tt.random_case(T=5, B=2, n_max=400, P=16, seed=3)
    a = tt.case_args(c)
    s = ref.paged_scores(*a)
    geo = IndexerGeometry(topk=24, pool_blocks=32, block=8)  # 32 > 24
    ids, pool = ref.candidate_source_ref(*a, geo)
    key = tt.block_key(s, c["n_visible"])
    tt.check_selection(pool, _brute_topk(key, 32), key, torch.zeros(5), "pool")
    for t in range(5):
        own = {int(i) // 8 for i in ids[t] if i >= 0}
        assert own <= {int(b) for b in pool[t] if b >= 0}, "pool misses the source's own top-k"
    # Reindex with the source's own queries inside its own pool gives back the source's top-k.
    tt.check_selection(ref.reindex_ref(*a, pool, geo), ids, s, torch.zeros(5))


def test_reindex_masks_outside_pool():
    c = tt.random_case(T=3, B=1, n_max=200, P=8, seed=5, n_visible=[200, 150, 9])
    a = tt.case_args(c)
    pool = torch.tensor([[0, 3, 24, -1], [18, 2, -1, -1], [1, -1, -1, -1]], dtype=torch.int32)
    ids = ref.reindex_ref(*a, pool, IndexerGeometry(topk=12, pool_blocks=0, block=8))
    s = ref.paged_scores(*a)
    allowed = [{8 * b + i for b in row if b >= 0 for i in range(8)} for row in pool.tolist()]
    key = s.clone()
    for t in range(3):
        for e in range(s.shape[1]):
            if e not in allowed[t]:
                key[t, e] = float("-inf")
    assert torch.equal(ids, _brute_topk(key, 12))
    assert (ids[2] >= 0).sum() == 1  # block 1 = entries 8..15, only entry 8 visible


def test_dequant_matches_codec():
    """The kernels' bit trick targets these bytes: pack_index_k output decoded by the codec."""
    x = torch.randn(6, 128) * torch.logspace(-3, 3, 6)[:, None]
    rec = pack_index_k(x)
    assert rec.shape == (6, 68) and rec.dtype == torch.uint8
    from sglang_dsv41.kv.records import fake_quant

    assert torch.equal(unpack_index_k(rec), fake_quant(Layout.INDEX_K, x))


_INTERP = r"""
import torch
from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ops, ref, testing as tt
from sglang_dsv41.kv.records import pack_index_k
ops.TUNING["scan"].update(bn=64, tiles=8, num_warps=4)
ops.TUNING["pool"].update(bn=64, tiles=4, num_warps=4)
for seed, (T, B, n, P) in enumerate([(4, 3, 300, 16), (3, 2, 45, 8)]):
    c = tt.random_case(T, B, n, P, seed=seed)
    if seed == 0:  # real records from the codec, not random bytes
        c["index_k"] = pack_index_k(torch.randn(c["index_k"].shape[0], 128) * 3)
    a = tt.case_args(c)
    s, tol = ref.paged_scores(*a), tt.rounding_bound(c)
    for force in (False, True):
        key = tt.block_key(s, c["n_visible"], force=force)
        out = ops.block_scores(*a, force_newest=force)
        fin = torch.isfinite(key)
        assert torch.equal(torch.isinf(out), torch.isinf(key))
        assert torch.equal(out == float("inf"), key == float("inf"))
        assert ((out[fin] - key[fin]).abs() <= tol[:, None].expand_as(key)[fin]).all()
    g20 = IndexerGeometry(topk=20, pool_blocks=0, block=8)
    tt.check_selection(ops.full_topk(*a, g20), ref.full_topk_ref(*a, g20), s, tol)
    for topk, nb in ((16, 8), (16, 2)):
        geo = IndexerGeometry(topk=topk, pool_blocks=nb, block=8)
        ids, pool = ops.candidate_source(*a, geo)
        rids, rpool = ref.candidate_source_ref(*a, geo)
        tt.check_selection(ids, rids, s, tol)
        tt.check_selection(pool, rpool, tt.block_key(s, c["n_visible"]), tol, "pool")
    g16 = IndexerGeometry(topk=16, pool_blocks=0, block=8)
    r = ops.reindex(*a, rpool, g16)
    tt.check_selection(r, ref.reindex_ref(*a, rpool, g16), tt.pool_key(s, rpool), tol)
pos = torch.tensor(list(range(300, 310)) + list(range(50, 55)))  # grouped prefill, ratio 2
c = tt.random_case(15, 2, 160, 16, seed=3, lengths=[160, 160], n_visible=(pos + 1) // 2)
c["req_ids"] = torch.tensor([1] * 10 + [0] * 5, dtype=torch.int32)
assert ops.groupable(c["req_ids"], 2) and not ops.groupable(c["req_ids"], 4)
a = tt.case_args(c)
s, tol = ref.paged_scores(*a), tt.rounding_bound(c)
ops.TUNING["scan_group"].update(bn=32, tiles=4)
for force in (False, True):
    out = ops.block_scores(*a, force_newest=force, group=2)
    key = tt.block_key(s, c["n_visible"], force=force)
    fin = torch.isfinite(key)
    assert torch.equal(torch.isinf(out), torch.isinf(key))
    assert torch.equal(out == float("inf"), key == float("inf"))
    assert ((out[fin] - key[fin]).abs() <= tol[:, None].expand_as(key)[fin]).all()
from sglang_dsv41.kernels.indexer.select import topk_rows
from sglang_dsv41.layers.index_math import topk_indices
v = torch.randn(3, 700)
v[0, ::3] = float("-inf")
v[2] = torch.round(v[2] * 2) / 2  # ties: the lower index wins, as in the oracle
v[2, 7], v[2, 9] = -0.0, 0.0  # -0 ties with +0
for k in (5, 100):
    ids = topk_rows(v, k, chunk=256)  # three chunks, then a merge round
    r = topk_indices(v, v > float("-inf"), k)
    for t in range(3):
        assert sorted(x for x in ids[t].tolist() if x >= 0) == sorted(
            x for x in r[t].tolist() if x >= 0)
print("INTERPRETER_OK")
"""


def test_triton_kernels_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run(
        [sys.executable, "-c", _INTERP], env=env, capture_output=True, text=True, timeout=300
    )
    assert "INTERPRETER_OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_dispatch_on_cpu_runs_the_reference(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sglang", None)  # the core never imports sglang
    from sglang_dsv41.kernels import indexer

    c = tt.random_case(T=3, B=2, n_max=120, P=8, seed=9)
    a = tt.case_args(c)
    geo = IndexerGeometry(topk=16, pool_blocks=4, block=8)
    assert torch.equal(indexer.full_topk(*a, geo, group=2), ref.full_topk_ref(*a, geo))
    ids, pool = indexer.candidate_source(*a, geo)
    rids, rpool = ref.candidate_source_ref(*a, geo)
    assert torch.equal(ids, rids) and torch.equal(pool, rpool)
    g8 = IndexerGeometry(topk=8, pool_blocks=4, block=8)
    assert torch.equal(indexer.reindex(*a, pool, g8), ref.reindex_ref(*a, pool, g8))
