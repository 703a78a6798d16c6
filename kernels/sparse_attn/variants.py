"""The launcher's vocabulary: `Variant`, the one choice the plan makes for a shape, and `SPECS`,
what each variant launches. Every variant here is chosen for some shape (`plan.choices`; the
table: `python -m sglang_dsv41.kernels.sparse_attn.plan`), each where it measured fastest on
the H200 (benchmarks/RESULTS.md). A spec is one of:

- `Cuda(build, per_sm)`: the CUDA kernel (`cuda_decode`) in one of its builds, the splits
  filling the GPU with per_sm blocks per SM;
- `Triton(heads, block_n, ...)`: the Triton kernel (`triton_kernel`) over the records, or with
  `workspace` over a bf16 workspace of the records referenced (`triton_workspace`);
- `FlashMla(private)`: FlashMLA's sparse prefill over that workspace (`triton_flashmla`), with
  `private` one row per (token, entry).

`Plan` is one launch: the variant, its Triton tile shape at the call's heads, the splits.
Imports nothing heavy (no torch, no Triton): the package imports where Triton is missing.
"""

from __future__ import annotations

import dataclasses
import enum
from types import MappingProxyType


class Variant(str, enum.Enum):
    """A named way to run the attention (names: route, tile or build, blocks per SM)."""

    CUDA_WIDE_X1 = "cuda_wide_x1"
    CUDA_X2 = "cuda_x2"
    CUDA_X3 = "cuda_x3"
    CUDA32_X2 = "cuda32_x2"
    CUDA_SLIM_X2 = "cuda_slim_x2"
    CUDA_SLIM_X3 = "cuda_slim_x3"
    CUDA_SLIM_X4 = "cuda_slim_x4"
    CUDA_HALF_X4 = "cuda_half_x4"
    CUDA_HALF_X5 = "cuda_half_x5"
    CUDA_WG64_X1 = "cuda_wg64_x1"
    DIRECT_N32_X2 = "direct_n32_x2"
    DIRECT_N32_PF_X2 = "direct_n32_pf_x2"
    SWAP_W8_N32_PF = "swap_w8_n32_pf"
    SKEW64_N32 = "skew64_n32"
    WS_DIRECT_N64 = "ws_direct_n64"
    WS_DIRECT_N32 = "ws_direct_n32"
    FLASHMLA = "flashmla"
    FLASHMLA_PRIVATE = "flashmla_private"
    PLAIN_N32 = "plain_n32"
    PLAIN_N32_IEEE = "plain_n32_ieee"


class Build(enum.Enum):
    """The CUDA kernel's builds (NVRTC options: `cuda_decode.defines_for`), each the fastest
    somewhere on the H200. Blocks of 8 or 16 heads unless said."""

    TILES16 = "tiles16"  # four warps, tiles of 16, two tile buffers, three stages: 3 blocks / SM
    TILES32 = "tiles32"  # tiles of 32, one tile buffer, two stages: fewer barriers, 2 blocks / SM
    SLIM = "slim"  # tiles of 16, one tile buffer: 4 blocks / SM at 8 heads a block, 3 at 16
    HALF = "half"  # two warps, each half of D; blocks of 8 heads: 5 blocks / SM (4 for fp32 q)
    WIDE = "wide"  # eight warps, each an eighth of D (a tile's chain half as long): 2 blocks / SM
    WG64 = "wg64"  # cuda_wg64.cu: blocks of 64 bf16 heads, tiles of 64, one block per SM


def _pow2(n: int) -> int:
    """The least power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class Heads(enum.Enum):
    """How many of H heads one Triton program takes."""

    RANK = "rank"  # a rank's heads at once up to 32 (bf16 q); 16 for fp32 q and above 32 heads
    ALL = "all"  # up to 64 at once
    SIXTY_FOUR = "64"

    def per_program(self, H: int, exact: bool) -> int:
        """Heads per program (a power of two >= 16): with fp32 q's three parts, programs of 32
        or 64 heads need more than the SM's 227 KB of shared memory (`Heads.RANK`)."""
        if self is Heads.SIXTY_FOUR:
            return 64
        if self is Heads.ALL:
            return min(64, max(16, _pow2(H)))
        return 16 if exact or H > 32 else max(16, _pow2(H))


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The Triton kernel's compile-time launch (`triton_kernel`): heads per program, entries per
    tile, warps, pipeline stages; swap: the entries on the MMA's M axis (else the heads);
    skew: P V one tile late; prefetch: the next tile's slots and records requested ahead."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int = 1
    swap: bool = False
    skew: bool = False
    prefetch: bool = False


@dataclasses.dataclass(frozen=True)
class Cuda:
    build: Build
    per_sm: int


@dataclasses.dataclass(frozen=True)
class Triton:
    """num_warps None: 4 for programs of 16 heads, else 8. ieee: fp32 q as fp32 tiles with IEEE
    products (cheap at small head dims) instead of three bf16 parts."""

    heads: Heads
    block_n: int
    num_warps: int | None = None
    num_stages: int = 1
    swap: bool = False
    skew: bool = False
    prefetch: bool = False
    per_sm: int = 1
    workspace: bool = False
    ieee: bool = False

    def tiles(self, H: int, exact: bool) -> Tiles:
        bh = self.heads.per_program(H, exact)
        nw = self.num_warps or (4 if bh <= 16 else 8)
        return Tiles(bh, self.block_n, nw, self.num_stages, self.swap, self.skew, self.prefetch)


@dataclasses.dataclass(frozen=True)
class FlashMla:
    private: bool


Spec = Cuda | Triton | FlashMla
_V, _B, _R = Variant, Build, Heads.RANK
SPECS: MappingProxyType[Variant, Spec] = MappingProxyType(
    {
        _V.CUDA_WIDE_X1: Cuda(_B.WIDE, per_sm=1),
        _V.CUDA_X2: Cuda(_B.TILES16, per_sm=2),
        _V.CUDA_X3: Cuda(_B.TILES16, per_sm=3),
        _V.CUDA32_X2: Cuda(_B.TILES32, per_sm=2),
        _V.CUDA_SLIM_X2: Cuda(_B.SLIM, per_sm=2),
        _V.CUDA_SLIM_X3: Cuda(_B.SLIM, per_sm=3),
        _V.CUDA_SLIM_X4: Cuda(_B.SLIM, per_sm=4),
        _V.CUDA_HALF_X4: Cuda(_B.HALF, per_sm=4),
        _V.CUDA_HALF_X5: Cuda(_B.HALF, per_sm=5),
        _V.CUDA_WG64_X1: Cuda(_B.WG64, per_sm=1),
        _V.DIRECT_N32_X2: Triton(_R, 32, per_sm=2),
        _V.DIRECT_N32_PF_X2: Triton(_R, 32, prefetch=True, per_sm=2),
        _V.SWAP_W8_N32_PF: Triton(_R, 32, num_warps=8, swap=True, prefetch=True),
        _V.SKEW64_N32: Triton(Heads.SIXTY_FOUR, 32, num_warps=8, skew=True),
        _V.WS_DIRECT_N64: Triton(_R, 64, num_stages=2, workspace=True),
        _V.WS_DIRECT_N32: Triton(_R, 32, num_stages=3, workspace=True),
        _V.FLASHMLA: FlashMla(private=False),
        _V.FLASHMLA_PRIVATE: FlashMla(private=True),
        _V.PLAIN_N32: Triton(Heads.ALL, 32),
        _V.PLAIN_N32_IEEE: Triton(Heads.ALL, 32, ieee=True),
    }
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One launch: `variant`; tiles: the Triton routes' tile shape at the call's heads (None on
    the others); num_splits: per (token, block of heads), None = fill the GPU `per_sm` times."""

    variant: Variant
    tiles: Tiles | None = None
    num_splits: int | None = None

    @property
    def spec(self) -> Spec:
        return SPECS[self.variant]


def plan_of(
    variant: Variant | str,
    H: int,
    exact: bool,
    tiles: Tiles | None = None,
    num_splits: int | None = None,
) -> Plan:
    """The plan that runs `variant` (or its name) at H heads, bf16 or (exact) fp32 q; tiles
    replace a Triton variant's tile shape (refused on the other routes)."""
    try:
        variant = Variant(variant)
    except ValueError:
        names = [v.value for v in Variant]
        raise ValueError(f"unknown variant {variant!r}; one of {names}") from None
    spec = SPECS[variant]
    if not isinstance(spec, Triton):
        if tiles is not None:
            raise ValueError(f"tiles apply to the Triton variants, not to {variant.value}")
        return Plan(variant, None, num_splits)
    return Plan(variant, tiles or spec.tiles(H, exact), num_splits)
