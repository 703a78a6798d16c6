"""Sparse attention on SM90 for few query heads, a CUDA kernel (`cuda_decode.cu`) built by NVRTC
(`cuda_jit`) at the first use of each build: the 8 / 16 heads per GPU of V4.1 served with tensor
parallelism over 8 / 4 GPUs (more heads run as blocks of 16, each block re-reading the records).

Each warp owns a quarter of the head dimension (a half in the half build, an eighth in the wide
build) for a whole tile of 16 or 32 entries (its own dequantized tile, q's part in registers);
only the logits are summed across the warps, so there is one block barrier a tile and no warp
re-reads q or another warp's records (the Triton kernel, whose warps split the entries, does
both; benchmarks/RESULTS.md). The wg64 build is another kernel with the same arguments
(`cuda_wg64.cu`: blocks of 64 bf16 heads on wgmma's M axis, each record dequantized once a
token). Same arguments and meaning as `triton.sparse_attention`; fp32 q (the exact path) splits
q and P into three exact bf16 parts, as the Triton exact path does. The torch reference is
`kernels.sparse_attn.ref.sparse_attention_ref` (the GPU tests compare every build with it).

Runs where: SM90 (H100 / H200), bf16 or fp32 q [T, H, 512] (blocks of 8 heads at up to 8 bf16
heads and for fp32 q, else 16; 64 in the wg64 build), V41 SWA records and V41 or V41_FP4 main-KV
records with contiguous rows, NVRTC loadable (PyTorch's CUDA wheels bring it). Not run on any
other GPU. `build_error(defines, device)` says whether one build runs here, building it once and
keeping the reason when not; the plan (`plan.plan_for`) then runs the shape's next choice.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
import triton

from ..dispatch import log_once, triton_interpreting
from .cuda_jit import CudaJitError, Kernel, load_source, nvrtc_version
from .merge import LOG2E, combine, gdc_wait, pick_splits
from .variants import Build

BN = 16  # entries per tile (the kernel's BN unless a build sets -DBN=32)
D = 512
GROUP_HEADS = 16  # heads per block (bf16 q, more than 8 heads)
GROUP_EXACT_HEADS = 8  # fp32 q (three bf16 parts of q and P): one tile of 8 heads per block
NAME = "sparse_decode_h16"
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_decode.cu")
# the 64-head warpgroup kernel (wgmma with the heads on M; built when the defines say -DWG64=1)
WG64_NAME = "sparse_wg64"
_WG64_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_wg64.cu")
WG64_HEADS = 64
WG64_SMEM = 2 * 65536 + 65536 + 512 + 16  # cuda_wg64.cu: SMEM_BYTES


def source(defines: tuple = ()) -> tuple[str, str]:
    """(source path, kernel name) of a build: with "-DWG64=1" the 64-head warpgroup kernel
    (cuda_wg64.cu), else cuda_decode.cu."""
    if "-DWG64=1" in defines:
        return _WG64_SRC, WG64_NAME
    return _SRC, NAME


@functools.cache
def kernel(defines: tuple = ()) -> Kernel:
    """The kernel built with `defines` (NVRTC options such as "-DMIN_BLOCKS=4"; `source`)."""
    path, name = source(defines)
    return Kernel(load_source(path), name, "sm_90a", defines)


def _option(defines: tuple, name: str, default: int) -> int:
    """The value of -D<name>=<int> in defines, else default."""
    for d in defines:
        if d.startswith(f"-D{name}="):
            return int(d.split("=", 1)[1])
    return default


def warps(defines: tuple = ()) -> int:
    """Warps per block: NW, 4 (each a quarter of the head dimension) unless the build says 2
    or 8; for the 64-head kernel two consumer warpgroups and a producer warpgroup."""
    if "-DWG64=1" in defines:
        return 12
    return _option(defines, "NW", 4)


def smem_bytes(defines: tuple = ()) -> int:
    """The kernel's dynamic shared memory for a build: per warp (NW of them, each owning DQ =
    512 / NW of the head dimension) KBUF dequantized tiles of BN rows of 2 DQ + 16 B, two
    buffers of logit fragments (512 B per 16 entries and tile of 8 heads), and per stage of
    the record ring, per 16 entries, DQ / 32 chunks of 512 B and the scale words (128 B at NW
    8, 256 B at 4, 512 B at 2) (defaults NW 4, NH 2, BN 16, KBUF 2 at BN 16 else 1, STAGES 3)."""
    if "-DWG64=1" in defines:  # two 64 KB tiles, q (64 x 512 bf16), the entry flags, mbarrier
        return WG64_SMEM
    nw, nh = warps(defines), _option(defines, "NH", 2)
    bn = _option(defines, "BN", BN)
    kbuf = _option(defines, "KBUF", 2 if bn == 16 else 1)
    stages = _option(defines, "STAGES", 3)
    et, dq = bn // 16, D // nw
    raw = dq // 32 * 512 + 32 * (32 // nw)  # a lane's scale bytes: 32 / NW
    red = 2 * (et if nh == 1 else 2 * et) * 512  # two buffers of RED_N float4 per lane
    return nw * (kbuf * bn * (2 * dq + 16) + red + stages * et * raw)


def group_heads(H: int, exact: bool, build: Build | None = None) -> int:
    """Heads per block: 64 in the wg64 build; else 8 (one tile of 8 in P V, NH = 1) at up to 8
    heads and for fp32 q, else 16 (NH = 2)."""
    if build is Build.WG64:
        return WG64_HEADS
    return GROUP_EXACT_HEADS if exact or H <= 8 else GROUP_HEADS


def defines_for(build: Build, H: int, exact: bool) -> tuple:
    """The NVRTC options of `build` for H heads (NH tiles of 8 in P V) and fp32 q (`exact`):
    tiles of 32 with two stages of records (the fastest for that tile size); the slim build
    with one tile buffer and two stages of records, 40 KB of shared memory, sized for four
    blocks per SM at 8 heads a block (at 16 heads a block three stages, 52 KB, three blocks
    per SM); the half build (blocks of 8 heads) one tile buffer and two stages, sized for five
    blocks per SM (four with fp32 q); the wide build sized for two blocks per SM; the wg64
    build (bf16 q only) the 64-head kernel's tiles of 64."""
    if build is Build.WG64:
        if exact:
            raise ValueError("the wg64 build takes bf16 q, not fp32")
        return ("-DWG64=1", "-DBN=64")
    nh = group_heads(H, exact) // 8
    if build is Build.HALF and nh != 1:
        raise ValueError(f"the half build takes blocks of 8 heads (H = {H}, bf16 q)")
    d = ("-DEXACT=1",) if exact else ()
    d += (f"-DNH={nh}",)
    if build is Build.TILES32:
        d += ("-DBN=32", "-DSTAGES=2")
    elif build is Build.SLIM:  # 16 heads a block: three stages (three blocks per SM either way)
        d += ("-DKBUF=1", f"-DSTAGES={2 if nh == 1 else 3}", f"-DMIN_BLOCKS={4 if nh == 1 else 3}")
    elif build is Build.HALF:
        d += ("-DNW=2", "-DKBUF=1", "-DSTAGES=2", f"-DMIN_BLOCKS={4 if exact else 5}")
    elif build is Build.WIDE:
        d += ("-DNW=8", "-DMIN_BLOCKS=2")
    return d


_ERRORS: dict[tuple[tuple, int], str | None] = {}  # (defines, device index) -> None or why not


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def why_unavailable(device: torch.device) -> str | None:
    """Why no build of the kernel runs on `device` (not CUDA, not SM90, no NVRTC), else None;
    builds nothing (a build's own failure: `build_error`)."""
    if device.type != "cuda":
        return "not a CUDA device"
    if triton_interpreting():
        return "TRITON_INTERPRET=1"
    index = _index(device)
    if torch.cuda.get_device_capability(index)[0] != 9:
        return f"device {index} is not SM90 (compute capability 9.x)"
    try:
        nvrtc_version()
    except CudaJitError as exc:
        return str(exc)
    return None


def _load(defines: tuple, index: int) -> None:
    """Build one build (NVRTC, ~1 s, then the disk cache) and load it on device `index`; raises
    CudaJitError or OSError where it cannot."""
    kernel(defines).function(index)


def build_error(defines: tuple, device: torch.device) -> str | None:
    """None when the build `defines` runs on `device`, else why not. Each build is built at its
    first use, once per process and device (a build no shape needs is never compiled), and
    never while a CUDA graph is being captured: a capture that comes first runs the shape's
    next choice until an eager call has built it. A build that fails to compile or load is
    logged once; the other builds are not affected."""
    if device.type != "cuda" or triton_interpreting():
        return why_unavailable(device)
    key = (defines, _index(device))
    if key not in _ERRORS:
        why = why_unavailable(device)
        if why is None:
            if torch.cuda.is_current_stream_capturing():
                return "not built yet, and a CUDA graph is being captured"
            try:
                _load(*key)
            except (CudaJitError, OSError) as exc:
                why = str(exc)
                log_once(
                    f"sparse_attention: the CUDA build {' '.join(defines)} cannot run on "
                    f"cuda:{key[1]} ({why}); the shapes whose variant uses it run their next "
                    "choice"
                )
        _ERRORS[key] = why
    return _ERRORS[key]


def check_args(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, out=None) -> None:
    """What the kernel needs of its arguments; ValueError naming the first one that differs."""
    T, H, Dq = q.shape
    if q.dtype not in (torch.bfloat16, torch.float32) or Dq != D or H < 1:
        raise ValueError(
            f"the CUDA kernel takes bf16 or fp32 q [T, H, {D}], got {q.dtype} {tuple(q.shape)}"
        )
    if q.stride(2) != 1:
        raise ValueError(f"q must have unit stride in D, got strides {q.stride()}")
    rec = 288 if kv_fp4 else 528
    for name, t, nb, n in (
        ("swa_flat", swa_flat, 528, swa_slots.shape[1]),
        ("kv_flat", kv_flat, rec, topk_slots.shape[1]),
    ):
        if not n:  # an empty segment: the cache is never read
            continue
        if t.dtype != torch.uint8 or t.dim() != 2 or t.shape[1] != nb or t.stride() != (nb, 1):
            raise ValueError(f"{name} must be contiguous uint8 rows of {nb} B, got {t.shape}")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start on a 16-byte boundary")
    for name, s in (("swa_slots", swa_slots), ("topk_slots", topk_slots)):
        bad = s.dtype != torch.int32 or s.dim() != 2 or s.shape[0] != T
        if bad or (s.shape[1] and s.stride(1) != 1):
            raise ValueError(f"{name} must be int32 [T, n], unit stride: {s.dtype} {s.shape}")
    if out is not None and (out.dtype not in (torch.bfloat16, torch.float32) or out.stride(2) != 1):
        raise ValueError(f"out must be bf16 or fp32 [T, H, {D}] with unit stride in D")


def sparse_attention(
    q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, attn_sink, scale: float, out,
    out_dtype=torch.bfloat16, *, build: Build, per_sm: int, num_splits: int | None = None,
    defines: tuple = (),
):  # fmt: skip
    """Launch `build` over T tokens (grid T x splits x head blocks of 32 `warps(defines)`
    threads); arguments as `triton.sparse_attention`. num_splits: per token, None = fill the
    GPU `per_sm` times (blocks per SM); defines: extra NVRTC options (benchmarks). The merge
    of the splits is a programmatic dependent launch (`merge.combine`: it starts while this
    kernel drains and waits for it before reading) unless defines say -DPDL=0."""
    T, H, _ = q.shape
    if out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    check_args(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, out)
    if T == 0:
        return out
    W, TOPK = swa_slots.shape[1], topk_slots.shape[1]
    exact = q.dtype == torch.float32
    defines = (*defines_for(build, H, exact), *defines)
    bn = _option(defines, "BN", BN)
    n_tiles = triton.cdiv(W, bn) + triton.cdiv(TOPK, bn)
    groups = triton.cdiv(H, group_heads(H, exact, build))
    ns = num_splits or pick_splits(T, groups, n_tiles, q.device, per_sm)
    ns = max(1, min(ns, max(n_tiles, 1)))
    dev = q.device
    if ns > 1:  # wg64's partials in a bf16 output's precision, else fp32
        bf16 = build is Build.WG64 and out.dtype == torch.bfloat16
        part = torch.empty(T, ns, H, D, dtype=torch.bfloat16 if bf16 else torch.float32, device=dev)
        lse = torch.empty(T, ns, H, dtype=torch.float32, device=dev)
        kind = 3 if bf16 else 0
    else:
        part = lse = torch.empty(0, dtype=torch.float32, device=dev)
        kind = 1 if out.dtype == torch.bfloat16 else 2
    sink = attn_sink if attn_sink is not None else lse
    if attn_sink is not None and (attn_sink.dtype != torch.float32 or attn_sink.stride(0) != 1):
        raise ValueError("attn_sink must be contiguous fp32 [H]")
    swa_s, kv_s = swa_slots, topk_slots  # an empty list's pointer is never read
    P, L, N, F = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
    args = [
        P(q.data_ptr()), L(q.stride(0)), L(q.stride(1)),
        P(swa_flat.data_ptr()), P(swa_s.data_ptr()), L(swa_s.stride(0)),
        P(kv_flat.data_ptr()), P(kv_s.data_ptr()), L(kv_s.stride(0)), N(int(kv_fp4)),
        P(sink.data_ptr()), N(int(attn_sink is not None)), P(part.data_ptr()), P(lse.data_ptr()),
        P(out.data_ptr()), L(out.stride(0)), L(out.stride(1)),
        N(kind), N(H), N(W), N(TOPK), N(ns), F(scale * LOG2E),
    ]  # fmt: skip
    kernel(defines)(
        (T, ns, groups), (32 * warps(defines),), args,
        stream=torch.cuda.current_stream(dev).cuda_stream, device_index=_index(dev),
        smem=smem_bytes(defines),
    )  # fmt: skip
    if ns > 1:
        combine(
            part,
            lse,
            sink,
            out,
            attn_sink is not None,
            pdl=_option(defines, "PDL", 1) == 1 and gdc_wait is not None,
        )
    return out
