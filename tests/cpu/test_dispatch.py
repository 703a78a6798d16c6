"""Kernel dispatch: cached capability paths, per-call limits logged once, forced paths raising,
and the argument bundles' checks. The device's paths are stubbed (no GPU here); the ops run
their torch references, so the results are checked against the references too."""

import logging

import pytest
import torch

from sglang_dsv41.kernels import dispatch, indexer
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK, SparseKV
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.indexer import ref
from sglang_dsv41.kernels.indexer import testing as tt
from sglang_dsv41.kv.records import Layout

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("DSV41_FORCE_REF", "DSV41_FORCE_FAST", "DSV41_KERNEL_PATH", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    dispatch.log_once.cache_clear()
    yield
    dispatch.log_once.cache_clear()


def _paths(monkeypatch, *paths):
    monkeypatch.setattr(dispatch, "device_paths", lambda device: tuple(paths))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "sglang_dsv41.kernels"]


def test_cpu_runs_references_silently(caplog):
    assert dispatch.device_paths(CPU) == ()
    with caplog.at_level(logging.WARNING):
        assert dispatch.select("op", CPU, {Path.TRITON: lambda: None}) is Path.REF
    assert _warnings(caplog) == []


def test_best_supported_path_wins(monkeypatch, caplog):
    _paths(monkeypatch, Path.SM100, Path.TRITON)
    with caplog.at_level(logging.WARNING):
        assert dispatch.select("op", CPU, {Path.TRITON: lambda: None}) is Path.TRITON  # no sm100
        fast = {Path.SM100: lambda: None, Path.TRITON: lambda: None}
        assert dispatch.select("op", CPU, fast) is Path.SM100
    assert _warnings(caplog) == []


def test_unsupported_falls_back_and_logs_once(monkeypatch, caplog):
    _paths(monkeypatch, Path.SM100, Path.TRITON)
    fast = {Path.SM100: lambda: "deep_gemm is not installed", Path.TRITON: lambda: None}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert dispatch.select("indexer.reindex", CPU, fast) is Path.TRITON
    assert _warnings(caplog) == [
        "indexer.reindex: the sm100 path cannot run (deep_gemm is not installed); running triton"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert dispatch.select("op", CPU, {Path.TRITON: lambda: "head dim 48"}) is Path.REF
    assert _warnings(caplog) == [
        "op: the triton path cannot run (head dim 48); running the torch reference"
    ]


def test_forced_paths_raise_with_the_reason(monkeypatch):
    _paths(monkeypatch, Path.TRITON)
    monkeypatch.setenv("DSV41_FORCE_FAST", "1")
    with pytest.raises(RuntimeError, match="op: a fast path was forced.*triton: head dim 48"):
        dispatch.select("op", CPU, {Path.TRITON: lambda: "head dim 48"})
    monkeypatch.delenv("DSV41_FORCE_FAST")
    monkeypatch.setenv("DSV41_KERNEL_PATH", "sm100")
    with pytest.raises(RuntimeError, match="DSV41_KERNEL_PATH=sm100 cannot run on cpu"):
        dispatch.select("op", CPU, {Path.SM100: lambda: None, Path.TRITON: lambda: None})
    # an op without an sm100 implementation takes its next fast path
    assert dispatch.select("op", CPU, {Path.TRITON: lambda: None}) is Path.TRITON
    monkeypatch.setenv("DSV41_KERNEL_PATH", "cuda")
    with pytest.raises(ValueError, match="DSV41_KERNEL_PATH='cuda'"):
        dispatch.select("op", CPU, {Path.TRITON: lambda: None})


def test_force_ref_wins(monkeypatch):
    _paths(monkeypatch, Path.SM100, Path.TRITON)
    monkeypatch.setenv("DSV41_FORCE_REF", "1")
    assert dispatch.select("op", CPU, {Path.SM100: lambda: None}) is Path.REF
    monkeypatch.delenv("DSV41_FORCE_REF")
    monkeypatch.setenv("DSV41_KERNEL_PATH", "ref")
    assert dispatch.select("op", CPU, {Path.TRITON: lambda: None}) is Path.REF


def test_triton_on_cpu_only_when_interpreting_and_asked(monkeypatch):
    pytest.importorskip("triton")
    assert Path.TRITON not in dispatch.device_paths(CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert Path.TRITON not in dispatch.device_paths(CPU)
    monkeypatch.setenv("DSV41_KERNEL_PATH", "triton")
    assert dispatch.device_paths(CPU) == (Path.TRITON,)


def test_indexer_geometry_the_fast_path_lacks_runs_the_reference(monkeypatch, caplog):
    """Blocks of 4 (not 8): the Triton indexer cannot take them; the reference runs with the
    caller's geometry (no Flash defaults anywhere), logged once; forced, it raises."""
    _paths(monkeypatch, Path.TRITON)
    c = tt.random_case(T=3, B=2, n_max=100, P=8, seed=1)
    a = tt.case_args(c)
    geo = IndexerGeometry(topk=12, pool_blocks=6, block=4)
    with caplog.at_level(logging.WARNING):
        ids, pool = indexer.candidate_source(*a, geo)
        indexer.candidate_source(*a, geo)
    rids, rpool = ref.candidate_source_ref(*a, geo)
    assert torch.equal(ids, rids) and torch.equal(pool, rpool)
    assert pool.shape == (3, 6) and ids.shape == (3, 12)
    assert _warnings(caplog) == [
        "indexer.candidate_source: the triton path cannot run (candidate blocks of 4 entries "
        "(needs 8)); running the torch reference"
    ]
    monkeypatch.setenv("DSV41_FORCE_FAST", "1")
    with pytest.raises(RuntimeError, match="candidate blocks of 4"):
        indexer.reindex(*a, pool, geo)


def test_bundles_name_the_field():
    k = torch.zeros(10, 68, dtype=torch.uint8)
    pt = torch.zeros(2, 3, dtype=torch.int32)
    ids = torch.zeros(4, dtype=torch.int32)
    view = PagedIndexK(k, pt, ids, ids, page_size=4, split_pages=False)
    assert view.record_bytes == 68 and view.head_dim == 128 and view.max_entries == 12
    with pytest.raises(ValueError, match="index_k: uint8"):
        PagedIndexK(k.int(), pt, ids, ids, page_size=4, split_pages=False)
    with pytest.raises(ValueError, match="index_k: split pages of 4 slots"):
        PagedIndexK(torch.zeros(3, 70, dtype=torch.uint8), pt, ids, ids, 4, split_pages=True)
    with pytest.raises(ValueError, match="n_visible"):
        PagedIndexK(k, pt, ids, ids[:3], page_size=4, split_pages=False)
    with pytest.raises(ValueError, match="INDEX_K record"):
        PagedIndexK(torch.zeros(3, 66, dtype=torch.uint8), pt, ids, ids, 1, split_pages=False)
    with pytest.raises(ValueError, match="topk: >= 1"):
        IndexerGeometry(topk=0, pool_blocks=4, block=8)
    with pytest.raises(TypeError):
        IndexerGeometry(topk=4)  # no defaults
    with pytest.raises(ValueError, match="kv_layout"):
        SparseKV(None, None, None, None, Layout.INDEX_K)
    with pytest.raises(ValueError, match="topk_slots: given without its cache"):
        SparseKV(None, None, None, torch.zeros(2, 3, dtype=torch.int32), Layout.V41)
    swa = torch.zeros(5, 66, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"swa_cache: \[..., 528\]"):
        SparseKV(swa, torch.zeros(2, 3), None, None, Layout.V41_FP4).check_dim(512)


def test_geometry_of_config():
    from sglang_dsv41.config import preset

    cfg = preset("tiny")
    geo = IndexerGeometry.of(cfg)
    assert (geo.topk, geo.pool_blocks, geo.block) == (
        cfg.index_topk,
        cfg.candidate_topk_blocks,
        cfg.candidate_block_size,
    )
