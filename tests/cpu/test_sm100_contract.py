"""Contract tests of the SM100 paths (kernels/indexer/sm100.py, kernels/sparse_attn/sm100.py).

NOT hardware tests: no SM100 GPU ran any of this. `deep_gemm` and `flash_mla` are replaced by
recording stand-ins (kernels/testing_sm100/) that check every argument against the libraries'
documented contracts and return what the documented kernels compute, evaluated with the
reference math through the arguments as given. The public dispatchers run with
DSV41_KERNEL_PATH=sm100 (the SM100 path or an error). Checked here:
  - the exact arguments (shapes, dtypes, strides, page tables, block ids, metadata inputs);
  - stand-ins returning the reference's logits / attention give the references' top-k sets and
    attention output (exactly, or within the documented bf16 logits);
  - SGLang 0.5.23's own call sites (its DeepGEMM wrappers and operand builders, run on CPU with
    the same stand-in installed) pass the same operands for the same batch;
  - the stand-ins reject perturbed arguments; dispatch, fallback logging and page sizes.
"""

import logging
import types

import pytest
import torch

from sglang_dsv41.kernels import dispatch, indexer
from sglang_dsv41.kernels import testing_sm100 as standin
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK, SparseKV
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.indexer import ref, sm100
from sglang_dsv41.kernels.indexer import testing as tt
from sglang_dsv41.kernels.sparse_attn import sm100 as attn_sm100
from sglang_dsv41.kernels.sparse_attn import sparse_attention, sparse_attention_ref
from sglang_dsv41.kv.records import Layout, pack, pack_index_k, unpack_index_k
from sglang_dsv41.kv.split_pages import write_split_records

P = 128  # index-K page of the SM100 path
INT32_MAX = 2**31 - 1


@pytest.fixture
def libs(monkeypatch):
    """Stand-ins installed as deep_gemm / flash_mla on an 'SM100 device'; returns their call
    lists. The SM100 path is forced: a call it cannot take raises."""
    calls = types.SimpleNamespace(dg=[], mla=[])
    monkeypatch.setitem(__import__("sys").modules, "deep_gemm", standin.deep_gemm(calls.dg))
    monkeypatch.setitem(__import__("sys").modules, "flash_mla", standin.flash_mla(calls.mla))
    monkeypatch.setattr(dispatch, "device_paths", lambda device: (Path.SM100, Path.TRITON))
    monkeypatch.setenv("DSV41_KERNEL_PATH", "sm100")
    monkeypatch.delenv("DSV41_FORCE_REF", raising=False)
    for f in (sm100.missing, attn_sm100.missing, dispatch.log_once):
        f.cache_clear()
    yield calls
    for f in (sm100.missing, attn_sm100.missing, dispatch.log_once):
        f.cache_clear()


def split_case(T, B, n_max, seed, HI=32, n_visible=None):
    """A random batch whose index K sits in split pages of 128 slots: (qI, w, PagedIndexK).
    With n_visible given, every request holds n_max entries."""
    lengths = None if n_visible is None else [n_max] * B
    c = tt.random_case(T, B, n_max, P, HI=HI, seed=seed, n_visible=n_visible, lengths=lengths)
    S = c["index_k"].shape[0]
    g = torch.Generator().manual_seed(seed + 7)
    rec = pack_index_k(torch.randn(S, 128, generator=g) * 2)  # real codec records
    pages = torch.zeros(S // P, P * 68, dtype=torch.uint8)
    write_split_records(pages, torch.arange(S), rec, P, 64)
    kv = PagedIndexK(pages, c["page_table"], c["req_ids"], c["n_visible"], P, split_pages=True)
    return c["qI"], c["w"], kv


def named(calls, name):
    return [c.args for c in calls if c.name == name]


# ---------------------------------------------------------------- indexer: Full scan


def test_full_topk_decode_arguments_and_result(libs):
    qI, w, kv = split_case(T=5, B=3, n_max=300, seed=1)
    geo = IndexerGeometry(topk=40, pool_blocks=16, block=8)
    ids = indexer.full_topk(qI, w, kv, geo)
    assert torch.equal(ids, ref.full_topk_ref(qI, w, kv, geo))  # fp32 logits: exact
    (meta,) = named(libs.dg, "get_paged_mqa_logits_metadata")
    (call,) = named(libs.dg, "fp8_fp4_paged_mqa_logits")
    T, HI = qI.shape[:2]
    q_fp, q_sf = call["q"]
    assert (q_fp.shape, q_fp.dtype, q_sf.shape, q_sf.dtype) == (
        (T, 1, HI, 64),
        torch.int8,
        (T, 1, HI),
        torch.int32,
    )
    # the query bytes decode back to the FP4 values exactly
    q_rec = torch.cat((q_fp.view(torch.uint8), q_sf.view(torch.uint8).view(T, 1, HI, 4)), -1)
    assert torch.equal(unpack_index_k(q_rec)[:, 0], qI.float())
    cache = call["kv_cache"]
    assert cache.shape == (kv.index_k.shape[0], P, 1, 68)
    assert cache.stride() == (P * 68, 68, 68, 1) and cache.data_ptr() == kv.index_k.data_ptr()
    assert torch.equal(call["context_lens"], kv.n_visible.view(T, 1))
    assert torch.equal(call["block_table"], kv.page_table[kv.req_ids.long()])
    assert call["max_context_len"] == kv.max_entries and call["clean_logits"] is False
    assert call["weights"].dtype == torch.float32 and torch.equal(call["weights"], w)
    assert call["logits_dtype"] == torch.float32
    assert meta["block_kv"] == P and meta["num_sms"] == standin.NUM_SMS
    assert meta["context_lens"] is call["context_lens"] or torch.equal(
        meta["context_lens"], call["context_lens"]
    )


def test_full_topk_prefill_uses_the_flat_kernel(libs):
    T = sm100.FLAT_MIN_ROWS + 6
    pos = torch.arange(200, 200 + T)
    qI, w, kv = split_case(T=T, B=2, n_max=300, seed=2, n_visible=(pos + 1) // 2)
    geo = IndexerGeometry(topk=32, pool_blocks=8, block=8)
    assert torch.equal(indexer.full_topk(qI, w, kv, geo), ref.full_topk_ref(qI, w, kv, geo))
    assert named(libs.dg, "fp8_fp4_paged_mqa_logits") == []
    (call,) = named(libs.dg, "fp8_fp4_mqa_logits")
    N = kv.max_entries
    assert torch.equal(call["starts"], kv.req_ids * N)
    assert torch.equal(call["ends"], kv.req_ids * N + kv.n_visible)
    assert call["max_seqlen_k"] == N and call["clean_logits"] is False
    kv_fp, kv_sf = call["kv"]
    assert kv_fp.shape == (kv.page_table.shape[0] * N, 64) and kv_sf.shape == (kv_fp.shape[0],)


def test_candidate_source_arguments_and_result(libs):
    qI, w, kv = split_case(T=6, B=2, n_max=380, seed=3)
    geo = IndexerGeometry(topk=24, pool_blocks=18, block=8)  # 18: padded to 20 for DeepGEMM
    ids, pool = indexer.candidate_source(qI, w, kv, geo)
    rids, rpool = ref.candidate_source_ref(qI, w, kv, geo)
    assert torch.equal(ids, rids) and torch.equal(pool, rpool)
    assert pool.shape == (6, 18) and pool.dtype == torch.int32


# ---------------------------------------------------------------- indexer: Reindex


def _reindex_case(seed, T=6, pool_blocks=18):
    qI, w, kv = split_case(T=T, B=2, n_max=380, seed=seed)
    geo = IndexerGeometry(topk=24, pool_blocks=pool_blocks, block=8)
    src_q, src_w, _ = split_case(T=T, B=2, n_max=380, seed=seed + 50)  # the source's queries
    pool = ref.candidate_source_ref(src_q, src_w, kv, geo)[1]
    # the sparse kernel takes bf16 head weights: make them bf16-exact, so the reference sees the
    # same weights and an exact comparison is meaningful
    return qI, w.to(torch.bfloat16).float(), kv, geo, pool


def test_reindex_arguments_and_exact_result(libs, monkeypatch):
    qI, w, kv, geo, pool = _reindex_case(seed=4)
    # strict: a stand-in returning fp32 logits must give the reference's sets exactly
    sys_modules = __import__("sys").modules
    monkeypatch.setitem(
        sys_modules, "deep_gemm", standin.deep_gemm(libs.dg, sparse_logits_dtype=torch.float32)
    )
    ids = indexer.reindex(qI, w, kv, pool, geo)
    assert torch.equal(ids, ref.reindex_ref(qI, w, kv, pool, geo))
    (meta,) = named(libs.dg, "get_paged_sparse_mqa_logits_metadata")
    (call,) = named(libs.dg, "fp8_fp4_paged_sparse_mqa_logits")
    T = qI.shape[0]
    blocks = meta["blocks"]
    assert blocks.shape == (T, 20) and blocks.dtype == torch.int32  # 18 -> multiple of 4
    for t in range(T):
        want = sorted(b for b in pool[t].tolist() if b >= 0)
        live = len(want)
        assert blocks[t].tolist() == want + [INT32_MAX] * (20 - live)
        assert int(meta["context_lens"][t]) == 8 * live  # DeepGEMM then reads `live` ids
    assert torch.equal(meta["block_table"], kv.page_table[kv.req_ids.long()])
    assert meta["page_kv"] == P and meta["sparse_block_kv"] == 8 and meta["qk_dtype"] == torch.int8
    assert torch.equal(meta["indices"], sm100.pair_ids(kv.req_ids))
    assert call["num_max_sparse_blocks"] == 20 and call["sparse_block_kv"] == 8
    assert call["weights"].dtype == torch.bfloat16
    assert torch.equal(call["weights"], w.to(torch.bfloat16))
    assert call["kv_cache"].stride(0) % 512 == 0 and call["metadata"] is not None


def test_reindex_with_documented_bf16_logits(libs):
    """bf16 logits (as documented) may reorder near-ties: sets equal up to bf16 rounding."""
    qI, w, kv, geo, pool = _reindex_case(seed=5)
    ids = indexer.reindex(qI, w, kv, pool, geo)
    rids = ref.reindex_ref(qI, w, kv, pool, geo)
    key = tt.pool_key(ref.paged_scores(qI, w, kv), pool)
    finite = torch.where(key > float("-inf"), key.abs(), torch.zeros_like(key))
    tol = finite.amax(1) * 2.0**-7  # bf16 logits and bf16 weights: a few ulps of the largest
    tt.check_selection(ids, rids, key, tol, "reindex")


def test_reindex_pool_with_holes_and_duplicates(libs, monkeypatch):
    """-1 holes and a repeated block: DeepGEMM gets only distinct live ids, ascending."""
    qI, w, kv, geo, pool = _reindex_case(seed=6)
    pool = pool.clone()
    pool[0, 1] = -1
    pool[1, 2] = pool[1, 0]
    monkeypatch.setitem(
        __import__("sys").modules,
        "deep_gemm",
        standin.deep_gemm(libs.dg, sparse_logits_dtype=torch.float32),
    )
    assert torch.equal(indexer.reindex(qI, w, kv, pool, geo), ref.reindex_ref(qI, w, kv, pool, geo))


# ---------------------------------------------------------------- indexer: SGLang's call sites


def test_sglang_call_sites_build_the_same_operands(libs):
    """SGLang's own DeepGEMM wrappers and operand builders, run on CPU against the same stand-in
    for the same batch, pass the operands our SM100 path passes."""
    common = pytest.importorskip("sglang.test.kernels.deepseek_v4.common")
    index_logits = pytest.importorskip("sglang.kernels.ops.attention.dsv4.index_logits")
    candidate_table = pytest.importorskip("sglang.kernels.ops.attention.dsv4.candidate_table")
    scoring = pytest.importorskip("sglang.srt.layers.attention.dsv4.v41_indexer.scoring")
    sparse_table = pytest.importorskip("sglang.srt.layers.attention.dsv4.v41_indexer.sparse_table")

    T = 6  # 20 candidate blocks, a multiple of 4 as SGLang's 2048 (its call reads
    # min(NB, ceil(n_visible / 8)) ids, so it needs NB to need no padding)
    qI, w, kv, geo, pool = _reindex_case(seed=8, T=T, pool_blocks=20)
    kv = PagedIndexK(  # rows of a request consecutive, as SGLang lays out a batch
        kv.index_k,
        kv.page_table,
        torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32),
        kv.n_visible,
        P,
        split_pages=True,
    )
    HI = qI.shape[1]
    indexer.full_topk(qI, w, kv, geo)
    indexer.reindex(qI, w, kv, pool, geo)
    ours = {c.name: c.args for c in libs.dg}
    libs.dg.clear()

    # queries: SGLang's torch packer (same scale and +0 rules; FP4 values round-trip unchanged)
    q_fp4, q_sf = common.quantize_fp4_indexer_ref(qI.float().reshape(T * HI, 128))
    q_fp4, q_sf = q_fp4.view(torch.int8).view(T, 1, HI, 64), q_sf.view(T, 1, HI)
    assert torch.equal(q_fp4, ours["fp8_fp4_paged_mqa_logits"]["q"][0])
    assert torch.equal(q_sf, ours["fp8_fp4_paged_mqa_logits"]["q"][1])
    # the index-K pool as SGLang views it
    pool_ns = types.SimpleNamespace(get_index_k_with_scale_buffer=lambda layer: kv.index_k)
    k_cache = scoring.get_index_k_cache(token_to_kv_pool=pool_ns, layer_id=0, page_size=P)
    table = kv.page_table[kv.req_ids.long()].contiguous()
    data = scoring.DeepGEMMDecodeData(q_fp4, q_sf, w, k_cache)
    meta_ns = types.SimpleNamespace(
        rows_per_request=1, compressed_seq_lens=kv.n_visible, page_table=table
    )
    q, lens, tab = data.paged_logits_args(meta_ns)
    index_logits.deep_gemm_fp4_paged_mqa_logits(
        q,
        k_cache,
        w,
        lens,
        tab,
        ours["fp8_fp4_paged_mqa_logits"]["schedule_meta"],
        kv.max_entries,
    )
    theirs = named(libs.dg, "fp8_fp4_paged_mqa_logits")[0]
    mine = ours["fp8_fp4_paged_mqa_logits"]
    for key in ("context_lens", "block_table", "weights"):
        assert torch.equal(theirs[key], mine[key]), key
        assert theirs[key].dtype == mine[key].dtype, key
    for key in ("max_context_len", "clean_logits", "logits_dtype"):
        assert theirs[key] == mine[key], key
    assert theirs["kv_cache"].shape == mine["kv_cache"].shape
    assert theirs["kv_cache"].stride() == mine["kv_cache"].stride()
    assert theirs["kv_cache"].data_ptr() == mine["kv_cache"].data_ptr()

    # the sparse table: SGLang's sorted blocks (sort_candidate_blocks' documented result), its
    # row-pair ids and its schedule / logits wrappers
    blocks = torch.where(pool >= 0, pool, torch.full_like(pool, INT32_MAX)).sort(1).values
    blocks = blocks.to(torch.int32).contiguous()
    req_pairs = sparse_table._row_pair_ids([3, 3], device=torch.device("cpu"))
    assert torch.equal(req_pairs, sm100.pair_ids(kv.req_ids))
    schedule = candidate_table.build_sparse_indexer_schedule(
        blocks, kv.n_visible, table, P, q_fp4.dtype, req_pairs
    )
    index_logits.sparse_logits(q_fp4, q_sf, k_cache, w.to(torch.bfloat16), schedule, 20)
    t_meta = named(libs.dg, "get_paged_sparse_mqa_logits_metadata")[0]
    m_meta = ours["get_paged_sparse_mqa_logits_metadata"]
    for key in ("block_table", "indices", "blocks"):
        assert torch.equal(t_meta[key], m_meta[key]), key
    for key in ("page_kv", "qk_dtype", "sparse_block_kv"):
        assert t_meta[key] == m_meta[key], key
    # SGLang passes the visible length, we pass 8 x the live blocks: the same ids are read
    nb = lambda c: [min(20, -(-int(x) // 8)) for x in c.tolist()]  # noqa: E731
    assert nb(t_meta["context_lens"]) == nb(m_meta["context_lens"])
    t_call = named(libs.dg, "fp8_fp4_paged_sparse_mqa_logits")[0]
    m_call = ours["fp8_fp4_paged_sparse_mqa_logits"]
    assert torch.equal(t_call["q"][0], m_call["q"][0]) and torch.equal(
        t_call["q"][1], m_call["q"][1]
    )
    assert torch.equal(t_call["weights"], m_call["weights"])
    assert t_call["kv_cache"].stride() == m_call["kv_cache"].stride()
    for key in ("num_max_sparse_blocks", "sparse_block_kv"):
        assert t_call[key] == m_call[key], key


# ---------------------------------------------------------------- attention


def attn_case(T, H=64, W=12, TOPK=20, layout=Layout.V41_FP4, paged=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    D, S = 512, 96
    swa = pack(Layout.V41, torch.randn(S, D, generator=g) * 2)
    kvc = pack(layout, torch.randn(S, D, generator=g) * 2)
    if paged:
        swa = swa.view(S // 32, 32, -1)
    sw = torch.randint(0, S, (T, W), generator=g, dtype=torch.int32)
    tk = torch.randint(0, S, (T, TOPK), generator=g, dtype=torch.int32)
    sw[0, :3] = -1
    tk[1, 7:] = -1
    sw[2] = -1
    tk[2] = -1  # sees nothing
    q = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    sink = torch.randn(H, generator=g)
    return q, SparseKV(swa, sw, kvc, tk, layout), sink


@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("paged", [False, True])
def test_flash_mla_decode_arguments_and_output(libs, layout, paged):
    q, kv, sink = attn_case(5, layout=layout, paged=paged)
    out = sparse_attention(q, kv, sink, out_dtype=torch.float32)
    want = sparse_attention_ref(q, kv, sink, None, torch.float32)
    assert torch.equal(out, want.to(torch.bfloat16).float())  # the kernel returns bf16
    assert (out[2] == 0).all()
    (call,) = named(libs.mla, "flash_mla_with_kvcache")
    T, H, D = q.shape
    assert call["q"].shape == (T, 1, H, D) and call["q"].dtype == torch.bfloat16
    k_cache = call["k_cache"]
    assert k_cache.shape == ((3, 32, 1, 528) if paged else (96, 1, 1, 528))
    assert k_cache.data_ptr() == kv.swa_cache.data_ptr()
    assert torch.equal(call["indices"], kv.swa_slots.view(T, 1, -1))
    nbytes = 288 if layout is Layout.V41_FP4 else 528
    assert call["extra_k_cache"].shape == (96, 1, 1, nbytes)
    assert torch.equal(call["extra_indices"], kv.topk_slots.view(T, 1, -1))
    assert call["indices"].dtype == call["extra_indices"].dtype == torch.int32
    assert call["softmax_scale"] == D**-0.5 and call["head_dim_v"] == D
    assert call["is_fp8_kvcache"] is True and call["causal"] is False
    assert torch.equal(call["attn_sink"], sink) and call["attn_sink"].dtype == torch.float32
    assert isinstance(call["sched"], standin.SchedMeta)


def test_flash_mla_swa_only_layer(libs):
    q, kv, sink = attn_case(4)
    swa_only = SparseKV(kv.swa_cache, kv.swa_slots, None, None, Layout.V41_FP4)
    out = sparse_attention(q, swa_only, None, out_dtype=torch.float32)
    assert torch.equal(out, sparse_attention_ref(q, swa_only, None).to(torch.bfloat16).float())
    (call,) = named(libs.mla, "flash_mla_with_kvcache")
    assert call["extra_k_cache"] is None and call["attn_sink"] is None


@pytest.mark.triton_interpret
def test_flash_mla_prefill_arguments_and_output(libs):
    """Prefill: flash_mla_sparse_fwd over the SM90 route's workspace (triton_workspace, run by
    the Triton interpreter here): each referenced record once, lists padded to 64."""
    T = attn_sm100.PREFILL_MIN_TOKENS + 4
    q, kv, sink = attn_case(T, W=6, TOPK=10)
    out = sparse_attention(q, kv, sink)
    assert out.dtype == torch.bfloat16
    assert torch.equal(
        out, sparse_attention_ref(q, kv, sink, None, torch.float32).to(torch.bfloat16)
    )
    assert named(libs.mla, "flash_mla_with_kvcache") == []
    (call,) = named(libs.mla, "flash_mla_sparse_fwd")
    ws, idx = call["kv"], call["indices"]
    assert ws.dtype == torch.bfloat16 and ws.shape[1:] == (1, 512)
    assert idx.shape == (T, 1, 64) and idx.dtype == torch.int32
    slots = torch.cat((kv.swa_slots, kv.topk_slots), 1)
    n_ref = len(set(kv.swa_slots[kv.swa_slots >= 0].tolist())) + len(
        set(kv.topk_slots[kv.topk_slots >= 0].tolist())
    )
    assert n_ref + 1 <= ws.shape[0] <= 2 * 96 + 1  # each referenced record once, a zero row
    seen = (slots >= 0).any(dim=1)
    assert torch.equal(idx[seen, 0, :16] < 0, slots[seen] < 0) and (idx[:, 0, 16:] < 0).all()
    assert call["sm_scale"] == 512**-0.5 and call["d_v"] == 512


# ---------------------------------------------------------------- dispatch and page sizes


def test_missing_or_old_library_falls_back_to_triton_once(monkeypatch, caplog):
    sys_modules = __import__("sys").modules
    monkeypatch.setattr(dispatch, "device_paths", lambda device: (Path.SM100, Path.TRITON))
    monkeypatch.delenv("DSV41_KERNEL_PATH", raising=False)
    monkeypatch.delenv("DSV41_FORCE_FAST", raising=False)
    qI, w, split = split_case(T=2, B=1, n_max=200, seed=9)
    # the pool as it is without DeepGEMM: one record per slot (index_page_size 1)
    kv = PagedIndexK(
        split.index_k.view(-1, 68), split.page_table, split.req_ids, split.n_visible, P, False
    )
    geo = IndexerGeometry(topk=8, pool_blocks=8, block=8)
    old = standin.deep_gemm([])
    old.__version__ = "0.2.1"
    cases = (
        (None, "deep_gemm is not importable"),
        (types.ModuleType("deep_gemm"), "lacks"),
        (old, "deep_gemm 0.2.1 is older than 0.2.3"),
    )
    for mod, why in cases:
        monkeypatch.setitem(sys_modules, "deep_gemm", mod)
        sm100.missing.cache_clear()
        dispatch.log_once.cache_clear()
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                assert indexer._path("reindex", qI, kv, geo) is Path.TRITON
        lines = [r.getMessage() for r in caplog.records if r.name == "sglang_dsv41.kernels"]
        assert len(lines) == 1 and why in lines[0] and "running triton" in lines[0], lines
        caplog.clear()
    monkeypatch.setenv("DSV41_KERNEL_PATH", "sm100")
    with pytest.raises(RuntimeError, match="sm100: deep_gemm"):
        indexer._path("reindex", qI, kv, geo)
    sm100.missing.cache_clear()


def test_unsupported_configurations_name_the_reason(libs):
    qI, w, kv = split_case(T=2, B=1, n_max=200, seed=10)
    geo = IndexerGeometry(topk=8, pool_blocks=8, block=8)
    records = PagedIndexK(
        kv.index_k.view(-1, 68), kv.page_table * 0, kv.req_ids, kv.n_visible, 1, split_pages=False
    )
    assert "split pages of 128" in sm100.unsupported("full_topk", qI, records, geo)
    assert "16 index heads" not in (sm100.unsupported("full_topk", qI[:, :16], kv, geo) or "")
    assert "8 index heads" in sm100.unsupported("full_topk", qI[:, :8], kv, geo)
    g4 = IndexerGeometry(topk=8, pool_blocks=8, block=4)
    assert "candidate blocks of 4" in sm100.unsupported("reindex", qI, kv, g4)
    big = IndexerGeometry(topk=8, pool_blocks=5000, block=8)
    assert "5000 candidate blocks" in sm100.unsupported("reindex", qI, kv, big)
    with pytest.raises(RuntimeError, match="sm100: 8 index heads"):
        indexer.full_topk(qI[:, :8].contiguous(), w[:, :8], kv, geo)
    q, akv, sink = attn_case(3)
    assert "queries in torch.float32" in attn_sm100.unsupported(q.float(), akv)
    assert "32 query heads" in attn_sm100.unsupported(q[:, :32], akv)


def test_index_page_size(monkeypatch, libs):
    cpu = torch.device("cpu")
    assert dispatch.index_page_size(cpu) == P  # stand-in deep_gemm on an 'SM100 device'
    monkeypatch.setenv("DSV41_KERNEL_PATH", "triton")
    assert dispatch.index_page_size(cpu) == 1
    monkeypatch.delenv("DSV41_KERNEL_PATH")
    monkeypatch.setitem(__import__("sys").modules, "deep_gemm", None)
    sm100.missing.cache_clear()
    assert dispatch.index_page_size(cpu) == 1
    monkeypatch.setattr(dispatch, "device_paths", lambda device: (Path.TRITON,))
    assert dispatch.index_page_size(cpu) == 1


# ---------------------------------------------------------------- the stand-ins can fail


def test_standins_reject_perturbed_arguments(libs):
    qI, w, kv, geo, pool = _reindex_case(seed=11)
    dg = __import__("sys").modules["deep_gemm"]
    q = sm100.pack_queries(qI)
    table = sm100.row_tables(kv)
    blocks, live = sm100.sparse_blocks(pool, kv, 8)
    ids = sm100.pair_ids(kv.req_ids)
    meta = dg.get_paged_sparse_mqa_logits_metadata(live * 8, table, ids, P, blocks, torch.int8, 8)
    cache = sm100.kv_cache_view(kv)
    wb = w.to(torch.bfloat16)
    dg.fp8_fp4_paged_sparse_mqa_logits(q, cache, wb, meta, 20, 8)  # as built: accepted
    bad = {
        "64-slot pages (stride 4352 B)": lambda: dg.fp8_fp4_paged_sparse_mqa_logits(
            q, kv.index_k.view(-1, 64, 1, 68), wb, meta, 20, 8
        ),
        "fp32 weights": lambda: dg.fp8_fp4_paged_sparse_mqa_logits(q, cache, w, meta, 20, 8),
        "unsorted blocks": lambda: dg.get_paged_sparse_mqa_logits_metadata(
            live * 8, table, ids, P, blocks.flip(1).contiguous(), torch.int8, 8
        ),
        "NB not a multiple of 4": lambda: dg.get_paged_sparse_mqa_logits_metadata(
            live * 8, table, ids, P, blocks[:, :18].contiguous(), torch.int8, 8
        ),
        "rows of two requests paired": lambda: dg.get_paged_sparse_mqa_logits_metadata(
            live * 8, table, torch.zeros(6, dtype=torch.int32), P, blocks, torch.int8, 8
        ),
    }
    for name, call in bad.items():
        with pytest.raises(AssertionError, match="contract"):
            call()
            pytest.fail(f"accepted {name}")
    mla = __import__("sys").modules["flash_mla"]
    qa, akv, sink = attn_case(3)
    with pytest.raises(AssertionError, match="indices are -1 or a token"):
        mla.flash_mla_with_kvcache(
            q=qa.view(3, 1, 64, 512),
            k_cache=akv.swa_cache.view(-1, 1, 1, 528),
            block_table=None,
            cache_seqlens=None,
            head_dim_v=512,
            tile_scheduler_metadata=standin.SchedMeta(),
            indices=(akv.swa_slots + 1000).view(3, 1, -1),
        )


@pytest.mark.triton_interpret
def test_b200_check_logic_against_the_standins(libs, monkeypatch):
    """kernels/sm100_check.py's indexer and attention checks, at small sizes, on the stand-ins:
    its own logic is sound (the script itself only means something on a B200). Under the
    Triton interpreter: the sparse prefill builds its workspace with the Triton kernels."""
    from sglang_dsv41.kernels import sm100_check

    monkeypatch.setattr(sm100_check, "SIZES", {"decode": (3, 2, 300), "prefill": (2, 1, 400)})
    notes = []
    with torch.no_grad():
        sm100_check._indexer_checks(torch.device("cpu"), notes)
        sm100_check._attention_checks(torch.device("cpu"), notes)
    assert len(notes) == 6, notes
    names = {c.name for c in libs.dg + libs.mla}
    assert {"fp8_fp4_paged_mqa_logits", "fp8_fp4_mqa_logits", "flash_mla_sparse_fwd"} <= names
    assert {"fp8_fp4_paged_sparse_mqa_logits", "flash_mla_with_kvcache"} <= names
