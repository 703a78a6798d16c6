"""Triton paged indexer (kernels/indexer) against the torch reference, on the GPU.

Fresh random pools (shuffled pages, random e2m1 codes and UE8M0 scales, FP4 queries) per case;
index sets must equal the reference's up to ties within the computed rounding bound, with -1
padding and visibility exact (kernels/indexer/testing.py).
"""

import pytest
import torch

from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ref
from sglang_dsv41.kernels.indexer import testing as tt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FLASH = IndexerGeometry(topk=512, pool_blocks=2048, block=8)  # V4.1-Flash's sizes
# (T, B, n_max, P, seed): decode batches, a partial last page, tiny and empty rows.
CASES = [
    (1, 1, 20000, 64, 1),
    (8, 8, 4096, 64, 2),
    (6, 3, 3000, 16, 3),
    (5, 2, 700, 32, 4),
    (4, 4, 37, 8, 5),
]


def _ops():
    from sglang_dsv41.kernels.indexer import ops

    return ops


def _case(T, B, n_max, P, seed, **kw):
    return tt.random_case(T, B, n_max, P, device="cuda", seed=seed, **kw)


@pytest.mark.parametrize("T,B,n_max,P,seed", CASES)
@pytest.mark.parametrize("force", [False, True])
def test_block_scores(T, B, n_max, P, seed, force):
    c = _case(T, B, n_max, P, seed)
    a = tt.case_args(c)
    out = _ops().block_scores(*a, force_newest=force)
    key = tt.block_key(ref.paged_scores(*a), c["n_visible"], force=force)
    assert torch.equal(torch.isinf(out), torch.isinf(key)), "-inf/+inf pattern differs"
    assert torch.equal(out == float("inf"), key == float("inf"))
    fin = torch.isfinite(key)
    tol = tt.rounding_bound(c)[:, None].expand_as(key)
    assert ((out[fin] - key[fin]).abs() <= tol[fin]).all()


@pytest.mark.parametrize("T,B,n_max,P,seed", CASES)
def test_full_topk(T, B, n_max, P, seed):
    c = _case(T, B, n_max, P, seed)
    a = tt.case_args(c)
    scores = ref.paged_scores(*a)
    ids = _ops().full_topk(*a, FLASH)
    assert ids.shape == (T, 512) and ids.dtype == torch.int32
    tt.check_selection(ids, ref.full_topk_ref(*a, FLASH), scores, tt.rounding_bound(c))


def test_full_topk_prefill_ratio2():
    """Prefill: 64 consecutive tokens of one request, n_visible = (pos + 1) // 2."""
    pos = torch.arange(3000, 3064)
    c = _case(64, 1, 1532, 64, 7, lengths=[1532], n_visible=(pos + 1) // 2)
    c["req_ids"].zero_()
    a = tt.case_args(c)
    ids = _ops().full_topk(*a, FLASH)
    tt.check_selection(
        ids, ref.full_topk_ref(*a, FLASH), ref.paged_scores(*a), tt.rounding_bound(c)
    )


@pytest.mark.parametrize("T,B,n_max,P,seed", CASES)
@pytest.mark.parametrize("topk,pool_blocks", [(512, 2048), (64, 256), (256, 16)])
def test_candidate_source(T, B, n_max, P, seed, topk, pool_blocks):
    c = _case(T, B, n_max, P, seed)
    a = tt.case_args(c)
    scores = ref.paged_scores(*a)
    tol = tt.rounding_bound(c)
    geo = IndexerGeometry(topk=topk, pool_blocks=pool_blocks, block=8)
    ids, pool = _ops().candidate_source(*a, geo)
    rids, rpool = ref.candidate_source_ref(*a, geo)
    assert pool.shape == (T, pool_blocks) and pool.dtype == torch.int32
    tt.check_selection(ids, rids, scores, tol)
    tt.check_selection(pool, rpool, tt.block_key(scores, c["n_visible"]), tol, "pool")
    nv = c["n_visible"].long()
    for t in torch.nonzero(nv > 0).flatten().tolist():
        assert ((nv[t] - 1) // 8) in pool[t].tolist(), "newest block not forced"


@pytest.mark.parametrize("T,B,n_max,P,seed", CASES)
def test_reindex(T, B, n_max, P, seed):
    c = _case(T, B, n_max, P, seed)
    a = tt.case_args(c)
    src = tt.random_case(T, B, n_max, P, device="cuda", seed=seed + 100)  # another layer's queries
    geo = IndexerGeometry(topk=512, pool_blocks=256, block=8)
    pool = ref.candidate_source_ref(src["qI"], src["w"], a[2], geo)[1]
    ids = _ops().reindex(*a, pool, geo)
    rids = ref.reindex_ref(*a, pool, geo)
    key = tt.pool_key(ref.paged_scores(*a), pool)
    tt.check_selection(ids, rids, key, tt.rounding_bound(c), "reindex")


def test_dispatch_uses_triton():
    from sglang_dsv41.kernels import indexer
    from sglang_dsv41.kernels.dispatch import Path, device_paths

    c = _case(2, 2, 5000, 64, 9)
    a = tt.case_args(c)
    has = Path.TRITON in device_paths(c["qI"].device)
    assert has == (torch.cuda.get_device_capability() >= (9, 0))
    tt.check_selection(
        indexer.full_topk(*a, FLASH),
        ref.full_topk_ref(*a, FLASH),
        ref.paged_scores(*a),
        tt.rounding_bound(c),
    )


@pytest.mark.parametrize(
    "T,M,k", [(3, 16384, 512), (2, 4096, 2048), (2, 300, 512), (2, 131072, 2048), (1, 200000, 512)]
)
def test_topk_rows_matches_oracle(T, M, k):
    """Exact values are copied, so the set equals the stable oracle's exactly (ties included)."""
    from sglang_dsv41.kernels.indexer.select import topk_rows
    from sglang_dsv41.layers.index_math import topk_indices

    g = torch.Generator(device="cuda").manual_seed(M + k)
    v = torch.randn(T, M, device="cuda", generator=g)
    v[0, ::3] = float("-inf")
    v[-1] = torch.round(v[-1] * 4) / 4  # many ties
    ids = topk_rows(v, k)
    ref_ids = topk_indices(v, v > float("-inf"), k)
    for t in range(T):
        a = ids[t][ids[t] >= 0].sort().values
        r = ref_ids[t][ref_ids[t] >= 0].sort().values
        assert torch.equal(a.long(), r.long()), f"row {t}"


@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("force", [False, True])
def test_grouped_prefill_scan(group, force):
    """Prefill chunks of two requests (aligned to the group), ratio-2 causal visibility, a
    ragged tail: the grouped scan equals the reference, and so do the selections built on it."""
    from sglang_dsv41.kernels.indexer import ops

    pos = torch.cat([torch.arange(5000, 5000 + 3 * group), torch.arange(100, 100 + 2 * group - 3)])
    c = _case(pos.numel(), 2, 2600, 64, 11 + group, lengths=[2600, 2600], n_visible=(pos + 1) // 2)
    c["req_ids"] = torch.tensor(
        [1] * (3 * group) + [0] * (2 * group - 3), dtype=torch.int32, device="cuda"
    )
    assert ops.groupable(c["req_ids"], group)
    a = tt.case_args(c)
    scores, tol = ref.paged_scores(*a), tt.rounding_bound(c)
    out = ops.block_scores(*a, force_newest=force, group=group)
    key = tt.block_key(scores, c["n_visible"], force=force)
    assert torch.equal(torch.isinf(out), torch.isinf(key))
    assert torch.equal(out == float("inf"), key == float("inf"))
    fin = torch.isfinite(key)
    assert ((out[fin] - key[fin]).abs() <= tol[:, None].expand_as(key)[fin]).all()
    tt.check_selection(
        ops.full_topk(*a, FLASH, group=group), ref.full_topk_ref(*a, FLASH), scores, tol
    )
    ids, pool = ops.candidate_source(*a, FLASH, group=group)
    rids, rpool = ref.candidate_source_ref(*a, FLASH)
    tt.check_selection(ids, rids, scores, tol)
    tt.check_selection(pool, rpool, tt.block_key(scores, c["n_visible"]), tol, "pool")
