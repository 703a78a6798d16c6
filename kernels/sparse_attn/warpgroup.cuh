// Warpgroup helpers of the wgmma kernel (cuda_wg64.cu), inlined into it by
// cuda_jit.load_source: named barriers, the generic-to-async proxy fence, wgmma's fence / commit
// / wait, the byte offset of a core matrix in the no-swizzle tiles it lays out, and mbarriers
// with bulk copies from global memory.

#pragma once

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
// shared-memory writes of this thread become visible to the async proxy (wgmma operands)
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}

// byte offset of core matrix (kb, mb) (8 rows x 16 B) of an operand 8 core matrices wide in its
// M / N direction: K block kb (e.g. 8 d), M / N block mb (e.g. 8 entries or 8 heads)
__device__ __forceinline__ int cm(int kb, int mb) { return (kb * 8 + mb) * 128; }

// mbarriers and bulk copies (the TMA unit) from global to shared memory: init with `count`
// arrivals, one arrival announcing `bytes` of copies, a copy completing its bytes on the
// barrier, and the wait for phase `parity` to complete
__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n\tfence.mbarrier_init.release.cluster;\n\t"
               "fence.proxy.async.shared::cta;"
               ::"r"((u32)__cvta_generic_to_shared(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"((u32)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, u32 bytes,
                                         unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes),
      "r"((u32)__cvta_generic_to_shared(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, u32 parity) {
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done) : "r"((u32)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
  }
}
