// Warpgroup helpers of the wgmma kernels (cuda_wgmma.cu, cuda_wg64.cu), inlined into them by
// cuda_jit.load_source: named barriers, the generic-to-async proxy fence, wgmma's fence / commit
// / wait, and the byte offset of a core matrix in the no-swizzle tiles both kernels lay out.

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
