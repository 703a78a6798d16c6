"""Triton (SM90) kernels of the paged lightning indexer; interface in kernels/indexer/ref.py.

Three kernels share one tile routine (`_keys_dot`: gather 68 B records, dequantize to bf16,
tensor-core dots against the query rows; then ReLU and the weighted head sum):
  * `_scan_kernel`  (Full layers, one query per program) scores every visible entry once and
    writes only the block max over blocks of 8: fp32 [T, ceil(N/8)], 1/8 of a logits row (0.5 B
    per entry next to the 68 B read). The newest block can be forced to +inf in the same pass.
  * `_scan_group_kernel`  the same for QB prefill tokens of one request per program: each key
    tile is dequantized once for all QB * HI query rows.
  * `_pool_kernel`  (Reindex, and the last stage of Full) scores the 8 entries of each listed
    block: fp32 [T, NB * 8]. Its work depends on NB, never on N.
Selection (kernels/indexer/select.py) runs on those small tensors; ops.py says why the Full
layer's top-k is exact up to ties when taken from its top-k blocks.

Dequantization: a code c (bit 3 sign, bits 0-2 = e1 e0 m) placed at fp16 bits 9..11 with the
sign at bit 15 is the e2m1 value times 2^-14 (the code for 0.5 lands on an fp16 subnormal, which
the fp16 -> fp32 conversion keeps exactly); multiplying by 2^(scale_byte - 113) gives
value * 2^(scale_byte - 127), exact, and the bf16 convert is exact too (2 significant bits). Per
value: a shift pair and a mask-or (integer), two converts and one multiply. Scale bytes must be
in [1, 240] (scales up to 2^113); K built by pack_index_k from finite data stays far inside.
"""

import triton
import triton.language as tl


@triton.jit
def _dot_slice(
    b_v,
    p_qcol,
    j: tl.constexpr,
    b_acc,
    W: tl.constexpr,
    SI: tl.constexpr,
    SJ: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """b_acc [BN, NCOL] += b_v fp32 [BN, W] @ b_q bf16 [W, NCOL], b_q[i, c] = p_qcol[c][SI i +
    SJ j] = q[c][8 i + j]: nibble slice j of the NCOL query rows (one per head, and per query
    when grouped). (SI, SJ) = (8, 1) for q as given, (HI, W HI) for ops.nibble_major(q)."""
    b_q = tl.load(p_qcol[None, :] + (tl.arange(0, W)[:, None] * SI + SJ * j))  # [W, NCOL]
    if DOT_F32:
        return tl.dot(b_v, b_q.to(tl.float32), b_acc, input_precision="ieee")
    return tl.dot(b_v.to(tl.bfloat16), b_q, b_acc)


@triton.jit
def _keys_dot(
    rec_ptr,
    o_slot,
    m_n,
    p_qcol,
    NCOL: tl.constexpr,
    BN: tl.constexpr,
    DI: tl.constexpr,
    SI: tl.constexpr,
    SJ: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """Dots of BN keys with NCOL query rows: fp32 [BN, NCOL] (garbage where ~m_n).

    rec_ptr: int32 view of the pool, DI/8 code words + DI/128 scale words per record; o_slot
    int64 [BN]; p_qcol: [NCOL] pointers to bf16 query rows (strides SI, SJ, see _dot_slice). Word i
    of a record
    holds values 8 i .. 8 i + 7 (nibble j = value 8 i + j), so nibble position j of all DI/8
    words is one K = DI/8 slice of the dot against q[:, j::8]: no reshapes. DOT_F32: fp32 dot,
    only for TRITON_INTERPRET (whose bf16 dot is wrong); on the GPU each bf16 product is exact,
    fp32 accumulated.
    """
    WPR: tl.constexpr = DI // 8 + DI // 128  # int32 words per record (17 at DI=128)
    W: tl.constexpr = DI // 8
    o_w = tl.arange(0, W)
    p_rec = rec_ptr + o_slot[:, None] * WPR  # [BN, 1]
    b_words = tl.load(p_rec + o_w[None, :], mask=m_n[:, None], other=0)  # [BN, W] int32
    # scale byte of word i: byte i // 4 of the scale word (one scale per 32 values = 4 words)
    b_sw = tl.load(p_rec + W, mask=m_n[:, None], other=0x7F7F7F7F)  # [BN, 1]
    b_sb = (b_sw >> ((o_w // 4) * 8)[None, :]) & 0xFF  # [BN, W]
    b_scale = ((b_sb + 14) << 23).to(tl.float32, bitcast=True)  # 2^(byte - 113)
    b_acc = tl.zeros((BN, NCOL), dtype=tl.float32)
    for j in tl.static_range(4):
        # nibbles j and j + 4 of each word at once, as the two fp16 halves of one int32
        b_c = b_words >> (4 * j)
        b_bits = ((b_c << 9) & 0x0E000E00) | ((b_c << 12) & -2147450880)  # 0x80008000
        b_lo = b_bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * b_scale
        b_hi = (b_bits >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * b_scale
        b_acc = _dot_slice(b_lo, p_qcol, j, b_acc, W, SI, SJ, DOT_F32)
        b_acc = _dot_slice(b_hi, p_qcol, j + 4, b_acc, W, SI, SJ, DOT_F32)
    return b_acc


@triton.jit
def _score_tile(
    rec_ptr,
    o_slot,
    m_n,
    qp_ptr,
    b_w,
    HI: tl.constexpr,
    BN: tl.constexpr,
    DI: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """Scores of BN entries for one query (qp_ptr: bf16 [HI, DI], b_w fp32 [HI]): fp32 [BN],
    -inf where ~m_n."""
    p_qcol = qp_ptr + tl.arange(0, HI) * DI
    b_acc = _keys_dot(rec_ptr, o_slot, m_n, p_qcol, HI, BN, DI, 8, 1, DOT_F32)  # [BN, HI]
    b_s = tl.sum(tl.maximum(b_acc, 0.0) * b_w[None, :], axis=1)  # [BN]
    return tl.where(m_n, b_s, float("-inf"))


@triton.jit
def _query(q_ptr, w_ptr, req_ptr, nvis_ptr, i_t, HI: tl.constexpr, DI: tl.constexpr):
    """Token i_t's visible entries, request (int64), query rows (bf16 [HI, DI] at the returned
    pointer) and head weights fp32 [HI]."""
    n_vis = tl.load(nvis_ptr + i_t)
    i_b = tl.load(req_ptr + i_t).to(tl.int64)
    qp_ptr = q_ptr + i_t.to(tl.int64) * HI * DI
    b_w = tl.load(w_ptr + i_t * HI + tl.arange(0, HI))  # [HI] fp32
    return n_vis, i_b, qp_ptr, b_w


@triton.jit
def _slots(pt_ptr, i_b, stride_pt, o_s, m_n, P):
    """Pool slots int64 [BN] of request i_b's entries o_s [BN] (page size P; 0 where ~m_n)."""
    b_page = tl.load(pt_ptr + i_b * stride_pt + o_s // P, mask=m_n, other=0)
    return b_page.to(tl.int64) * P + o_s % P


@triton.jit
def _tile_blocks(u, BN: tl.constexpr, BLOCK: tl.constexpr):
    """Tile u of a score row: its first entry s0 = u * BN and its block ids int [BN / BLOCK]."""
    s0 = u * BN
    return s0, s0 // BLOCK + tl.arange(0, BN // BLOCK)


@triton.jit
def _tile_slots(s0, n, pt_ptr, i_b, stride_pt, P, BN: tl.constexpr):
    """Entries o_s = s0 .. s0 + BN - 1 of request i_b: (o_s, m_n = o_s < n, pool slots int64)."""
    o_s = s0 + tl.arange(0, BN)
    m_n = o_s < n
    return o_s, m_n, _slots(pt_ptr, i_b, stride_pt, o_s, m_n, P)


# P is never specialized: Triton 3.6 derives 16-divisibility for a contiguous run of slots from a
# 16-divisible P and keeps it through the odd record stride (17 words), emitting misaligned
# 16-byte record loads (seen on the H200 as "misaligned address").
@triton.jit(do_not_specialize=["P"])
def _scan_kernel(
    q_ptr,
    w_ptr,
    rec_ptr,
    pt_ptr,
    req_ptr,
    nvis_ptr,
    out_ptr,
    stride_pt,
    NBLK,
    P,
    FORCE_NEWEST: tl.constexpr,
    HI: tl.constexpr,
    DI: tl.constexpr,
    BN: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """Block max of the score row: out fp32 [T, NBLK], -inf past the visible blocks."""
    i_t = tl.program_id(0)
    i_c = tl.program_id(1)
    n_vis, i_b, qp_ptr, b_w = _query(q_ptr, w_ptr, req_ptr, nvis_ptr, i_t, HI, DI)
    newest = tl.where(n_vis > 0, (n_vis - 1) // BLOCK, -1)
    NB_T: tl.constexpr = BN // BLOCK
    for i in range(TILES):
        s0, o_blk = _tile_blocks(i_c * TILES + i, BN, BLOCK)  # o_blk [BN/BLOCK]
        if s0 < n_vis:
            o_s, m_n, o_slot = _tile_slots(s0, n_vis, pt_ptr, i_b, stride_pt, P, BN)
            b_s = _score_tile(rec_ptr, o_slot, m_n, qp_ptr, b_w, HI, BN, DI, DOT_F32)
            b_max = tl.max(tl.reshape(b_s, (NB_T, BLOCK)), axis=1)  # [BN/BLOCK]
        else:
            b_max = tl.full((NB_T,), float("-inf"), tl.float32)
        if FORCE_NEWEST:
            b_max = tl.where(o_blk == newest, float("inf"), b_max)
        tl.store(out_ptr + i_t.to(tl.int64) * NBLK + o_blk, b_max, mask=o_blk < NBLK)


@triton.jit(do_not_specialize=["P"])
def _pool_kernel(
    q_ptr,
    w_ptr,
    rec_ptr,
    pt_ptr,
    req_ptr,
    nvis_ptr,
    blocks_ptr,
    out_ptr,
    stride_pt,
    NB,
    P,
    HI: tl.constexpr,
    DI: tl.constexpr,
    BN: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """Scores of the entries of listed blocks: out fp32 [T, NB * BLOCK], -inf where the block
    id is -1 or the entry is not visible. blocks int32 [T, NB]."""
    i_t = tl.program_id(0)
    i_c = tl.program_id(1)
    n_vis, i_b, qp_ptr, b_w = _query(q_ptr, w_ptr, req_ptr, nvis_ptr, i_t, HI, DI)
    for i in range(TILES):
        j0 = (i_c * TILES + i) * BN
        o_j = j0 + tl.arange(0, BN)  # [BN] position in the pool row
        m_j = o_j < NB * BLOCK
        b_blk = tl.load(blocks_ptr + i_t.to(tl.int64) * NB + o_j // BLOCK, mask=m_j, other=-1)
        o_s = b_blk * BLOCK + o_j % BLOCK  # [BN] entry ids
        m_n = m_j & (b_blk >= 0) & (o_s < n_vis)
        o_slot = _slots(pt_ptr, i_b, stride_pt, o_s, m_n, P)
        b_s = _score_tile(rec_ptr, o_slot, m_n, qp_ptr, b_w, HI, BN, DI, DOT_F32)
        tl.store(out_ptr + i_t.to(tl.int64) * NB * BLOCK + o_j, b_s, mask=m_j)


@triton.jit(do_not_specialize=["P"])
def _scan_group_kernel(
    q_ptr,
    w_ptr,
    rec_ptr,
    pt_ptr,
    req_ptr,
    nvis_ptr,
    out_ptr,
    T,
    stride_pt,
    NBLK,
    P,
    FORCE_NEWEST: tl.constexpr,
    HI: tl.constexpr,
    DI: tl.constexpr,
    QB: tl.constexpr,
    BN: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """`_scan_kernel` for QB consecutive query tokens of ONE request (prefill): each key tile is
    gathered and dequantized once and multiplied against all QB * HI query rows (the dequant,
    not the bytes, bounds the scan). Tokens t0 .. t0 + QB - 1 must share req_ids[t0]. q_ptr:
    nibble-major queries bf16 [T, 8, DI/8, HI] (ops.nibble_major), so slices load contiguous."""
    i_g = tl.program_id(0)
    i_c = tl.program_id(1)
    t0 = i_g * QB
    o_q = tl.arange(0, QB)
    m_q = t0 + o_q < T
    b_nvis = tl.where(m_q, tl.load(nvis_ptr + tl.minimum(t0 + o_q, T - 1)), 0)  # [QB]
    n_max = tl.max(b_nvis, axis=0)
    i_b = tl.load(req_ptr + t0).to(tl.int64)
    o_col = tl.arange(0, QB * HI)
    col_t = tl.minimum(t0 + o_col // HI, T - 1).to(tl.int64)  # [QB * HI] token of each column
    p_qcol = q_ptr + col_t * HI * DI + (o_col % HI)
    b_w = tl.load(w_ptr + col_t * HI + o_col % HI)  # [QB * HI] fp32
    newest = tl.where(b_nvis > 0, (b_nvis - 1) // BLOCK, -1)  # [QB]
    NB_T: tl.constexpr = BN // BLOCK
    for i in range(TILES):
        s0, o_blk = _tile_blocks(i_c * TILES + i, BN, BLOCK)  # o_blk [BN/BLOCK]
        if s0 < n_max:
            o_s, m_n, o_slot = _tile_slots(s0, n_max, pt_ptr, i_b, stride_pt, P, BN)
            b_acc = _keys_dot(
                rec_ptr, o_slot, m_n, p_qcol, QB * HI, BN, DI, HI, (DI // 8) * HI, DOT_F32
            )
            b_acc = tl.maximum(b_acc, 0.0) * b_w[None, :]  # [BN, QB * HI]
            b_s = tl.sum(tl.reshape(b_acc, (BN, QB, HI)), axis=2)  # [BN, QB]
            b_s = tl.where(o_s[:, None] < b_nvis[None, :], b_s, float("-inf"))
            b_max = tl.max(tl.reshape(tl.trans(b_s), (QB, NB_T, BLOCK)), axis=2)  # [QB, BN/8]
        else:
            b_max = tl.full((QB, NB_T), float("-inf"), tl.float32)
        if FORCE_NEWEST:
            b_max = tl.where(o_blk[None, :] == newest[:, None], float("inf"), b_max)
        p_out = out_ptr + (t0 + o_q)[:, None].to(tl.int64) * NBLK + o_blk[None, :]
        tl.store(p_out, b_max, mask=m_q[:, None] & (o_blk < NBLK)[None, :])
