"""Sparse attention on SM90 for few query heads, a CUDA kernel (`cuda_decode.cu`) built at first
use by NVRTC (`cuda_jit`): the 8 / 16 heads per GPU of V4.1 served with tensor parallelism over
8 / 4 GPUs (more heads run as groups of 16, each block re-reading the records).

Each warp owns a quarter of the head dimension (a half in the half build, an eighth in the wide
build) for a whole tile of 16 or 32 entries (its own dequantized tile, q's part in registers);
only the logits are summed across the warps, so there is one block barrier a tile and no warp
re-reads q or another warp's records (the Triton kernel, whose warps split the entries, does
both; benchmarks/RESULTS.md).
Two more kernels take the same arguments: the wg build (`cuda_wgmma.cu`: wgmma over 64-entry
tiles, producer and consumer warpgroups, blocks of 8 heads), measured and not chosen by the
plan, and the wg64 build (`cuda_wg64.cu`: blocks of 64 bf16 heads on wgmma's M axis, each record
dequantized once a token), the plan's choice above 16 heads from 2 decode tokens. Same
arguments and meaning as `triton.sparse_attention`; fp32 q (the exact path) splits q and P into
three exact bf16 parts, as the Triton exact path does. The torch reference is
`kernels.sparse_attn.ref.sparse_attention_ref` (the GPU tests compare every shape with it).

Runs where: SM90 (H100 / H200), bf16 or fp32 q [T, H, 512] (blocks of 8 heads at up to 8 bf16
heads and for fp32 q, else 16; 64 in the wg64 build), V41 SWA records and V41 or V41_FP4 main-KV
records with contiguous rows, NVRTC loadable (PyTorch's CUDA wheels bring it). Not run on any
other GPU. `available(device)` says whether it does here, building once and keeping the reason
when not; the launcher (`triton.plan_for`) then keeps the Triton kernels.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
import triton

from sglang_dsv41.kernels.sparse_attn import merge
from sglang_dsv41.kernels.sparse_attn.cuda_jit import CudaJitError, Kernel, load_source

BN = 16  # entries per tile (the kernel's BN unless a build sets -DBN=32)
D = 512
GROUP_HEADS = 16  # heads per block (bf16 q, more than 8 heads)
GROUP_EXACT_HEADS = 8  # fp32 q (three bf16 parts of q and P): one tile of 8 heads per block
NAME = "sparse_decode_h16"
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_decode.cu")
# the warpgroup kernel (wgmma; up to 8 heads a block; built when the defines say -DWG=1)
WG_NAME = "sparse_wg"
_WG_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_wgmma.cu")
# the 64-head warpgroup kernel (wgmma with the heads on M; built when the defines say -DWG64=1)
WG64_NAME = "sparse_wg64"
_WG64_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_wg64.cu")
WG64_HEADS = 64
WG64_SMEM = 2 * 65536 + 65536 + 512 + 16  # cuda_wg64.cu: SMEM_BYTES


def source(defines: tuple = ()) -> tuple[str, str]:
    """(source path, kernel name) of a build: with "-DWG64=1" the 64-head warpgroup kernel
    (cuda_wg64.cu), with "-DWG=1" the warpgroup kernel (cuda_wgmma.cu), else cuda_decode.cu."""
    if "-DWG64=1" in defines:
        return _WG64_SRC, WG64_NAME
    if "-DWG=1" in defines:
        return _WG_SRC, WG_NAME
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
    or 8;
    for the warpgroup kernel 4 consumer warps and 4 per producer warpgroup (NPW); for the
    64-head one two consumer warpgroups and a producer warpgroup."""
    if "-DWG64=1" in defines:
        return 12
    if "-DWG=1" in defines:  # a consumer warpgroup and NPW producer warpgroups
        return 4 + 4 * _option(defines, "NPW", 1)
    return _option(defines, "NW", 4)


def smem_bytes(defines: tuple = ()) -> int:
    """The kernel's dynamic shared memory for a build: per warp (NW of them, each owning DQ =
    512 / NW of the head dimension) KBUF dequantized tiles of BN rows of 2 DQ + 16 B, two
    buffers of logit fragments (512 B per 16 entries and tile of 8 heads), and per stage of
    the record ring, per 16 entries, DQ / 32 chunks of 512 B and the scale words (128 B at NW
    8, 256 B at 4, 512 B at 2) (defaults NW 4, NH 2, BN 16, KBUF 2 at BN 16 else 1, STAGES 3)."""
    if "-DWG64=1" in defines:  # two 64 KB tiles, q (64 x 512 bf16), the entry flags, mbarrier
        return WG64_SMEM
    if "-DWG=1" in defines:  # two 64 KB tiles, two stages of 34 KB, q and P^T parts, maxima
        qp = 3 if "-DEXACT=1" in defines else 1
        npw = _option(defines, "NPW", 1)
        stage = 16 // npw * 128 * npw * 16 + 128 * npw * (16 if npw == 1 else 8)
        return 2 * 65536 + 2 * stage + qp * (8192 + 1024) + 256
    nw, nh = warps(defines), _option(defines, "NH", 2)
    bn = _option(defines, "BN", BN)
    kbuf = _option(defines, "KBUF", 2 if bn == 16 else 1)
    stages = _option(defines, "STAGES", 3)
    et, dq = bn // 16, D // nw
    raw = dq // 32 * 512 + 32 * (32 // nw)  # a lane's scale bytes: 32 / NW
    red = 2 * (et if nh == 1 else 2 * et) * 512  # two buffers of RED_N float4 per lane
    return nw * (kbuf * bn * (2 * dq + 16) + red + stages * et * raw)


STAGES = {16: 3, 32: 2}  # tiles of records in flight per tile size (the fastest on the H200)


def group_heads(H: int, exact: bool, wg64: bool = False) -> int:
    """Heads per block: 64 in the wg64 build; else 8 (one tile of 8 in P V, NH = 1) at up to 8
    heads and for fp32 q, else 16 (NH = 2)."""
    if wg64:
        return WG64_HEADS
    return GROUP_EXACT_HEADS if exact or H <= 8 else GROUP_HEADS


def defines_for(
    H: int, exact: bool, block_n: int = BN, slim: bool = False, half: bool = False,
    wg: bool = False, wg64: bool = False, wide: bool = False,
) -> tuple:  # fmt: skip
    """The NVRTC options of the build for H heads (NH tiles of 8 in P V), fp32 q (`exact`) and
    tiles of block_n (16 or 32) entries; `slim` (tiles of 16): one tile buffer and two stages of
    records, 40 KB of shared memory, sized for four blocks per SM at 8 heads a block (at 16
    heads a block three stages, 52 KB, three blocks per SM); `half` (tiles of 16, blocks of 8
    heads): two warps a block, each half of the head dimension, one tile buffer and two stages,
    sized for five blocks per SM (four with fp32 q); `wide` (tiles of 16): eight warps a block,
    each an eighth of the head dimension, so a block's chain of work per tile is about half as
    long (the few-token batches, where each block has one or two tiles), sized for two blocks
    per SM; `wg` (blocks of 8 heads): the warpgroup kernel (cuda_wgmma.cu, tiles of 64, one
    block per SM; two producer warpgroups with bf16 q, one with fp32 q); `wg64`: the 64-head
    warpgroup kernel (cuda_wg64.cu: bf16 q, blocks of 64 heads, tiles of 64, one block per SM)."""
    flags = {"slim": slim, "half": half, "wg": wg, "wg64": wg64, "wide": wide}
    builds = [name for name, on in flags.items() if on]
    if len(builds) > 1:
        raise ValueError(f"the CUDA kernel takes one build at a time, not {' and '.join(builds)}")
    if wg64:
        if exact:
            raise ValueError("the wg64 build takes bf16 q, not fp32")
        return ("-DWG64=1", "-DBN=64")
    if block_n not in STAGES or (builds and block_n != BN):
        raise ValueError(
            f"the CUDA kernel takes tiles of {sorted(STAGES)} entries (slim, half, wg, wide: "
            f"{BN}), not {block_n}"
        )
    nh = group_heads(H, exact) // 8
    if (half or wg) and nh != 1:
        raise ValueError(f"the {builds[0]} build takes blocks of 8 heads (H = {H}, bf16 q)")
    d = ("-DEXACT=1",) if exact else ()
    d += (f"-DNH={nh}",)
    if block_n != BN:
        d += (f"-DBN={block_n}", f"-DSTAGES={STAGES[block_n]}")
    if slim:  # 16 heads a block: three stages (three blocks per SM either way)
        d += ("-DKBUF=1", f"-DSTAGES={2 if nh == 1 else 3}", f"-DMIN_BLOCKS={4 if nh == 1 else 3}")
    if half:
        d += ("-DNW=2", "-DKBUF=1", "-DSTAGES=2", f"-DMIN_BLOCKS={4 if exact else 5}")
    if wg:
        d += ("-DWG=1", "-DBN=64", f"-DNPW={1 if exact else 2}")
    if wide:
        d += ("-DNW=8", "-DMIN_BLOCKS=2")
    return d


# The builds the plan uses (sparse_attention): blocks of 8 / 16 bf16 heads and of 8 fp32 heads,
# tiles of 16 and 32 and the wide build, the slim, half and wg builds for blocks of 8 heads, the
# slim one for blocks of 16, and the 64-head one.
_BLOCKS = ((8, False), (16, False), (8, True))
BUILDS = (
    tuple(defines_for(H, exact, bn) for H, exact in _BLOCKS for bn in STAGES)
    + tuple(defines_for(H, exact, wide=True) for H, exact in _BLOCKS)
    + tuple(defines_for(8, x, **{k: True}) for k in ("slim", "half", "wg") for x in (False, True))
    + (defines_for(16, False, slim=True),)
    + (defines_for(64, False, wg64=True),)
)
_PROBES: dict[int, str | None] = {}  # device index -> None (all builds load) or why not


def _probe(index: int) -> str | None:
    """None when every build loads on device `index`, else why not. Built once per process
    (NVRTC, ~1 s a build, then the disk cache), never while a CUDA graph is being captured: a
    capture that comes first keeps the Triton kernels until an eager call has built them."""
    if index not in _PROBES:
        if torch.cuda.is_current_stream_capturing():
            return "not built yet, and a CUDA graph is being captured"
        if torch.cuda.get_device_capability(index)[0] != 9:
            _PROBES[index] = f"device {index} is not SM90 (compute capability 9.x)"
        else:
            try:
                for build in BUILDS:
                    kernel(build).function(index)
                _PROBES[index] = None
            except (CudaJitError, OSError) as exc:
                _PROBES[index] = str(exc)
    return _PROBES[index]


def available(device: torch.device) -> bool:
    """Whether the CUDA kernel runs on `device` (built and loaded once per process)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _probe(index) is None


def why_unavailable(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "not a CUDA device"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _probe(index)


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
    out_dtype=torch.bfloat16, num_splits: int | None = None, per_sm: int = 3, block_n: int = BN,
    slim: bool = False, half: bool = False, defines: tuple = (), wg: bool = False,
    wg64: bool = False, wide: bool = False,
):  # fmt: skip
    """Launch over T tokens (grid T x splits x head groups of 32 `warps(defines)` threads);
    arguments as `triton.sparse_attention`. num_splits: per token, None = fill the GPU `per_sm`
    times; block_n: entries per tile, 16 or 32 (two blocks per SM; fewer barriers and softmax
    steps per entry); slim, half: the builds for more blocks per SM (`defines_for`: slim four
    at 8 heads a block, three at 16; half five), wide: eight warps a block, wg: the warpgroup
    kernel, wg64: the 64-head warpgroup kernel; defines: extra NVRTC options (benchmarks). The
    merge of the splits is a programmatic dependent launch (`merge.combine`:
    it starts while this kernel drains and waits for it before reading) unless defines say
    -DPDL=0."""
    from sglang_dsv41.kernels.sparse_attn import triton as tri

    T, H, _ = q.shape
    if out is None:
        out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
    check_args(q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, out)
    if T == 0:
        return out
    W, TOPK = swa_slots.shape[1], topk_slots.shape[1]
    exact = q.dtype == torch.float32
    defines = (*defines_for(H, exact, block_n, slim, half, wg, wg64, wide), *defines)
    bn = _option(defines, "BN", BN)
    n_tiles = triton.cdiv(W, bn) + triton.cdiv(TOPK, bn)
    groups = triton.cdiv(H, group_heads(H, exact, wg64))
    ns = num_splits or tri.pick_splits(T, groups, n_tiles, q.device, per_sm)
    ns = max(1, min(ns, max(n_tiles, 1)))
    dev = q.device
    if ns > 1:  # wg64's partials in a bf16 output's precision, else fp32
        bf16 = wg64 and out.dtype == torch.bfloat16
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
        N(kind), N(H), N(W), N(TOPK), N(ns), F(scale * tri.LOG2E),
    ]  # fmt: skip
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    kernel(defines)(
        (T, ns, groups), (32 * warps(defines),), args,
        stream=torch.cuda.current_stream(dev).cuda_stream, device_index=index,
        smem=smem_bytes(defines),
    )  # fmt: skip
    if ns > 1:
        merge.combine(
            part,
            lse,
            sink,
            out,
            attn_sink is not None,
            pdl=_option(defines, "PDL", 1) == 1 and merge.gdc_wait is not None,
        )
    return out
