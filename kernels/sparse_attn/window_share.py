"""A prefill's SWA windows attended once per group of neighbouring query tokens (SM90).

In a prefill (or any extend) the window of token t at position p is the W slots of positions
p - W + 1 .. p, so G consecutive tokens of one request read W + G - 1 distinct window records
between them instead of G W: the per-token CUDA kernel dequantizes and multiplies each window
record once per token that sees it (a window record costs ~1.7 top-k records' time: 528 B of
e4m3 against 288 B of e2m1). At H = 8 or 16 heads per GPU, G = 64 / H tokens make the 64 rows
of the 64-head warpgroup kernel (`cuda_wg64.cu`): `window_partials` cuts the first T - T mod G
tokens into groups, takes the union of each group's first and last token's windows (W + G - 1
entries) and runs that kernel once per group over the union, with the band mask (row (i, h)
sees union entries i .. i + W - 1) and bf16 partials out. A token is *covered* when its own list
is exactly its slice of the union (`covered_ref` states the rule; tokens of another request, of
the tail or with lists that are not windows are not); for covered tokens the partial is the
softmax of the window alone: o_w (normalized) and its base-2 log-sum-exp. The per-token kernel
(`cuda_decode.sparse_attention(..., win_share=True)`) then reads a covered token's top-k
entries only and joins its window partial in the output factors like a second sink; an
uncovered token keeps its whole list there, so the result is the same softmax for any lists.

Shapes: q bf16 [T, H, 512]; swa_flat uint8 [S, 528] (V41 records); swa_slots int32 [T, W]
(-1 = left out), W >= G. Out: o_w bf16 [T, H, 512], lse_w fp32 [T, H] (base 2, of the logits x
scale; -inf where the window holds no entry), covered int32 [T] (1 / 0); o_w and lse_w are
meaningful for covered tokens only.

The math is `layers.sparse_attention.attend_keys` over the window's keys alone (`partials_ref`,
the torch reference; the GPU tests compare both, and the joined output with the whole formula,
`ref.sparse_attention_ref`). Runs where the CUDA kernel runs (SM90); the union and coverage
(`union_and_coverage`) are torch ops, tested on the CPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

ROWS = 64  # (token, head) rows of one group: the 64-head kernel's M


def group_tokens(H: int) -> int | None:
    """Tokens per group at H heads (64 / H), or None where H is not 8 or 16."""
    return ROWS // H if H in (8, 16) else None


def union_and_coverage(swa_slots: Tensor, G: int) -> tuple[Tensor, Tensor]:
    """(union int32 [T // G, W + G - 1]: group g's first token's window, then the last G - 1
    entries of its last token's; covered int32 [T]: 1 where the token's list equals its slice
    union[g, i : i + W] (i its place in the group), 0 elsewhere and for the tail tokens).
    Torch ops on the lists' device, no host sync."""
    T, W = swa_slots.shape
    n = T // G
    v = swa_slots[: n * G].view(n, G, W)
    union = torch.cat((v[:, 0, :], v[:, G - 1, W - G + 1 :]), dim=1).contiguous()
    covered = torch.zeros(T, dtype=torch.int32, device=swa_slots.device)
    covered[: n * G] = (union.unfold(1, W, 1) == v).all(dim=2).flatten().to(torch.int32)
    return union, covered


def window_partials(
    q: Tensor, swa_flat: Tensor, swa_slots: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(o_w bf16 [T, H, D], lse_w fp32 [T, H], covered int32 [T]); see the module docstring.
    One launch of the 64-head kernel with the band mask, no host sync."""
    from sglang_dsv41.kernels.sparse_attn import cuda_decode

    T, H, D = q.shape
    W = swa_slots.shape[1]
    G = group_tokens(H)
    if G is None or q.dtype != torch.bfloat16 or D != 512:
        raise ValueError(f"window_partials takes bf16 q [T, 8 or 16, 512], got {q.dtype} {q.shape}")
    if W < G:
        raise ValueError(f"window_partials needs W >= {G} (tokens per group at {H} heads), got {W}")
    union, covered = union_and_coverage(swa_slots, G)
    o = torch.empty(T, H, D, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    n = T // G
    if n:
        qg = q[: n * G].contiguous().view(n, ROWS, D)
        cuda_decode.band_partials(qg, swa_flat, union, W, H, scale, o[: n * G], lse[: n * G])
    return o, lse, covered


def covered_ref(swa_slots: Tensor, H: int) -> Tensor:
    """bool [T]: token t0 + i of a full group (t0 = G floor(t / G), t0 + G <= T) is covered when
    entry w of its list equals union entry i + w for every w, the union being token t0's list
    followed by the last G - 1 entries of token t0 + G - 1's."""
    T, W = swa_slots.shape
    G = group_tokens(H)
    cov = torch.zeros(T, dtype=torch.bool, device=swa_slots.device)
    for t0 in range(0, T - G + 1, G):
        union = torch.cat((swa_slots[t0], swa_slots[t0 + G - 1, W - G + 1 :]))
        for i in range(G):
            cov[t0 + i] = bool(torch.equal(swa_slots[t0 + i], union[i : i + W]))
    return cov


def partials_ref(
    q: Tensor, swa_cache: Tensor, swa_slots: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Torch reference of the window partials of every token (covered or not): (o_w fp32 [T,
    H, D] = `layers.sparse_attention.attend_keys` over the token's window alone, no sink;
    lse_w fp32 [T, H], base 2, -inf where the window holds no entry)."""
    from sglang_dsv41.kernels.sparse_attn.ref import gather_records
    from sglang_dsv41.kv.records import Layout
    from sglang_dsv41.layers.sparse_attention import attend_keys

    T, H, D = q.shape
    keys = gather_records(swa_cache, swa_slots, Layout.V41, D)  # [T, W, D]
    ok = swa_slots >= 0
    no_sink = torch.full((H,), float("-inf"), device=q.device)
    o = attend_keys(q.float(), keys, ok, no_sink, scale, torch.float32)
    logits = torch.einsum("thd,twd->thw", q.float(), keys) * scale
    logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    seen = ok.any(dim=1)[:, None, None]
    return torch.where(seen, o, torch.zeros((), device=q.device)), lse
