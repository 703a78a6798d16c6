// Sparse MQA attention over V4.1 records, D = 512, up to 8 heads a block, bf16 q (or fp32:
// EXACT), SM90 (sm_90a: wgmma). Built at first use by NVRTC (cuda_jit.py); launched by
// cuda_decode.py with the same arguments as cuda_decode.cu. The math is ref.py's.
//
// One CTA = one query token x one split of its entry list (tiles of 64 entries) x 8 heads,
// 256 threads in two warpgroups:
//  - the producer warpgroup (threads 128-255; thread p: entry p % 64 of the tile, half p / 64
//    of d) requests each tile's records by cp.async one tile ahead, dequantizes its 256 values
//    (records.cuh) into a bf16 tile of shared memory laid out as wgmma's no-swizzle core
//    matrices (8 entries x 8 d of 16 B rows; d permuted inside each 8 as records.cuh), two
//    tile buffers, and signals the tile full (named barriers);
//  - the consumer warpgroup computes S^T = K q^T (64 entries on M, the 8 heads on N; 32
//    wgmma.m64n8k16 over d, q from shared memory), the online softmax (base 2; maxima over the
//    4 warps through shared memory), writes P^T to shared memory, and adds P V as O^T = K^T P^T
//    (d on M through the transposed-A descriptor of the same tile, 8 blocks of 64 d x 4 steps
//    of 16 entries), then frees the buffer.
// EXACT: q and P in three exact bf16 parts, each product three wgmmas (small parts first).
// Output as cuda_decode.cu: fp32 partials with base-2 log-sum-exps, or with one split the final
// rows with the sink.

#include "records.cuh"
#include "warpgroup.cuh"

#ifndef EXACT
#define EXACT 0
#endif
#define QP (EXACT ? 3 : 1)
#ifndef PDL
#define PDL 1
#endif
#define TE 64  // entries per tile
#ifndef NPW
#define NPW 1  // producer warpgroups (each thread of them: one entry, 512 / (2 NPW) of d)
#endif
#define NPT (128 * NPW)  // producer threads
#define DP (256 / NPW)   // d per producer thread
#define NTH (128 + NPT)  // threads per block
#ifndef QK_CHAINS
#define QK_CHAINS 4  // independent accumulators of the logits (k-steps interleaved)
#endif
// named barriers: 1 the consumer warpgroup; 2, 3 buffer b full; 4, 5 buffer b free
#define BAR_CONS 1
#define BAR_FULL 2
#define BAR_FREE 4
// shared memory (bytes): two tiles, the producers' staging (2 stages of DP / 16 chunks x NPT
// threads x 16 B and the threads' scale bytes), q's parts (64 core matrices each), P^T's parts
// (8 each), the maxima
#define SM_TILE 65536
#define NCHP (DP / 16)             // a producer thread's 16 B chunks of a V41 record (FP4: half)
#define SCB (NPW == 1 ? 16 : 8)    // a producer thread's scale bytes (room for FP4's DP / 16)
#define SM_STAGE (NCHP * NPT * 16 + NPT * SCB)
#define OFF_STG (2 * SM_TILE)
#define OFF_Q (OFF_STG + 2 * SM_STAGE)
#define OFF_P (OFF_Q + QP * 8192)
#define OFF_RED (OFF_P + QP * 1024)

// no-swizzle matrix descriptor: start address, LBO (between core matrices along K), SBO (along
// M or N), all in bytes
__device__ __forceinline__ unsigned long long desc(const void* p, u32 lbo, u32 sbo) {
  const u32 a = (u32)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32);
}

// d[4] (+)= A B, m64n8k16, A and B from shared memory; TA: A is M-major (transposed)
template <int TA>
__device__ __forceinline__ void wgmma8(float* d, unsigned long long da, unsigned long long db,
                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, "
      "%7, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}

extern "C" __global__ void __launch_bounds__(NTH, 1) sparse_wg(SPARSE_ATTN_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int t = blockIdx.x, split = blockIdx.y;
  const int hg0 = 8 * blockIdx.z, H = min(8, H_all - hg0);
  q = (const unsigned char*)q + (long long)hg0 * stride_qh * (EXACT ? 4 : 2);
  sink += has_sink ? hg0 : 0;
  part = part_heads(part, out_kind, hg0);  // partials [T, NS, H_all, 512], or out's rows
  out = out_heads(out, out_kind, hg0, stride_oh);
  lse += hg0;
  const int tid = threadIdx.x;

  // q's parts as the logits' B operand: core matrix db (8 heads x d 8 db + 0..7 permuted)
  for (int r = tid; r < 512; r += NTH) {
    const int h = r >> 6, db = r & 63;
    u32 w[QP][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int d0 = 8 * db + PERM8(2 * j), d1 = 8 * db + PERM8(2 * j + 1);
      u32 v[QP];
#pragma unroll
      for (int c = 0; c < QP; ++c) v[c] = 0;
      if (h < H) {
#if EXACT
        const float* p = (const float*)q + t * stride_qt + h * stride_qh;
        split3(p[d0], p[d1], v);
#else
        const u16* p = (const u16*)q + t * stride_qt + h * stride_qh;
        v[0] = (u32)p[d0] | ((u32)p[d1] << 16);
#endif
      }
#pragma unroll
      for (int c = 0; c < QP; ++c) w[c][j] = v[c];
    }
#pragma unroll
    for (int c = 0; c < QP; ++c)
      *(uint4*)(smem + OFF_Q + c * 8192 + db * 128 + h * 16) = make_uint4(w[c][0], w[c][1], w[c][2], w[c][3]);
  }
  fence_async_smem();
  __syncthreads();

  const EntryTiles tiles =
      entry_tiles(swa_idx, stride_swt, kv_idx, stride_kvt, t, W, TOPK, TE, num_splits, split);
  const int u0 = tiles.u0, u1 = tiles.u1;
  auto slot_of = [&](int u, int e) { return tiles.slot(u, e); };

  if (tid >= 128) {  // ---------------------------------------------------------- producer
    // thread p: entry e of the tile, d in [DP h, DP h + DP)
    const int p = tid - 128, e = p & 63, h = p >> 6;
    auto issue = [&](int u, int slot) {  // tile u's bytes of (e, h) into stage (u - u0) % 2
      if (u < u1) {
        uint4* stg = (uint4*)(smem + OFF_STG + ((u - u0) & 1) * SM_STAGE);
        const int n = slot >= 0 ? 16 : 0;
        const int fmt = tiles.swa(u) ? 0 : kv_fp4;
        const u8* rec = (tiles.swa(u) ? swa : kv) + (long long)(slot >= 0 ? slot : 0) * (fmt ? 288 : 528);
        if (fmt) {  // DP / 2 bytes of values, DP / 16 scale bytes
#pragma unroll
          for (int c = 0; c < NCHP / 2; ++c) cp16(stg + c * NPT + p, rec + DP / 2 * h + 16 * c, n);
#if NPW == 1
          cp16(stg + NCHP * NPT + p, rec + 256 + 16 * h, n);
#else
          cp8((uint2*)(stg + NCHP * NPT) + p, rec + 256 + 8 * h, slot >= 0 ? 8 : 0);
#endif
        } else {  // DP bytes of values, DP / 32 scale bytes
#pragma unroll
          for (int c = 0; c < NCHP; ++c) cp16(stg + c * NPT + p, rec + DP * h + 16 * c, n);
#if NPW == 1
          cp8(stg + NCHP * NPT + p, rec + 512 + 8 * h, slot >= 0 ? 8 : 0);
#else
          cp4((uint2*)(stg + NCHP * NPT) + p, rec + 512 + 4 * h, slot >= 0 ? 4 : 0);
#endif
        }
      }
      cp_commit();
    };
    issue(u0, slot_of(u0, e));
    int s_next = slot_of(u0 + 1, e);
    for (int u = u0; u < u1; ++u) {
      issue(u + 1, s_next);
      s_next = slot_of(u + 2, e);
      asm volatile("cp.async.wait_group 1;" ::: "memory");  // tile u's bytes landed
      const int b = (u - u0) & 1;
      if (u - u0 >= 2) bar_sync(BAR_FREE + b, NTH);
      const uint4* stg = (const uint4*)(smem + OFF_STG + b * SM_STAGE);
      unsigned char* tile = smem + b * SM_TILE + (e >> 3) * 128 + (e & 7) * 16;
#if NPW == 1
      const uint4 sc = stg[NCHP * NPT + p];
#else
      const uint2 sc2 = ((const uint2*)(stg + NCHP * NPT))[p];
      const uint4 sc = make_uint4(sc2.x, sc2.y, 0u, 0u);
#endif
      if (!tiles.swa(u) && kv_fp4) {  // NCHP / 2 chunks of 32 values; e4m3 scales 2 c, 2 c + 1
        const u32 sw[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
        for (int c = 0; c < NCHP / 2; ++c) {
          const uint4 a = stg[c * NPT + p];
          u32 m0, m1;
          fp4_mults(sw[c >> 1] >> (16 * (c & 1)), m0, m1);
          const int db = DP / 8 * h + 4 * c;
          *(uint4*)(tile + cm(db, 0)) = fp4_word(a.x, m0);
          *(uint4*)(tile + cm(db + 1, 0)) = fp4_word(a.y, m0);
          *(uint4*)(tile + cm(db + 2, 0)) = fp4_word(a.z, m1);
          *(uint4*)(tile + cm(db + 3, 0)) = fp4_word(a.w, m1);
        }
      } else {  // NCHP chunks of 16 values; one UE8M0 per 32
#pragma unroll
        for (int c = 0; c < NCHP; ++c) {
          const uint4 a = stg[c * NPT + p];
          const u32 m = v41_mult((((c >> 3) ? sc.y : sc.x) >> (8 * ((c >> 1) & 3))) & 0xFFu);
          const int db = DP / 8 * h + 2 * c;
          *(uint4*)(tile + cm(db, 0)) = e4m3_words(a.x, a.y, m);
          *(uint4*)(tile + cm(db + 1, 0)) = e4m3_words(a.z, a.w, m);
        }
      }
      fence_async_smem();
      bar_arrive(BAR_FULL + b, NTH);
    }
    return;
  }

  // ------------------------------------------------------------------------------ consumer
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  float acc[8][4];  // O^T: 8 blocks of 64 d positions (M) x the 8 heads (N)
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_a = -1e30f, m_b = -1e30f, l_a = 0.f, l_b = 0.f;  // heads 2 tq, 2 tq + 1
  const float sc = qk_scale * 256.0f;                       // the tiles are the values x 2^-8
  const float ninf = -__int_as_float(0x7F800000);
  float* red = (float*)(smem + OFF_RED);                    // [2][4 warps][8 heads]
  int e_lo = slot_of(u0, 16 * warp + g), e_hi = slot_of(u0, 16 * warp + g + 8);
  for (int u = u0; u < u1; ++u) {
    const int b = (u - u0) & 1;
    const bool ok0 = e_lo >= 0, ok1 = e_hi >= 0;
    e_lo = slot_of(u + 1, 16 * warp + g);
    e_hi = slot_of(u + 1, 16 * warp + g + 8);
    const unsigned char* tile = smem + b * SM_TILE;
    bar_sync(BAR_FULL + b, NTH);
    // S^T[64 entries, 8 heads]: rows 16 warp + g (s0, s1) and + 8 (s2, s3), heads 2 tq, + 1;
    // QK_CHAINS independent accumulators over interleaved k-steps, summed after
    float ch[QK_CHAINS][4], s[4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      const unsigned long long da = desc(tile + 2 * kk * 1024, 1024, 128);
#pragma unroll
      for (int c = QP - 1; c >= 0; --c)
        wgmma8<0>(ch[kk % QK_CHAINS], da, desc(smem + OFF_Q + c * 8192 + 2 * kk * 128, 128, 1024),
                  kk >= QK_CHAINS || c < QP - 1);
    }
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[j] = ch[0][j];
#pragma unroll
      for (int i = 1; i < QK_CHAINS; ++i) s[j] += ch[i][j];
    }
    float x[4];
    x[0] = ok0 ? s[0] * sc : ninf;
    x[1] = ok0 ? s[1] * sc : ninf;
    x[2] = ok1 ? s[2] * sc : ninf;
    x[3] = ok1 ? s[3] * sc : ninf;
    float mx_a = fmaxf(x[0], x[2]), mx_b = fmaxf(x[1], x[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, o));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, o));
    }
    float* rb = red + b * 32;
    if (g == 0) rb[warp * 8 + 2 * tq] = mx_a, rb[warp * 8 + 2 * tq + 1] = mx_b;
    bar_sync(BAR_CONS, 128);
#pragma unroll
    for (int w = 0; w < 4; ++w) mx_a = fmaxf(mx_a, rb[w * 8 + 2 * tq]), mx_b = fmaxf(mx_b, rb[w * 8 + 2 * tq + 1]);
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float al_a = exp2f(m_a - mn_a), al_b = exp2f(m_b - mn_b);
    m_a = mn_a;
    m_b = mn_b;
    const float p0 = exp2f(x[0] - mn_a), p1 = exp2f(x[1] - mn_b);
    const float p2 = exp2f(x[2] - mn_a), p3 = exp2f(x[3] - mn_b);
    l_a = l_a * al_a + p0 + p2;
    l_b = l_b * al_b + p1 + p3;
    // P^T as B (K = entries, N = heads; core matrix per 8 entries, a row per head): (p0, p1) is
    // row g of the block of entries 16 warp + 0..7, heads 2 tq, + 1; transposed, head g's
    // entries 2 tq, 2 tq + 1 of it
    {
      u32 lo[QP], hi[QP];
#if EXACT
      split3(p0, p1, lo);
      split3(p2, p3, hi);
#else
      lo[0] = pack_bf16(p0, p1);
      hi[0] = pack_bf16(p2, p3);
#endif
#pragma unroll
      for (int c = 0; c < QP; ++c) {
        unsigned char* pp = smem + OFF_P + c * 1024 + g * 16 + tq * 4;
        *(u32*)(pp + (2 * warp) * 128) = movtrans(lo[c]);
        *(u32*)(pp + (2 * warp + 1) * 128) = movtrans(hi[c]);
      }
    }
    if (al_a != 1.f || al_b != 1.f) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i][0] *= al_a, acc[i][1] *= al_b, acc[i][2] *= al_a, acc[i][3] *= al_b;
    }
    fence_async_smem();
    bar_sync(BAR_CONS, 128);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {  // the 8 blocks' accumulators are independent
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
        const unsigned long long da = desc(tile + cm(8 * mb, 2 * ks), 128, 1024);
#pragma unroll
        for (int c = QP - 1; c >= 0; --c)
          wgmma8<1>(acc[mb], da, desc(smem + OFF_P + c * 1024 + 2 * ks * 128, 128, 1024), 1);
      }
    }
    wg_commit();
    wg_wait0();
    if (u - u0 + 2 < u1 - u0) bar_arrive(BAR_FREE + b, NTH);
  }

#if PDL
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // l over the 4 warps' rows: lanes of the same tq, then the warps through shared memory
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, o);
    l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, o);
  }
  bar_sync(BAR_CONS, 128);  // the last tile's maxima were read
  if (g == 0) red[warp * 8 + 2 * tq] = l_a, red[warp * 8 + 2 * tq + 1] = l_b;
  bar_sync(BAR_CONS, 128);
  l_a = red[2 * tq] + red[8 + 2 * tq] + red[16 + 2 * tq] + red[24 + 2 * tq];
  l_b = red[2 * tq + 1] + red[9 + 2 * tq] + red[17 + 2 * tq] + red[25 + 2 * tq];
  const int ha = 2 * tq, hb = ha + 1;
  const BlockOut ob = {part, lse, out, stride_ot, stride_oh, out_kind, H_all, H, num_splits, t,
                       split};
  float f_a, f_b;
  head_factors(ob, sink, has_sink, ha, hb, m_a, m_b, l_a, l_b, warp == 0 && g == 0, f_a, f_b);
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int pos = 64 * mb + 16 * warp + g + 8 * rr;  // stored position
      const int d = (pos & ~7) + PERM8(pos & 7);
      store_pair(ob, d, ha, hb, acc[mb][2 * rr] * f_a, acc[mb][2 * rr + 1] * f_b);
    }
  }
}
