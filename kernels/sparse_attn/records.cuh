// Device helpers of the CUDA sparse-attention kernels (cuda_decode.cu, cuda_wg64.cu),
// inlined into them by cuda_jit.load_source: the records' dequantization (the
// inline-PTX formulas of triton_records.py: values x 2^-8, d permuted inside each group of 8 as
// 0 2 4 6 1 3 5 7), the exact path's three-part split, the PTX wrappers (mma.sync, movmatrix,
// cp.async), a token's entry tiles and split (EntryTiles), and the output of a block (partials
// with their log-sum-exps, or final rows with the sink).

#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

__device__ __forceinline__ u32 prmt(u32 a, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(a), "r"(sel));
  return d;
}

__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ float lo_f(u32 pr) { return __uint_as_float(pr << 16); }
__device__ __forceinline__ float hi_f(u32 pr) { return __uint_as_float(pr & 0xFFFF0000u); }

// (x0, x1) -> three bf16x2 words whose sums are x0 and x1 exactly (the exact path's split:
// each part is the bf16 rounding of what the previous ones left), largest first.
__device__ __forceinline__ void split3(float x0, float x1, u32* out) {
  out[0] = pack_bf16(x0, x1);
  const float r0 = x0 - lo_f(out[0]), r1 = x1 - hi_f(out[0]);
  out[1] = pack_bf16(r0, r1);
  out[2] = pack_bf16(r0 - lo_f(out[1]), r1 - hi_f(out[1]));
}

// bf16 pairs (m, m) of two FP4 groups' multipliers, e4m3 scale x 2^118 (exact), from the
// two scale bytes in the low half of `two` (the hardware e4m3 -> f16 conversion is exact).
__device__ __forceinline__ void fp4_mults(u32 two, u32& m_lo, u32& m_hi) {
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)two));
  float f0, f1;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f0) : "h"((u16)h2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f1) : "h"((u16)(h2 >> 16)));
  m_lo = prmt(__float_as_uint(f0 * 3.32306998946229e35f), 0x3232u);
  m_hi = prmt(__float_as_uint(f1 * 3.32306998946229e35f), 0x3232u);
}

// bf16 pair (m, m): a V41 group's multiplier 2^(s - 15); s above 142 gives inf.
__device__ __forceinline__ u32 v41_mult(u32 s) {
  u32 bits = ((s < 143u ? s : 143u) + 112u) << 7;
  return bits | (bits << 16);
}

// 8 e2m1 values (one word, even index in the low nibble) -> 4 bf16x2 words, positions
// 0..7 = d 0 2 4 6 1 3 5 7, times the multiplier pair mm.
__device__ __forceinline__ uint4 fp4_word(u32 r, u32 mm) {
  u32 x = prmt(r, 0x3120u);
  uint4 o;
  o.x = mul_bf16x2(((x << 12) & 0x80008000u) | ((x << 6) & 0x01C001C0u), mm);  // d 0, 2
  o.y = mul_bf16x2(((x << 4) & 0x80008000u) | ((x >> 2) & 0x01C001C0u), mm);   // d 4, 6
  o.z = mul_bf16x2(((x << 8) & 0x80008000u) | ((x << 2) & 0x01C001C0u), mm);   // d 1, 3
  o.w = mul_bf16x2((x & 0x80008000u) | ((x >> 6) & 0x01C001C0u), mm);          // d 5, 7
  return o;
}

__device__ __forceinline__ u32 e4m3_pair(u32 r, u32 sel, u32 mm) {
  u32 x = prmt(r, sel);  // the two bytes at bits 8..15 and 24..31
  return mul_bf16x2((x & 0x80008000u) | ((x >> 4) & 0x07F007F0u), mm);
}

// 8 e4m3 values (two words) -> 4 bf16x2 words in the same permuted order.
__device__ __forceinline__ uint4 e4m3_words(u32 w0, u32 w1, u32 mm) {
  uint4 o;
  o.x = e4m3_pair(w0, 0x2000u, mm);  // d 0, 2
  o.y = e4m3_pair(w1, 0x2000u, mm);  // d 4, 6
  o.z = e4m3_pair(w0, 0x3010u, mm);  // d 1, 3
  o.w = e4m3_pair(w1, 0x3010u, mm);  // d 5, 7
  return o;
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 8 x 8 bf16 matrix whose C / A fragment this lane holds (row lane / 4, columns 2 (lane % 4)
// and + 1), transposed: the same fragment of the transpose.
__device__ __forceinline__ u32 movtrans(u32 a) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

__device__ __forceinline__ void cp16(void* dst, const void* src, int n) {
  u32 a = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp4(void* dst, const void* src, int n) {
  u32 a = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(a), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }

__device__ __forceinline__ void cp8(void* dst, const void* src, int n) {
  u32 a = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(a), "l"(src), "r"(n));
}

// The parameters of every sparse-attention kernel, in the order cuda_decode.py's launcher passes
// them: q [T, H_all, 512] (bf16, fp32 with EXACT) and its strides; the SWA cache (V41 rows), the
// window slots [T, W] and their row stride; the main-KV cache (V41_FP4 rows if kv_fp4, else
// V41), the top-k slots [T, TOPK] and their row stride; the sink [H_all] (if has_sink); the
// partials and log-sum-exps (out_kind 0 fp32, 3 bf16) or the output rows (1 bf16, 2 fp32) with
// their strides; the splits per token and the logit scale times log2(e).
#define SPARSE_ATTN_PARAMS                                                                    \
  const void *__restrict__ q, long long stride_qt, long long stride_qh,                       \
      const u8 *__restrict__ swa, const int *__restrict__ swa_idx, long long stride_swt,      \
      const u8 *__restrict__ kv, const int *__restrict__ kv_idx, long long stride_kvt,        \
      int kv_fp4, const float *__restrict__ sink, int has_sink, float *__restrict__ part,     \
      float *__restrict__ lse, void *__restrict__ out, long long stride_ot,                   \
      long long stride_oh, int out_kind, int H_all, int W, int TOPK, int num_splits,          \
      float qk_scale

// A token's entry list cut in tiles of `te` entries, its SWA window (W slots) first, then its
// top-k list (TOPK), and this block's split of the tiles: every num_splits-th tile from tile
// `split` on (interleaved, so that each split holds its share of the window's tiles, which
// cost more than the top-k's FP4 ones), numbered u in [u0, u1) = [0, count) for the loops.
struct EntryTiles {
  const int* sw_row;  // the token's window slots [W]
  const int* kv_row;  // its top-k slots [TOPK]
  int W, TOPK, te, n_sw, first, step, u0, u1;

  // the token's tile index of this split's tile u
  __device__ __forceinline__ int tile(int u) const { return first + u * step; }
  // whether tile u is a window tile (V41 records of the SWA cache)
  __device__ __forceinline__ bool swa(int u) const { return tile(u) < n_sw; }

  // the slots of entries e0 + 16 k (k < N) of tile u: -1 beyond the segment or the split (and
  // the lists' own -1 padding); the tile's checks made once for the N
  template <int N>
  __device__ __forceinline__ void slots(int u, int e0, int* s) const {
    const int g = tile(u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      int v = -1;
      if (u < u1) {
        if (g < n_sw) {
          const int i = te * g + 16 * k + e0;
          v = i < W ? __ldg(sw_row + i) : -1;
        } else {
          const int i = te * (g - n_sw) + 16 * k + e0;
          v = i < TOPK ? __ldg(kv_row + i) : -1;
        }
      }
      s[k] = v;
    }
  }
  // the slot of entry e of tile u
  __device__ __forceinline__ int slot(int u, int e) const {
    int s;
    slots<1>(u, e, &s);
    return s;
  }
};

// token t's tiles of te entries and split `split` of num_splits (tiles split, split +
// num_splits, ...: the splits' counts differ by one at most)
__device__ __forceinline__ EntryTiles entry_tiles(const int* swa_idx, long long stride_swt,
                                                  const int* kv_idx, long long stride_kvt, int t,
                                                  int W, int TOPK, int te, int num_splits,
                                                  int split) {
  EntryTiles r;
  r.sw_row = swa_idx + (long long)t * stride_swt;
  r.kv_row = kv_idx + (long long)t * stride_kvt;
  r.W = W;
  r.TOPK = TOPK;
  r.te = te;
  r.n_sw = (W + te - 1) / te;
  const int n_tiles = r.n_sw + (TOPK + te - 1) / te;
  r.first = split;
  r.step = num_splits;
  r.u0 = 0;
  r.u1 = split < n_tiles ? (n_tiles - split + num_splits - 1) / num_splits : 0;
  return r;
}

// stored position -> d inside a group of 8 (the dequantization's order 0 2 4 6 1 3 5 7)
#define PERM8(p) ((((p) & 3) << 1) | ((p) >> 2))

// Where a block writes: out_kind 0 / 3 = partials part [T, NS, H_all, 512] (fp32 / bf16: bf16
// only from the wg64 kernel, for a bf16 output) and base-2 log-sum-exps lse [T, NS, H_all];
// 1 / 2 = the final rows of out (bf16 / fp32) with the sink. store_pair writes kinds 0-2. The
// pointers start at the block's first head (part_heads, out_heads); H of its heads exist.
struct BlockOut {
  float* part;
  float* lse;
  void* out;
  long long stride_ot, stride_oh;
  int out_kind, H_all, H, num_splits, t, split;
};

__device__ __forceinline__ bool partial_kind(int out_kind) { return out_kind == 0 || out_kind == 3; }

// part, or out's rows, from the block's first head hg0 on (kernel entry)
__device__ __forceinline__ float* part_heads(float* part, int out_kind, int hg0) {
  return out_kind == 3 ? (float*)((u16*)part + hg0 * 512) : part + hg0 * 512;
}
__device__ __forceinline__ void* out_heads(void* out, int out_kind, int hg0, long long stride_oh) {
  if (partial_kind(out_kind)) return out;
  return (unsigned char*)out + hg0 * stride_oh * (out_kind == 1 ? 2 : 4);
}

// The output factors of heads ha, hb from their softmax state (base-2 maxima m, sums l over
// the block's entries): with one split the softmax over the entries and the sink (sink [H],
// natural log units), else 1 / l, the partial's lse written by the lane lse_lane; times 2^8
// (the tiles hold the values x 2^-8).
__device__ __forceinline__ void head_factors(const BlockOut& o, const float* sink, int has_sink,
                                             int ha, int hb, float m_a, float m_b, float l_a,
                                             float l_b, bool lse_lane, float& f_a, float& f_b) {
  const float ninf = -__int_as_float(0x7F800000);
  if (partial_kind(o.out_kind)) {
    f_a = l_a > 0.f ? 1.f / l_a : 0.f;
    f_b = l_b > 0.f ? 1.f / l_b : 0.f;
    if (lse_lane) {
      float* pl = o.lse + ((long long)o.t * o.num_splits + o.split) * o.H_all;
      if (ha < o.H) pl[ha] = l_a > 0.f ? m_a + log2f(l_a) : ninf;
      if (hb < o.H) pl[hb] = l_b > 0.f ? m_b + log2f(l_b) : ninf;
    }
  } else {
    const float s_a = (has_sink && ha < o.H) ? sink[ha] * 1.4426950408889634f : ninf;
    const float s_b = (has_sink && hb < o.H) ? sink[hb] * 1.4426950408889634f : ninf;
    const float mf_a = fmaxf(m_a, s_a), mf_b = fmaxf(m_b, s_b);
    const float w_a = exp2f(m_a - mf_a), w_b = exp2f(m_b - mf_b);
    const float den_a = l_a * w_a + exp2f(s_a - mf_a), den_b = l_b * w_b + exp2f(s_b - mf_b);
    f_a = den_a > 0.f ? w_a / den_a : 0.f;
    f_b = den_b > 0.f ? w_b / den_b : 0.f;
  }
  f_a *= 256.0f;
  f_b *= 256.0f;
}

// Output values v0, v1 of heads h0, h1 at head-dim index d.
__device__ __forceinline__ void store_pair(const BlockOut& o, int d, int h0, int h1, float v0,
                                           float v1) {
  if (o.out_kind == 0) {
    float* po = o.part + ((long long)o.t * o.num_splits + o.split) * o.H_all * 512 + d;
    if (h0 < o.H) po[(long long)h0 * 512] = v0;
    if (h1 < o.H) po[(long long)h1 * 512] = v1;
  } else if (o.out_kind == 1) {
    u16* po = (u16*)o.out + (long long)o.t * o.stride_ot + d;
    const u32 pr = pack_bf16(v0, v1);
    if (h0 < o.H) po[(long long)h0 * o.stride_oh] = (u16)(pr & 0xFFFFu);
    if (h1 < o.H) po[(long long)h1 * o.stride_oh] = (u16)(pr >> 16);
  } else {
    float* po = (float*)o.out + (long long)o.t * o.stride_ot + d;
    if (h0 < o.H) po[(long long)h0 * o.stride_oh] = v0;
    if (h1 < o.H) po[(long long)h1 * o.stride_oh] = v1;
  }
}
