"""The lightning indexer's scoring and selection, stated as plain torch (the oracle's definition).

    I[t, s] = sum_h w[t, h] * ReLU(qI[t, h] . k[s])            over visible entries s
    top-k   = the min(TOPK, #allowed) allowed entries with the highest scores, -1 padded

Selection is deterministic: higher score first, ties broken by the lower index, so the oracle
and every serving path pick the same set whenever their scores agree. The candidate pool of the
decoder's candidate source (docs/design.md 2.2, step 6) max-pools the score row over blocks,
forces the block holding the newest visible entry, and keeps the top blocks (ties -> lower
block id).
"""

import torch

from sglang_dsv41.kv.pages import entries_visible
from sglang_dsv41.layers.linear import stable_linear

NEG_INF = float("-inf")


def index_scores(qI: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """qI [T, HI, DI], w [T, HI], k [N, DI] -> fp32 [T, N]."""
    T, HI, DI = qI.shape
    dots = stable_linear(qI.float().reshape(T * HI, DI), k.float()).view(T, HI, -1)  # [T, HI, N]
    return head_sum(w, dots)


def head_sum(w: torch.Tensor, dots: torch.Tensor) -> torch.Tensor:
    """w [T, HI], dots fp32 [T, HI, N] (qI . k) -> fp32 [T, N]: sum_h w[t, h] ReLU(dots).
    A plain sum over heads: its order does not depend on N (an einsum's batched GEMV would)."""
    return (w.float()[:, :, None] * dots.clamp_min(0)).sum(1)


def visible_mask(pos: torch.Tensor, ratio: int, n: int) -> torch.Tensor:
    """bool [T, n]: entry s is visible at position pos when s < entries_visible(pos, ratio)."""
    vis = entries_visible(pos, ratio)  # [T]
    return torch.arange(n, device=pos.device)[None, :] < vis[:, None]


def _stable_top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of the k largest values per row, ties -> lower index (stable sort)."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return order[:, :k]


def topk_indices(scores: torch.Tensor, allowed: torch.Tensor, topk: int) -> torch.Tensor:
    """scores fp32 [T, N], allowed bool [T, N] -> int64 [T, topk]; -1 where fewer are allowed.

    Entries with a NaN score sort as -inf here (never preferred over a real score).
    """
    T, N = scores.shape
    out = torch.full((T, topk), -1, dtype=torch.int64, device=scores.device)
    if N == 0:
        return out
    s = torch.where(allowed & ~torch.isnan(scores), scores, torch.full_like(scores, NEG_INF))
    # Allowed -inf scores cannot happen (scores are finite); masked entries sit strictly below.
    key = torch.where(allowed, s, torch.full_like(s, NEG_INF))
    k = min(topk, N)
    idx = _stable_top(key, k)  # [T, k]
    n_ok = allowed.sum(-1)  # [T]
    keep = torch.arange(k, device=scores.device)[None, :] < n_ok[:, None]
    out[:, :k] = torch.where(keep, idx, torch.full_like(idx, -1))
    return out


def candidate_blocks(
    scores: torch.Tensor, visible: torch.Tensor, block: int, n_blocks: int
) -> torch.Tensor:
    """Block ids [T, n_blocks] int64 (-1 padded) of each query's candidate pool.

    scores fp32 [T, N] (entries s >= visible[t] are ignored), visible int64 [T] >= 1.
    Block b covers entries [b*block, (b+1)*block). Block score = max over its visible entries
    (-inf padding); the newest block (visible-1)//block is forced in; the rest are the highest
    block scores, ties -> lower block id. At most min(n_blocks, #visible blocks) ids per row.
    """
    T, N = scores.shape
    nb = -(-N // block)
    pad = torch.full((T, nb * block), NEG_INF, dtype=torch.float32, device=scores.device)
    vis = torch.arange(N, device=scores.device)[None, :] < visible[:, None]
    pad[:, :N] = torch.where(vis, scores.float(), torch.full_like(scores.float(), NEG_INF))
    bscore = pad.view(T, nb, block).amax(-1)  # [T, nb]
    bscore = torch.nan_to_num(bscore, nan=NEG_INF)
    n_vis_blocks = (visible + block - 1) // block  # [T]
    newest = (visible - 1) // block
    bid = torch.arange(nb, device=scores.device)[None, :]
    bscore = torch.where(bid == newest[:, None], torch.full_like(bscore, float("inf")), bscore)
    # Visible blocks whose entries all score -inf still rank above invisible blocks.
    key = torch.where(
        bid < n_vis_blocks[:, None],
        bscore.clamp_min(torch.finfo(torch.float32).min),
        torch.full_like(bscore, NEG_INF),
    )
    k = min(n_blocks, nb)
    idx = _stable_top(key, k)
    keep = torch.arange(k, device=scores.device)[None, :] < n_vis_blocks[:, None]
    out = torch.full((T, n_blocks), -1, dtype=torch.int64, device=scores.device)
    out[:, :k] = torch.where(keep, idx, torch.full_like(idx, -1))
    return out


def pool_mask(blocks: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """bool [T, n]: entry s is in the pool when its block s // block is among `blocks` [T, NB]."""
    T = blocks.shape[0]
    nb = -(-n // block)
    hit = torch.zeros(T, nb + 1, dtype=torch.bool, device=blocks.device)
    hit.scatter_(1, torch.where(blocks >= 0, blocks, torch.full_like(blocks, nb)), True)
    ent_block = torch.arange(n, device=blocks.device) // block
    return hit[:, :nb][:, ent_block]
