// wgmma_probe.cu — how fast can the prefill mainloop's consumer shape drive the tensor
// cores, with no producer and no epilogue? The prefill GEMMs (wgmma_mx.cuh) keep the
// tensor pipe ~60-70% busy at M=4096, and a session-10 diagnostic whose producer copied
// nothing stayed at ~63%: the consumer loop alone caps them. This probe runs that loop
// (2 consumer warpgroups per SM, per 64-K chunk a wait, the weight decode, then one
// group of wgmmas on a shared B tile) in variants that take one thing away or change the
// shape, so each one's cost is measured apart:
//   rs128       today's shape: 2 accumulators of m64 x n128, A in registers, fixed A
//   rs128-dec   the same with today's decode of 8 FP4 words per chunk from shared memory
//   ss128-nowait  ss128 with a group left in flight at each wait (the tensor pipe's own rate)
//   ss128       A from shared memory (8 KB per accumulator), no decode
//   rs256       1 accumulator of m64 x n256 (CTA tile 128 rows x 256 tokens), fixed A
//   rs256-dec   the same with the decode (4 words per chunk: half today's per FLOP)
//
// Build (development machine) and run (H200):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda -Iinclude \
//        bench/wgmma_probe.cu -o build-gpu/wgmma_probe
//   build-gpu/wgmma_probe
// Prints one line per variant: median us over 9 runs, TFLOP/s and the fraction of the
// measured BF16 peak (792 TFLOP/s, ../shared/H200.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"
#include "ptx.cuh"
#include "wgmma_mx.cuh"  // pf_chunk_frags, pf_chunk_mma: the mainloop's decode and MMAs

namespace {
using namespace mxmoe::cuda_detail;

enum Variant { kRs128, kRs128Dec, kSs128NoWait, kSs128, kRs256, kRs256Dec };
constexpr const char* kNames[] = {"rs128", "rs128-dec", "ss128-nowait", "ss128", "rs256", "rs256-dec"};
constexpr int kChunks = 2048;       // 64-K chunks per CTA
constexpr int kSmemB = 256 * 128;   // 256 token rows x 64 bf16, 128-byte swizzled rows
constexpr int kSmemA = 4 * 64 * 128;  // 4 A tiles of 64 rows x 64 bf16 (ss128)
constexpr int kSmemW = 256 * 32 + 256 * 4;  // 2 uint4 weight words + a scale word per thread
constexpr int kSmemBytes = 1024 + kSmemB + kSmemA + kSmemW;

/// FLOPs of one CTA's run: per chunk each of the 2 warpgroups multiplies 64 x 256 weight
/// row-token pairs over 64 K (n128: 2 m64 tiles x 128 tokens; n256: one m64 x 256).
constexpr double kFlopsPerCta = kChunks * 2 * (2.0 * 64 * 256 * 64);

template <int kVar>
__global__ void __launch_bounds__(384, 1) probe_kernel(float* out) {
#if defined(MXMOE_SM90A)  // the device pass for sm_90a (ptx.cuh)
  extern __shared__ __align__(1024) uint8_t dyn[];
  uint8_t* base = dyn + ((1024u - (smem_addr(dyn) & 1023u)) & 1023u);
  uint8_t* sb = base;
  uint8_t* sa = base + kSmemB;
  uint8_t* sw = sa + kSmemA;
  // Small finite values everywhere (bf16 0x3C00 = 2^-7 and its neighbours; FP4 codes 1..7).
  for (int i = threadIdx.x; i < (kSmemB + kSmemA) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(base)[i] = 0x3C003C00u + (i & 0x00070007u);
  for (int i = threadIdx.x; i < kSmemW / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sw)[i] = (i & 1) ? 0x76767676u : 0x34123412u;
  __syncthreads();
  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0) {
    setmaxnreg_dec<56>();
    return;
  }
  setmaxnreg_inc<224>();
  const int i = threadIdx.x - 128;
  const uint64_t desc_b = smem_desc_k128(sb);
  const uint4* words = reinterpret_cast<const uint4*>(sw) + 2 * i;
  const uint32_t* scales = reinterpret_cast<const uint32_t*>(sw + 256 * 32) + i;
  float sum = 0.0f;
  if constexpr (kVar == kRs256 || kVar == kRs256Dec) {
    float acc[128];
#pragma unroll
    for (int j = 0; j < 128; ++j) acc[j] = 0.0f;
    uint32_t fa[2][2][4];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) fa[b][k][r] = 0x3C003C00u + r + k + b + i;
    for (int kc = 0; kc < kChunks; ++kc) {
      const uint4 w = words[0];
      const uint32_t s = *scales;
      wgmma_wait<0>();
      if constexpr (kVar == kRs256Dec) {
        __nv_bfloat162 e, o;  // as pf_chunk_frags: rows g (even bytes) and g + 8, block k in lane k
        bf16_scale_pairs(s, e, o);
        pf_a_frags(w.x, w.y, __low2bfloat162(e), __low2bfloat162(o), fa[0]);
        pf_a_frags(w.z, w.w, __high2bfloat162(e), __high2bfloat162(o), fa[1]);
      }
      wgmma_fence();
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int k = 0; k < 2; ++k)
          wgmma_m64n256k16_rs(acc, fa[b][k], desc_b + static_cast<uint64_t>(((2 * b + k) * 32) >> 4));
      wgmma_commit();
    }
    wgmma_wait<0>();
    acc_fence(acc);
#pragma unroll
    for (int j = 0; j < 128; ++j) sum += acc[j];
  } else {
    float acc_a[64], acc_b[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc_a[j] = acc_b[j] = 0.0f;
    uint32_t fa[2][2][4], fb[2][2][4];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          fa[b][k][r] = 0x3C003C00u + r + k + b + i;
          fb[b][k][r] = 0x3C003C01u + r + k + b + i;
        }
    const int wgi = wg - 1;
    const uint64_t desc_a0 = smem_desc_k128(sa + (2 * wgi) * 64 * 128);
    const uint64_t desc_a1 = smem_desc_k128(sa + (2 * wgi + 1) * 64 * 128);
    for (int kc = 0; kc < kChunks; ++kc) {
      const uint4 wa = words[0], wb = words[1];
      const uint32_t s = *scales;
      if constexpr (kVar == kSs128NoWait) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      if constexpr (kVar == kRs128Dec) {
        pf_chunk_frags(wa, s, wb, s >> 4, fa, fb);
      }
      wgmma_fence();
      if constexpr (kVar == kSs128 || kVar == kSs128NoWait) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // 4 k16 steps, 32 bytes apart in both tiles
          wgmma_m64n128k16_ss(acc_a, desc_a0 + 2 * k, desc_b + 2 * k);
          wgmma_m64n128k16_ss(acc_b, desc_a1 + 2 * k, desc_b + 2 * k);
        }
      } else {
        pf_chunk_mma(acc_a, acc_b, fa, fb, desc_b);
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    acc_fence(acc_a);
    acc_fence(acc_b);
#pragma unroll
    for (int j = 0; j < 64; ++j) sum += acc_a[j] + acc_b[j];
  }
  out[blockIdx.x * 256 + i] = sum;
#endif
}

template <int kVar>
void run(float* out, int sms) {
  CHECK(cudaFuncSetAttribute(probe_kernel<kVar>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const double us = median_us([&] { probe_kernel<kVar><<<sms, 384, kSmemBytes>>>(out); });
  const double tflops = kFlopsPerCta * sms / (us * 1e-6) / 1e12;
  std::printf("%-14s %9.1f us %7.1f TFLOP/s %5.1f%% of 792\n", kNames[kVar], us, tflops, 100.0 * tflops / 792.0);
}

}  // namespace

int main() {
  return probe_main([](float* out, int sms) {
    run<kRs128>(out, sms);
    run<kRs128Dec>(out, sms);
    run<kSs128NoWait>(out, sms);
    run<kSs128>(out, sms);
    run<kRs256>(out, sms);
    run<kRs256Dec>(out, sms);
  });
}
