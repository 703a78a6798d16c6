// Sparse MQA attention over V4.1 records, D = 512, bf16 q (or fp32: EXACT), SM90.
// Built at first use by NVRTC (cuda_jit.py); launched by cuda_decode.py, which states the
// arguments. Self-contained: no CUDA headers, the tensor-core and conversion steps in PTX.
// The math is kernels/sparse_attn/ref.py's (the GPU tests compare the two).
//
// One CTA = one query token x one split of its entry list (SWA tiles, then top-k tiles, of BN
// = 16 or 32 entries; a split takes every num_splits-th tile: EntryTiles) x one group of 8 NH
// heads (NH = 1: up to 8; 2: 16); NW = 4 warps (or 2, or 8), warp w owns the head-dim range d
// in [DQ w, DQ w + DQ), DQ = 512 / NW:
//  - the records of tile u + STAGES - 1 are requested by cp.async into a per-warp ring while
//    tile u is computed (each lane stages and reads back only its own bytes);
//  - each warp dequantizes its range of a tile's records into its own shared-memory tile, in
//    the order of triton_records' PTX (d permuted inside each group of 8: stored positions
//    0..7 hold d 0 2 4 6 1 3 5 7), as the values x 2^-8 (FAST_FACTOR);
//  - its logits over the range (mma m16n8k16), q's range held in registers (loaded in the
//    same permuted order), the tile by ldmatrix: with NH = 1 transposed (entries on M, the 8
//    heads on N), with NH = 2 the 16 heads on M;
//  - the NW partial logits are summed through shared memory (one block barrier a tile), every
//    warp runs the same online softmax (base 2), rescaling its accumulator only when a maximum
//    moved, and adds P V over its range with d on M and heads on N: A = K^T by
//    ldmatrix.trans, B = P^T from the logits' registers (transposed by movmatrix when NH = 1);
//    its accumulator is DQ d x 8 NH heads, fp32.
// NW = 2 halves the per-tile work that every warp repeats (index loads, softmax, barrier) at
// twice the accumulator and dequantization per warp: faster in prefill at up to 8 heads.
// NW = 8 halves each warp's dequantization and products of a tile instead (the same index
// loads and softmax on eight warps): faster where a block has only one or two tiles.
// EXACT (fp32 q, NH = 1): q and P are split into three exact bf16 parts and each product is
// three MMAs, the small parts first (the Triton exact path's arithmetic).
// Output: fp32 partials (normalized, with base-2 log-sum-exps) for the merge kernel, or, with
// one split, the final rows with the sink applied (bf16 or fp32).

#include "records.cuh"

#ifndef BN
#define BN 16  // entries per tile: 16 or 32
#endif
#define ET (BN / 16)  // 16-entry sub-tiles of a tile
#ifndef NW
#define NW 4  // warps per block, each owning DQ = 512 / NW of the head dimension (8, 4 or 2)
#endif
#if NW != 8 && NW != 4 && NW != 2
#error "NW is 8 (eighths of the head dimension), 4 (quarters) or 2 (halves)"
#endif
#define DQ (512 / NW)
#define KS (DQ / 16)  // 16-wide steps of a warp's d range (k-steps of the logits, m-tiles of P V)
#define ROW (DQ + 8)  // shared tile row: DQ bf16 + 16 B of padding (ldmatrix rows on distinct banks)

__device__ __forceinline__ void ldsm_x4(u32* r, const void* p) {
  u32 a = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(u32* r, const void* p) {
  u32 a = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

#ifndef STAGES
#define STAGES 3  // tiles of records in flight per warp (cp.async ring in shared memory)
#endif

__device__ __forceinline__ void cp_wait() {  // all but the newest STAGES - 2 groups landed
  asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
}

// The staging ring of one warp for one tile: chunk i of every lane side by side (16 B a lane,
// so each cp.async and each read-back of the warp is one conflict-free 512 B row), and each
// lane's scale bytes (8 B a lane).
#define NCH (DQ / 32)  // 16 B chunks of a lane (V41; V41_FP4 uses the first half)
#if NW == 8
typedef u32 ScaleWords;  // a lane's scale bytes: V41 the pair of warps' 4, V41_FP4 4
#elif NW == 4
typedef uint2 ScaleWords;  // a lane's scale bytes: V41 4, V41_FP4 8
#else
typedef uint4 ScaleWords;  // V41 8, V41_FP4 16
#endif
struct Raw {
  uint4 v[NCH][32];  // [chunk][lane]
  ScaleWords s[32];  // [lane]
};

// Request the record bytes lane (e, hh) dequantizes, e = lane % 16 the entry of the tile: in
// the warp's d range, chunk i of 16 B at 32 i + 16 hh (the two lanes of an entry read whole
// 32 B sectors together). fmt 0 = V41 (528 B; NCH chunks = DQ / 2 e4m3 values; DQ / 32 scale
// bytes at 512 + DQ / 32 warp, one UE8M0 per 32 values: byte i for chunk i), 1 = V41_FP4 (288
// B; NCH / 2 chunks = DQ / 2 e2m1 values; DQ / 16 scale bytes at 256 + DQ / 16 warp, one e4m3
// per 16 values: bytes 2 hh, 2 hh + 1 of word i for chunk i). Zeros for slot -1.
__device__ __forceinline__ void issue_raw(Raw& r, int lane, const u8* base, int slot, int fmt,
                                          int warp, int hh) {
  const int n = slot >= 0 ? 16 : 0;
  const u8* rec = base + (long long)(slot >= 0 ? slot : 0) * (fmt ? 288 : 528);
  if (fmt) {
    const u8* pv = rec + DQ / 2 * warp + 16 * hh;
#pragma unroll
    for (int i = 0; i < NCH / 2; ++i) cp16(&r.v[i][lane], pv + 32 * i, n);
#if NW == 8
    cp4(&r.s[lane], rec + 256 + 4 * warp, slot >= 0 ? 4 : 0);
#elif NW == 4
    cp8(&r.s[lane], rec + 256 + 8 * warp, slot >= 0 ? 8 : 0);
#else
    cp16(&r.s[lane], rec + 256 + 16 * warp, n);
#endif
  } else {
    const u8* pv = rec + DQ * warp + 16 * hh;
#pragma unroll
    for (int i = 0; i < NCH; ++i) cp16(&r.v[i][lane], pv + 32 * i, n);
#if NW == 8  // 2 bytes a warp: the word of the warp pair (store_tile takes its half)
    cp4(&r.s[lane], rec + 512 + 4 * (warp >> 1), slot >= 0 ? 4 : 0);
#elif NW == 4
    cp4(&r.s[lane], rec + 512 + 4 * warp, slot >= 0 ? 4 : 0);
#else
    cp8(&r.s[lane], rec + 512 + 8 * warp, slot >= 0 ? 8 : 0);
#endif
  }
}

// Dequantize lane (e, hh)'s staged values into row e of the warp's tile: chunk i holds the
// warp's values 32 i + 16 hh .. + 15 (V41) or 64 i + 32 hh .. + 31 (FP4).
__device__ __forceinline__ void store_tile(u16* tile, const Raw& r, int lane, int fmt, int e,
                                           int hh) {
  const ScaleWords scw = r.s[lane];
#if NW == 8
  const u32 sc[1] = {fmt ? scw : scw >> (16 * ((threadIdx.x >> 5) & 1))};
#elif NW == 4
  const u32 sc[2] = {scw.x, scw.y};
#else
  const u32 sc[4] = {scw.x, scw.y, scw.z, scw.w};
#endif
  if (fmt) {
#pragma unroll
    for (int i = 0; i < NCH / 2; ++i) {
      const uint4 a = r.v[i][lane];
      u32 m0, m1;
      fp4_mults(sc[i] >> (16 * hh), m0, m1);
      uint4* dst = (uint4*)(tile + e * ROW + 64 * i + 32 * hh);
      dst[0] = fp4_word(a.x, m0);
      dst[1] = fp4_word(a.y, m0);
      dst[2] = fp4_word(a.z, m1);
      dst[3] = fp4_word(a.w, m1);
    }
  } else {
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const uint4 a = r.v[i][lane];
      const u32 m = v41_mult((sc[i >> 2] >> (8 * (i & 3))) & 0xFFu);
      uint4* dst = (uint4*)(tile + e * ROW + 32 * i + 16 * hh);
      dst[0] = e4m3_words(a.x, a.y, m);
      dst[1] = e4m3_words(a.z, a.w, m);
    }
  }
}

#ifndef MIN_BLOCKS
#define MIN_BLOCKS (BN == 16 ? 3 : 2)  // blocks per SM the registers are sized for
#endif
#ifndef NH
#define NH 2  // tiles of 8 heads in the output product: 1 for H <= 8, 2 for H <= 16
#endif
#ifndef EXACT
#define EXACT 0  // 1: fp32 q and P, each split into three exact bf16 parts (NH = 1 only)
#endif
#ifndef PDL
#define PDL 1  // let the merge kernel launch once this block's tiles are done (SM90)
#endif
#define QP (EXACT ? 3 : 1)  // bf16 parts of q and P
#ifndef QK_CHAINS
#define QK_CHAINS (EXACT ? 2 : 1)  // independent accumulator chains of the logits product
#endif
#if EXACT && NH != 1
#error "the exact mode takes up to 8 heads (NH = 1)"
#endif
// Up to 8 heads (NH = 1) the logits are computed transposed, S^T = K q^T with the 16 entries
// on M and the 8 heads on N (one MMA a k-step, no padded rows); P^T for the output product is
// then the logits' C fragments transposed in registers (movmatrix). 9-16 heads: heads on M.
#define ESWAP (NH == 1)
#define RED_N (ESWAP ? ET : 2 * ET)  // float4 logit fragments per lane a tile
#ifndef KBUF
#define KBUF (BN == 16 ? 2 : 1)  // dequantized tile buffers per warp (2: the next one early)
#endif

extern "C" __global__ void __launch_bounds__(32 * NW, MIN_BLOCKS)
    sparse_decode_h16(SPARSE_ATTN_PARAMS) {
  // out_kind: 0 = fp32 partials part [T, NS, H, D] + lse [T, NS, H]; 1 = bf16 out; 2 = fp32 out
  extern __shared__ __align__(16) unsigned char smem[];  // SMEM_BYTES(STAGES), cuda_decode.py
  // [KBUF][warp] dequantized tiles, [2][warp][RED_N] logit fragments, [STAGES][warp][ET] staging
  u16(*ktile)[NW][BN * ROW] = (u16(*)[NW][BN * ROW])smem;
  unsigned char* p_red = smem + KBUF * NW * BN * ROW * 2;
  float4(*red)[NW][RED_N][32] = (float4(*)[NW][RED_N][32])p_red;
  Raw(*raw)[NW][ET] = (Raw(*)[NW][ET])(p_red + 2 * NW * RED_N * 32 * 16);
  const int t = blockIdx.x, split = blockIdx.y;
  // this block's heads: group blockIdx.z of 8 NH heads (H of them), q / sink / out from there
  const int hg0 = 8 * NH * blockIdx.z, H = min(8 * NH, H_all - hg0);
  q = (const unsigned char*)q + (long long)hg0 * stride_qh * (EXACT ? 4 : 2);
  sink += has_sink ? hg0 : 0;
  part = part_heads(part, out_kind, hg0);  // partials [T, NS, H_all, 512], or out's rows
  out = out_heads(out, out_kind, hg0, stride_oh);
  lse += hg0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int e_ld = lane & 15, hh = lane >> 4;  // this lane's entry of a tile, half of it
  // this lane's ldmatrix row in a tile, for both products: matrix lane / 8 of the x4 load is
  // entries 0-7 or 8-15 (bit 1) x d 0-7 or 8-15 of a 16-wide step (bit 0), row lane % 8
  const int ld_off = ((lane & 7) + 8 * ((lane >> 4) & 1)) * ROW + 8 * ((lane >> 3) & 1);
#if ESWAP
  // the logits' loads with ESWAP: the tile as the A operand (entries on M), matrices in A's
  // register order (entries 0-7 / 8-15 by bit 0 of lane / 8, d 0-7 / 8-15 by bit 1)
  const int ld_qk = ((lane & 7) + 8 * ((lane >> 3) & 1)) * ROW + 8 * ((lane >> 4) & 1);
#else
  const int ld_qk = ld_off;
#endif
  // d offsets inside a group of 8 of this lane's fragment columns 2 tq, 2 tq + 1
  const int dlo = (tq & 1) * 4 + (tq >> 1), dhi = dlo + 2;  // positions 0..7 -> 0 2 4 6 1 3 5 7

  // q over the warp's d range as fragments of KS k-steps of 16 positions, zero for heads beyond
  // H: with ESWAP B fragments (head g; positions 2 tq, 2 tq + 1 and 8 + those), else A
  // fragments (heads g and g + 8 on M)
#if ESWAP
  u32 qa[QP][KS][2];  // [part][k-step][k half]
#else
  u32 qa[QP][KS][4];  // [part][k-step]
#endif
  {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long d0 = DQ * warp + 16 * kk + 8 * half;
        u32 r0[QP], r1[QP];
#pragma unroll
        for (int c = 0; c < QP; ++c) r0[c] = r1[c] = 0;
#if EXACT
        if (g < H) {
          const float* p = (const float*)q + t * stride_qt + g * stride_qh + d0;
          split3(p[dlo], p[dhi], r0);
        }
#else
        const u16* qt = (const u16*)q + (long long)t * stride_qt;
        if (g < H) {
          const u16* p = qt + (long long)g * stride_qh + d0;
          r0[0] = (u32)p[dlo] | ((u32)p[dhi] << 16);
        }
        if (NH == 2 && g + 8 < H) {
          const u16* p = qt + (long long)(g + 8) * stride_qh + d0;
          r1[0] = (u32)p[dlo] | ((u32)p[dhi] << 16);
        }
#endif
#pragma unroll
        for (int c = 0; c < QP; ++c) {
#if ESWAP
          qa[c][kk][half] = r0[c];
#else
          qa[c][kk][2 * half] = r0[c];
          qa[c][kk][2 * half + 1] = r1[c];
#endif
        }
      }
    }
  }

  const EntryTiles tiles =
      entry_tiles(swa_idx, stride_swt, kv_idx, stride_kvt, t, W, TOPK, BN, num_splits, split);
  const int u0 = tiles.u0, u1 = tiles.u1;

  // this lane's entries of tile u (16 et + e_ld, et < ET), -1 beyond the segment
  auto slots_of = [&](int u, int* s) { tiles.slots<ET>(u, e_ld, s); };

  // O^T over the warp's d range: KS tiles of 16 d (M) x NH tiles of 8 heads (N); c0, c1 = (d =
  // g, heads 2 tq, 2 tq + 1), c2, c3 = (d = g + 8, same heads)
  float acc[KS][NH][4];
#pragma unroll
  for (int i = 0; i < KS; ++i)
#pragma unroll
    for (int j = 0; j < NH; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  // scales head tile j of the accumulator: columns 2 tq by a0, 2 tq + 1 by a1
  auto rescale = [&](int j, float a0, float a1) {
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      acc[i][j][0] *= a0;
      acc[i][j][1] *= a1;
      acc[i][j][2] *= a0;
      acc[i][j][3] *= a1;
    }
  };
  // softmax state of two heads: with ESWAP heads 2 tq, 2 tq + 1 (this lane's accumulator
  // columns; l summed over this lane's entries only), else heads g, g + 8 (rows of S)
  float m_a = -1e30f, m_b = -1e30f, l_a = 0.f, l_b = 0.f;
  const float sc = qk_scale * 256.0f;  // the tiles are the values x 2^-8

  // Software pipeline: the records of tile u + STAGES - 1 are requested (cp.async) while tile
  // u is computed; tile u + 1 is dequantized while the logits of tile u are summed across the
  // warps (before the block barrier) with two tile buffers (KBUF 2), else after P V.
  auto seg_base = [&](int u) { return tiles.swa(u) ? swa : kv; };
  auto seg_fmt = [&](int u) { return tiles.swa(u) ? 0 : kv_fp4; };
  int slots[STAGES][ET];  // slots[k]: this lane's entries of tile u + k (u being computed)
#pragma unroll
  for (int k = 0; k < STAGES; ++k) slots_of(u0 + k, slots[k]);
  auto issue = [&](int un, const int* s) {  // request tile un's records into its stage
    const int st = (un - u0) % STAGES;
    if (un < u1)
#pragma unroll
      for (int et = 0; et < ET; ++et)
        issue_raw(raw[st][warp][et], lane, seg_base(un), s[et], seg_fmt(un), warp, hh);
    cp_commit();
  };
  // dequantize tile un (its records landed) into `tile`; returns its live entries (bit e)
  auto prepare = [&](int un, u16* tile, const int* s) -> u32 {
    const int st = (un - u0) % STAGES;
    cp_wait();
    u32 valid = 0;
#pragma unroll
    for (int et = 0; et < ET; ++et) {
      store_tile(tile + 16 * et * ROW, raw[st][warp][et], lane, seg_fmt(un), e_ld, hh);
      valid |= (__ballot_sync(0xFFFFFFFFu, s[et] >= 0) & 0xFFFFu) << (16 * et);
    }
    return valid;
  };
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) issue(u0 + k, slots[k]);
  int s_ahead[ET];
  slots_of(u0 + STAGES, s_ahead);
  u32 valid_cur = 0;
  if (u0 < u1) {
    valid_cur = prepare(u0, ktile[0][warp], slots[0]);
    __syncwarp();
  }
  for (int u = u0; u < u1; ++u) {
    const int buf = (u - u0) & 1;
    u16* tile = ktile[(u - u0) % KBUF][warp];
    issue(u + STAGES - 1, slots[STAGES - 1]);  // into the stage tile u - 1 used

    // partial logits over the warp's d range, QK_CHAINS independent accumulators (k-steps
    // interleaved) summed at the end. ESWAP: S^T[16 entries, 8 heads] per 16 entries et in
    // s[et] (c0, c1 = entry g, heads 2 tq, 2 tq + 1; c2, c3 = entry g + 8); else S[16 heads,
    // 8 entries] in s[2 et] (entries 0-7 of the 16) and s[2 et + 1] (8-15)
    float s[RED_N][4];
    {
      float ch[QK_CHAINS][RED_N][4];
#pragma unroll
      for (int i = 0; i < QK_CHAINS; ++i)
#pragma unroll
        for (int r = 0; r < RED_N; ++r) ch[i][r][0] = ch[i][r][1] = ch[i][r][2] = ch[i][r][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int et = 0; et < ET; ++et) {
          u32 b[4];
          ldsm_x4(b, tile + 16 * et * ROW + ld_qk + 16 * kk);
#if ESWAP
#pragma unroll
          for (int c = QP - 1; c >= 0; --c)  // the small parts first; b is the tile as A
            mma16816(ch[kk % QK_CHAINS][et], b, qa[c][kk][0], qa[c][kk][1]);
#else
#pragma unroll
          for (int c = QP - 1; c >= 0; --c) {
            mma16816(ch[kk % QK_CHAINS][2 * et], qa[c][kk], b[0], b[1]);
            mma16816(ch[kk % QK_CHAINS][2 * et + 1], qa[c][kk], b[2], b[3]);
          }
#endif
        }
      }
#pragma unroll
      for (int r = 0; r < RED_N; ++r) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[r][j] = ch[0][r][j];
#pragma unroll
          for (int i = 1; i < QK_CHAINS; ++i) s[r][j] += ch[i][r][j];
        }
        red[buf][warp][r][lane] = make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
      }
    }

    u32 valid_next = 0;
#if KBUF == 2
    // the next tile, while the other warps catch up
    if (u + 1 < u1) valid_next = prepare(u + 1, ktile[(u + 1 - u0) % KBUF][warp], slots[1]);
#endif
#pragma unroll
    for (int k = 0; k < STAGES - 1; ++k)
#pragma unroll
      for (int et = 0; et < ET; ++et) slots[k][et] = slots[k + 1][et];
#pragma unroll
    for (int et = 0; et < ET; ++et) slots[STAGES - 1][et] = s_ahead[et];
    slots_of(u + STAGES + 1, s_ahead);
    __syncthreads();
    const float ninf = -__int_as_float(0x7F800000);
    u32 pb[QP][NH][2 * ET];  // P^T as B fragments: [part][head tile][k half of 16 entries]
    float al_a, al_b;        // the rescale factors of heads a, b
    bool moved;              // some head's maximum moved (all lanes agree)
    {
      float x[RED_N * 4];
#pragma unroll
      for (int i = 0; i < RED_N * 4; ++i) x[i] = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int r = 0; r < RED_N; ++r) {
          const float4 v = red[buf][w][r][lane];
          x[4 * r] += v.x; x[4 * r + 1] += v.y; x[4 * r + 2] += v.z; x[4 * r + 3] += v.w;
        }
#if ESWAP
      // x[4 et + 0, 1]: entry 16 et + g, heads a, b; x[4 et + 2, 3]: entry 16 et + g + 8
#pragma unroll
      for (int i = 0; i < RED_N * 4; ++i) {
        const int e = 16 * (i >> 2) + g + 8 * ((i >> 1) & 1);
        x[i] = ((valid_cur >> e) & 1u) ? x[i] * sc : ninf;
      }
      float mx_a = x[0], mx_b = x[1];
#pragma unroll
      for (int i = 2; i < RED_N * 4; i += 2) mx_a = fmaxf(mx_a, x[i]), mx_b = fmaxf(mx_b, x[i + 1]);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {  // over the lanes of the same tq (entries g)
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, o));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, o));
      }
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      moved = __any_sync(0xFFFFFFFFu, mn_a != m_a || mn_b != m_b);
      al_a = exp2f(m_a - mn_a);
      al_b = exp2f(m_b - mn_b);
      m_a = mn_a;
      m_b = mn_b;
      float p[RED_N * 4];
#pragma unroll
      for (int i = 0; i < RED_N * 4; i += 2) p[i] = exp2f(x[i] - mn_a), p[i + 1] = exp2f(x[i + 1] - mn_b);
      float sa = 0.f, sb = 0.f;
#pragma unroll
      for (int i = 0; i < RED_N * 4; i += 2) sa += p[i], sb += p[i + 1];
      l_a = l_a * al_a + sa;
      l_b = l_b * al_b + sb;
      // (p[4 et], p[4 et + 1]) is row g of P^T's 8 x 8 block of entries 16 et + 0-7 (heads
      // 2 tq, 2 tq + 1): its transpose's fragment is the B fragment (entries 2 tq, 2 tq + 1
      // of head g)
#pragma unroll
      for (int k = 0; k < 2 * ET; ++k) {
#if EXACT
        u32 a[3];
        split3(p[2 * k], p[2 * k + 1], a);
#pragma unroll
        for (int c = 0; c < 3; ++c) pb[c][0][k] = movtrans(a[c]);
#else
        pb[0][0][k] = movtrans(pack_bf16(p[2 * k], p[2 * k + 1]));
#endif
      }
#else
      // x[8 et + 0, 1]: row g, entries 16 et + 2 tq, + 1; x[8 et + 2, 3]: row g + 8, same;
      // x[8 et + 4..7]: the same for entries 16 et + 8 + ...
#pragma unroll
      for (int i = 0; i < RED_N * 4; ++i) {
        const int e = 16 * (i >> 3) + 2 * tq + (i & 1) + 8 * ((i >> 2) & 1);
        x[i] = ((valid_cur >> e) & 1u) ? x[i] * sc : ninf;
      }
      float mx_a = ninf, mx_b = ninf;
#pragma unroll
      for (int i = 0; i < RED_N * 4; ++i) {
        if (i & 2) mx_b = fmaxf(mx_b, x[i]);
        else mx_a = fmaxf(mx_a, x[i]);
      }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, 2));
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      moved = __any_sync(0xFFFFFFFFu, mn_a != m_a || mn_b != m_b);
      const float ra = exp2f(m_a - mn_a), rb = exp2f(m_b - mn_b);
      m_a = mn_a;
      m_b = mn_b;
      float p[RED_N * 4], sa = 0.f, sb = 0.f;
#pragma unroll
      for (int i = 0; i < RED_N * 4; ++i) {
        p[i] = exp2f(x[i] - ((i & 2) ? mn_b : mn_a));
        if (i & 2) sb += p[i];
        else sa += p[i];
      }
      l_a = l_a * ra + sa;
      l_b = l_b * rb + sb;
      // P^T as B fragments (k = entries 2 tq, 2 tq + 1 and 8 + those, n = head g): the
      // logits' own C layout, heads 0..7 from rows g, heads 8..15 from rows g + 8
#pragma unroll
      for (int et = 0; et < ET; ++et) {
        pb[0][0][2 * et] = pack_bf16(p[8 * et], p[8 * et + 1]);
        pb[0][0][2 * et + 1] = pack_bf16(p[8 * et + 4], p[8 * et + 5]);
        pb[0][1][2 * et] = pack_bf16(p[8 * et + 2], p[8 * et + 3]);
        pb[0][1][2 * et + 1] = pack_bf16(p[8 * et + 6], p[8 * et + 7]);
      }
      if (moved) {  // this lane's accumulator columns are heads 2 tq, 2 tq + 1 (+ 8)
        al_a = __shfl_sync(0xFFFFFFFFu, ra, 8 * tq);
        al_b = __shfl_sync(0xFFFFFFFFu, ra, 8 * tq + 4);
        rescale(1, __shfl_sync(0xFFFFFFFFu, rb, 8 * tq), __shfl_sync(0xFFFFFFFFu, rb, 8 * tq + 4));
      }
#endif
    }
    if (moved) rescale(0, al_a, al_b);  // head tile 0: columns 2 tq, 2 tq + 1
    // A = K^T tiles (d on M, entries on K) by ldmatrix.trans of the same 8 x 8 blocks
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
#pragma unroll
      for (int et = 0; et < ET; ++et) {
        u32 a[4];
        ldsm_x4_t(a, tile + 16 * et * ROW + ld_off + 16 * mt);
#pragma unroll
        for (int j = 0; j < NH; ++j)
#pragma unroll
          for (int c = QP - 1; c >= 0; --c)
            mma16816(acc[mt][j], a, pb[c][j][2 * et], pb[c][j][2 * et + 1]);
      }
    }
    __syncwarp();
#if KBUF == 1
    // the next tile into the same buffer, now that this warp is done with it (slots[0] is
    // already the next tile's)
    if (u + 1 < u1) {
      valid_next = prepare(u + 1, tile, slots[0]);
      __syncwarp();
    }
#endif
    valid_cur = valid_next;
  }

#if PDL
  // the merge (a programmatic dependent launch) may start; it waits for this grid to finish
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // per head: the output factor (with the sink, or 1 / l for a partial) and the partial's lse
#if ESWAP
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, o);
    l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, o);
  }
  const int ha = 2 * tq, hb = ha + 1;
  const bool lse_lane = warp == 0 && g == 0;
#else
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 1);
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 2);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 1);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 2);
  const int ha = g, hb = g + 8;
  const bool lse_lane = warp == 0 && tq == 0;
#endif
  const BlockOut ob = {part, lse, out, stride_ot, stride_oh, out_kind, H_all, H, num_splits, t,
                       split};
  float f_a, f_b;
  head_factors(ob, sink, has_sink, ha, hb, m_a, m_b, l_a, l_b, lse_lane, f_a, f_b);
#pragma unroll
  for (int j = 0; j < NH; ++j) {
#if ESWAP
    const float f0 = f_a, f1 = f_b;
#else
    const float fsrc = j ? f_b : f_a;  // lane 4 h' holds head h' (+ 8 j)'s factor
    const float f0 = __shfl_sync(0xFFFFFFFFu, fsrc, 8 * tq), f1 = __shfl_sync(0xFFFFFFFFu, fsrc, 8 * tq + 4);
#endif
    const int h0 = 8 * j + 2 * tq, h1 = h0 + 1;
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int pos = 16 * mt + g + 8 * rr;  // stored position in the warp's d range
        const int d = DQ * warp + (pos & ~7) + PERM8(pos & 7);
        store_pair(ob, d, h0, h1, acc[mt][j][2 * rr] * f0, acc[mt][j][2 * rr + 1] * f1);
      }
    }
  }
}
