"""Blackwell (SM100 / SM103) sparse attention on FlashMLA's V4.1 kernels.

Interface and semantics: kernels/sparse_attn/__init__.py (the reference is ref.py). Written
against FlashMLA's documented API (sgl-flash-mla 1.0: `flash_mla_interface` docstrings and
SGLang 0.5.23's call sites) and tested on CPU by contract (tests/cpu/test_sm100_contract.py, a
recording stand-in for `flash_mla`); never run on an SM100 GPU here. `scripts/b200_check.sh`
checks it against the reference on a B200.

    decode (and any call inside a CUDA graph, or with few tokens):
        flash_mla_with_kvcache reads the records natively: the SWA cache as the main cache (V41,
        528 B per token) and the source layer's main KV as the extra cache (V41_FP4 288 B, or V41);
        q [T, 1, H, 512] bf16 (each token is one "batch" row, s_q = 1), indices = our slot lists
        [T, 1, W] / [T, 1, TOPK] (-1 = skip, the kernel's own sentinel), attn_sink fp32 [H].
        Its tile-scheduler metadata is computed on the device by the kernel's first call on a
        fresh FlashMLASchedMeta, so a call is CUDA-graph capturable.
    prefill (T >= PREFILL_MIN_TOKENS, outside graph capture):
        flash_mla_sparse_fwd over a bf16 workspace holding each distinct referenced record once
        (`triton_workspace`, the SM90 route's: dequantized exactly, each token's list as
        workspace rows padded to 64, a token that sees nothing pointed at a zero row), in
        chunks of at most MAX_ROWS rows by the bound min(cache slots, kv.max_slots, T N), or
        sized to the referenced slots where that bound needs chunks (one host sync).

FlashMLA's V4.1 records are this package's records (kv/records.py, byte-identical to SGLang's
writers): per token the data bytes, then the scale bytes. Limits: D = 512, H in (64, 128),
bf16 queries (fp32 queries ask for the exact path, which only the Triton kernel has).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.dispatch import older_than
from sglang_dsv41.kv.records import Layout, record_bytes

HEADS = (64, 128)
HEAD_DIM = 512
PREFILL_MIN_TOKENS = 256
API = ("flash_mla_with_kvcache", "flash_mla_sparse_fwd", "get_mla_metadata")


@functools.cache
def missing() -> str | None:
    """None when flash_mla has the API this path calls, else why not (cached per process)."""
    try:
        import flash_mla
    except Exception as e:  # ImportError, or a CUDA library error raised at import
        return f"flash_mla is not importable ({type(e).__name__}: {e})"
    version = getattr(flash_mla, "__version__", "?")
    absent = [name for name in API if not callable(getattr(flash_mla, name, None))]
    if absent:
        return f"flash_mla {version} lacks {', '.join(absent)} (needs sgl-flash-mla >= 1.0)"
    if older_than(version, (1, 0)):  # the V4.1 record formats
        return f"flash_mla {version} is older than 1.0"
    return None


def unsupported(q: Tensor, kv: SparseKV) -> str | None:
    """None when this path takes the call, else the reason (kernels.dispatch.select)."""
    why = missing()
    if why is not None:
        return why
    T, H, D = q.shape
    if D != HEAD_DIM:
        return f"head dim {D} (FlashMLA's V4.1 kernels need {HEAD_DIM})"
    if H not in HEADS:
        return f"{H} query heads (FlashMLA's V4.1 kernels take {HEADS})"
    if q.dtype != torch.bfloat16:
        return f"queries in {q.dtype} (FlashMLA takes bf16; fp32 asks for the exact path)"
    if kv.swa_slots is None:
        return "no SWA slot list (FlashMLA's main cache is the V41 SWA cache)"
    return None


def _paged(cache: Tensor, nbytes: int) -> Tensor:
    """A cache as FlashMLA's [num_blocks, page_block_size, 1, bytes]: a [num_pages, P, bytes]
    cache keeps its pages, anything else is [S, 1, 1, bytes]. Slot s stays index s."""
    if cache.dim() == 3:
        return cache.view(cache.shape[0], cache.shape[1], 1, nbytes)
    return cache.view(-1, 1, 1, nbytes)


def decode(q: Tensor, kv: SparseKV, attn_sink: Tensor | None, scale: float) -> Tensor:
    """o bf16 [T, H, 512] through flash_mla_with_kvcache."""
    import flash_mla

    T, H, D = q.shape
    extra = extra_idx = None
    if kv.topk_slots is not None:
        extra = _paged(kv.kv_cache, record_bytes(kv.kv_layout, D))
        extra_idx = kv.topk_slots.to(torch.int32).contiguous().view(T, 1, -1)
    sched, _ = flash_mla.get_mla_metadata()
    out, _ = flash_mla.flash_mla_with_kvcache(
        q=q.contiguous().view(T, 1, H, D),
        k_cache=_paged(kv.swa_cache, record_bytes(Layout.V41, D)),
        block_table=None,
        cache_seqlens=None,
        head_dim_v=D,
        tile_scheduler_metadata=sched,
        softmax_scale=scale,
        is_fp8_kvcache=True,
        indices=kv.swa_slots.to(torch.int32).contiguous().view(T, 1, -1),
        attn_sink=None if attn_sink is None else attn_sink.float().contiguous(),
        extra_k_cache=extra,
        extra_indices_in_kvcache=extra_idx,
    )
    return out.view(T, H, D)


def prefill(q: Tensor, kv: SparseKV, attn_sink: Tensor | None, scale: float) -> Tensor:
    """o bf16 [T, H, 512] through flash_mla_sparse_fwd over the workspace of the referenced
    records (`triton_workspace.workspaces`), chunk by chunk."""
    import flash_mla

    from sglang_dsv41.kernels.sparse_attn.triton_workspace import workspaces

    T, H, D = q.shape
    sink = None if attn_sink is None else attn_sink.float().contiguous()
    out = None
    fp4 = kv.kv_layout is Layout.V41_FP4
    for t0, t1, ws, rows in workspaces(*kv.flat(T, D, q.device), fp4, D, max_slots=kv.max_slots):
        o, _, _ = flash_mla.flash_mla_sparse_fwd(
            q=q[t0:t1].contiguous(),
            kv=ws.view(-1, 1, D),
            indices=rows.view(t1 - t0, 1, -1),
            sm_scale=scale,
            d_v=D,
            attn_sink=sink,
        )
        if (t0, t1) == (0, T):
            return o
        if out is None:
            out = torch.empty(T, H, D, dtype=o.dtype, device=q.device)
        out[t0:t1] = o
    return out


def sparse_attention(q: Tensor, kv: SparseKV, attn_sink, scale: float, out: Tensor) -> Tensor:
    """Fill `out` [T, H, 512] (any float dtype) with the sparse attention of q bf16."""
    if q.shape[0] == 0:
        return out
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    use_prefill = q.shape[0] >= PREFILL_MIN_TOKENS and not capturing
    o = (prefill if use_prefill else decode)(q, kv, attn_sink, scale)
    out.copy_(o)
    return out
