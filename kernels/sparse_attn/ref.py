"""Torch reference of sparse MQA attention over V4.1 records (docs/design.md 2.2, step 7).

The formula is the oracle's, `sglang_dsv41.layers.sparse_attention` (one softmax over the SWA
logits, the top-k logits and the sink; K = V; the sink unscaled with a zero value); this file only
adds the gather and dequantization of the records named by the slot lists (-1 = left out). A
token that sees nothing gets o = 0, with or without a sink.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kv.records import Layout, record_bytes, unpack
from sglang_dsv41.layers.sparse_attention import sparse_attention


def gather_records(cache: Tensor, slots: Tensor, layout: Layout, dim: int) -> Tensor:
    """cache uint8 [..., B] (slots = rows of cache.view(-1, B)), slots [T, N] int (-1 = none)
    -> fp32 [T, N, D] dequantized like `kv.records.unpack`, zeros at -1 entries."""
    flat = cache.view(-1, record_bytes(layout, dim))
    rec = flat[slots.clamp(min=0).long()]  # [T, N, B]
    k = unpack(layout, rec)  # [T, N, D]
    return torch.where((slots >= 0)[..., None], k, torch.zeros((), dtype=k.dtype, device=k.device))


def _decoded_once(cache, slots, layout, D):
    """CPU: (values fp32 [U, D], index int64 [T, N] into them) with every distinct record of
    `slots` decoded once; a prefill's queries share most of their keys. None elsewhere (the
    distinct count is a host sync, and the GPU reference must stay graph-capturable)."""
    if slots is None or slots.device.type != "cpu" or slots.shape[0] < 2:
        return None
    flat = cache.view(-1, record_bytes(layout, D))
    uniq, index = torch.unique(slots.clamp(min=0).long(), return_inverse=True)
    return unpack(layout, flat[uniq]), index


def _keys(cache, slots, layout, rows: slice, q: Tensor, decoded) -> tuple[Tensor, Tensor]:
    """(keys fp32 [t, N, D], valid bool [t, N]) of one slot list, [t, 0, D] when absent."""
    t, D = rows.stop - rows.start, q.shape[-1]
    if slots is None:
        return q.new_zeros(t, 0, D, dtype=torch.float32), torch.zeros(
            t, 0, dtype=torch.bool, device=q.device
        )
    s = slots[rows]
    ok = s >= 0
    if decoded is None:
        return gather_records(cache, s, layout, D), ok
    values, index = decoded
    k = values[index[rows]]  # [t, N, D]
    return torch.where(ok[..., None], k, k.new_zeros(())), ok


def sparse_attention_ref(
    q: Tensor,
    kv: SparseKV,
    attn_sink: Tensor | None = None,
    scale: float | None = None,
    out_dtype: torch.dtype | None = None,
    compute_dtype: torch.dtype = torch.float32,
    chunk: int | None = None,
) -> Tensor:
    """o [T, H, D] = sparse attention of q over kv's SWA records (V41) and top-k records.

    q [T, H, D] float; kv: kernels.args.SparseKV; attn_sink fp32 [H] or None; scale defaults to
    D^-0.5. compute_dtype: fp32 for the oracle, bf16 for "plain bf16 torch" (the 2x error bar);
    fp64 queries always compute in fp64 (the twin check, tools/twin_check.py);
    records are dequantized in fp32 first (exact in bf16 too). Rows are done `chunk` at a time
    (default: as many as keep the gathered keys near 64 MiB, at least 64).
    """
    T, H, D = q.shape
    kv.check_dim(D)
    if q.dtype == torch.float64:
        compute_dtype = torch.float64
    scale = D**-0.5 if scale is None else scale
    sink = attn_sink if attn_sink is not None else q.new_full((H,), float("-inf"))
    out = torch.empty(T, H, D, dtype=out_dtype or q.dtype, device=q.device)
    swa = (kv.swa_cache, kv.swa_slots, Layout.V41)
    top = (kv.kv_cache, kv.topk_slots, kv.kv_layout)
    swa_dec, top_dec = (_decoded_once(*src, D) for src in (swa, top))
    if chunk is None:
        n_keys = sum(s.shape[1] for s in (kv.swa_slots, kv.topk_slots) if s is not None)
        chunk = max(64, (64 << 20) // (4 * D * max(n_keys, 1)))
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        k_swa, swa_ok = _keys(*swa, rows, q, swa_dec)
        k_top, top_ok = _keys(*top, rows, q, top_dec)
        o = sparse_attention(q[rows], k_swa, swa_ok, k_top, top_ok, sink, scale, compute_dtype)
        seen = torch.cat((swa_ok, top_ok), dim=1).any(dim=1)  # [t]
        out[rows] = torch.where(seen[:, None, None], o, o.new_zeros(()))
    return out
