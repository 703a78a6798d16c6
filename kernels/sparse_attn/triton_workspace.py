"""A bf16 workspace of the records a batch of tokens references: each record dequantized once.

Prefill tokens share most of their entries (a window slides by one token; top-k lists overlap),
so dequantizing per (token, entry) repeats the same work ~100 times over a 4K-token chunk. Here
the referenced slots are compacted and dequantized once:

1. mark: flag[c] = 1 for every referenced slot, in one slot space c (SWA slots first, then the
   main-KV slots shifted by the SWA cache's size);
2. rank: row[c] = (number of flagged slots before c), a cumulative sum;
3. dequantize: `dequant_rows_kernel` writes each flagged record's D values as bf16 at its row;
4. remap: each token's entry list becomes workspace rows (-1 stays -1; a token that sees no entry
   gets the workspace's last row, all zeros, so its output is 0 as the sink-only softmax gives).

All steps run on device without host syncs (CUDA-graph capturable). Consumers: FlashMLA's sparse
prefill (`triton_flashmla`) and the Triton kernel over BF16 rows (`triton.py`).

Steps 1-2 walk the whole slot space (S1 + S2 flags and a cumulative sum over them, and step 3
launches a program per 16 slots), which is cheap for the caches of one prompt but not for a
served pool of tens of millions of slots; when the caches hold more than SORT_FACTOR x T N slots
the referenced slots are sorted and ranked instead (`_build_sorted`: O(T N log) whatever the
pool size) and `dequant_pick_kernel` dequantizes one row per unique slot.

Decode tokens share no entries (each request has its own window and top-k), so there
`build_private_workspace` skips the compaction: entry j of token t is dequantized into row
t N + j by the same `dequant_pick_kernel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_dsv41.kernels.sparse_attn.triton_records import deq, raw

ROW_ALIGN = 64  # entry lists are padded to a multiple of 64 (FlashMLA walks blocks of 64)
SORT_FACTOR = 8  # caches over 8 x the T N referenced entries: sort them instead of flagging
MAX_ROWS = 1 << 18  # workspace rows per chunk of tokens: 256 MB of bf16 at D = 512


def token_chunks(swa_flat, swa_slots, kv_flat, topk_slots, private: bool = False) -> list:
    """[(t0, t1)]: token ranges whose workspace stays under MAX_ROWS rows. One range unless both
    the slots the tokens may reference and T x N reach MAX_ROWS (private: unless T x N does)."""
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    N = W + TOPK
    bound = (swa_flat.shape[0] if W else 0) + (kv_flat.shape[0] if TOPK else 0)
    if private:
        bound = T * N
    step = T if min(bound, T * N) < MAX_ROWS else max(1, MAX_ROWS // max(N, 1))
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


@triton.jit
def dequant_rows_kernel(
    src_ptr,  # uint8 [S, RS] records
    flag_ptr,  # int32 [S]: 1 = referenced
    row_ptr,  # int32 [S]: workspace row of a referenced slot
    ws_ptr,  # bf16 [R, D]
    S,
    D: tl.constexpr,
    RS: tl.constexpr,
    BS: tl.constexpr,
    FMT: tl.constexpr,
):
    """ws[row[s]] = dequantized record s, for the flagged slots s of this program's BS slots."""
    o_s = tl.program_id(0) * BS + tl.arange(0, BS)
    m_s = o_s < S
    flag = tl.load(flag_ptr + o_s, mask=m_s, other=0)
    if tl.max(flag, 0) != 0:  # most blocks of a large cache hold no referenced slot
        slot = tl.where(flag != 0, o_s, -1)
        b_v, b_s = raw(src_ptr, RS, slot, D, FMT)
        b_k = deq(b_v, b_s, D, BS, tl.float32, FMT)  # [BS, D], exact in bf16
        row = tl.load(row_ptr + o_s, mask=m_s, other=0).to(tl.int64)
        o_d = tl.arange(0, D)
        p_ws = ws_ptr + row[:, None] * D + o_d[None, :]
        tl.store(p_ws, b_k.to(ws_ptr.dtype.element_ty), mask=(slot >= 0)[:, None])


@triton.jit
def dequant_pick_kernel(
    swa_ptr,  # uint8 [S1, D + D/32] V41 records
    swa_list_ptr,  # int32 [M]: a SWA slot, or -1
    kv_ptr,  # uint8 [S2, KV_RS] records in KV_FMT
    kv_list_ptr,  # int32 [M]: a main-KV slot, or -1 (where the SWA list has one)
    ws_ptr,  # bf16 [>= M, D]
    M,
    D: tl.constexpr,
    KV_RS: tl.constexpr,
    KV_FMT: tl.constexpr,
    BS: tl.constexpr,
):
    """ws[i] = SWA record swa_list[i] dequantized, or main-KV record kv_list[i] (at most one of
    the two is >= 0), for this program's BS rows i; rows where both hold -1 are left alone."""
    o_i = tl.program_id(0) * BS + tl.arange(0, BS)
    m_i = o_i < M
    s_swa = tl.load(swa_list_ptr + o_i, mask=m_i, other=-1)
    s_kv = tl.load(kv_list_ptr + o_i, mask=m_i, other=-1)
    o_d = tl.arange(0, D)
    p_ws = ws_ptr + o_i.to(tl.int64)[:, None] * D + o_d[None, :]
    if tl.max(s_swa, 0) >= 0:  # a block dequantizes only the formats it holds
        v1, c1 = raw(swa_ptr, D + D // 32, s_swa, D, 0)
        k1 = deq(v1, c1, D, BS, tl.float32, 0)  # [BS, D], exact in bf16
        tl.store(p_ws, k1.to(tl.bfloat16), mask=(s_swa >= 0)[:, None])
    if tl.max(s_kv, 0) >= 0:
        v2, c2 = raw(kv_ptr, KV_RS, s_kv, D, KV_FMT)
        k2 = deq(v2, c2, D, BS, tl.float32, KV_FMT)
        tl.store(p_ws, k2.to(tl.bfloat16), mask=(s_kv >= 0)[:, None])


def _fill_picked(swa_flat, swa_list, kv_flat, kv_list, kv_fp4: bool, D: int, R: int):
    """ws bf16 [R, D]: row i < len(lists) from `dequant_pick_kernel`, row R - 1 zeros."""
    M = swa_list.numel()
    ws = torch.empty(R, D, dtype=torch.bfloat16, device=swa_list.device)
    ws[R - 1].zero_()
    if M:
        BS = 16
        dequant_pick_kernel[(triton.cdiv(M, BS),)](
            swa_flat, swa_list, kv_flat, kv_list, ws, M,
            D=D, KV_RS=kv_flat.shape[1], KV_FMT=int(kv_fp4), BS=BS,
        )  # fmt: skip
    return ws


def _rows(valid, row, n_pad: int, R: int):
    """int32 [T, n_pad]: row where valid, else -1; a token with no entry gets row R - 1."""
    T, N = valid.shape
    rows = torch.full((T, n_pad), -1, dtype=torch.int32, device=valid.device)
    rows[:, :N] = torch.where(valid, row, -1)
    rows[:, 0] = torch.where(valid.any(dim=1), rows[:, 0], R - 1)
    return rows


def workspaces(swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int, private=False):
    """Yield (t0, t1, ws, rows): the workspace (`build_workspace`, or `build_private_workspace`
    when private) of tokens t0 .. t1 - 1, in chunks of at most MAX_ROWS rows (`token_chunks`,
    from the static bound min(cache slots, T N)). Outside CUDA-graph capture, when that bound
    needs several chunks or the caches are large enough for the sorted compaction, all T tokens
    are first tried at once, sized to the slots they reference (one host sync): a prefill chunk
    of a served pool references far fewer slots than T N, and each chunk costs its own launches
    (eager prefill at 1 M main-KV slots: 8.7 ms in 11 chunks, benchmarks/RESULTS.md)."""
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    S1 = swa_flat.shape[0] if W else 0
    S2 = kv_flat.shape[0] if TOPK else 0
    capturing = swa_slots.is_cuda and torch.cuda.is_current_stream_capturing()
    chunks = token_chunks(swa_flat, swa_slots, kv_flat, topk_slots, private)
    big = S1 + S2 > SORT_FACTOR * T * (W + TOPK)
    if not private and not capturing and T and (big or len(chunks) > 1):
        c = torch.cat((swa_slots, torch.where(topk_slots >= 0, topk_slots + S1, -1)), dim=1)
        n_pad = triton.cdiv(W + TOPK, ROW_ALIGN) * ROW_ALIGN
        one = _build_sorted(swa_flat, kv_flat, c, c >= 0, S1, S2, kv_fp4, D, n_pad, True)
        if one is not None:
            yield 0, T, *one
            return
    build = build_private_workspace if private else build_workspace
    for t0, t1 in chunks:
        yield t0, t1, *build(swa_flat, swa_slots[t0:t1], kv_flat, topk_slots[t0:t1], kv_fp4, D)


def build_private_workspace(swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int):
    """As `build_workspace`, with one row per (token, entry): R = T N + 1 rows, entry j of token
    t at row t N + j. No compaction (decode: no entry is shared)."""
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    N = W + TOPK
    n_pad = triton.cdiv(N, ROW_ALIGN) * ROW_ALIGN
    none = torch.full((T, N), -1, dtype=torch.int32, device=swa_slots.device)
    swa_list = torch.cat((swa_slots, none[:, W:]), dim=1)  # [T, N]
    kv_list = torch.cat((none[:, :W], topk_slots), dim=1)
    ws = _fill_picked(swa_flat, swa_list, kv_flat, kv_list, kv_fp4, D, T * N + 1)
    row = torch.arange(T * N, dtype=torch.int32, device=swa_slots.device).view(T, N)
    return ws, _rows((swa_list >= 0) | (kv_list >= 0), row, n_pad, T * N + 1)


def build_workspace(swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int):
    """(ws bf16 [R, D], rows int32 [T, N']): the referenced records dequantized once, and each
    token's entries as workspace rows (-1 = skip), N' = W + TOPK rounded up to 64.

    swa_flat uint8 [S1, D + D/32] with swa_slots int32 [T, W]; kv_flat uint8 [S2, B] with
    topk_slots int32 [T, TOPK] (-1 = skip). Row R - 1 is zeros: a token with no entry points
    there (its output is then 0, as the reference gives).
    """
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    S1 = swa_flat.shape[0] if W else 0
    S2 = kv_flat.shape[0] if TOPK else 0
    N = W + TOPK
    n_pad = triton.cdiv(N, ROW_ALIGN) * ROW_ALIGN
    c = torch.cat((swa_slots, torch.where(topk_slots >= 0, topk_slots + S1, -1)), dim=1)
    valid = c >= 0  # [T, N]
    if S1 + S2 > SORT_FACTOR * T * N:
        return _build_sorted(swa_flat, kv_flat, c, valid, S1, S2, kv_fp4, D, n_pad)
    dev = swa_slots.device
    R = min(S1 + S2, T * N) + 1
    c_any = torch.where(valid, c, S1 + S2).long()  # invalid entries flag the extra slot
    flag = torch.zeros(S1 + S2 + 1, dtype=torch.int32, device=dev)
    flag.index_fill_(0, c_any.flatten(), 1)
    flag[S1 + S2 :].zero_()  # (a fill: item assignment would copy from the host)
    row = torch.cumsum(flag, 0, dtype=torch.int32) - flag  # [S1 + S2 + 1]
    ws = torch.empty(R, D, dtype=torch.bfloat16, device=dev)
    ws[R - 1].zero_()
    BS = 16
    for src, n, off, fmt in ((swa_flat, S1, 0, 0), (kv_flat, S2, S1, int(kv_fp4))):
        if n:
            dequant_rows_kernel[(triton.cdiv(n, BS),)](
                src, flag[off:], row[off:], ws, n, D=D, RS=src.shape[1], BS=BS, FMT=fmt
            )
    return ws, _rows(valid, row[c_any], n_pad, R)


def _build_sorted(
    swa_flat, kv_flat, c, valid, S1: int, S2: int, kv_fp4: bool, D: int, n_pad, exact_size=False
):
    """`build_workspace` for caches much larger than the T N entries referenced (a served pool):
    the referenced slots are sorted and ranked instead of flagged over the whole slot space, so
    the work is O(T N log) whatever the cache size. R = T N + 1 rows (the unique slots first),
    or with exact_size U + 1 for the U unique slots (one host sync; None when U + 1 exceeds
    MAX_ROWS)."""
    T, N = c.shape
    M = T * N
    dev = c.device
    key = torch.where(valid, c, S1 + S2).flatten()  # int32 slots; invalid entries sort last
    sv, order = torch.sort(key)
    first = torch.ones(M, dtype=torch.bool, device=dev)
    first[1:] = sv[1:] != sv[:-1]
    first &= sv < S1 + S2
    rank = torch.cumsum(first, 0, dtype=torch.int32) - 1  # row of each sorted entry's slot
    row = torch.empty(M, dtype=torch.int32, device=dev).scatter_(0, order, rank)
    uniq = torch.full((M + 1,), -1, dtype=torch.int32, device=dev)  # row -> slot; M: a sink
    uniq.scatter_(0, torch.where(first, rank, M).long(), sv)
    R = M + 1
    if exact_size:
        R = int(first.sum()) + 1  # the host sync
        if R > MAX_ROWS:
            return None
    uniq = uniq[: R - 1]
    swa_list = torch.where(uniq < S1, uniq, -1)
    kv_list = torch.where(uniq >= S1, uniq - S1, -1)
    ws = _fill_picked(swa_flat, swa_list, kv_flat, kv_list, kv_fp4, D, R)
    return ws, _rows(valid, row.view(T, N), n_pad, R)
