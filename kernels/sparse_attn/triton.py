"""Sparse MQA attention over V4.1 records on SM90: the launcher of the plan's variants.

`sparse_attention` is the entry the dispatcher (`kernels/sparse_attn/__init__.py`) calls. It
runs the `Plan` that `plan.plan_for` picks from the shapes alone (tokens T, heads H, head dim
D, what runs on the device), so a decode call is CUDA-graph capturable (static grid, no host
syncs), or the variant the caller names. Routes (`variants.SPECS`): the CUDA kernel
(`cuda_decode`), FlashMLA's sparse prefill over a bf16 workspace (`triton_flashmla`), the
Triton kernel (`triton_kernel`) over the records or over that workspace (`triton_workspace`).
A default plan whose CUDA kernel cannot take the call's arguments (a cache off a 16-byte
boundary) runs the shape's next choice; a variant asked for by name runs or raises.

fp32 q (the exact path, `SGLANG_DSV41_ATTN_DTYPE=fp32`) is the torch reference's arithmetic up
to summation order: q and P split into three exact bf16 parts (`triton_kernel.split3`; the
CUDA kernel's exact mode likewise), or fp32 tiles with IEEE products (`plain_n32_ieee`: small
head dims); never FlashMLA (bf16 q) nor SKEW. Splits (flash-decoding): with few tokens, each
token's entry list is cut over several programs, merged with the sink by `merge.combine`.
"""

from __future__ import annotations

import torch
import triton

from ..dispatch import triton_interpreting
from . import cuda_decode, triton_flashmla, triton_workspace
from .merge import LOG2E, combine, pick_splits
from .plan import plan_for
from .triton_kernel import sparse_attn_kernel
from .triton_records import BF16, V41, V41_FP4
from .variants import Cuda, FlashMla, Plan, Tiles, Triton, Variant, plan_of


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
    *,
    variant: Variant | str | None = None,
    num_splits: int | None = None,
    tiles: Tiles | None = None,
):
    """Launch; arguments as validated by `kernels.sparse_attn.sparse_attention`.

    q [T, H, D] bf16, or fp32 for the exact path; swa_flat uint8 [S, D + D/32] and swa_slots
    int32 [T, W]; kv_flat uint8 [S', B] and topk_slots int32 [T, TOPK]; attn_sink fp32 [H]
    (this rank's heads) or None; out [T, H, D] (bf16 or fp32) written in place, or None: a new
    out_dtype tensor is returned (the FlashMLA route then returns FlashMLA's own output, no
    copy). W or TOPK may be 0 (pass a dummy cache). max_slots: `SparseKV.max_slots` (the
    workspace routes' bound, no host sync). variant: run this one (a `Variant` or its name)
    instead of the plan's; num_splits: per (token, block of heads) instead of filling the GPU;
    tiles: the Triton kernel's tile shape instead of the variant's (with no variant named, on
    the plan's first choice without the CUDA kernel, which must then be a Triton one).
    """
    T, H, D = q.shape
    exact = q.dtype == torch.float32
    if variant is not None:
        plan = plan_of(variant, H, exact, tiles, num_splits)
        spec = plan.spec
        if isinstance(spec, Cuda):
            why = cuda_decode.build_error(cuda_decode.defines_for(spec.build, H, exact), q.device)
            if why is not None:
                raise cuda_decode.CudaJitError(f"{plan.variant.value} cannot run here: {why}")
    else:
        plan = plan_for(T, H, D, q.device, exact, cuda=tiles is None)
        if isinstance(plan.spec, Cuda):  # the next choice where the arguments don't fit
            try:
                cuda_decode.check_args(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, out)
            except ValueError:
                plan = plan_for(T, H, D, q.device, exact, cuda=False)
        if tiles is not None or num_splits is not None:
            plan = plan_of(plan.variant, H, exact, tiles, num_splits)
    return _run(plan, q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale,
                out, out_dtype, max_slots)  # fmt: skip


def _run(plan: Plan, q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out,
         out_dtype, max_slots):  # fmt: skip
    """Run `plan` (arguments as `sparse_attention`)."""
    T, H, D = q.shape
    exact = q.dtype == torch.float32
    spec = plan.spec
    if exact and (isinstance(spec, FlashMla) or (plan.tiles and plan.tiles.skew and not spec.ieee)):
        raise ValueError("fp32 q (the exact path) takes neither the FlashMLA route nor SKEW")
    if isinstance(spec, Cuda):
        return cuda_decode.sparse_attention(
            q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out, out_dtype,
            build=spec.build, per_sm=spec.per_sm, num_splits=plan.num_splits,
        )  # fmt: skip
    if isinstance(spec, FlashMla) and T:
        return triton_flashmla.sparse_attention(
            q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out, out_dtype,
            spec.private, max_slots,
        )  # fmt: skip
    if out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    if T == 0:
        return out
    assert isinstance(spec, Triton)
    if spec.workspace:
        empty = swa_slots[:, :0]
        for t0, t1, ws, rows in triton_workspace.workspaces(
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
    interpret = triton_interpreting()
    exact = q.dtype == torch.float32
    ieee = plan.spec.ieee
    exact3 = exact and not ieee
    tiles = plan.tiles
    BH, BN = tiles.block_h, tiles.block_n
    if exact3 and kv_fmt == V41_FP4 and BN < 32 and not interpret:
        raise ValueError(
            "fp32 q over V41_FP4 records needs block_n >= 32: with tiles of 16 the three-part "
            "kernel gave wrong output on the H200 (Triton 3.6; benchmarks/RESULTS.md)"
        )
    head_blocks = triton.cdiv(H, BH)
    n_tiles = triton.cdiv(W, BN) + triton.cdiv(TOPK, BN)
    ns = plan.num_splits or pick_splits(T, head_blocks, n_tiles, q.device, plan.spec.per_sm)
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
        SWAP=tiles.swap,
        SKEW=tiles.skew,
        PREFETCH=tiles.prefetch,
        DOT_FP32=interpret or (exact and ieee),
        ROUND_Q=not exact,
        PREC="ieee" if exact else "tf32",
        EXACT3=exact3,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if split:
        combine(part, lse, sink, out, attn_sink is not None)
    return out
