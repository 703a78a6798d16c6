"""The `deep_gemm` stand-in: paged / flat / paged-sparse MQA logits and their metadata, checked
against sgl-deep-gemm 0.2.3's host assertions (csrc/apis/attention.hpp)."""

from __future__ import annotations

import types

import torch

from sglang_dsv41.kernels.testing_sm100.common import (
    NUM_SMS,
    _garbage_rows,
    _need,
    _queries,
    _row_keys,
    _scores,
    recording,
)
from sglang_dsv41.kv.records import unpack_index_k


def deep_gemm(calls: list, sparse_logits_dtype=torch.bfloat16) -> types.ModuleType:
    """A `deep_gemm` module that records into `calls` (a list of Call)."""
    m = types.ModuleType("deep_gemm")
    m.__version__ = "0.2.3.post2 (stand-in)"
    tables: dict[int, dict] = {}

    def get_num_sms():
        return NUM_SMS

    @recording(calls)
    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
        _need(context_lens.dim() == 2, "context_lens.dim() == 2")
        _need(
            context_lens.dtype == torch.int32 and context_lens.is_contiguous(),
            "context_lens int32, contiguous",
        )
        _need(block_kv in (32, 64, 128), "arch 10: block_kv in (32, 64, 128)")
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    @recording(calls)
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

    @recording(calls, cu_seq_len_k_start="starts", cu_seq_len_k_end="ends", schedule_meta=None)
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

    @recording(calls, sparse_kv_block_indices="blocks")
    def get_paged_sparse_mqa_logits_metadata(
        context_lens,
        block_table,
        indices,
        page_kv,
        sparse_kv_block_indices,
        qk_dtype,
        sparse_block_kv,
    ):
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

    @recording(calls)
    def fp8_fp4_paged_sparse_mqa_logits(
        q, kv_cache, weights, metadata, num_max_sparse_blocks, sparse_block_kv
    ):
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
