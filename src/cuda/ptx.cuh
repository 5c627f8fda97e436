// ptx.cuh — the only file with inline PTX. Every wrapper here is plain sm_80 PTX, so
// the same code compiles for sm_80, sm_90a and sm_120a. None is `volatile`: each is a
// pure function of its operands (the loads read weights that no kernel writes), so the
// compiler may schedule them like ordinary arithmetic.
#pragma once

#include <cstdint>

namespace mxmoe::cuda_detail {

/// D = A*B + C with A 16x16 bf16 (row), B 16x8 bf16 (col), C/D 16x8 fp32.
/// Fragment ownership (lane = 4*g + t):
///   a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..)
///   b0:(k 2t..2t+1, n g) b1:(k 2t+8.., n g)
///   c0,c1:(g, 2t..2t+1) c2,c3:(g+8, 2t..2t+1)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// D = A*B + C with A 16x16 f16 (row), B 16x8 f16 (col), C/D 16x8 fp32; same fragment
/// ownership as the BF16 form.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4],
                                              uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// 16-byte global load that bypasses L1 allocation: weights are streamed once per
/// tile and would only evict the activations that every warp of the block re-reads.
__device__ __forceinline__ uint4 ldg_stream_u4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// 16-byte asynchronous global -> shared copy (cp.async, L2 only: the weights are
/// streamed once). It holds no registers while in flight, so a warp can keep many
/// chunks of weights in flight at a small register footprint.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
/// Closes the calling thread's current group of cp.async copies (possibly empty).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most `kPending` of the calling thread's most recent groups are still in
/// flight; the copies of older groups are then visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace mxmoe::cuda_detail
