"""Sparse MQA attention over V4.1 records on SM90: the launcher, its shape-based plan, the merge.

`sparse_attention` is the entry the dispatcher (`kernels/sparse_attn/__init__.py`) calls. It
picks a `Plan` from the shapes alone (tokens T, heads H, head dim D, capability), so a decode
call is CUDA-graph capturable (static grid, no host syncs):

- on SM90 the CUDA kernel (`cuda_decode`: blocks of 8 or 16 heads, each warp a quarter of D,
  NVRTC-built at first use; the Triton path where it cannot be built) where `_cuda_variant`
  says: below 8 (token, block of heads) pairs in decode its wide build (eight warps a block,
  each an eighth of D), else up to 16 heads always, fp32 q at any head count, and above 16
  bf16 heads in decode from 2 tokens the 64-head kernel `cuda_wg64.cu`; otherwise:
- up to 16 heads: `triton_kernel` with 16 heads per program on M (mma.sync), tiles of 32,
  splits filling the GPU twice (from 32 tokens the next tile requested ahead);
- 32 heads: the entries on M (SWAP), 8 warps, the next tile's records requested ahead;
- 64 heads: batches under 8 tokens as 16-head programs; from 32 tokens 64-head programs whose
  P V product trails one tile (SKEW); on SM90 with `flash_mla` installed, FlashMLA's sparse
  prefill over a bf16 workspace (`triton_flashmla`): from 128 tokens one row per (token, entry)
  (decode batches share no entries), from 1024 tokens each referenced record once;
- prefill-sized T at 17-63 heads: FlashMLA's sparse prefill over that workspace with the heads
  padded to 64 (SM90, `flash_mla` installed); without it at 17-32 heads (and up to 16 without
  the CUDA kernel) `triton_kernel` over a bf16 workspace of the referenced records, each
  dequantized once (`triton_workspace`);
- fp32 q (the exact path, `SGLANG_DSV41_ATTN_DTYPE=fp32`): on SM90 the CUDA kernel's exact mode
  at every head count and size (blocks of 8 heads); elsewhere the Triton kernels with q and P
  split into three exact bf16 parts (`triton_kernel.split3`), never FlashMLA (bf16 q) nor SKEW;
  `ieee=True` takes fp32 tiles with IEEE products instead (slow at D = 512);
- TRITON_INTERPRET=1 and D < 512: heads on M, no options.
Each choice is the fastest of `variants_for` on the H200 (benchmarks/RESULTS.md).

Splits (flash-decoding): with few tokens, each token's entry list is cut over several programs
that write normalized partials and base-2 log-sum-exps; `merge.combine` merges them with the
sink. Every choice can be overridden through `**launch` (see `Plan`).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton

from sglang_dsv41.kernels.dispatch import device_capability
from sglang_dsv41.kernels.sparse_attn import merge
from sglang_dsv41.kernels.sparse_attn.triton_kernel import sparse_attn_kernel
from sglang_dsv41.kernels.sparse_attn.triton_records import BF16, V41, V41_FP4
from sglang_dsv41.kernels.sparse_attn.variants import (  # noqa: F401  (re-exported)
    Plan,
    _exact_variants,
    _variants,
    variants_for,
)

LOG2E = 1.4426950408889634
FLASHMLA_MIN_TOKENS = 1024  # from here on (bf16 q, 17-128 heads, SM90) the FlashMLA path
FLASHMLA_PRIVATE_MIN_TOKENS = 128  # from here to 1024: FlashMLA over per-entry workspace rows
WORKSPACE_MIN_TOKENS = 1024  # from here on (up to 32 heads) the kernel over a bf16 workspace
# decode with fewer (token, block of heads) pairs than this, at any head count: the CUDA kernel's
# wide build (eight warps a block; each block then has one to three tiles, so the chain of
# work per tile bounds the time)
WIDE_UNDER_BLOCKS = 8
# up to 8 bf16 heads from this many decode tokens to 127: the slim build with grids of three
# blocks per SM (benchmarks/RESULTS.md, twelfth session: 2.5-25 % under tiles of 16 in grids
# of two blocks per SM)
SLIM_X3_MIN_TOKENS = 40
# fp32 q at D = 512 (the exact path, `_exact_variants`): under 8 programs of 16 heads, decode
# and extend, T >= 1024 (benchmarks/RESULTS.md, "The served layer's exact path")
EXACT_FEW, EXACT_DECODE, EXACT_PREFILL = "swap_w8_n32_pf", "direct_n32_x2", "ws_direct_n32"


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def plan_for(T: int, H: int, D: int, device: torch.device, exact: bool, cuda: bool = True) -> Plan:
    """The default plan for T tokens x H heads x D (shape-only, so graph-capturable); `exact`:
    fp32 q; `cuda`: whether the CUDA kernel may be chosen (False: the Triton plan for the
    shape, what a call the CUDA kernel cannot take falls back to)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret or D < 512:  # small models keep IEEE products on the GPU (cheap at small D)
        bh = min(64, max(16, triton.next_power_of_2(H)))
        nw = 4 if bh <= 16 else 8
        return Plan(block_h=bh, block_n=32, num_warps=nw, swap=False, ieee=exact and not interpret)
    if exact:
        v = _exact_variants(H)
        name = _cuda_variant(T, H, True) if cuda else None
        if name and _cuda_ok(device):  # the CUDA kernel's exact mode
            return v[name]
        if T >= WORKSPACE_MIN_TOKENS:
            return v[EXACT_PREFILL]
        return v[EXACT_FEW if T * triton.cdiv(H, 16) < 8 else EXACT_DECODE]
    v = _variants(H)
    name = _cuda_variant(T, H, False) if cuda else None
    if name and _cuda_ok(device):
        return v[name]
    if 16 < H < 64 and T >= FLASHMLA_MIN_TOKENS and _flashmla_ok(device):
        return v["flashmla"]  # the heads padded to 64: 0.65x the CUDA kernel's time at 32
    if H <= 32 and T >= WORKSPACE_MIN_TOKENS:
        return v["ws_direct_n64"]
    if H <= 16:
        return v["direct_n32_pf_x2"] if T >= 32 else v["direct_n32_x2"]
    if H <= 32:
        return v["swap_w8_n32_pf"]
    if T * triton.cdiv(H, 64) < 8:  # too few tokens to fill the GPU with 64-head programs
        return v["swap_w8_n32_pf_bh16"]
    if H in (64, 128) and T >= FLASHMLA_PRIVATE_MIN_TOKENS and _flashmla_ok(device):
        return v["flashmla"] if T >= FLASHMLA_MIN_TOKENS else v["flashmla_private"]
    return v["skew64_n32"]


def _cuda_variant(T: int, H: int, exact: bool) -> str | None:
    """The CUDA kernel's variant for T tokens x H heads where it was the fastest on the H200
    (benchmarks/RESULTS.md), else None. Decode with fewer than 8 (token, block of heads) pairs
    (blocks of 8 heads up to 8 bf16 heads and for fp32 q, else of 16): the wide build (eight
    warps a block, splits filling the GPU once), e.g. below 8 tokens at up to 16 bf16 heads,
    one to three tokens at 32, one at 64. Up to 8 heads the slim build (four blocks per SM)
    from 128 tokens, and for bf16 q from 40 tokens in grids of three blocks per SM; in prefill
    the build with two warps a block (five blocks per SM, four with fp32 q); else tiles of 16
    in grids of 2 blocks per SM (3 for fp32 q below 32 tokens). 9-16 bf16 heads: the slim
    build (one tile buffer, three stages of records) in prefill and at 32-127 tokens, tiles of
    32 ("cuda32_x2": two blocks per SM) otherwise. fp32 q at any head count in blocks of 8
    heads, each re-reading the records (the Triton exact path is slower still), the half build
    from 128 tokens. Above 16 bf16 heads in decode past the wide build the 64-head warpgroup
    kernel (blocks of 64 heads, 32 padded: each record dequantized once a token)."""
    from sglang_dsv41.kernels.sparse_attn.cuda_decode import group_heads

    prefill = T >= WORKSPACE_MIN_TOKENS
    if not prefill and T * triton.cdiv(H, group_heads(H, exact)) < WIDE_UNDER_BLOCKS:
        return "cuda_wide_x1"
    if H <= 8:
        if prefill:
            return "cuda_half_x4" if exact else "cuda_half_x5"
        if T >= 128:
            return "cuda_slim_x4"
        if T >= SLIM_X3_MIN_TOKENS and not exact:
            return "cuda_slim_x3"
        return "cuda_x2" if T >= 32 or not exact else "cuda_x3"
    if exact:
        if T >= 128:  # prefill included: the half build (four blocks per SM)
            return "cuda_half_x4"
        return "cuda_x3" if T < 32 else "cuda32_x2"
    if H <= 16:  # the slim build at 16 heads: one tile buffer, three stages
        return "cuda_slim_x2" if prefill or 32 <= T < 128 else "cuda32_x2"
    if 2 <= T and not prefill:  # 17-64 heads (and blocks of 64 above)
        return "cuda_wg64_x1"
    return None


def _cuda_ok(device: torch.device) -> bool:
    """The CUDA kernel builds and loads here (SM90, NVRTC); probed once per device."""
    from sglang_dsv41.kernels.sparse_attn import cuda_decode

    return cuda_decode.available(device)


def _flashmla_ok(device: torch.device) -> bool:
    from sglang_dsv41.kernels.sparse_attn import triton_flashmla

    return (
        device.type == "cuda" and device_capability(device)[0] == 9 and triton_flashmla.available()
    )


def pick_splits(T: int, head_blocks: int, n_tiles: int, device: torch.device, per_sm: int) -> int:
    """Splits per (token, head block) so that the grid fills the GPU about per_sm times, as few
    as give each program the same number of tiles (a ceil share each: no empty splits)."""
    ns = max(1, min(n_tiles, per_sm * _sms(device) // max(1, T * head_blocks)))
    return triton.cdiv(n_tiles, triton.cdiv(n_tiles, ns)) if n_tiles else 1


def sparse_attention(
    q,
    swa_flat,
    swa_slots,
    kv_flat,
    topk_slots,
    kv_fp4: bool,
    attn_sink,
    scale: float,
    out: torch.Tensor | None,
    out_dtype: torch.dtype = torch.bfloat16,
    max_slots: int | None = None,
    **launch,
):
    """Launch; arguments as validated by `kernels.sparse_attn.sparse_attention`.

    q [T, H, D] bf16, or fp32 for the exact path (the torch reference's arithmetic up to
    summation order: three-part bf16 products, or fp32 tiles with IEEE dots with `ieee=True`);
    swa_flat uint8 [S, D + D/32] and swa_slots int32 [T, W]; kv_flat uint8 [S', B] and
    topk_slots int32 [T, TOPK]; attn_sink fp32 [H] (this rank's heads) or None; out [T, H, D]
    (bf16 or fp32) written in place, or None: a new out_dtype tensor is returned (the FlashMLA
    route then returns FlashMLA's own output, no copy). W or TOPK may be 0 (pass a dummy
    cache). max_slots: `SparseKV.max_slots` (the workspace routes' bound, no host sync).
    `launch`: fields of `Plan` to override.
    """
    T, H, D = q.shape
    exact = q.dtype == torch.float32
    unknown = set(launch) - {f.name for f in dataclasses.fields(Plan)}
    if unknown:
        raise TypeError(f"sparse_attention: unknown launch options {sorted(unknown)}")
    plan = dataclasses.replace(plan_for(T, H, D, q.device, exact), **launch)
    if plan.block_n != 16:  # tiles of 32 asked for: not a build of tiles of 16 unless asked
        plan = dataclasses.replace(
            plan, slim=plan.slim and "slim" in launch, half=plan.half and "half" in launch,
            wg=plan.wg and "wg" in launch, wide=plan.wide and "wide" in launch,
        )  # fmt: skip
    if exact and (plan.flashmla or (plan.skew and not plan.ieee)):
        raise ValueError("fp32 q (the exact path) takes neither the FlashMLA route nor SKEW")
    if plan.cuda and "cuda" not in launch:  # the default plan: Triton where the args don't fit
        from sglang_dsv41.kernels.sparse_attn import cuda_decode

        try:
            cuda_decode.check_args(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, out)
        except ValueError:
            plan = dataclasses.replace(plan_for(T, H, D, q.device, exact, cuda=False), **launch)
    if plan.cuda:
        from sglang_dsv41.kernels.sparse_attn import cuda_decode

        return cuda_decode.sparse_attention(
            q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out, out_dtype,
            plan.num_splits, plan.per_sm, plan.block_n, plan.slim, plan.half, wg=plan.wg,
            wg64=plan.wg64, wide=plan.wide,
        )  # fmt: skip
    if plan.flashmla and T:
        from sglang_dsv41.kernels.sparse_attn import triton_flashmla

        return triton_flashmla.sparse_attention(
            q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out, out_dtype,
            plan.private, max_slots,
        )  # fmt: skip
    if out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    if T == 0:
        return out
    if plan.workspace:
        from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

        empty = swa_slots[:, :0]
        for t0, t1, ws, rows in tw.workspaces(
            swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, D, max_slots=max_slots
        ):
            _launch(q[t0:t1], swa_flat, empty[t0:t1], ws, rows, BF16, attn_sink, scale,
                    out[t0:t1], plan)  # fmt: skip
        return out
    kv_fmt = V41_FP4 if kv_fp4 else V41
    return _launch(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fmt, attn_sink, scale, out, plan)


def _launch(q, swa_flat, swa_slots, kv_rows, kv_slots, kv_fmt, attn_sink, scale, out, plan):
    """One kernel launch (plus the merge when split) over the SWA records and kv_rows [S', RS]
    in format kv_fmt (V41, V41_FP4 or BF16 rows)."""
    T, H, D = q.shape
    W, TOPK = swa_slots.shape[1], kv_slots.shape[1]
    if W and swa_flat.stride(0) != D + D // 32:
        raise ValueError(f"swa_flat rows must be contiguous records of {D + D // 32} B")
    if TOPK and kv_rows.stride(0) != kv_rows.shape[1]:
        raise ValueError(f"kv rows must be contiguous, got strides {kv_rows.stride()}")
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    exact = q.dtype == torch.float32
    exact3 = exact and not plan.ieee
    BH, BN = plan.block_h, plan.block_n
    if exact3 and kv_fmt == V41_FP4 and BN < 32 and not interpret:
        raise ValueError(
            "fp32 q over V41_FP4 records needs block_n >= 32: with tiles of 16 the three-part "
            "kernel gave wrong output on the H200 (Triton 3.6; benchmarks/RESULTS.md)"
        )
    head_blocks = triton.cdiv(H, BH)
    n_tiles = triton.cdiv(W, BN) + triton.cdiv(TOPK, BN)
    ns = plan.num_splits or pick_splits(T, head_blocks, n_tiles, q.device, plan.per_sm)
    ns = max(1, min(ns, max(n_tiles, 1)))
    split = ns > 1
    if split:
        part = torch.empty(T, ns, H, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(T, ns, H, dtype=torch.float32, device=q.device)
        o_t, o_args = part, (part.stride(0), part.stride(1), part.stride(2))
    else:
        lse = out
        o_t, o_args = out, (out.stride(0), 0, out.stride(1))
    sink = attn_sink if attn_sink is not None else lse
    sparse_attn_kernel[(T, head_blocks, ns)](
        q,
        q.stride(0),
        q.stride(1),
        swa_flat,
        swa_slots,
        swa_slots.stride(0),
        kv_rows,
        kv_slots,
        kv_slots.stride(0),
        sink,
        o_t,
        *o_args,
        lse,
        H,
        W,
        TOPK,
        ns,
        scale * LOG2E,
        D=D,
        BH=BH,
        BN=BN,
        KV_FMT=kv_fmt,
        KV_RS=kv_rows.shape[1],
        HAS_SINK=attn_sink is not None,
        SPLIT=split,
        SWAP=plan.swap,
        SKEW=plan.skew,
        PREFETCH=plan.prefetch,
        DOT_FP32=interpret or (exact and plan.ieee),
        ROUND_Q=not exact,
        PREC="ieee" if exact else "tf32",
        EXACT3=exact3,
        FAST_DEQ=plan.fast,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )
    if split:
        merge.combine(part, lse, sink, out, attn_sink is not None)
    return out
