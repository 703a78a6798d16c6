"""The core of every V4.1 attention layer: one softmax over SWA keys, selected keys and a sink.

    o[t, h] = softmax([q.K_swa, q.K_top] * scale  ||  sink[h]) . [V_swa, V_top, 0]

MQA with K = V: one shared 512-d key/value per entry. The sink logit is unscaled and has a zero
value. Masked slots contribute nothing; a row with no valid slot attends to the sink only (o = 0).
"""

import torch

from sglang_dsv41.layers.dtypes import compute_dtype


def sparse_attention(
    q: torch.Tensor,
    k_swa: torch.Tensor,
    swa_ok: torch.Tensor,
    k_top: torch.Tensor,
    top_ok: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """q [T, H, D], k_swa [T, W, D], swa_ok bool [T, W], k_top [T, TOPK, D], top_ok bool
    [T, TOPK], sink fp32 [H] -> o [T, H, D] computed in `dtype` (default: fp32, fp64 for fp64
    queries)."""
    kv = torch.cat((k_swa, k_top), dim=1)  # [T, W + TOPK, D]
    ok = torch.cat((swa_ok, top_ok), dim=1)  # [T, W + TOPK]
    return attend_keys(q, kv, ok, sink, scale, dtype)


def attend_keys(
    q: torch.Tensor,
    kv: torch.Tensor,
    ok: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`sparse_attention` over its keys already joined: kv [T, S, D] (SWA keys, then top-k
    keys), ok bool [T, S] -> o [T, H, D]."""
    if dtype is None:
        dtype = compute_dtype(q)
    kv = kv.to(dtype)
    logits = torch.einsum("thd,tsd->ths", q.to(dtype), kv) * scale  # [T, H, S]
    logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
    sink_col = sink.to(dtype)[None, :, None].expand(q.shape[0], -1, 1)  # [T, H, 1]
    full = torch.cat((logits, sink_col), dim=-1)
    p = torch.softmax(full, dim=-1)[..., :-1]  # [T, H, S]
    return torch.einsum("ths,tsd->thd", p, kv)
