// ptx.cuh — the only file with inline PTX. The first part is plain sm_80 PTX (the same
// code compiles for sm_80, sm_90a and sm_120a); the MMAs and loads there are not
// `volatile`: each is a pure function of its operands (the loads read weights that no
// kernel writes), so the compiler may schedule them like ordinary arithmetic. The second
// part (wgmma, mbarriers, setmaxnreg) exists only for sm_90a, the prefill path's target.
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

/// 8-byte read-only load into `v` when `pred` holds; otherwise `v` keeps its value. The
/// load is predicated, not branched around and selected: `v = 0; if (p) v = __ldg(..)`
/// compiles to a load into a temporary and a predicated move right after it, which waits
/// for the load there instead of where `v` is used.
__device__ __forceinline__ void ldg_nc_u2_if(bool pred, const void* p, uint2& v) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n"
      "@q ld.global.nc.v2.u32 {%0, %1}, [%3];\n}\n"
      : "+r"(v.x), "+r"(v.y)
      : "r"(static_cast<uint32_t>(pred)), "l"(p));
}

/// ldg_nc_u2_if (kCoherent false), or the same through a plain global load (kCoherent):
/// for data another kernel may still be writing while this one runs (GEMM2's intermediate
/// under the expert-ready counters). The read-only path is not coherent with writes made
/// during the kernel's lifetime; a plain load after an acquire sees them.
template <bool kCoherent>
__device__ __forceinline__ void ldg_u2_if(bool pred, const void* p, uint2& v) {
  if constexpr (kCoherent) {
    asm volatile(
        "{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n"
        "@q ld.global.v2.u32 {%0, %1}, [%3];\n}\n"
        : "+r"(v.x), "+r"(v.y)
        : "r"(static_cast<uint32_t>(pred)), "l"(p));
  } else {
    ldg_nc_u2_if(pred, p, v);
  }
}

/// 16-byte read-only load into v[0..3] when `pred` holds (else they keep their values),
/// predicated like ldg_nc_u2_if, so no move right after it waits for the load.
__device__ __forceinline__ void ldg_nc_u4_if(bool pred, const void* p, uint32_t (&v)[4]) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %4, 0;\n"
      "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%5];\n}\n"
      : "+r"(v[0]), "+r"(v[1]), "+r"(v[2]), "+r"(v[3])
      : "r"(static_cast<uint32_t>(pred)), "l"(p));
}

/// 16-byte asynchronous global -> shared copy (cp.async, L2 only: the weights are
/// streamed once). It holds no registers while in flight, so a warp can keep many
/// chunks of weights in flight at a small register footprint.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
/// cp_async_16 to a shared-memory address already in the shared window (the `cvta` done
/// once per warp instead of once per copy), both addresses plus byte offsets that the
/// instruction encodes (no address arithmetic per copy).
template <uint32_t kDstOffset, uint32_t kSrcOffset>
__device__ __forceinline__ void cp_async_16_at(uint32_t smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(smem_dst), "l"(gmem_src),
               "n"(kDstOffset), "n"(kSrcOffset)
               : "memory");
}
/// Starts moving the 128-byte line holding `p` into L2 (no registers, no completion): a
/// later load of it then waits for L2, not for HBM.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
/// Closes the calling thread's current group of cp.async copies (possibly empty).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most `kPending` of the calling thread's most recent groups are still in
/// flight; the copies of older groups are then visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// cp_async_16 that copies `src_bytes` (0 or 16) bytes and zero-fills the rest: rows past
/// a tile's end land as zeros without a branch around the copy.
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, uint32_t src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

/// Programmatic dependent launch (sm_90 and later; no-ops before, and for a grid that was
/// not launched as a programmatic dependent). A dependent grid may start while the
/// stream's previous kernel still runs: it must wait here before it reads what that
/// kernel writes (or writes what it reads); the wait returns once the previous grid has
/// completed and its memory is visible.
__device__ __forceinline__ void pdl_wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/// Lets the stream's next kernel, if launched as a programmatic dependent, start its
/// blocks once every block of this grid has called this or exited (they still wait for
/// this grid's completion before reading its results).
__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// atomicAdd with acquire-release semantics at GPU scope. Release: the caller's earlier
/// writes, and those a barrier ordered before this thread (bar.sync, bar.warp.sync), are
/// visible to whoever acquires the new value. Acquire: the caller's later reads, and a
/// barrier's other threads' after it, see what the earlier adders released. Why not
/// __threadfence around a plain atomicAdd, in every thread: that fence is sequentially
/// consistent (MEMBAR.SC.GPU) and took two per thread; this one compiles to one
/// MEMBAR.ALL.GPU before the atomic, in one thread (session 28: -0.3..-0.8% at M=1..128).
__device__ __forceinline__ uint32_t atomic_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

/// red.add with release semantics at GPU scope (no value returned): the caller's earlier
/// writes, and those a barrier ordered before this thread, are visible to whoever
/// acquires a value at least this sum (ld_acquire_gpu).
__device__ __forceinline__ void red_add_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
/// Load with acquire semantics at GPU scope: the caller's later reads, and a barrier's
/// other threads' after it, see what was released up to the value read.
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Named barrier over `threads` threads (a multiple of 32) of the block; id 0 is
/// __syncthreads' barrier.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// threadIdx.x and blockIdx.z read at this point. A volatile read is neither hoisted out
/// of a loop nor merged with an earlier one, so a value derived from it (a row index, a
/// split) is formed where it is used instead of kept live, and spilled, across a mainloop
/// (the decode kernels' register budgets; PERFORMANCE.md session 58).
__device__ __forceinline__ int thread_index_here() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}
__device__ __forceinline__ int block_index_z_here() {
  int z;
  asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(z));
  return z;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MXMOE_SM90A 1

// ---------------------------------------------------------------- mbarriers (sm_90)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
/// mbar_arrive on a barrier's 32-bit shared address.
__device__ __forceinline__ void mbar_arrive_at(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive_at(smem_addr(bar)); }
/// Spins until the phase with parity `parity` of `bar` has completed. The loop is in the
/// asm, so that each retry is the try_wait and its branch: with the loop in C++, ptxas
/// recomputed the barrier's shared address (7 uniform instructions) on every retry, and
/// the FP8 GEMM1's consumers spent 17% of all the kernel's issued instructions retrying
/// (ncu, session 38). `bar`: the barrier's 32-bit shared address (mbar_wait: its pointer).
__device__ __forceinline__ void mbar_wait_at(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "mxmoe_mbar_retry:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra mxmoe_mbar_retry;\n}\n"
      :
      : "r"(bar), "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait_at(smem_addr(bar), parity); }
/// Shared-memory loads from a 32-bit shared address, ordered after earlier volatile asm
/// (barrier waits) like the memory accesses they stand for.
__device__ __forceinline__ uint4 lds_u4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
/// Orders generic-proxy shared-memory writes (cp.async copies), observed through a
/// barrier wait just before, ahead of this thread's later async-proxy reads (wgmma
/// operands from shared memory).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/// An arrival on `bar`, made once every cp.async copy this thread has issued so far has
/// landed; the thread goes on at once. `.noinc`: the arrival is one of the barrier's
/// expected ones (the plain form would add one to the count first). The copies are
/// generic-proxy writes: a reader through the async proxy (wgmma) fences after its wait.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/// Makes mbarrier initializations visible to the async proxy (bulk copies) before use.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// Arms the current phase of the barrier at shared address `bar` with `bytes` of
/// asynchronous copies to wait for and arrives (one of the barrier's expected arrivals).
__device__ __forceinline__ void mbar_arrive_expect_tx_at(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/// A bulk copy of `bytes` (a multiple of 16, both addresses 16-aligned) that completes on
/// the barrier at `bar`, whose phase must be armed for these bytes
/// (mbar_arrive_expect_tx_at). Both as 32-bit shared addresses.
__device__ __forceinline__ void bulk_copy_g2s_tx_at(uint32_t smem_dst, const void* gmem_src, uint32_t bytes,
                                                    uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_dst),
               "l"(gmem_src), "r"(bytes), "r"(bar)
               : "memory");
}
/// One bulk copy (the TMA engine, one instruction, no per-lane addresses) of `bytes`
/// (a multiple of 16) from global memory to shared memory, completing on `bar`, whose
/// phase this thread's arrival also arms with the byte count. Measured in
/// bench/stream_probe.cu against the per-lane cp.async ring: no faster (session 9).
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                              uint64_t* bar) {
  mbar_arrive_expect_tx_at(smem_addr(bar), bytes);
  bulk_copy_g2s_tx_at(smem_addr(smem_dst), gmem_src, bytes, smem_addr(bar));
}
/// The TMA engine's copy of the box at element coordinates (x, y) of the 2-D tensor map
/// `map` (a kernel parameter or global memory) to shared memory, completing on `bar`.
/// With a swizzled map the swizzle follows the shared address bits, so a box placed at
/// its row's offset inside a 1024-aligned tile lands as the whole tile would. The
/// destination and the barrier as 32-bit shared addresses.
__device__ __forceinline__ void tma_load_2d_at(uint32_t smem_dst, const void* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// ---------------------------------------------------------------- register budget
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------- wgmma (sm_90a)
/// Pins the accumulators here: a volatile asm that reads and rewrites them, so the
/// compiler cannot move their uses above an earlier wgmma_wait (wgmma writes them
/// asynchronously, which the compiler does not know).
template <int kN>
__device__ __forceinline__ void acc_fence(float (&acc)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) asm volatile("" : "+f"(acc[j])::"memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/// Shared-memory matrix descriptor of a K-major BF16 operand stored in 128-byte swizzled
/// rows (8-row atoms of 1024 bytes, atoms 1024 bytes apart; the tile base 1024-aligned):
/// start address, leading offset 1 (unused by this layout), stride offset 1024, swizzle
/// mode 1 (128B). A k16 step inside the 64-element row moves the start by 32 bytes.
/// `addr`: the tile's 32-bit shared address (smem_desc_k128: its pointer).
__device__ __forceinline__ uint64_t smem_desc_k128_at(uint32_t addr) {
  return ((uint64_t{addr} & 0x3FFFFull) >> 4) | (1ull << 16) | (uint64_t{1024 >> 4} << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t smem_desc_k128(const void* p) { return smem_desc_k128_at(smem_addr(p)); }

// The fp32 accumulator operands of an m64nN wgmma (N = 32, 64, 96, 128: N / 2 registers),
// read and written ("+f") in the order of the D layout below: the register list of the
// instruction (%0 .. %(N/2 - 1), first in the operand list) and the matching constraints,
// built from 16-register pieces so that every wgmma wrapper shares them.
#define MXMOE_WGMMA_R0_15 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MXMOE_WGMMA_R16_31 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MXMOE_WGMMA_R32_47 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define MXMOE_WGMMA_R48_63 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MXMOE_WGMMA_ACC16_REGS "{" MXMOE_WGMMA_R0_15 "}, "
#define MXMOE_WGMMA_ACC32_REGS "{" MXMOE_WGMMA_R0_15 ", " MXMOE_WGMMA_R16_31 "}, "
#define MXMOE_WGMMA_ACC48_REGS "{" MXMOE_WGMMA_R0_15 ", " MXMOE_WGMMA_R16_31 ", " MXMOE_WGMMA_R32_47 "}, "
#define MXMOE_WGMMA_ACC64_REGS \
  "{" MXMOE_WGMMA_R0_15 ", " MXMOE_WGMMA_R16_31 ", " MXMOE_WGMMA_R32_47 ", " MXMOE_WGMMA_R48_63 "}, "
#define MXMOE_WGMMA_F8(d, o)                                                                \
  "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]),           \
      "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7])
#define MXMOE_WGMMA_ACC16(d) MXMOE_WGMMA_F8(d, 0), MXMOE_WGMMA_F8(d, 8)
#define MXMOE_WGMMA_ACC32(d) MXMOE_WGMMA_ACC16(d), MXMOE_WGMMA_F8(d, 16), MXMOE_WGMMA_F8(d, 24)
#define MXMOE_WGMMA_ACC48(d) MXMOE_WGMMA_ACC32(d), MXMOE_WGMMA_F8(d, 32), MXMOE_WGMMA_F8(d, 40)
#define MXMOE_WGMMA_ACC64(d)                                                                \
  MXMOE_WGMMA_ACC32(d), MXMOE_WGMMA_F8(d, 32), MXMOE_WGMMA_F8(d, 40), MXMOE_WGMMA_F8(d, 48), \
      MXMOE_WGMMA_F8(d, 56)

/// D[64 x 128] += A[64 x 16] * B[16 x 128], A bf16 in registers (each warp of the
/// warpgroup holds 16 rows in the mma.m16n8k16 A layout), B bf16 in shared memory
/// (descriptor, K-major), fp32 accumulators in the wgmma D layout:
///   warp w, lane (g, t): d[4j + 2h + c] = D(16w + g + 8h, 8j + 2t + c).
/// Asynchronous: a, d and the shared tile must stay untouched until wgmma_wait.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC64_REGS
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)
      : "memory");
}
/// The same for 32, 64 and 96 tokens (the prefill path's smaller token tiles): D[64 x N] with
/// N / 2 accumulators per thread, in the layout above (j < N / 8).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC32_REGS
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)
      : "memory");
}
/// 96 tokens (where the busier experts hold 65-96 rows, or 129-192: heuristics.h prefill_token_tile).
__device__ __forceinline__ void wgmma_m64n96k16_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC48_REGS
      "{%48, %49, %50, %51}, %52, p, 1, 1, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC48(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)
      : "memory");
}
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC16_REGS
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)
      : "memory");
}
// The 128 accumulators of an m64n256 wgmma (wgmma_m64n256k16_rs; used by the
// bench/wgmma_probe.cu shapes).
#define MXMOE_WGMMA_R64_79 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define MXMOE_WGMMA_R80_95 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MXMOE_WGMMA_R96_111 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define MXMOE_WGMMA_R112_127 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MXMOE_WGMMA_ACC128_REGS                                                                      \
  "{" MXMOE_WGMMA_R0_15 ", " MXMOE_WGMMA_R16_31 ", " MXMOE_WGMMA_R32_47 ", " MXMOE_WGMMA_R48_63 ", " \
  MXMOE_WGMMA_R64_79 ", " MXMOE_WGMMA_R80_95 ", " MXMOE_WGMMA_R96_111 ", " MXMOE_WGMMA_R112_127 "}, "
#define MXMOE_WGMMA_ACC128(d)                                                                   \
  MXMOE_WGMMA_ACC64(d), MXMOE_WGMMA_F8(d, 64), MXMOE_WGMMA_F8(d, 72), MXMOE_WGMMA_F8(d, 80),   \
      MXMOE_WGMMA_F8(d, 88), MXMOE_WGMMA_F8(d, 96), MXMOE_WGMMA_F8(d, 104), MXMOE_WGMMA_F8(d, 112), \
      MXMOE_WGMMA_F8(d, 120)
/// D[64 x 256] += A[64 x 16] * B[16 x 256]: wgmma_m64n128k16_rs with 256 tokens (128
/// accumulators per thread, j < 32 in the D layout above).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC128_REGS
      "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)
      : "memory");
}
/// D[64 x 128] += A[64 x 16] * B[16 x 128], both BF16 in shared memory (descriptors,
/// K-major), accumulators as in wgmma_m64n128k16_rs (bench/wgmma_probe.cu's SS shape).
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      MXMOE_WGMMA_ACC64_REGS
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : MXMOE_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(1)
      : "memory");
}
/// wgmma_m64n{32,64,96,128}k16_rs by the accumulator count.
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  wgmma_m64n32k16_rs(d, a, b);
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  wgmma_m64n64k16_rs(d, a, b);
}
__device__ __forceinline__ void wgmma_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t b) {
  wgmma_m64n96k16_rs(d, a, b);
}
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  wgmma_m64n128k16_rs(d, a, b);
}
/// D[64 x 128] (+)= A[64 x 32] * B[32 x 128], both E4M3 in shared memory (descriptors,
/// K-major: FP8 wgmma has no transposed form), fp32 accumulators in the layout of
/// wgmma_m64n128k16_rs. `accumulate` 0 overwrites D (the first K step of a group).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                         int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      MXMOE_WGMMA_ACC64_REGS
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : MXMOE_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate)
      : "memory");
}
/// D[64 x 64] (+)= A[64 x 32] * B[32 x 64], E4M3 as above: 32 accumulators, j < 8 in that
/// layout (bench/f8_consumer_probe.cu's narrow shape; the branch s47-narrow's narrow tiles).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      MXMOE_WGMMA_ACC32_REGS
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : MXMOE_WGMMA_ACC32(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate)
      : "memory");
}
#endif  // sm_90a

}  // namespace mxmoe::cuda_detail
