"""The `flash_mla` stand-in: V4.1 sparse decode (`flash_mla_with_kvcache`) and sparse prefill
(`flash_mla_sparse_fwd`), checked against `flash_mla_interface`'s docstrings."""

from __future__ import annotations

import types

import torch

from sglang_dsv41.kernels.testing_sm100.common import Call, _need
from sglang_dsv41.kv.records import Layout, record_dim, unpack
from sglang_dsv41.layers.sparse_attention import sparse_attention


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
