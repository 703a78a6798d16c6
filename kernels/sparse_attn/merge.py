"""Flash-decoding splits: with few tokens, each token's entry list is cut over several programs
(`pick_splits` sizes the grid), each writing its normalized partial output and base-2
log-sum-exp; `combine` weighs them and the sink into the output. Used by the Triton kernels
(`triton.py`) and the CUDA kernels (`cuda_decode.py`); the formula is the reference's softmax
over all entries and the sink (`ref.py`), split by entries."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4: grid dependency control (programmatic dependent launch)
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - older Triton: combine(pdl=True) is refused
    gdc_wait = None


LOG2E = 1.4426950408889634  # logits are scaled by scale x LOG2E: the kernels' softmax is base 2


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def pick_splits(T: int, head_blocks: int, n_tiles: int, device: torch.device, per_sm: int) -> int:
    """Splits per (token, head block) so that the grid fills the GPU about per_sm times, as few
    as give each program the same number of tiles (a ceil share each: no empty splits)."""
    ns = max(1, min(n_tiles, per_sm * _sms(device) // max(1, T * head_blocks)))
    return triton.cdiv(n_tiles, triton.cdiv(n_tiles, ns)) if n_tiles else 1


@triton.jit(do_not_specialize=["H", "num_splits"])
def combine_kernel(
    part_ptr,  # [T, NS, H, D] fp32 or bf16, each split's normalized output
    lse_ptr,  # fp32 [T, NS, H], base-2 log-sum-exp (-inf: the split saw nothing)
    sink_ptr,  # fp32 [H]
    o_ptr,  # [T, H, D]
    stride_ot,
    stride_oh,
    H,
    num_splits,
    D: tl.constexpr,
    NS_P2: tl.constexpr,
    HAS_SINK: tl.constexpr,
    DC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """o[t, h, d] = sum_s 2^lse_s part_s / (sum_s 2^lse_s + e^sink[h]); grid (T, H, D / DC),
    each program DC columns, the splits' rows read as independent loads (one unrolled step
    each: no cross-row reduction of the partials). PDL: launched as a programmatic dependent
    of the kernel that wrote the partials (SM90+), which it waits for before reading them."""
    if PDL:
        gdc_wait()
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, NS_P2)
    lse = tl.load(
        lse_ptr + (i_t * num_splits + o_s) * H + i_h, mask=o_s < num_splits, other=float("-inf")
    )
    if HAS_SINK:
        s2 = tl.load(sink_ptr + i_h) * 1.4426950408889634
    else:
        s2 = float("-inf")
    m = tl.maximum(tl.maximum(tl.max(lse, 0), s2), -1e30)
    den = tl.sum(tl.exp2(lse - m), 0) + tl.exp2(s2 - m)
    o_d = tl.program_id(2) * DC + tl.arange(0, DC)
    acc = tl.zeros([DC], dtype=tl.float32)
    for s in tl.static_range(NS_P2):
        ok = s < num_splits
        row = (i_t * num_splits + s) * H + i_h
        lse_s = tl.load(lse_ptr + row, mask=ok, other=float("-inf"))
        b_p = tl.load(part_ptr + row * D + o_d, mask=ok & (o_d < D), other=0.0)
        acc += tl.exp2(lse_s - m) * b_p.to(tl.float32)
    o = acc / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + i_t * stride_ot + i_h * stride_oh + o_d, o.to(o_ptr.dtype.element_ty))


def launch_shape(ns: int, D: int) -> tuple[int, int, int]:
    """(NS_P2, DC, warps) of the merge of ns splits: columns per program DC = 4096 / NS_P2 (at
    most 256, at least 32), two warps at 256 columns, else one (the fastest on the H200 at 8,
    16 and 64 heads, decode batch 1-32, benchmarks/RESULTS.md)."""
    ns_p2 = triton.next_power_of_2(ns)
    dc = min(D, 256, max(32, 4096 // ns_p2))
    return ns_p2, dc, 2 if dc >= 256 else 1


def combine(part, lse, sink, out, has_sink: bool, pdl: bool = False) -> None:
    """Merge the splits' partials part [T, NS, H, D] (fp32, or bf16) and lse [T, NS, H] into out
    [T, H, D] (`combine_kernel`, `launch_shape`). pdl (SM90+ only): launched as a programmatic
    dependent launch, so that its programs start while the kernel before it drains."""
    if pdl and gdc_wait is None:
        raise ValueError("pdl needs Triton >= 3.4 (triton.language.extra.cuda.gdc_wait)")
    T, ns, H, D = part.shape
    ns_p2, dc, warps = launch_shape(ns, D)
    combine_kernel[(T, H, triton.cdiv(D, dc))](
        part, lse, sink, out, out.stride(0), out.stride(1), H, ns,
        D=D, NS_P2=ns_p2, HAS_SINK=has_sink, DC=dc, PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )  # fmt: skip
