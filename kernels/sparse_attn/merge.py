"""The merge of flash-decoding splits: each split of a token's entry list wrote its normalized
partial output and base-2 log-sum-exp; `combine` weighs them and the sink into the output.
Used by the Triton kernels (`triton.py`) and the CUDA kernel (`cuda_decode.py`); the formula is
the reference's softmax over all entries and the sink (`ref.py`), split by entries."""

from __future__ import annotations

import triton
import triton.language as tl

try:  # Triton >= 3.4: grid dependency control (programmatic dependent launch)
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - older Triton: combine(pdl=True) is refused
    gdc_wait = None


@triton.jit(do_not_specialize=["H", "num_splits"])
def combine_kernel(
    part_ptr,  # fp32 [T, NS, H, D], each split's normalized output
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
    each program DC columns. PDL: launched as a programmatic dependent of the kernel that wrote
    the partials (SM90+), which it waits for before reading them."""
    if PDL:
        gdc_wait()
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, NS_P2)
    o_d = tl.program_id(2) * DC + tl.arange(0, DC)
    m_s = o_s < num_splits
    lse = tl.load(lse_ptr + (i_t * num_splits + o_s) * H + i_h, mask=m_s, other=float("-inf"))
    if HAS_SINK:
        s2 = tl.load(sink_ptr + i_h) * 1.4426950408889634
    else:
        s2 = float("-inf")
    m = tl.maximum(tl.maximum(tl.max(lse, 0), s2), -1e30)
    w = tl.exp2(lse - m)  # [NS_P2]
    den = tl.sum(w, 0) + tl.exp2(s2 - m)
    p_p = part_ptr + ((i_t * num_splits + o_s[:, None]) * H + i_h) * D + o_d[None, :]
    b_p = tl.load(p_p, mask=m_s[:, None], other=0.0)  # [NS_P2, DC]
    o = tl.sum(b_p * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + i_t * stride_ot + i_h * stride_oh + o_d, o.to(o_ptr.dtype.element_ty))


def combine(part, lse, sink, out, has_sink: bool, pdl: bool = False) -> None:
    """Merge the splits' partials part [T, NS, H, D] and lse [T, NS, H] into out [T, H, D]
    (`combine_kernel`); programs of at most 4096 partial values each, so that a few tokens
    with many splits still spread over the GPU. pdl (SM90+ only): launched as a programmatic
    dependent launch, so that its programs start while the kernel before it drains."""
    if pdl and gdc_wait is None:
        raise ValueError("pdl needs Triton >= 3.4 (triton.language.extra.cuda.gdc_wait)")
    T, ns, H, D = part.shape
    ns_p2 = triton.next_power_of_2(ns)
    dc = min(D, max(32, 4096 // ns_p2))
    combine_kernel[(T, H, triton.cdiv(D, dc))](
        part, lse, sink, out, out.stride(0), out.stride(1), H, ns,
        D=D, NS_P2=ns_p2, HAS_SINK=has_sink, DC=dc, PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
