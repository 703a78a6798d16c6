"""Sparse attention through FlashMLA's SM90 sparse prefill, for 64 (or 128) heads and
prefill-sized token counts: the records the tokens reference are dequantized once into a bf16
workspace (`triton_workspace`), which FlashMLA (`sgl-flash-mla`, a dependency of SGLang) reads
through per-token row lists; it does not read V4.1 records on SM90 itself. Fewer than 64 heads
are padded to 64 (zero queries and sink logits; their outputs are dropped), as upstream runs
FlashMLA's SM90 kernels at fewer heads.

Tokens are taken in chunks whose workspace stays under `triton_workspace.MAX_ROWS` rows.
"""

from __future__ import annotations

import functools

import torch

from sglang_dsv41.kernels.sparse_attn.triton_workspace import workspaces


@functools.cache
def available() -> bool:
    """True when `flash_mla` (with `flash_mla_sparse_fwd`) imports."""
    try:
        import flash_mla
    except Exception:
        return False
    return hasattr(flash_mla, "flash_mla_sparse_fwd")


def sparse_attention(
    q, swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, attn_sink, scale, out, out_dtype,
    private=False, max_slots=None,
):  # fmt: skip
    """Same contract as `triton.sparse_attention`, for q bf16 [T, H, 512] on SM90, H <= 64
    (padded to 64) or 128. With out None and bf16 out_dtype, FlashMLA's own output is returned
    when one chunk covers T (no copy: 2 x T x H x D x 2 bytes, ~130 us at 4096 x 64 heads;
    padded, the view of its first H heads, not contiguous). private: one workspace row per
    (token, entry) (`build_private_workspace`), for decode. max_slots: the caller's bound on
    the distinct slots referenced (`triton_workspace.workspaces`)."""
    import flash_mla

    T, H, D = q.shape
    if q.dtype != torch.bfloat16 or not (1 <= H <= 64 or H == 128) or D != 512:
        raise ValueError(
            f"the FlashMLA path takes bf16 q with up to 64 heads (padded to 64) or 128 heads "
            f"of 512, got {q.dtype} {tuple(q.shape)}"
        )
    pad = 64 - H if H < 64 else 0
    if pad:  # zero queries, zero sink logits: finite rows, dropped below
        q = torch.cat((q, q.new_zeros(T, pad, D)), dim=1)
        if attn_sink is not None:
            attn_sink = torch.cat((attn_sink, attn_sink.new_zeros(pad)))
    q = q if q.is_contiguous() else q.contiguous()  # FlashMLA reads q densely
    for t0, t1, ws, rows in workspaces(
        swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, D, private, max_slots
    ):
        o = flash_mla.flash_mla_sparse_fwd(
            q[t0:t1],
            ws.view(-1, 1, D),
            rows.view(t1 - t0, 1, -1),
            scale,
            D,
            attn_sink=attn_sink,
            use_legacy=True,
            return_log2_lse=False,
        )[0][:, :H]
        if out is None and out_dtype == torch.bfloat16 and (t0, t1) == (0, T):
            return o  # one chunk: FlashMLA's own output (its first H heads when padded)
        if out is None:
            out = torch.empty(T, H, D, dtype=out_dtype, device=q.device)
        out[t0:t1].copy_(o)
    return out
