"""Torch reference of sparse MQA attention over V4.1 records (DESIGN.md section 3, step 7).

For query token t and head h: one softmax over
    [q[t,h] . K_swa[t, :] * scale,  q[t,h] . K_topk[t, :] * scale,  attn_sink[h]]
with K = V (the records' dequantized D-vectors), the sink unscaled and of value zero. Entries whose
slot is -1 are left out. A token that sees nothing gets o = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kv.records import Layout, record_bytes, unpack


def gather_records(cache: Tensor, slots: Tensor, layout: Layout, dim: int) -> Tensor:
    """cache uint8 [..., B] (slots = rows of cache.view(-1, B)), slots [T, N] int (-1 = none)
    -> fp32 [T, N, D] dequantized like `kv.records.unpack`, zeros at -1 entries."""
    flat = cache.view(-1, record_bytes(layout, dim))
    rec = flat[slots.clamp(min=0).long()]  # [T, N, B]
    k = unpack(layout, rec)  # [T, N, D]
    return torch.where((slots >= 0)[..., None], k, torch.zeros((), dtype=k.dtype, device=k.device))


def sparse_attention_ref(
    q: Tensor,
    swa_cache: Tensor | None,
    swa_slots: Tensor | None,
    kv_cache: Tensor | None,
    topk_slots: Tensor | None,
    kv_layout: Layout = Layout.V41_FP4,
    attn_sink: Tensor | None = None,
    scale: float | None = None,
    out_dtype: torch.dtype | None = None,
    compute_dtype: torch.dtype = torch.float32,
    chunk: int = 64,
) -> Tensor:
    """o [T, H, D] = sparse attention of q over SWA records (V41) and top-k records (kv_layout).

    q [T, H, D] float; swa_cache uint8 [..., D + D/32] with swa_slots [T, W] int (-1 = skip);
    kv_cache uint8 [..., record_bytes(kv_layout, D)] with topk_slots [T, TOPK] (-1 = skip);
    either pair may be None. attn_sink fp32 [H] or None; scale defaults to D^-0.5.
    compute_dtype: fp32 for the oracle, bf16 for "plain bf16 torch" (the 2x error bar);
    records are dequantized in fp32 first (exact in bf16 too). Rows are done `chunk` at a time.
    """
    T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    out = torch.empty(T, H, D, dtype=out_dtype or q.dtype, device=q.device)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        ks, masks = [], []
        if swa_slots is not None and swa_slots.shape[1] > 0:
            ks.append(gather_records(swa_cache, swa_slots[t0:t1], Layout.V41, D))
            masks.append(swa_slots[t0:t1] >= 0)
        if topk_slots is not None and topk_slots.shape[1] > 0:
            ks.append(gather_records(kv_cache, topk_slots[t0:t1], kv_layout, D))
            masks.append(topk_slots[t0:t1] >= 0)
        qc = q[t0:t1].to(compute_dtype)  # [t, H, D]
        if not ks:
            out[t0:t1] = 0
            continue
        k = torch.cat(ks, dim=1).to(compute_dtype)  # [t, N, D]
        valid = torch.cat(masks, dim=1)  # [t, N]
        logits = torch.einsum("thd,tnd->thn", qc, k) * scale  # [t, H, N]
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        if attn_sink is not None:
            sink = attn_sink.to(compute_dtype)[None, :, None].expand(t1 - t0, H, 1)
            logits = torch.cat((logits, sink), dim=-1)  # [t, H, N + 1]
        p = torch.softmax(logits, dim=-1)
        p = torch.nan_to_num(p[..., : k.shape[1]], nan=0.0)  # rows that saw nothing -> 0
        out[t0:t1] = torch.einsum("thn,tnd->thd", p, k).to(out.dtype)
    return out
