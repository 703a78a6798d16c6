"""The attention of a global layer when every visible compressed entry is selected.

    o[t, h] = softmax([q.K_swa, q.K_main[s] for s visible] * scale  ||  sink[h]) . [V..., 0]

This is `layers.sparse_attention.sparse_attention` with the top-k replaced by all entries the
query may see (the dense warm-up of the indexer's training): the same softmax, the same sink,
without materialising K_main per query. It also returns the softmax mass of each main-KV
entry, which the indexer is distilled towards; `selected_mass` gives the same for the
sparse phase (the selected slots of `sparse_attention`).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def dense_attention(
    q: torch.Tensor,
    k_swa: torch.Tensor,
    swa_ok: torch.Tensor,
    main: torch.Tensor,
    main_ok: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
):
    """q [T, H, D], k_swa [T, W, D], swa_ok bool [T, W], main [N, D] (every entry of the kv
    source), main_ok bool [T, N] (visible), sink fp32 [H]
    -> (o [T, H, D], p_main [T, H, N] the softmax mass of each main entry)."""
    T, H, _ = q.shape
    W = k_swa.shape[1]
    q = q.float()
    s_swa = torch.einsum("thd,twd->thw", q, k_swa.float()) * scale  # [T, H, W]
    s_main = torch.einsum("thd,nd->thn", q, main.float()) * scale  # [T, H, N]
    s_swa = s_swa.masked_fill(~swa_ok[:, None, :], NEG_INF)
    s_main = s_main.masked_fill(~main_ok[:, None, :], NEG_INF)
    sink_col = sink.float()[None, :, None].expand(T, H, 1)  # [T, H, 1]
    p = torch.softmax(torch.cat((s_swa, s_main, sink_col), dim=-1), dim=-1)
    p_swa, p_main = p[..., :W], p[..., W:-1]
    o = torch.einsum("thw,twd->thd", p_swa, k_swa.float()) + torch.einsum(
        "thn,nd->thd", p_main, main.float()
    )
    return o, p_main


def selected_mass(q, k_swa, swa_ok, k_top, top_ok, sink, scale: float) -> torch.Tensor:
    """`selected_probs` without gradient."""
    with torch.no_grad():
        return selected_probs(q, k_swa, swa_ok, k_top, top_ok, sink, scale)


def selected_probs(
    q: torch.Tensor,
    k_swa: torch.Tensor,
    swa_ok: torch.Tensor,
    k_top: torch.Tensor,
    top_ok: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The softmax mass `sparse_attention` gives each selected slot (with graph):
    q [T, H, D], k_swa [T, W, D], swa_ok bool [T, W], k_top [T, TOPK, D], top_ok bool
    [T, TOPK], sink fp32 [H] -> p_top fp32 [T, H, TOPK]."""
    T, H, _ = q.shape
    W = k_swa.shape[1]
    kv = torch.cat((k_swa, k_top), dim=1).float()  # [T, W + TOPK, D]
    ok = torch.cat((swa_ok, top_ok), dim=1)
    s = torch.einsum("thd,tsd->ths", q.float(), kv) * scale
    s = s.masked_fill(~ok[:, None, :], NEG_INF)
    sink_col = sink.float()[None, :, None].expand(T, H, 1)
    p = torch.softmax(torch.cat((s, sink_col), dim=-1), dim=-1)  # [T, H, W + TOPK + 1]
    return p[..., W:-1]
