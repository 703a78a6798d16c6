"""Row-wise top-k in one Triton program per row chunk (replaces torch.topk on the indexer's small
rows: pool scores [T, 16384], block maxima [T, N/8]).

A row chunk of at most MAX_CHUNK floats is held in registers. Its values map to uint32 keys with
the float order (-0 as +0); the k-th largest key tau is built bit by bit from the top (32
counting passes; four 8-bit tl.histogram passes spilled ~1.1 KB/thread at 16384), then every key >
tau and the lowest-index keys == tau are kept (ties -> lower index, as the
oracle's stable sort), compacted by a prefix sum. -inf is never kept; missing outputs are -1.
Rows longer than MAX_CHUNK are cut into chunks whose top-k are merged in further rounds (the
union of the chunks' top-k holds the row's top-k). Output order along k is by index, not score.
"""

import torch
import triton
import triton.language as tl

MAX_CHUNK = 16384


@triton.jit
def _select_kernel(
    val_ptr,
    idx_ptr,
    blocks_ptr,
    out_val_ptr,
    out_idx_ptr,
    M,
    NB,
    K,
    MC: tl.constexpr,
    HAS_IDX: tl.constexpr,
    MAP_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """val fp32 [T, M]; idx int32 [T, M] (HAS_IDX) or the column; chunk i_c of row i_t ->
    out_val fp32 / out_idx int32 [T, C, K]. MAP_BLOCKS: column j -> blocks[t, j // BLOCK] *
    BLOCK + j % BLOCK (pool scores -> entry ids)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1)
    o_m = i_c * MC + tl.arange(0, MC)
    m_m = o_m < M
    b_v = tl.load(val_ptr + i_t * M + o_m, mask=m_m, other=float("-inf"))  # [MC]
    b_bits = tl.where(b_v == 0.0, 0.0, b_v).to(tl.int32, bitcast=True)  # -0 ties with +0
    b_key = b_bits ^ ((b_bits >> 31) & 0x7FFFFFFF)  # signed int order == float order
    b_u = (b_key ^ -2147483648).to(tl.uint32, bitcast=True)  # unsigned order == float order
    b_ok = b_v > float("-inf")
    tau = tl.zeros((), dtype=tl.uint32)
    bit = tl.full((), 2147483648, tl.uint32)
    for _ in range(32):  # a dynamic loop: unrolled, it compiles slowly and spills
        cand = tau | bit
        cnt = tl.sum((b_u >= cand).to(tl.int32), axis=0)
        tau = tl.where(cnt >= K, cand, tau)
        bit = bit >> 1
    b_gt = (b_u > tau) & b_ok
    n_gt = tl.sum(b_gt.to(tl.int32), axis=0)
    b_eq = (b_u == tau) & b_ok
    b_take = b_gt | (b_eq & (tl.cumsum(b_eq.to(tl.int32), axis=0) <= K - n_gt))
    b_pos = tl.cumsum(b_take.to(tl.int32), axis=0) - 1
    n_take = tl.sum(b_take.to(tl.int32), axis=0)
    if HAS_IDX:
        b_id = tl.load(idx_ptr + i_t * M + o_m, mask=b_take, other=-1)
    elif MAP_BLOCKS:
        b_blk = tl.load(blocks_ptr + i_t * NB + o_m // BLOCK, mask=b_take, other=-1)
        b_id = b_blk * BLOCK + o_m % BLOCK
    else:
        b_id = o_m
    C = tl.num_programs(1)
    p_out = (i_t * C + i_c) * K
    tl.store(out_idx_ptr + p_out + b_pos, b_id, mask=b_take)
    tl.store(out_val_ptr + p_out + b_pos, b_v, mask=b_take)
    o_k = tl.arange(0, MC)
    m_pad = (o_k >= n_take) & (o_k < K)
    tl.store(out_idx_ptr + p_out + o_k, tl.full((MC,), -1, tl.int32), mask=m_pad)
    tl.store(out_val_ptr + p_out + o_k, tl.full((MC,), float("-inf"), tl.float32), mask=m_pad)


def _launch(vals, idx, blocks, k, chunk):
    T, M = vals.shape
    C = triton.cdiv(M, chunk)
    mc = max(16, triton.next_power_of_2(min(chunk, M)), triton.next_power_of_2(k))
    out_v = torch.empty(T, C, k, dtype=torch.float32, device=vals.device)
    out_i = torch.empty(T, C, k, dtype=torch.int32, device=vals.device)
    dummy = out_i
    _select_kernel[(T, C)](
        vals,
        idx if idx is not None else dummy,
        blocks if blocks is not None else dummy,
        out_v,
        out_i,
        M,
        blocks.shape[1] if blocks is not None else 0,
        k,
        MC=mc,
        HAS_IDX=idx is not None,
        MAP_BLOCKS=blocks is not None,
        BLOCK=8,
        num_warps=16,
    )
    return out_v.view(T, C * k), out_i.view(T, C * k)


def topk_rows(
    vals: torch.Tensor, k: int, blocks: torch.Tensor = None, chunk: int = MAX_CHUNK
) -> torch.Tensor:
    """Top-k columns of vals fp32 [T, M] (-inf never chosen): int32 [T, k], -1 padded.

    With blocks int32 [T, M / 8] the chosen column j is returned as entry id
    blocks[t, j // 8] * 8 + j % 8 (pool score columns -> entry ids). k <= chunk / 2, so each
    merge round shrinks the rows.
    """
    assert vals.dtype == torch.float32 and 2 * k <= chunk
    vals = vals.contiguous()
    T, M = vals.shape
    if M == 0 or k == 0:
        return torch.full((T, k), -1, dtype=torch.int32, device=vals.device)
    idx = None
    if blocks is not None:
        blocks = blocks.to(torch.int32).contiguous()
        if M > chunk:  # map columns to entry ids up front, then merge rounds carry them
            col = torch.arange(M, device=vals.device)
            idx = (blocks[:, col // 8] * 8 + col % 8).to(torch.int32)
            idx = torch.where(blocks[:, col // 8] >= 0, idx, torch.full_like(idx, -1))
            blocks = None
    while True:
        v, i = _launch(vals, idx, blocks, k, chunk)
        if v.shape[1] == k:
            return i
        vals, idx, blocks = v, i, None
