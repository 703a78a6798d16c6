"""Torch reference of sparse MQA attention over V4.1 records (docs/design.md 2.2, step 7).

The formula is the oracle's, `sglang_dsv41.layers.sparse_attention` (one softmax over the SWA
logits, the top-k logits and the sink; K = V; the sink unscaled with a zero value); this file only
adds the gather and dequantization of the records named by the slot lists (-1 = left out). A
token that sees nothing gets o = 0, with or without a sink.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sglang_dsv41.kernels.args import DecodedRecords, SparseKV
from sglang_dsv41.kv.records import Layout, record_bytes, unpack
from sglang_dsv41.layers.sparse_attention import attend_keys, sparse_attention


def gather_records(cache: Tensor, slots: Tensor, layout: Layout, dim: int) -> Tensor:
    """cache uint8 [..., B] (slots = rows of cache.view(-1, B)), slots [T, N] int (-1 = none)
    -> fp32 [T, N, D] dequantized like `kv.records.unpack`, zeros at -1 entries."""
    flat = cache.view(-1, record_bytes(layout, dim))
    rec = flat[slots.clamp(min=0).long()]  # [T, N, B]
    k = unpack(layout, rec)  # [T, N, D]
    return torch.where((slots >= 0)[..., None], k, torch.zeros((), dtype=k.dtype, device=k.device))


def decode_records(cache: Tensor, slots: Tensor, layout: Layout, dim: int) -> DecodedRecords:
    """Every distinct record of slots [T, N] (int, -1 = none) decoded once, on the CPU: a
    prefill's queries share most of their keys, and layers that share a top-k list can share its
    decode (SparseKV.topk_decoded). The distinct count is a host sync: the GPU reference gathers
    per row instead, to stay graph-capturable."""
    flat = cache.view(-1, record_bytes(layout, dim))
    if slots.shape[0] < 2:  # one query: its slots are the records
        uniq = slots.clamp(min=0).long().flatten()
        index = torch.arange(uniq.numel(), device=slots.device).view(slots.shape)
    else:
        uniq, index = torch.unique(slots.clamp(min=0).long(), return_inverse=True)
    values = unpack(layout, flat[uniq])  # [U, D]
    values = torch.cat((values, values.new_zeros(1, dim)))
    return DecodedRecords(values, torch.where(slots >= 0, index, uniq.numel()))


def _joined(q: Tensor, kv: SparseKV) -> tuple[DecodedRecords, Tensor]:
    """CPU: (the call's SWA and top-k records decoded once, joined: index [T, S] into values,
    S = W + TOPK, SWA slots first; ok bool [T, S])."""
    T, D = q.shape[0], q.shape[-1]
    parts = []
    if kv.swa_slots is not None:
        parts.append((decode_records(kv.swa_cache, kv.swa_slots, Layout.V41, D), kv.swa_slots))
    if kv.topk_slots is not None:
        top = kv.topk_decoded or decode_records(kv.kv_cache, kv.topk_slots, kv.kv_layout, D)
        parts.append((top, kv.topk_slots))
    if not parts:
        none = DecodedRecords(q.new_zeros(1, D, dtype=torch.float32), q.new_zeros(T, 0).long())
        return none, torch.zeros(T, 0, dtype=torch.bool, device=q.device)
    if len(parts) == 1:
        dec, slots = parts[0]
        return dec, slots >= 0
    (a, sa), (b, sb) = parts
    values = torch.cat((a.values, b.values))
    index = torch.cat((a.index, b.index + a.values.shape[0]), dim=1)
    return DecodedRecords(values, index), torch.cat((sa >= 0, sb >= 0), dim=1)


def _keys(cache, slots, layout, rows: slice, q: Tensor) -> tuple[Tensor, Tensor]:
    """(keys fp32 [t, N, D], valid bool [t, N]) of one slot list, [t, 0, D] when absent."""
    t, D = rows.stop - rows.start, q.shape[-1]
    if slots is None:
        return q.new_zeros(t, 0, D, dtype=torch.float32), torch.zeros(
            t, 0, dtype=torch.bool, device=q.device
        )
    s = slots[rows]
    return gather_records(cache, s, layout, D), s >= 0


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
    if q.dtype == torch.float64:  # the twin check: never round float64 queries down
        compute_dtype = torch.float64
    scale = D**-0.5 if scale is None else scale
    sink = attn_sink if attn_sink is not None else q.new_full((H,), float("-inf"))
    out = torch.empty(T, H, D, dtype=out_dtype or q.dtype, device=q.device)
    if chunk is None:
        n_keys = sum(s.shape[1] for s in (kv.swa_slots, kv.topk_slots) if s is not None)
        chunk = max(64, (64 << 20) // (4 * D * max(n_keys, 1)))
    if q.device.type == "cpu":
        joined, ok = _joined(q, kv)
        for t0 in range(0, T, chunk):
            rows = slice(t0, min(T, t0 + chunk))
            keys = joined.values[joined.index[rows]]  # [t, S, D], zeros at -1 slots
            o = attend_keys(q[rows], keys, ok[rows], sink, scale, compute_dtype)
            seen = ok[rows].any(dim=1)  # [t]
            out[rows] = torch.where(seen[:, None, None], o, o.new_zeros(()))
        return out
    swa = (kv.swa_cache, kv.swa_slots, Layout.V41)
    top = (kv.kv_cache, kv.topk_slots, kv.kv_layout)
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        k_swa, swa_ok = _keys(*swa, rows, q)
        k_top, top_ok = _keys(*top, rows, q)
        o = sparse_attention(q[rows], k_swa, swa_ok, k_top, top_ok, sink, scale, compute_dtype)
        seen = torch.cat((swa_ok, top_ok), dim=1).any(dim=1)  # [t]
        out[rows] = torch.where(seen[:, None, None], o, o.new_zeros(()))
    return out
