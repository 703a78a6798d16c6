// Device helpers of the CUDA sparse-attention kernel (cuda_decode.cu), inlined
// into it by cuda_jit.load_source: the records' dequantization (the inline-PTX formulas of
// triton_records.py: values x 2^-8, d permuted inside each group of 8 as 0 2 4 6 1 3 5 7), the
// exact path's three-part split, and the PTX wrappers (mma.sync, movmatrix, cp.async).

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
