"""Which kernel runs for a shape: `choices` names the variants (`variants.Variant`) for T tokens x
H heads per GPU, bf16 or fp32 q, best first; `plan_for` runs the first one that runs here. Both
read the shape alone, so a decode call stays CUDA-graph capturable. The table, from this code:

    python -m sglang_dsv41.kernels.sparse_attn.plan [--heads 8,16,64] [--exact | --both]
        [--device cuda]

(`--device`: also which choice runs on that device; docs/hopper_attention.md shows `--both`).

What was measured fastest on the H200 (benchmarks/RESULTS.md), D = 512:
- the CUDA kernel (`cuda_decode`, SM90, NVRTC) wherever `_cuda_choice` names a build: in decode
  with fewer than 8 (token, block of heads) pairs its wide build; up to 16 heads always; fp32 q
  at any head count (blocks of 8 heads); above 16 bf16 heads in decode from 2 tokens the
  64-head warpgroup kernel;
- FlashMLA's sparse prefill over a bf16 workspace (SM90, `flash_mla` installed): in prefill
  (T >= 1024) from 17 bf16 heads (fewer than 64 padded to 64), and at 64 / 128 heads from 128
  tokens where the CUDA kernel does not run (below 1024 tokens one row per (token, entry));
- else the Triton kernel: up to 16 heads 16-head programs with the heads on M, tiles of 32,
  splits filling the GPU twice (from 32 tokens the next tile requested ahead); 17-32 heads
  the entries on M; more heads 16-head programs below 8 tokens, else 64-head programs with
  P V one tile late; up to 32 heads in prefill over a bf16 workspace of the records referenced;
  fp32 q in 16-head programs with q and P in three exact bf16 parts;
- head dims below 512 and TRITON_INTERPRET=1: the plain Triton launch (heads on M).
A choice that cannot run here (not SM90, its CUDA build failed: logged once by
`cuda_decode.build_error`; no `flash_mla`) gives way to the next, down to a Triton one.
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton

from ..dispatch import device_capability, triton_interpreting
from . import cuda_decode, triton_flashmla
from .cuda_decode import defines_for, group_heads
from .variants import SPECS, Cuda, FlashMla, Plan, Variant, plan_of

V = Variant
PREFILL_MIN_TOKENS = 1024  # from here on the prefill choices (the workspace routes)
FLASHMLA_PRIVATE_MIN_TOKENS = 128  # 64 / 128 heads from here to 1024: FlashMLA, per-entry rows
# decode with fewer (token, block of heads) pairs than this, at any head count: the CUDA
# kernel's wide build (each block then has one to three tiles, so the chain of work per tile
# bounds the time)
WIDE_UNDER_BLOCKS = 8
# up to 8 bf16 heads from this many decode tokens to 127: the slim build in grids of three
# blocks per SM (2.5-25 % under tiles of 16 in grids of two blocks per SM)
SLIM_X3_MIN_TOKENS = 40
HEADS = (8, 16, 32, 64, 128)  # the table's head counts: a GPU's heads at TP16 .. DP attention
MAX_TOKENS = 4096  # the table's last row holds from its first T on


def _cuda_choice(T: int, H: int, exact: bool) -> Variant | None:
    """The CUDA kernel's variant for T tokens x H heads where it was the fastest, else None.
    Decode under WIDE_UNDER_BLOCKS (token, block of heads) pairs: the wide build. Up to 8
    heads: the slim build from 128 tokens (four blocks per SM), for bf16 q from 40 in grids of
    three; the half build in prefill; else tiles of 16 (grids of 3 blocks per SM for fp32 q
    below 32 tokens). fp32 q above 8 heads (blocks of 8, each re-reading the records): the half
    build from 128 tokens, else tiles of 16 below 32 tokens, of 32 from there. 9-16 bf16 heads:
    the slim build in prefill and at 32-127 tokens, else tiles of 32. Above 16 bf16 heads in
    decode from 2 tokens: the 64-head warpgroup kernel (32 heads padded to 64)."""
    prefill = T >= PREFILL_MIN_TOKENS
    if not prefill and T * triton.cdiv(H, group_heads(H, exact)) < WIDE_UNDER_BLOCKS:
        return V.CUDA_WIDE_X1
    if H <= 8:
        if prefill:
            return V.CUDA_HALF_X4 if exact else V.CUDA_HALF_X5
        if T >= 128:
            return V.CUDA_SLIM_X4
        if T >= SLIM_X3_MIN_TOKENS and not exact:
            return V.CUDA_SLIM_X3
        return V.CUDA_X2 if T >= 32 or not exact else V.CUDA_X3
    if exact:
        if T >= 128:
            return V.CUDA_HALF_X4
        return V.CUDA_X3 if T < 32 else V.CUDA32_X2
    if H <= 16:
        return V.CUDA_SLIM_X2 if prefill or 32 <= T < 128 else V.CUDA32_X2
    if 2 <= T and not prefill:
        return V.CUDA_WG64_X1
    return None


def _triton_choices(T: int, H: int, exact: bool) -> tuple[Variant, ...]:
    """Without the CUDA kernel: FlashMLA where it is the fastest (when installed), then the
    Triton variant for the shape (the last choice: it runs wherever the launcher does)."""
    prefill = T >= PREFILL_MIN_TOKENS
    if exact:  # 16-head programs: under 8 of them the entries on M
        if prefill:
            return (V.WS_DIRECT_N32,)
        return (V.SWAP_W8_N32_PF if T * triton.cdiv(H, 16) < 8 else V.DIRECT_N32_X2,)
    first = (V.FLASHMLA,) if 16 < H < 64 and prefill else ()  # heads padded to 64
    if H <= 32 and prefill:
        return (*first, V.WS_DIRECT_N64)
    if H <= 16:
        return (V.DIRECT_N32_PF_X2 if T >= 32 else V.DIRECT_N32_X2,)
    if H <= 32 or T * triton.cdiv(H, 64) < 8:  # too few tokens for 64-head programs
        return (V.SWAP_W8_N32_PF,)
    if H in (64, 128) and T >= FLASHMLA_PRIVATE_MIN_TOKENS:
        first = (V.FLASHMLA if prefill else V.FLASHMLA_PRIVATE,)
    return (*first, V.SKEW64_N32)


@functools.lru_cache(maxsize=4096)
def choices(T: int, H: int, D: int = 512, exact: bool = False, interpret: bool = False):
    """The variants for T tokens x H heads x head dim D, fp32 q (`exact`) or bf16, best first
    (a tuple; the last always runs where the launcher does). interpret: TRITON_INTERPRET=1."""
    if interpret or D < 512:  # small models keep IEEE products on the GPU (cheap at small D)
        return (V.PLAIN_N32_IEEE if exact and not interpret else V.PLAIN_N32,)
    cuda = _cuda_choice(T, H, exact)
    return ((cuda,) if cuda else ()) + _triton_choices(T, H, exact)


def _cuda_error(defines: tuple, device: torch.device) -> str | None:
    """None when the CUDA build `defines` runs on device (built at its first use)."""
    return cuda_decode.build_error(defines, device)


def _flashmla_ok(device: torch.device) -> bool:
    return (
        device.type == "cuda" and device_capability(device)[0] == 9 and triton_flashmla.available()
    )


def runs(variant: Variant, H: int, exact: bool, device: torch.device) -> bool:
    """Whether `variant` runs on device at H heads (CUDA: its build loads; FlashMLA: installed;
    Triton: wherever the launcher runs)."""
    spec = SPECS[variant]
    if isinstance(spec, Cuda):
        return _cuda_error(defines_for(spec.build, H, exact), device) is None
    if isinstance(spec, FlashMla):
        return _flashmla_ok(device)
    return True


@functools.lru_cache(maxsize=1024)
def _plan(variant: Variant, H: int, exact: bool) -> Plan:
    return plan_of(variant, H, exact)


def plan_for(T: int, H: int, D: int, device: torch.device, exact: bool, cuda: bool = True) -> Plan:
    """The plan for T tokens x H heads x D on device: the first of `choices` that `runs` there;
    `exact`: fp32 q; `cuda` False: no CUDA variant (what a call whose arguments the CUDA kernel
    cannot take runs)."""
    interpret = triton_interpreting()
    for v in choices(T, H, D, exact, interpret):
        if (cuda or not isinstance(SPECS[v], Cuda)) and runs(v, H, exact, device):
            return _plan(v, H, exact)
    raise AssertionError(f"no variant runs T={T} H={H} D={D}")  # the last choice always runs


def table(H: int, exact: bool) -> list[tuple[int, int, tuple[Variant, ...]]]:
    """[(T0, T1, choices)] for T in 1..MAX_TOKENS at H heads, D = 512 (T1 = MAX_TOKENS: the
    choices hold from T0 on)."""
    rows: list = []
    for T in range(1, MAX_TOKENS + 1):
        c = choices(T, H, 512, exact)
        if rows and rows[-1][2] == c:
            rows[-1][1] = T
        else:
            rows.append([T, T, c])
    return [tuple(r) for r in rows]


def variants_at(H: int, exact: bool) -> tuple[Variant, ...]:
    """Every variant some T chooses at H heads (D = 512), fallbacks included, in table order."""
    seen: dict = {}
    for _, _, c in table(H, exact):
        seen.update(dict.fromkeys(c))
    return tuple(seen)


def reachable_builds() -> tuple[tuple, ...]:
    """The NVRTC options of every CUDA build some shape of the table chooses."""
    builds: dict = {}
    for H in HEADS:
        for exact in (False, True):
            for v in variants_at(H, exact):
                if isinstance(SPECS[v], Cuda):
                    builds[defines_for(SPECS[v].build, H, exact)] = None
    return tuple(builds)


def markdown(heads=HEADS, dtypes=(False,), device: torch.device | None = None) -> str:
    """The table as markdown: per q dtype, heads and token range, the choices best first (and
    with `device`, the one that runs there)."""
    head = "| q | heads | tokens | variants, best first |"
    rule = "|---|---|---|---|"
    if device is not None:
        head, rule = head + f" runs on {device} |", rule + "---|"
    lines = [head, rule]
    for exact in dtypes:
        for H in heads:
            for t0, t1, c in table(H, exact):
                tokens = f"{t0}+" if t1 == MAX_TOKENS else f"{t0}" if t0 == t1 else f"{t0}-{t1}"
                row = f"| {'fp32' if exact else 'bf16'} | {H} | {tokens} | "
                row += ", ".join(v.value for v in c) + " |"
                if device is not None:
                    row += f" {plan_for(t0, H, 512, device, exact).variant.value} |"
                lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="which sparse-attention kernel runs for a shape")
    ap.add_argument("--heads", default=",".join(map(str, HEADS)), help="heads per GPU")
    q = ap.add_mutually_exclusive_group()
    q.add_argument("--exact", action="store_true", help="fp32 q (the exact path) only")
    q.add_argument("--both", action="store_true", help="bf16 q, then fp32 q")
    ap.add_argument("--device", default=None, help="also which choice runs there, e.g. cuda")
    args = ap.parse_args(argv)
    dtypes = (False, True) if args.both else (args.exact,)
    device = torch.device(args.device) if args.device else None
    print(markdown([int(h) for h in args.heads.split(",")], dtypes, device))


if __name__ == "__main__":
    main()
