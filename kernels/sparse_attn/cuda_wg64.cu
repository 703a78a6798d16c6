// Sparse MQA attention over V4.1 records for 64 query heads a block (DP attention, or a GPU's
// 32 heads padded to 64), D = 512, bf16 q, SM90 (sm_90a: wgmma, setmaxnreg). Built at first
// use by NVRTC (cuda_jit.py); launched by cuda_decode.py with the same arguments as
// cuda_decode.cu. The math is ref.py's.
//
// One CTA = one query token x one split of its entry list (tiles of 64 entries) x 64 heads,
// 384 threads in three warpgroups (the heads on wgmma's M axis, where its size fits):
//  - the producer warpgroup (threads 256-383; thread p: entry p % 64 of the tile, half p / 64
//    of d) loads a tile's records into registers one tile ahead (the slots two ahead) and
//    dequantizes its 256 values (records.cuh) into a bf16 tile of shared memory laid out as
//    wgmma's no-swizzle core matrices (8 entries x 8 d, 16 B rows; d permuted inside each 8 as
//    records.cuh), two tile buffers, with a flag per entry (slot >= 0), and signals each
//    consumer group that the tile is full (named barriers);
//  - consumer warpgroup c (threads 128 c ..) owns d 256 c .. 256 c + 255 of the output. Both
//    compute all the logits (S = q K^T, m64n64k16, q and the tile from shared memory) and the
//    same online softmax, so they never wait for each other; P stays in registers as the A
//    operand of P V (O[64 heads, 256 d] += P[64, 64] V, m64n256k16 with V the same tile
//    through the transposed-B descriptor); each then frees the buffer. First they bring q in:
//    a bulk copy (the TMA unit) into tile buffer 1, permuted from there into q's core matrices
//    before the producer fills buffer 1 with the second tile.
// setmaxnreg gives the consumers 200 registers (the 128 of O) and the producer 104.
// Output: partials with base-2 log-sum-exps (bf16 for a bf16 output: half the bytes to store and
// merge; else fp32), or with one split the final rows with the sink, staged through shared
// memory and stored as whole rows.

#include "records.cuh"
#include "warpgroup.cuh"

#ifndef PDL
#define PDL 1
#endif
#ifndef ABL_NOQK  // ablations (benchmarks only): no logits product, no P V, no dequantization
#define ABL_NOQK 0
#endif
#ifndef ABL_NOPV
#define ABL_NOPV 0
#endif
#ifndef ABL_NODEQ
#define ABL_NODEQ 0
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#define TE 64    // entries per tile
#define NTH 384  // threads per block
// named barriers: 1 the two consumer warpgroups; 2 + 2 b + c buffer b full for group c; 6, 7
// buffer b free; 8, 9 the logits order (PINGPONG); 10 q's rows no longer read from buffer 1
#define BAR_CONS 1
#define BAR_FULL 2
#define BAR_FREE 6
#define BAR_PP 8  // 8, 9: group 0's logits of a tile of that parity are done
#define BAR_QRAW 10
// shared memory (bytes): two tiles, q (64 heads x 512 d as core matrices (db, hb)), the entry
// flags of both buffers, the mbarrier of q's copy
#define SM_TILE 65536
#define OFF_Q (2 * SM_TILE)
#define OFF_OK (OFF_Q + 65536)
#define OFF_MBAR (OFF_OK + 512)
#define SMEM_BYTES (OFF_MBAR + 16)
#define STAGE_ROW 520  // floats (bf16: halves) a row of the output staged over the tiles and q

// the two words of a no-swizzle descriptor: lo = start address >> 4 (14 bits) | LBO >> 4 << 16,
// hi = SBO >> 4; a byte offset x (a multiple of 16) from the start is lo + x / 16
__device__ __forceinline__ u32 desc_lo(const void* p, u32 lbo) {
  return (((u32)__cvta_generic_to_shared(p) & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
}

// d[32] (+)= A B: m64n64k16, A and B K-major from shared memory
__device__ __forceinline__ void wgmma_n64(float* d, u32 da, u32 db, u32 dhi, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %35, 0;\n"
      "mov.b64 da, {%32, %34};\nmov.b64 db, {%33, %34};\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19"
      ", %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, da, db, p, 1, 1, 0, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(da), "r"(db), "r"(dhi), "r"(accumulate));
}

// d[128] += A B: m64n256k16, A (a[4], the m16n8k16 A fragment of each warp's 16 rows) from
// registers, B N-major (transposed) from shared memory
__device__ __forceinline__ void wgmma_n256_rs(float* d, const u32* a, u32 db, u32 dhi) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %134, 0;\n"
      "mov.b64 db, {%132, %133};\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19"
      ", %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %"
      "37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54,"
      " %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %7"
      "2, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "
      "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %1"
      "06, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, "
      "%121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, db, p, 1, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db), "r"(dhi), "r"(1));
}

extern "C" __global__ void __launch_bounds__(NTH, 1) sparse_wg64(SPARSE_ATTN_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int t = blockIdx.x, split = blockIdx.y;
  const int hg0 = 64 * blockIdx.z, H = min(64, H_all - hg0);
  q = (const u16*)q + (long long)hg0 * stride_qh;
  sink += has_sink ? hg0 : 0;
  part = part_heads(part, out_kind, hg0);  // partials [T, NS, H_all, 512], or out's rows
  out = out_heads(out, out_kind, hg0, stride_oh);
  lse += hg0;
  const int tid = threadIdx.x;

  const EntryTiles tiles =
      entry_tiles(swa_idx, stride_swt, kv_idx, stride_kvt, t, W, TOPK, TE, num_splits, split);
  const int u0 = tiles.u0, u1 = tiles.u1;
  auto slot_of = [&](int u, int e) { return tiles.slot(u, e); };
  int* okf = (int*)(smem + OFF_OK);  // [2 buffers][64 entries]

  if (tid >= 256) {  // ---------------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 104;");
    // thread p: entry e of the tile, d in [256 hh, 256 hh + 256)
    const int p = tid - 256, e = p & 63, hh = p >> 6;
    uint4 R[16];  // V41: 256 B of values; FP4: 128 B of values and 16 scale bytes in R[8]
    uint2 S;      // V41: 8 scale bytes
    int fp4 = 0;
    auto load = [&](int u, int slot) {  // tile u's records of this thread's entry (at slot)
      fp4 = tiles.swa(u) ? 0 : kv_fp4;
      const bool ok = slot >= 0;
      const u8* rec = (tiles.swa(u) ? swa : kv) + (long long)(ok ? slot : 0) * (fp4 ? 288 : 528);
      if (fp4) {
#pragma unroll
        for (int c = 0; c < 8; ++c)
          R[c] = ok ? __ldg((const uint4*)(rec + 128 * hh) + c) : make_uint4(0u, 0u, 0u, 0u);
        R[8] = ok ? __ldg((const uint4*)(rec + 256) + hh) : make_uint4(0u, 0u, 0u, 0u);
      } else {
#pragma unroll
        for (int c = 0; c < 16; ++c)
          R[c] = ok ? __ldg((const uint4*)(rec + 256 * hh) + c) : make_uint4(0u, 0u, 0u, 0u);
        S = ok ? __ldg((const uint2*)(rec + 512) + hh) : make_uint2(0u, 0u);
      }
    };
    // tile u (buffer u - u0 & 1), its records in R, its slot in s_this, the next tile's in
    // s_other; then the next tile's records are requested and s_this takes the slot two tiles
    // ahead (two slot registers in turn: no register copy waits for a pending load)
    auto step = [&](int u, int& s_this, int s_other) {
      const int b = (u - u0) & 1;
      if (u - u0 >= 2) bar_sync(BAR_FREE + b, NTH);
      if (u - u0 == 1) bar_sync(BAR_QRAW, NTH);  // q's rows have left buffer 1
      unsigned char* tile = smem + b * SM_TILE + (e >> 3) * 128 + (e & 7) * 16;
      if (ABL_NODEQ) {
      } else if (fp4) {  // 8 chunks of 32 values; e4m3 scales 2 c, 2 c + 1
        const u32 sw[4] = {R[8].x, R[8].y, R[8].z, R[8].w};
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          u32 m0, m1;
          fp4_mults(sw[c >> 1] >> (16 * (c & 1)), m0, m1);
          const int db = 32 * hh + 4 * c;
          *(uint4*)(tile + cm(db, 0)) = fp4_word(R[c].x, m0);
          *(uint4*)(tile + cm(db + 1, 0)) = fp4_word(R[c].y, m0);
          *(uint4*)(tile + cm(db + 2, 0)) = fp4_word(R[c].z, m1);
          *(uint4*)(tile + cm(db + 3, 0)) = fp4_word(R[c].w, m1);
        }
      } else {  // 16 chunks of 16 values; one UE8M0 per 32
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          const u32 m = v41_mult((((c >> 3) ? S.y : S.x) >> (8 * ((c >> 1) & 3))) & 0xFFu);
          const int db = 32 * hh + 2 * c;
          *(uint4*)(tile + cm(db, 0)) = e4m3_words(R[c].x, R[c].y, m);
          *(uint4*)(tile + cm(db + 1, 0)) = e4m3_words(R[c].z, R[c].w, m);
        }
      }
      if (hh == 0) okf[64 * b + e] = s_this >= 0;
      fence_async_smem();
      bar_arrive(BAR_FULL + 2 * b, 256);
      bar_arrive(BAR_FULL + 2 * b + 1, 256);
      if (u + 1 < u1) load(u + 1, s_other);
      s_this = slot_of(u + 2, e);
    };
    int s_a = slot_of(u0, e), s_b = slot_of(u0 + 1, e);
    load(u0, s_a);
    for (int u = u0; u < u1; u += 2) {
      step(u, s_a, s_b);
      if (u + 1 < u1) step(u + 1, s_b, s_a);
    }
    if (u1 - u0 < 2) bar_sync(BAR_QRAW, NTH);
    return;
  }

  // ----------------------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 200;");
  const int cg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  // q as the logits' A operand: core matrix (db, h / 8), row h % 8 = d 8 db + 0..7 permuted
  // (PERM8). Rows on 16 bytes come by bulk copy (the TMA unit: one copy of H KB when the rows
  // are contiguous, else one a row) into tile buffer 1 and are permuted from there: lane l of
  // warp w takes row r = 8 w + l % 8 and 16-byte pieces c = 4 k + l / 8 + l % 8 (mod 64), so a
  // quarter-warp reads 8 rows at 8 distinct bank groups and writes one core matrix. (The
  // threads' own 16-byte loads took 1.3-1.7 us more at 64 heads: benchmarks/RESULTS.md.) Rows
  // off 16 bytes take 2-byte loads in a loop of their own. Then buffer 1 is the producer's.
  {
    const u16* qt = (const u16*)q + t * stride_qt;
    const int r = 8 * (tid >> 5) + (tid & 7);
    auto put = [&](int c, u32 w0, u32 w1, u32 w2, u32 w3) {
      *(uint4*)(smem + OFF_Q + cm(c, r >> 3) + (r & 7) * 16) =
          make_uint4(__byte_perm(w0, w1, 0x5410), __byte_perm(w2, w3, 0x5410),
                     __byte_perm(w0, w1, 0x7632), __byte_perm(w2, w3, 0x7632));
    };
    if ((((unsigned long long)qt & 15) == 0) && (stride_qh & 7) == 0) {
      unsigned long long* mbar = (unsigned long long*)(smem + OFF_MBAR);
      unsigned char* raw = smem + SM_TILE;
      if (tid == 0) {
        mbar_init(mbar, 1);
        mbar_expect_tx(mbar, 1024u * H);
      }
      bar_sync(BAR_CONS, 256);
      if (stride_qh == 512) {
        if (tid == 0) bulk_g2s(raw, qt, 1024u * H, mbar);
      } else if (tid < H) {
        bulk_g2s(raw + 1024 * tid, qt + tid * stride_qh, 1024, mbar);
      }
      mbar_wait(mbar, 0);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int c = (4 * k + ((tid >> 3) & 3) + (tid & 7)) & 63;
        const uint4 x = r < H ? *(const uint4*)(raw + 1024 * r + 16 * c) : make_uint4(0u, 0u, 0u, 0u);
        put(c, x.x, x.y, x.z, x.w);
      }
    } else {
#pragma unroll 1
      for (int k = 0; k < 16; ++k) {
        const int c = 4 * k + ((tid >> 3) & 3);
        u32 w[4] = {0u, 0u, 0u, 0u};
        if (r < H) {
          const u16* p = qt + r * stride_qh + 8 * c;
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = (u32)p[2 * j] | ((u32)p[2 * j + 1] << 16);
        }
        put(c, w[0], w[1], w[2], w[3]);
      }
    }
    bar_arrive(BAR_QRAW, NTH);
  }
  fence_async_smem();
  bar_sync(BAR_CONS, 256);
  const int r0 = 16 * warp + g;  // this thread's rows (heads) r0 and r0 + 8
  float o[128];                  // O[64 heads, d 256 cg + 0..255]: n8 block j in o[4 j ..]
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -1e30f, m1 = -1e30f, l0 = 0.f, l1 = 0.f;  // rows r0, r0 + 8
  const float sc = qk_scale * 256.0f;                   // the tiles are the values x 2^-8
  const float ninf = -__int_as_float(0x7F800000);
  // descriptors' low words: q (K-major, LBO 1024 = the next 8 d), buffer 0 as the logits' B
  // (K-major, LBO 1024), and buffer 0's d 256 cg .. as P V's transposed B (LBO 128 = the next
  // 8 entries, SBO 1024 = the next 8 d)
  const u32 dq = desc_lo(smem + OFF_Q, 1024), dt = desc_lo(smem, 1024);
  const u32 dv = desc_lo(smem + cm(32 * cg, 0), 128);
  for (int u = u0; u < u1; ++u) {
    const int b = (u - u0) & 1;
    bar_sync(BAR_FULL + 2 * b + cg, 256);
#if PINGPONG
    // group 1 issues its logits after group 0's are done, so that one group's softmax runs
    // while the other's products use the tensor cores (a barrier per tile parity: group 0 is
    // never two tiles ahead, the producer waits for both groups to free a buffer)
    if (cg == 1) bar_sync(BAR_PP + (u & 1), 256);
#endif
    // S[64 heads, 64 entries]: n8 block j in s[4 j ..] (row r0: 0, 1; r0 + 8: 2, 3)
    float s[32];
#if ABL_NOQK
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
#else
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 32; ++kk)
      wgmma_n64(s, dq + cm(2 * kk, 0) / 16, dt + b * (SM_TILE / 16) + cm(2 * kk, 0) / 16, 128 >> 4,
                kk > 0);
    wg_commit();
    wg_wait0();
#endif
#if PINGPONG
    if (cg == 0) bar_arrive(BAR_PP + (u & 1), 256);
#endif
    float mx0 = ninf, mx1 = ninf;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int2 ok = *(const int2*)(okf + 64 * b + 8 * j + 2 * tq);
      s[4 * j] = ok.x ? s[4 * j] * sc : ninf;
      s[4 * j + 1] = ok.y ? s[4 * j + 1] * sc : ninf;
      s[4 * j + 2] = ok.x ? s[4 * j + 2] * sc : ninf;
      s[4 * j + 3] = ok.y ? s[4 * j + 3] * sc : ninf;
      mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    // P as the A operand of P V: k-step ks (entries 16 ks ..) is n8 blocks 2 ks and 2 ks + 1
    u32 pa[4][4];
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = exp2f(s[4 * j] - mn0), p1 = exp2f(s[4 * j + 1] - mn0);
      const float p2 = exp2f(s[4 * j + 2] - mn1), p3 = exp2f(s[4 * j + 3] - mn1);
      ps0 += p0 + p1;
      ps1 += p2 + p3;
      pa[j >> 1][2 * (j & 1)] = pack_bf16(p0, p1);
      pa[j >> 1][2 * (j & 1) + 1] = pack_bf16(p2, p3);
    }
    l0 = l0 * al0 + ps0;
    l1 = l1 * al1 + ps1;
    if (al0 != 1.f || al1 != 1.f) {
#pragma unroll
      for (int j = 0; j < 32; ++j) o[4 * j] *= al0, o[4 * j + 1] *= al0, o[4 * j + 2] *= al1, o[4 * j + 3] *= al1;
    }
#if !ABL_NOPV
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_n256_rs(o, pa[ks], dv + b * (SM_TILE / 16) + cm(0, 2 * ks) / 16, 1024 >> 4);
    wg_commit();
    wg_wait0();
#endif
    if (u - u0 + 2 < u1 - u0) bar_arrive(BAR_FREE + b, NTH);
  }

#if PDL
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // l over the quad's lanes (both groups hold the same m and l)
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, x);
    l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, x);
  }
  bar_sync(BAR_CONS, 256);  // both groups are done with the tiles and q
  const BlockOut ob = {part, lse, out, stride_ot, stride_oh, out_kind, H_all, H, num_splits, t,
                       split};
  float f0, f1;
  head_factors(ob, sink, has_sink, r0, r0 + 8, m0, m1, l0, l1, cg == 0 && tq == 0, f0, f1);
  // the rows through shared memory (the tiles and q are no longer read) in the stored order,
  // then stored whole in d order (consecutive threads: consecutive 16 B). Positions 0..7 of a
  // group of 8 d hold d 0 2 4 6 1 3 5 7 (PERM8).
  if (out_kind == 1 || out_kind == 3) {  // bf16 rows or partials: staged as bf16 pairs
    // The accumulator fragments are stored by stmatrix: per instruction the warp's 8 x 8 blocks
    // (rows 16 w .. + 7, + 8 .. + 15) x (groups j, j + 1); lane l gives row l % 8 of block l / 8.
    unsigned char* stage = smem;  // [64 heads][STAGE_ROW / 2 words] (a row: 512 d + 8 pad, bf16)
    {
      const int lane_row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), lane_j = lane >> 4;
      const u32 a0 = (u32)__cvta_generic_to_shared(stage + lane_row * (STAGE_ROW * 2)) +
                     2 * (256 * cg + 8 * lane_j);
#pragma unroll
      for (int j = 0; j < 32; j += 2) {
        const u32 r0w = pack_bf16(o[4 * j] * f0, o[4 * j + 1] * f0);
        const u32 r1w = pack_bf16(o[4 * j + 2] * f1, o[4 * j + 3] * f1);
        const u32 r2w = pack_bf16(o[4 * j + 4] * f0, o[4 * j + 5] * f0);
        const u32 r3w = pack_bf16(o[4 * j + 6] * f1, o[4 * j + 7] * f1);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                     ::"r"(a0 + 16 * j), "r"(r0w), "r"(r1w), "r"(r2w), "r"(r3w) : "memory");
      }
    }
    bar_sync(BAR_CONS, 256);
    u16* base = out_kind == 1 ? (u16*)out + t * stride_ot
                              : (u16*)part + ((long long)t * num_splits + split) * H_all * 512;
    const long long row = out_kind == 1 ? stride_oh : 512;
    // a group of 8 d a thread: the words (d 0 2), (4 6), (1 3), (5 7) give (d 0 1), (2 3),
    // (4 5), (6 7) by byte permutes; 16-byte stores where every row is on 16 bytes
    auto group = [&](int i) {
      const uint4 v = *(const uint4*)(stage + (i >> 6) * (STAGE_ROW * 2) + 16 * (i & 63));
      return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                        __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
    };
    if ((((unsigned long long)base & 15) | (row & 7)) == 0) {
#pragma unroll 4
      for (int i = tid; i < H * 64; i += 256)
        *(uint4*)(base + (i >> 6) * row + 8 * (i & 63)) = group(i);
    } else {
      for (int i = tid; i < H * 64; i += 256) {
        const uint4 w = group(i);
        u16* po = base + (i >> 6) * row + 8 * (i & 63);
        const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) po[2 * k] = (u16)(ws[k] & 0xFFFFu), po[2 * k + 1] = (u16)(ws[k] >> 16);
      }
    }
  } else {  // fp32 partials or rows: staged as floats (pairs of positions: one 8-byte store)
    float* stage = (float*)smem;  // [64 heads][STAGE_ROW]
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int pos = 256 * cg + 8 * j + 2 * tq;
      *(float2*)(stage + r0 * STAGE_ROW + pos) = make_float2(o[4 * j] * f0, o[4 * j + 1] * f0);
      *(float2*)(stage + (r0 + 8) * STAGE_ROW + pos) = make_float2(o[4 * j + 2] * f1, o[4 * j + 3] * f1);
    }
    bar_sync(BAR_CONS, 256);
    float* base = out_kind == 0 ? part + ((long long)t * num_splits + split) * H_all * 512
                                : (float*)out + t * stride_ot;
    const long long row = out_kind == 0 ? 512 : stride_oh;
    // 4 d a thread: positions 2 k, 2 k + 1 and 2 k + 4, 2 k + 5 of a group (k = 0, 1)
    for (int i = tid; i < H * 128; i += 256) {
      const int h = i >> 7, c4 = 4 * (i & 127), g8 = c4 & ~7, k = (c4 >> 2) & 1;
      const float2 a = *(const float2*)(stage + h * STAGE_ROW + g8 + 2 * k);
      const float2 b2 = *(const float2*)(stage + h * STAGE_ROW + g8 + 2 * k + 4);
      float* po = base + h * row + c4;
      if (((unsigned long long)po & 15) == 0) {
        *(float4*)po = make_float4(a.x, b2.x, a.y, b2.y);
      } else {
        po[0] = a.x, po[1] = b2.x, po[2] = a.y, po[3] = b2.y;
      }
    }
  }
}
