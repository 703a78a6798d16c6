"""The launch plan's vocabulary: `Plan` (one launch's choices: kernel, tile shapes, splits,
routes) and the named variants `triton.plan_for` chooses from at each head count, bf16 or fp32
q (`variants_for`; the GPU tests run each, benchmarks/bench_attention.py --sweep times each)."""

from __future__ import annotations

import dataclasses
import functools
from types import MappingProxyType

import triton


@dataclasses.dataclass(frozen=True)
class Plan:
    """One launch's choices. Any field can be passed to `sparse_attention` to override it.

    block_h heads per program (a power of two >= 16), block_n entries per tile, num_warps,
    num_stages; swap: entries on M (see triton_kernel); skew / prefetch: see triton_kernel;
    num_splits: programs per (token, head block), None = fill the GPU `per_sm` times;
    flashmla: FlashMLA's sparse prefill over a dequantized workspace (triton_flashmla);
    workspace: this kernel over that workspace's BF16 rows (triton_workspace);
    ieee: fp32 q only: fp32 tiles with IEEE products instead of three bf16 parts;
    private: with flashmla, one workspace row per (token, entry), no compaction (decode);
    fast: records dequantized by inline PTX where the kernel allows it (triton_kernel: 16-head
    programs, or 32 with the entries on M; bf16 q); False keeps Triton's own conversions;
    cuda: the CUDA kernel (cuda_decode; splits from num_splits / per_sm, tiles of block_n = 16
    or 32 entries); slim: its build with one tile buffer (tiles of 16; two stages of records
    and four blocks per SM at 8 heads a block, three and three at 16); half: its build with
    two warps a block, each half of the head dimension (tiles of 16, one tile buffer, two
    stages; at most 8 heads a block); wide: its build with eight warps a block, each an eighth
    of the head dimension (tiles of 16, two blocks per SM; a block's chain of work per tile
    about half as long); wg: the warpgroup kernel (cuda_wgmma.cu: wgmma over tiles of 64
    entries, producer and consumer warpgroups, one block per SM, blocks of 8 heads; measured,
    chosen nowhere yet); wg64: the
    64-head warpgroup kernel (cuda_wg64.cu: the heads on wgmma's M axis, tiles of 64 entries,
    one block per SM, blocks of 64 heads, bf16 q).
    """

    block_h: int
    block_n: int
    num_warps: int
    swap: bool
    skew: bool = False
    prefetch: bool = False
    num_stages: int = 1
    num_splits: int | None = None
    per_sm: int = 1
    flashmla: bool = False
    workspace: bool = False
    ieee: bool = False
    private: bool = False
    fast: bool = True
    cuda: bool = False
    slim: bool = False
    half: bool = False
    wg: bool = False
    wg64: bool = False
    wide: bool = False


@functools.cache
def _variants(H: int) -> MappingProxyType:
    """The kernel variants `plan_for` chooses from at H heads, measured on the H200
    (benchmarks/RESULTS.md): 16 or 32 heads per program (8-32 heads, and 64 heads at batch < 8),
    or 64 (64 heads and up). Built once per H (a read-only view: `plan_for` runs every call)."""
    bh = max(16, triton.next_power_of_2(H)) if H <= 32 else 16
    small = {
        "direct_n32": Plan(block_h=bh, block_n=32, num_warps=4 if bh <= 16 else 8, swap=False),
        "swap_w8_n32_pf": Plan(block_h=bh, block_n=32, num_warps=8, swap=True, prefetch=True),
        "ws_direct_n32": Plan(
            block_h=bh, block_n=32, num_warps=4 if bh <= 16 else 8, swap=False, workspace=True,
            num_stages=3,
        ),
        "ws_swap_w8_n32": Plan(
            block_h=bh, block_n=32, num_warps=8, swap=True, workspace=True, num_stages=3
        ),
        "ws_direct_n64": Plan(
            block_h=bh, block_n=64, num_warps=4 if bh <= 16 else 8, swap=False, workspace=True,
            num_stages=2,
        ),
    }  # fmt: skip
    small["direct_n32_x2"] = dataclasses.replace(small["direct_n32"], per_sm=2)
    small["direct_n32_pf_x2"] = dataclasses.replace(small["direct_n32_x2"], prefetch=True)
    # the CUDA kernel (cuda_decode; blocks of 8 or 16 heads): tiles of 16, grids of 2 or 3
    # blocks per SM; tiles of 32, two; the slim build, two, three or four; the wide build, one
    cuda = {
        f"cuda_x{k}": Plan(block_h=16, block_n=16, num_warps=4, swap=False, cuda=True, per_sm=k)
        for k in (2, 3)
    }
    cuda["cuda32_x2"] = dataclasses.replace(cuda["cuda_x2"], block_n=32)
    for k in (2, 3, 4):
        cuda[f"cuda_slim_x{k}"] = dataclasses.replace(cuda["cuda_x2"], slim=True, per_sm=k)
    cuda["cuda_wide_x1"] = dataclasses.replace(cuda["cuda_x2"], wide=True, per_sm=1)
    if H <= 8:  # two warps a block (blocks of 8 heads): five blocks per SM, four with fp32 q
        for k in (4, 5):
            cuda[f"cuda_half_x{k}"] = dataclasses.replace(cuda["cuda_x2"], half=True, per_sm=k)
        cuda["cuda_wg_x1"] = dataclasses.replace(cuda["cuda_x2"], wg=True, per_sm=1)
    if H > 16:  # blocks of 64 heads (32 heads padded to 64)
        cuda["cuda_wg64_x1"] = Plan(
            block_h=64, block_n=64, num_warps=12, swap=False, cuda=True, wg64=True, per_sm=1
        )
    if H <= 32:  # and FlashMLA's sparse prefill over the workspace, the heads padded to 64
        return MappingProxyType(small | cuda | {"flashmla": _FLASHMLA})
    many_heads = {
        "direct64_n32": Plan(block_h=64, block_n=32, num_warps=8, swap=False),
        "direct64_n64": Plan(block_h=64, block_n=64, num_warps=8, swap=False),
        "skew64_n32": Plan(block_h=64, block_n=32, num_warps=8, swap=False, skew=True),
        "direct_n32_bh16": small["direct_n32"],
        "swap_w8_n32_pf_bh16": small["swap_w8_n32_pf"],
        "flashmla": _FLASHMLA,
        "flashmla_private": Plan(
            block_h=64, block_n=32, num_warps=8, swap=False, flashmla=True, private=True
        ),
    }
    return MappingProxyType(cuda | many_heads)


_FLASHMLA = Plan(block_h=64, block_n=32, num_warps=8, swap=False, flashmla=True)


@functools.cache
def _exact_variants(H: int) -> MappingProxyType:
    """The exact path's variants (fp32 q) at H heads: 16-head programs (with q's three parts,
    32 or 64 heads per program need more than the SM's 227 KB of shared memory), no FlashMLA
    (bf16 q) or SKEW, plus `ieee_bh16` (fp32 tiles with IEEE products: the exact path before
    the three-part split), and the CUDA kernel's exact mode (blocks of 8 heads at any H, so
    its half build too)."""
    v = {k: p for k, p in _variants(8).items() if not (p.flashmla or p.skew)}
    v["ieee_bh16"] = Plan(block_h=16, block_n=32, num_warps=4, swap=False, ieee=True)
    return MappingProxyType(v)


def variants_for(H: int, exact: bool = False) -> dict:
    """Named launch options (every field of `Plan`) of each variant `plan_for` chooses from at H
    heads, for bf16 q or (exact) fp32 q; the GPU tests run each, benchmarks/bench_attention.py
    --sweep times each."""
    v = _exact_variants(H) if exact else _variants(H)
    return {name: dataclasses.asdict(plan) for name, plan in v.items()}
