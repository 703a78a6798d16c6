"""A bf16 workspace of the records a batch of tokens references: each record dequantized once.

Prefill tokens share most of their entries (a window slides by one token; top-k lists overlap),
so dequantizing per (token, entry) repeats the same work ~100 times over a 4K-token chunk. Here
the referenced slots are compacted and dequantized once, in one slot space c (SWA slots first,
then the main-KV slots shifted by the SWA cache's size), with work O(T N) whatever the caches'
size (a served pool holds tens of millions of slots):

1. claim: every valid entry i = t N + j writes its index into mark[c] (mark: an uninitialized
   int32 array over the slot space; the writes to one c race and one of them stays), unless
   mark[c] already names an entry whose slot is c (most do: a slot is referenced ~100 times);
2. owners: entry i owns slot c when mark[c] == i after that (one owner per referenced slot);
   the owners are ranked by a cumulative sum over the T N entries: rank = the slot's row;
3. remap: each entry's row is its owner's rank, rank[mark[c]] (-1 stays -1; a token that sees
   no entry gets the workspace's last row, all zeros, so its output is 0 as the sink-only
   softmax gives), lists padded to a multiple of 64; each owner names its slot at its row;
4. dequantize: `dequant_pick_kernel` writes each row's record as D bf16 values.

mark needs no clearing: a value found there counts only when it names an entry of this call
whose slot is that one (`claim_kernel`), and anything else is overwritten. The rows come in the
owners' order, which the race (and what mark held) decides: the workspace's row order may
differ between calls, the values each entry reads never do. Outside CUDA-graph capture the
workspace can be sized to the referenced slots (one host sync, `workspaces`); inside, to the
static bound min(slots, T N).
All steps run on device; consumers: FlashMLA's sparse prefill (`triton_flashmla`) and the
Triton kernel over BF16 rows (`triton.py`).

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
MAX_ROWS = 1 << 18  # workspace rows per chunk of tokens: 256 MB of bf16 at D = 512


def token_chunks(
    swa_flat, swa_slots, kv_flat, topk_slots, private: bool = False, max_slots: int | None = None
) -> list:
    """[(t0, t1)]: token ranges whose workspace stays under MAX_ROWS rows. One range unless both
    the slots the tokens may reference (the caches' slots, or max_slots when given: the
    caller's bound on the distinct slots the lists hold) and T x N reach MAX_ROWS (private:
    unless T x N does)."""
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    N = W + TOPK
    bound = (swa_flat.shape[0] if W else 0) + (kv_flat.shape[0] if TOPK else 0)
    if max_slots is not None:
        bound = min(bound, max_slots)
    if private:
        bound = T * N
    step = T if min(bound, T * N) < MAX_ROWS else max(1, MAX_ROWS // max(N, 1))
    return [(t0, min(T, t0 + step)) for t0 in range(0, T, step)]


@triton.jit
def _entry_slots(swa_ptr, topk_ptr, t, o_j, W, TOPK, S1, S2):
    """The slots c (int64; -1 = none, and for a slot outside its cache) of token t's entries
    o_j in the joint slot space."""
    t64 = t.to(tl.int64)
    s_w = tl.load(swa_ptr + t64 * W + o_j, mask=o_j < W, other=-1)
    o_k = o_j - W
    m_k = (o_k >= 0) & (o_k < TOPK)
    s_k = tl.load(topk_ptr + t64 * TOPK + o_k, mask=m_k, other=-1)
    c = tl.where(o_j < W, tl.where(s_w < S1, s_w, -1), tl.where(s_k < S2, s_k, -1))
    c = tl.where(c >= 0, c + tl.where(o_j < W, 0, S1), -1)
    return c.to(tl.int64)


@triton.jit
def claim_kernel(swa_ptr, topk_ptr, mark_ptr, T, W, TOPK, S1, S2, N, BN: tl.constexpr):
    """mark[c] = t N + j for every valid entry j of token t (racing writes: one stays), unless
    mark[c] already names an entry whose slot is c: a slot is referenced ~100 times in a
    prefill, and stores to one address serialize (this kernel took 144 us of a 200 us build
    on the H200 before the check). A value left from an earlier call that names such an entry
    is as good an owner as any."""
    t = tl.program_id(0)
    o_j = tl.program_id(1) * BN + tl.arange(0, BN)
    c = _entry_slots(swa_ptr, topk_ptr, t, o_j, W, TOPK, S1, S2)
    m = (o_j < N) & (c >= 0)
    v = tl.load(mark_ptr + c, mask=m, other=-1)
    named = m & (v >= 0) & (v < T * N)
    tv = tl.where(named, v // N, 0)
    cv = _entry_slots(swa_ptr, topk_ptr, tv, tl.where(named, v - tv * N, N), W, TOPK, S1, S2)
    tl.store(mark_ptr + c, t * N + o_j, mask=m & ~(named & (cv == c)))


@triton.jit
def owner_kernel(swa_ptr, topk_ptr, mark_ptr, own_ptr, W, TOPK, S1, S2, N, BN: tl.constexpr):
    """own[t N + j] = 1 where entry j of token t is its slot's owner (mark[c] holds it), else 0."""
    t = tl.program_id(0)
    o_j = tl.program_id(1) * BN + tl.arange(0, BN)
    c = _entry_slots(swa_ptr, topk_ptr, t, o_j, W, TOPK, S1, S2)
    i = t * N + o_j
    m = (o_j < N) & (c >= 0)
    owner = tl.load(mark_ptr + c, mask=m, other=-1)
    tl.store(own_ptr + i, (m & (owner == i)).to(tl.int32), mask=o_j < N)


@triton.jit
def remap_kernel(
    swa_ptr, topk_ptr, mark_ptr, rank_ptr, rows_ptr, swa_list_ptr, kv_list_ptr,
    W, TOPK, S1, S2, N, n_pad, R, NAN_ROW, BN: tl.constexpr,
):  # fmt: skip
    """Token t's rows [n_pad]: rank[mark[c]] (inclusive ranks: minus 1) where valid, -1 else and
    in the padding, R - 1 in column 0 when nothing is valid; each owner writes both lists at its
    row, its slot into the one of its cache and -1 into the other (so the lists need no filling:
    every row below the owners' count is written). An entry whose row would pass the workspace
    (R - 1 data rows: a caller's max_slots below the slots actually referenced) reads row
    NAN_ROW instead, so its token's output is NaN, never silently wrong, and nothing is written
    out of bounds."""
    t = tl.program_id(0)
    o_j = tl.arange(0, BN)
    c = _entry_slots(swa_ptr, topk_ptr, t, o_j, W, TOPK, S1, S2)
    m = (o_j < N) & (c >= 0)
    owner = tl.load(mark_ptr + c, mask=m, other=0)
    row = tl.load(rank_ptr + owner, mask=m, other=0) - 1
    over = m & (row >= R - 1)
    rows = tl.where(m, tl.where(over, NAN_ROW, row), -1)
    rows = tl.where((o_j == 0) & (tl.max(m.to(tl.int32), 0) == 0), R - 1, rows)
    tl.store(rows_ptr + t.to(tl.int64) * n_pad + o_j, rows, mask=o_j < n_pad)
    mine = m & (owner == t * N + o_j) & ~over
    tl.store(swa_list_ptr + row, tl.where(c < S1, c, -1).to(tl.int32), mask=mine)
    tl.store(kv_list_ptr + row, tl.where(c >= S1, c - S1, -1).to(tl.int32), mask=mine)


@triton.jit
def dequant_pick_kernel(
    swa_ptr,  # uint8 [S1, D + D/32] V41 records
    swa_list_ptr,  # int32 [M]: a SWA slot, or -1
    kv_ptr,  # uint8 [S2, KV_RS] records in KV_FMT
    kv_list_ptr,  # int32 [M]: a main-KV slot, or -1 (where the SWA list has one)
    ws_ptr,  # bf16 [> max(M - 1, ZERO_ROW, NAN_ROW), D]
    M,
    count_ptr,  # int32: with HAS_COUNT, count_ptr[0] = the lists' written rows (<= M or not)
    ZERO_ROW,
    NAN_ROW,  # -1: none
    D: tl.constexpr,
    KV_RS: tl.constexpr,
    KV_FMT: tl.constexpr,
    BS: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """ws[i] = SWA record swa_list[i] dequantized, or main-KV record kv_list[i] (at most one of
    the two is >= 0), for this program's BS rows i < M (and < count_ptr[0] with HAS_COUNT: the
    lists hold garbage past it); rows where both hold -1 are left alone; row ZERO_ROW zeros, row
    NAN_ROW NaN (the workspace's special rows, so that it needs no fill of its own)."""
    o_i = tl.program_id(0) * BS + tl.arange(0, BS)
    m_i = o_i < M
    if HAS_COUNT:
        m_i = m_i & (o_i < tl.load(count_ptr))
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
    special = (o_i == ZERO_ROW) | (o_i == NAN_ROW)
    if tl.max(special.to(tl.int32), 0) > 0:
        val = tl.where(o_i == NAN_ROW, float("nan"), 0.0)
        tl.store(p_ws, (val[:, None] + tl.zeros([BS, D], tl.float32)).to(tl.bfloat16),
                 mask=special[:, None])  # fmt: skip


def _fill_picked(
    swa_flat, swa_list, kv_flat, kv_list, kv_fp4: bool, D: int, R: int, nan_row: bool = False,
    count: torch.Tensor | None = None,
):  # fmt: skip
    """ws bf16 [R, D] (nan_row: [R + 1, D], row R NaN): row i < len(lists) from
    `dequant_pick_kernel` (only i < count[0] when count, int32 on device, is given), row R - 1
    zeros; one launch."""
    M = swa_list.numel()
    ws = torch.empty(R + int(nan_row), D, dtype=torch.bfloat16, device=swa_list.device)
    BS = 16
    dequant_pick_kernel[(triton.cdiv(R + int(nan_row), BS),)](
        swa_flat, swa_list, kv_flat, kv_list, ws, M, swa_list if count is None else count,
        R - 1, R if nan_row else -1,
        D=D, KV_RS=kv_flat.shape[1], KV_FMT=int(kv_fp4), BS=BS, HAS_COUNT=count is not None,
    )  # fmt: skip
    return ws


def _rows(valid, row, n_pad: int, R: int):
    """int32 [T, n_pad]: row where valid, else -1; a token with no entry gets row R - 1."""
    T, N = valid.shape
    rows = torch.full((T, n_pad), -1, dtype=torch.int32, device=valid.device)
    rows[:, :N] = torch.where(valid, row, -1)
    rows[:, 0] = torch.where(valid.any(dim=1), rows[:, 0], R - 1)
    return rows


def workspaces(
    swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int, private=False,
    max_slots: int | None = None,
):  # fmt: skip
    """Yield (t0, t1, ws, rows): the workspace (`build_workspace`, or `build_private_workspace`
    when private) of tokens t0 .. t1 - 1, in chunks of at most MAX_ROWS rows (`token_chunks`,
    from the static bound min(cache slots, max_slots, T N)). max_slots: the caller's bound on
    the distinct slots the lists reference (the served layer's, from the batch's sequence
    lengths, known on the host): a served pool holds millions of slots, a prefill chunk
    references thousands, so with it one chunk usually covers the call without a host sync.
    Outside CUDA-graph capture, when the bound needs several chunks, all T tokens are first
    tried at once, sized to the slots they reference (one host sync): each chunk costs its own
    launches (eager prefill at 1 M main-KV slots: 8.7 ms in 11 chunks, benchmarks/RESULTS.md)."""
    T = swa_slots.shape[0]
    capturing = swa_slots.is_cuda and torch.cuda.is_current_stream_capturing()
    chunks = token_chunks(swa_flat, swa_slots, kv_flat, topk_slots, private, max_slots)
    if not private and not capturing and T and len(chunks) > 1:
        one = build_workspace(swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4, D, True)
        if one is not None:
            yield 0, T, *one
            return
    for t0, t1 in chunks:
        sw, tk = swa_slots[t0:t1], topk_slots[t0:t1]
        if private:
            built = build_private_workspace(swa_flat, sw, kv_flat, tk, kv_fp4, D)
        else:
            built = build_workspace(swa_flat, sw, kv_flat, tk, kv_fp4, D, max_slots=max_slots)
        yield t0, t1, *built


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


def _claim_array(n: int, dev) -> torch.Tensor:
    """int32 [max(n, 1)], uninitialized: the claims need no clearing (module docstring)."""
    return torch.empty(max(n, 1), dtype=torch.int32, device=dev)


def build_workspace(
    swa_flat, swa_slots, kv_flat, topk_slots, kv_fp4: bool, D: int, exact_size: bool = False,
    max_slots: int | None = None,
):  # fmt: skip
    """(ws bf16 [R, D], rows int32 [T, N']): the referenced records dequantized once, and each
    token's entries as workspace rows (-1 = skip), N' = W + TOPK rounded up to 64 (the module
    docstring's steps).

    swa_flat uint8 [S1, D + D/32] with swa_slots int32 [T, W]; kv_flat uint8 [S2, B] with
    topk_slots int32 [T, TOPK] (-1 = skip). Row R - 1 is zeros: a token with no entry points
    there (its output is then 0, as the reference gives). R = min(S1 + S2, T N) + 1, or with
    exact_size U + 1 for the U referenced slots (one host sync; None when that passes MAX_ROWS).
    max_slots (the caller's bound on U, no sync): R = min(S1 + S2, T N, max_slots) + 1, and
    where it is the smaller one ws has a row R of NaN, which an entry past the bound reads
    (`remap_kernel`: its token's output turns NaN; nothing is written out of bounds).
    """
    T, W = swa_slots.shape
    TOPK = topk_slots.shape[1]
    S1 = swa_flat.shape[0] if W else 0
    S2 = kv_flat.shape[0] if TOPK else 0
    N = W + TOPK
    n_pad = triton.cdiv(N, ROW_ALIGN) * ROW_ALIGN
    dev = swa_slots.device
    swa_slots, topk_slots = swa_slots.contiguous(), topk_slots.contiguous()
    mark = _claim_array(S1 + S2, dev)
    own = torch.empty(T * N, dtype=torch.int32, device=dev)
    BN = 256
    grid = (T, triton.cdiv(N, BN))
    if T * N:
        claim_kernel[grid](swa_slots, topk_slots, mark, T, W, TOPK, S1, S2, N, BN=BN)
        owner_kernel[grid](swa_slots, topk_slots, mark, own, W, TOPK, S1, S2, N, BN=BN)
    rank = torch.cumsum(own, 0, dtype=torch.int32)  # inclusive: row = rank - 1
    R = min(S1 + S2, T * N) + 1
    guard = not exact_size and max_slots is not None and max_slots + 1 < R
    if guard:
        R = max(max_slots, 0) + 1
    if exact_size:
        R = (int(rank[-1]) if T * N else 0) + 1  # the host sync
        if R > MAX_ROWS:
            return None
    rows = torch.empty(T, n_pad, dtype=torch.int32, device=dev)
    # written by the owners below their count (remap_kernel), read only there (dequant_pick)
    swa_list = torch.empty((R,), dtype=torch.int32, device=dev)
    kv_list = torch.empty((R,), dtype=torch.int32, device=dev)
    if T:
        BLK = triton.next_power_of_2(max(n_pad, 1))
        remap_kernel[(T,)](
            swa_slots, topk_slots, mark, rank, rows, swa_list, kv_list,
            W, TOPK, S1, S2, N, n_pad, R, R if guard else R - 1, BN=BLK,
        )  # fmt: skip
    ws = _fill_picked(
        swa_flat, swa_list[: R - 1], kv_flat, kv_list[: R - 1], kv_fp4, D, R, nan_row=guard,
        count=rank[-1:] if T * N else None,
    )  # fmt: skip
    return ws, rows
