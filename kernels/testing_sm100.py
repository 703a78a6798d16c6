"""Recording stand-ins for `deep_gemm` and `flash_mla`, for the SM100 contract tests on CPU.

Each stand-in function (1) records its arguments, (2) checks them against the library's
documented contract: the host checks DeepGEMM compiles in (sgl-deep-gemm 0.2.3's
csrc/apis/attention.hpp assertions), the scheduler's reading of the block lists, and
FlashMLA's `flash_mla_interface` docstrings, raising AssertionError naming the rule, and (3)
returns what the documented kernel computes, evaluated with this package's reference math
(records decoded by kv.records through the arguments exactly as the library addresses them).
A call whose arguments address the wrong bytes therefore returns the wrong numbers.

These are contract tests, never hardware tests: they cannot show that the real kernels agree
with their documentation. `kernels.sm100_check` (scripts/b200_check.sh) does that on a B200.
"""

from __future__ import annotations

import dataclasses
import types

import torch

from sglang_dsv41.kv.records import Layout, record_dim, unpack, unpack_index_k
from sglang_dsv41.layers.index_math import index_scores
from sglang_dsv41.layers.sparse_attention import sparse_attention

NUM_SMS = 148  # a B200
SPLIT_KV = 256  # DeepGEMM pads logits rows to a multiple of this


def _need(ok, rule: str) -> None:
    if not ok:
        raise AssertionError(f"contract: {rule}")


def _garbage_rows(rows: int, cols: int, dtype) -> torch.Tensor:
    """[rows, cols] logits as DeepGEMM allocates them (row stride padded to SPLIT_KV), NaN where
    the kernel writes nothing (clean_logits=False leaves those unspecified)."""
    full = torch.full((rows, -(-cols // SPLIT_KV) * SPLIT_KV), float("nan"), dtype=dtype)
    return full[:, :cols]


def _queries(q_fp: torch.Tensor, q_sf: torch.Tensor) -> torch.Tensor:
    """Packed FP4 queries int8 [..., H, 64] + int32 [..., H] -> fp32 [..., H, 128]."""
    rec = torch.cat(
        (q_fp.view(torch.uint8), q_sf.contiguous().view(torch.uint8).view(*q_sf.shape, 4)), -1
    )
    return unpack_index_k(rec)


def _paged_record(cache: torch.Tensor, page: int, off: int) -> torch.Tensor:
    """Record (uint8 [68]) at (page, offset) of a fused [pages, P, 1, 68] cache whose pages are
    split (P x 64 value bytes, then P x 4 scale bytes), addressed through its strides."""
    P = cache.shape[1]
    base = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))[page]
    return torch.cat(
        (base[off * 64 : off * 64 + 64], base[P * 64 + off * 4 : P * 64 + off * 4 + 4])
    )


def _scores(
    q_row: torch.Tensor, w_row: torch.Tensor, keys: torch.Tensor, width: int
) -> torch.Tensor:
    """Scores fp32 [width] of one query (q [1, H, 128], w [1, H]) against keys [n <= width,
    128], the keys zero-padded to `width` rows: the reference scores a row against all its
    addressable entries at once, and a matmul's rounding may depend on its shape."""
    pad = torch.zeros(width - keys.shape[0], keys.shape[1], dtype=keys.dtype)
    return index_scores(q_row, w_row.float(), torch.cat((keys, pad)))[0]


def _row_keys(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """Keys fp32 [n, 128] of entries 0..n-1 through a page-table row (page -1: zeros)."""
    P = cache.shape[1]
    recs = []
    for s in range(n):
        page = int(table_row[s // P])
        _need(page < cache.shape[0], f"entry {s}: page {page} inside the cache")
        rec = _paged_record(cache, page, s % P) if page >= 0 else torch.zeros(68, dtype=torch.uint8)
        recs.append(rec)
    return unpack_index_k(torch.stack(recs)) if recs else torch.zeros(0, 128)


@dataclasses.dataclass
class Call:
    name: str
    args: dict


def deep_gemm(calls: list, sparse_logits_dtype=torch.bfloat16) -> types.ModuleType:
    """A `deep_gemm` module that records into `calls` (a list of Call)."""
    m = types.ModuleType("deep_gemm")
    m.__version__ = "0.2.3.post2 (stand-in)"
    tables: dict[int, dict] = {}

    def get_num_sms():
        return NUM_SMS

    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
        calls.append(
            Call(
                "get_paged_mqa_logits_metadata",
                dict(
                    context_lens=context_lens, block_kv=block_kv, num_sms=num_sms, indices=indices
                ),
            )
        )
        _need(context_lens.dim() == 2, "context_lens.dim() == 2")
        _need(
            context_lens.dtype == torch.int32 and context_lens.is_contiguous(),
            "context_lens int32, contiguous",
        )
        _need(block_kv in (32, 64, 128), "arch 10: block_kv in (32, 64, 128)")
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(
        q,
        kv_cache,
        weights,
        context_lens,
        block_table,
        schedule_meta,
        max_context_len,
        clean_logits=False,
        logits_dtype=torch.float,
        indices=None,
    ):
        calls.append(
            Call(
                "fp8_fp4_paged_mqa_logits",
                dict(
                    q=q,
                    kv_cache=kv_cache,
                    weights=weights,
                    context_lens=context_lens,
                    block_table=block_table,
                    schedule_meta=schedule_meta,
                    max_context_len=max_context_len,
                    clean_logits=clean_logits,
                    logits_dtype=logits_dtype,
                    indices=indices,
                ),
            )
        )
        q_fp, q_sf = q
        _need(q_sf is not None, "FP4 queries come with q_sf")
        B, n, H, half = q_fp.shape
        _need(n >= 1 and H in (16, 32, 64) and half * 2 == 128, "q [B, next_n, H in 16/32/64, 64]")
        _need(q_fp.dtype == torch.int8 and q_fp.is_contiguous(), "q int8 (packed FP4), contiguous")
        _need(
            tuple(q_sf.shape) == (B, n, H) and q_sf.dtype == torch.int32 and q_sf.is_contiguous(),
            "q_sf int32 [B, next_n, H], contiguous",
        )
        nb, bkv, hk, width = kv_cache.shape
        _need(
            bkv in (32, 64, 128) and hk == 1 and width == 68, "kv_cache [blocks, 32/64/128, 1, 68]"
        )
        _need(
            kv_cache.stride(1) == 68 and kv_cache.stride(3) == 1,
            "kv_cache stride(1) == 68, stride(3) == 1",
        )
        _need(
            kv_cache.dtype == torch.uint8 and kv_cache.stride(0) % 4 == 0,
            "kv_cache uint8, stride(0) % 4",
        )
        _need(
            tuple(weights.shape) == (B * n, H) and weights.stride(1) == 1, "weights [B * next_n, H]"
        )
        _need(
            weights.dtype == torch.float32 or logits_dtype == torch.bfloat16,
            "bf16 weights only with bf16 logits",
        )
        _need(block_table.dim() == 2 and block_table.shape[0] == B, "block_table [B, max_blocks]")
        _need(
            block_table.dtype == torch.int32 and block_table.stride(1) == 1,
            "block_table int32, stride(1) 1",
        )
        _need(
            tuple(schedule_meta.shape) == (NUM_SMS + 1, 2) and schedule_meta.dtype == torch.int32,
            "schedule_meta [num_sms + 1, 2] int32",
        )
        _need(
            tuple(context_lens.shape) == (B, n)
            and context_lens.dtype == torch.int32
            and context_lens.is_contiguous(),
            "context_lens int32 [B, next_n], contiguous",
        )
        _need(logits_dtype in (torch.float32, torch.bfloat16), "logits fp32 or bf16")
        _need(n == 1, "stand-in: next_n == 1")
        qv = _queries(q_fp, q_sf)[:, 0]  # [B, H, 128]
        out = _garbage_rows(B, max_context_len, logits_dtype)
        for b in range(B):
            n_ctx = int(context_lens[b, 0])
            _need(n_ctx <= max_context_len, "context_lens <= max_context_len")
            for s in range(n_ctx):
                page = int(block_table[b, s // bkv])
                _need(0 <= page < nb, f"row {b} entry {s}: block_table page {page} in range")
            k = _row_keys(kv_cache, block_table[b], max_context_len)
            sc = _scores(qv[b : b + 1], weights[b : b + 1], k, max_context_len)
            out[b, :n_ctx] = sc[:n_ctx].to(logits_dtype)
        return out

    def fp8_fp4_mqa_logits(
        q,
        kv,
        weights,
        cu_seq_len_k_start,
        cu_seq_len_k_end,
        clean_logits=False,
        max_seqlen_k=0,
        logits_dtype=torch.float,
        schedule_meta=None,
    ):
        calls.append(
            Call(
                "fp8_fp4_mqa_logits",
                dict(
                    q=q,
                    kv=kv,
                    weights=weights,
                    starts=cu_seq_len_k_start,
                    ends=cu_seq_len_k_end,
                    clean_logits=clean_logits,
                    max_seqlen_k=max_seqlen_k,
                    logits_dtype=logits_dtype,
                ),
            )
        )
        (q_fp, q_sf), (kv_fp, kv_sf) = q, kv
        T, H, half = q_fp.shape
        _need(H in (16, 32, 64) and half * 2 == 128, "q [T, H in 16/32/64, 64]")
        _need(q_fp.dtype == torch.int8 and q_fp.is_contiguous(), "q int8, contiguous")
        _need(
            tuple(q_sf.shape) == (T, H) and q_sf.dtype == torch.int32 and q_sf.is_contiguous(),
            "q_sf int32 [T, H]",
        )
        N, kv_half = kv_fp.shape
        _need(
            kv_half == half and kv_fp.dtype == torch.int8 and kv_fp.is_contiguous(),
            "kv int8 [N, 64], contiguous",
        )
        _need(
            tuple(kv_sf.shape) == (N,) and kv_sf.dtype == torch.int32 and kv_sf.is_contiguous(),
            "kv_sf int32 [N]",
        )
        _need(tuple(weights.shape) == (T, H) and weights.stride(1) == 1, "weights [T, H]")
        _need(
            weights.dtype == torch.float32 or logits_dtype == torch.bfloat16,
            "bf16 weights only with bf16 logits",
        )
        for name, t in (
            ("cu_seq_len_k_start", cu_seq_len_k_start),
            ("cu_seq_len_k_end", cu_seq_len_k_end),
        ):
            _need(
                tuple(t.shape) == (T,) and t.dtype == torch.int32 and t.is_contiguous(),
                f"{name} int32 [T]",
            )
        _need(
            max_seqlen_k > 0 and not clean_logits, "with max_seqlen_k, clean_logits must be False"
        )
        qv = _queries(q_fp, q_sf)
        keys = unpack_index_k(
            torch.cat((kv_fp.view(torch.uint8), kv_sf.view(torch.uint8).view(N, 4)), 1)
        )
        out = _garbage_rows(T, max_seqlen_k, logits_dtype)
        for t in range(T):
            a, e = int(cu_seq_len_k_start[t]), int(cu_seq_len_k_end[t])
            _need(0 <= a <= e <= N and e - a <= max_seqlen_k, f"row {t}: 0 <= start <= end <= N")
            if e > a:
                k = keys[a : min(N, a + max_seqlen_k)]
                sc = _scores(qv[t : t + 1], weights[t : t + 1], k, max_seqlen_k)
                out[t, : e - a] = sc[: e - a].to(logits_dtype)
        return out

    def get_paged_sparse_mqa_logits_metadata(
        context_lens,
        block_table,
        indices,
        page_kv,
        sparse_kv_block_indices,
        qk_dtype,
        sparse_block_kv,
    ):
        calls.append(
            Call(
                "get_paged_sparse_mqa_logits_metadata",
                dict(
                    context_lens=context_lens,
                    block_table=block_table,
                    indices=indices,
                    page_kv=page_kv,
                    blocks=sparse_kv_block_indices,
                    qk_dtype=qk_dtype,
                    sparse_block_kv=sparse_block_kv,
                ),
            )
        )
        T = context_lens.numel()
        blocks = sparse_kv_block_indices
        _need(
            T > 0 and context_lens.dtype == torch.int32 and context_lens.is_contiguous(),
            "context_lens int32 [T]",
        )
        _need(
            block_table.dim() == 2
            and block_table.shape[0] == T
            and block_table.shape[1] > 0
            and block_table.dtype == torch.int32
            and block_table.stride(1) == 1,
            "block_table int32 [T, n], stride(1) 1",
        )
        _need(
            indices.dim() == 1
            and indices.shape[0] == T
            and indices.dtype == torch.int32
            and indices.is_contiguous(),
            "indices int32 [T], contiguous",
        )
        _need(page_kv > 0 and page_kv % sparse_block_kv == 0, "page_kv % sparse_block_kv == 0")
        _need(
            blocks.dtype == torch.int32
            and blocks.is_contiguous()
            and blocks.dim() == 2
            and blocks.shape[0] == T,
            "sparse_kv_block_indices int32 [T, NB], contiguous",
        )
        NB = blocks.shape[1]
        _need(NB > 0 and NB % 4 == 0 and NB <= 4096, "NB % 4 == 0 and NB <= 4096")
        _need(sparse_block_kv in (8, 16), "sparse_block_kv in (8, 16)")
        _need(qk_dtype in (torch.int8, torch.float8_e4m3fn), "qk_dtype packed FP4 (int8) or e4m3")
        n_blocks = [min(NB, -(-int(c) // sparse_block_kv)) for c in context_lens.tolist()]
        for t in range(T):
            row = blocks[t, : n_blocks[t]].tolist()
            _need(
                all(a < b for a, b in zip(row, row[1:], strict=False)),
                f"row {t}: block ids strictly ascending",
            )
            for b in row:
                page = b * sparse_block_kv // page_kv
                _need(
                    0 <= page < block_table.shape[1] and int(block_table[t, page]) >= 0,
                    f"row {t}: block {b} lies on an allocated page",
                )
            if t + 1 < T and int(indices[t + 1]) == int(indices[t]):
                _need(
                    torch.equal(block_table[t], block_table[t + 1]),
                    f"rows {t}, {t + 1}: paired rows share a page table",
                )
        key = len(tables) + 1
        tables[key] = dict(
            n_blocks=n_blocks,
            blocks=blocks.clone(),
            table=block_table.clone(),
            page_kv=page_kv,
            blk=sparse_block_kv,
            NB=NB,
        )
        meta = torch.zeros(64, dtype=torch.uint8)
        meta[:8] = torch.tensor([key], dtype=torch.int64).view(torch.uint8)
        return meta

    def fp8_fp4_paged_sparse_mqa_logits(
        q, kv_cache, weights, metadata, num_max_sparse_blocks, sparse_block_kv
    ):
        calls.append(
            Call(
                "fp8_fp4_paged_sparse_mqa_logits",
                dict(
                    q=q,
                    kv_cache=kv_cache,
                    weights=weights,
                    metadata=metadata,
                    num_max_sparse_blocks=num_max_sparse_blocks,
                    sparse_block_kv=sparse_block_kv,
                ),
            )
        )
        q_fp, q_sf = q
        T, n, H, half = q_fp.shape
        _need(q_sf is not None, "arch 10: q_sf given")
        _need(T > 0 and n == 1 and half * 2 == 128, "q [T, 1, H, 64]")
        _need(q_fp.dtype == torch.int8 and q_fp.is_contiguous(), "q int8, contiguous")
        _need(
            tuple(q_sf.shape) == (T, 1, H) and q_sf.dtype == torch.int32 and q_sf.is_contiguous(),
            "q_sf int32 [T, 1, H]",
        )
        pages, page_kv, hk, width = kv_cache.shape
        _need(pages > 0 and hk == 1 and width == 68, "fused_kv_cache [pages, page_kv, 1, 68]")
        _need(
            kv_cache.dtype == torch.uint8
            and kv_cache.stride(1) == 68
            and kv_cache.stride(3) == 1
            and kv_cache.stride(0) % 512 == 0,
            "fused_kv_cache uint8, stride(1) 68, stride(0) % 512 == 0",
        )
        _need(
            tuple(weights.shape) == (T, H)
            and weights.dtype == torch.bfloat16
            and weights.stride(1) == 1,
            "weights bf16 [T, H], stride(1) 1",
        )
        _need(
            metadata.dim() == 1 and metadata.dtype == torch.uint8 and metadata.is_contiguous(),
            "metadata uint8 [n]",
        )
        meta = tables[int(metadata[:8].view(torch.int64))]
        _need(
            meta["NB"] == num_max_sparse_blocks and meta["blk"] == sparse_block_kv,
            "NB and block as in the metadata",
        )
        _need(
            meta["page_kv"] == page_kv and page_kv % sparse_block_kv == 0,
            "page_kv as in the metadata",
        )
        blk = sparse_block_kv
        qv = _queries(q_fp, q_sf)[:, 0]
        out = _garbage_rows(T, num_max_sparse_blocks * blk, sparse_logits_dtype)
        for t in range(T):
            nbk = meta["n_blocks"][t]
            if nbk == 0:
                continue
            width = meta["table"].shape[1] * page_kv  # every entry the row's table addresses
            sc = _scores(
                qv[t : t + 1],
                weights[t : t + 1],
                _row_keys(kv_cache, meta["table"][t], width),
                width,
            )
            ent = (meta["blocks"][t, :nbk].long()[:, None] * blk + torch.arange(blk)).flatten()
            out[t, : nbk * blk] = sc[ent].to(sparse_logits_dtype)
        return out

    for f in (
        get_num_sms,
        get_paged_mqa_logits_metadata,
        fp8_fp4_paged_mqa_logits,
        fp8_fp4_mqa_logits,
        get_paged_sparse_mqa_logits_metadata,
        fp8_fp4_paged_sparse_mqa_logits,
    ):
        setattr(m, f.__name__, f)
    return m


class SchedMeta:
    """FlashMLASchedMeta stand-in: empty until the first call fills it."""

    have_initialized = False


def _gather(cache: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens of a [blocks, page, 1, bytes] cache at indices [b, s_q, k] (-1 = invalid):
    (fp32 keys [b * s_q, k, 512], valid [b * s_q, k])."""
    nbytes = cache.shape[-1]
    layout = Layout.V41 if nbytes == 528 else Layout.V41_FP4
    _need(nbytes in (528, 288), "cache bytes per token 528 (V4.1) or 288 (V4.1 fp4)")
    n_tok = cache.shape[0] * cache.shape[1]
    flat = cache.reshape(n_tok, nbytes)
    i = idx.reshape(-1, idx.shape[-1]).long()
    _need(
        bool(((i == -1) | ((i >= 0) & (i < n_tok))).all()), "indices are -1 or a token of the cache"
    )
    k = unpack(layout, flat[i.clamp_min(0)])
    _need(record_dim(layout, nbytes) == 512, "512-d tokens")
    return torch.where((i >= 0)[..., None], k, torch.zeros(())), i >= 0


def flash_mla(calls: list) -> types.ModuleType:
    """A `flash_mla` module that records into `calls`."""
    m = types.ModuleType("flash_mla")
    m.__version__ = "1.0.0 (stand-in)"

    def get_mla_metadata(*args, **kwargs):
        return SchedMeta(), None

    def flash_mla_with_kvcache(
        q,
        k_cache,
        block_table,
        cache_seqlens,
        head_dim_v,
        tile_scheduler_metadata,
        num_splits=None,
        softmax_scale=None,
        causal=False,
        is_fp8_kvcache=None,
        indices=None,
        attn_sink=None,
        extra_k_cache=None,
        extra_indices_in_kvcache=None,
        topk_length=None,
        extra_topk_length=None,
        enable_batch_invariant=False,
        use_legacy=False,
        kv_format=None,
        descale_q=None,
        descale_k=None,
    ):
        calls.append(
            Call(
                "flash_mla_with_kvcache",
                dict(
                    q=q,
                    k_cache=k_cache,
                    head_dim_v=head_dim_v,
                    sched=tile_scheduler_metadata,
                    softmax_scale=softmax_scale,
                    causal=causal,
                    is_fp8_kvcache=is_fp8_kvcache,
                    indices=indices,
                    attn_sink=attn_sink,
                    extra_k_cache=extra_k_cache,
                    extra_indices=extra_indices_in_kvcache,
                    topk_length=topk_length,
                    extra_topk_length=extra_topk_length,
                    use_legacy=use_legacy,
                ),
            )
        )
        b, s_q, h_q, d = q.shape
        _need(
            q.dtype == torch.bfloat16 and d == 512 and h_q in (64, 128),
            "q bf16 [b, s_q, 64 or 128, 512]",
        )
        _need(
            isinstance(tile_scheduler_metadata, SchedMeta) and num_splits is None,
            "a FlashMLASchedMeta, num_splits None",
        )
        _need(
            indices is not None and not causal and is_fp8_kvcache is not False,
            "sparse, not causal, fp8 cache",
        )
        _need(
            head_dim_v == 512 and not use_legacy and kv_format is None,
            "head_dim_v 512, current kernels",
        )
        _need(
            k_cache.dim() == 4 and k_cache.shape[2] == 1 and k_cache.shape[3] == 528,
            "k_cache [blocks, page, 1, 528]",
        )
        _need(k_cache.dtype in (torch.uint8, torch.int8, torch.float8_e4m3fn), "k_cache 8-bit")
        _need(
            indices.dtype == torch.int32 and tuple(indices.shape[:2]) == (b, s_q),
            "indices int32 [b, s_q, topk]",
        )
        _need(
            attn_sink is None
            or (attn_sink.dtype == torch.float32 and tuple(attn_sink.shape) == (h_q,)),
            "attn_sink fp32 [h_q]",
        )
        keys, ok = _gather(k_cache, indices)
        if extra_k_cache is not None:
            _need(
                extra_k_cache.dim() == 4 and extra_k_cache.shape[2] == 1,
                "extra_k_cache [blocks, page, 1, bytes]",
            )
            _need(
                extra_indices_in_kvcache.dtype == torch.int32
                and tuple(extra_indices_in_kvcache.shape[:2]) == (b, s_q),
                "extra indices int32 [b, s_q, k]",
            )
            ek, eok = _gather(extra_k_cache, extra_indices_in_kvcache)
        else:
            ek, eok = keys[:, :0], ok[:, :0]
        sink = attn_sink if attn_sink is not None else torch.full((h_q,), float("-inf"))
        scale = softmax_scale if softmax_scale is not None else d**-0.5
        o = sparse_attention(q.reshape(b * s_q, h_q, d), keys, ok, ek, eok, sink, scale)
        seen = torch.cat((ok, eok), 1).any(1)
        o = torch.where(seen[:, None, None], o, torch.zeros(()))
        return o.to(torch.bfloat16).view(b, s_q, h_q, d), torch.zeros(b, h_q, s_q)

    def flash_mla_sparse_fwd(
        q,
        kv,
        indices,
        sm_scale,
        d_v=512,
        attn_sink=None,
        topk_length=None,
        use_legacy=False,
        return_log2_lse=None,
    ):
        calls.append(
            Call(
                "flash_mla_sparse_fwd",
                dict(
                    q=q,
                    kv=kv,
                    indices=indices,
                    sm_scale=sm_scale,
                    d_v=d_v,
                    attn_sink=attn_sink,
                    topk_length=topk_length,
                ),
            )
        )
        s_q, h_q, d = q.shape
        _need(
            q.dtype == torch.bfloat16 and d == 512 and h_q in (64, 128),
            "q bf16 [s_q, 64 or 128, 512]",
        )
        _need(
            kv.dtype == torch.bfloat16
            and kv.dim() == 3
            and kv.shape[1] == 1
            and kv.shape[2] == 512,
            "kv bf16 [s_kv, 1, 512]",
        )
        _need(
            indices.dtype == torch.int32 and tuple(indices.shape[:2]) == (s_q, 1),
            "indices int32 [s_q, 1, topk]",
        )
        _need(d_v == 512, "d_v 512")
        _need(
            attn_sink is None
            or (attn_sink.dtype == torch.float32 and tuple(attn_sink.shape) == (h_q,)),
            "attn_sink fp32 [h_q]",
        )
        i = indices[:, 0].long()
        ok = (i >= 0) & (i < kv.shape[0])  # invalid: -1 or >= s_kv
        keys = torch.where(
            ok[..., None], kv[i.clamp(0, kv.shape[0] - 1), 0].float(), torch.zeros(())
        )
        sink = attn_sink if attn_sink is not None else torch.full((h_q,), float("-inf"))
        o = sparse_attention(q, keys, ok, keys[:, :0], ok[:, :0], sink, sm_scale)
        o = torch.where(ok.any(1)[:, None, None], o, torch.zeros(()))
        return o.to(torch.bfloat16), torch.zeros(s_q, h_q), torch.zeros(s_q, h_q)

    for f in (get_mla_metadata, flash_mla_with_kvcache, flash_mla_sparse_fwd):
        setattr(m, f.__name__, f)
    return m
