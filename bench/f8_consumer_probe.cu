// f8_consumer_probe.cu — how fast can the FP8 mode's consumer loop (wgmma_fp8.cuh
// f8_mainloop) drive the tensor cores with no producer, no drain and no epilogue? The FP8
// GEMM1 runs at ~61% of the 1448 TFLOP/s FP8 peak alone (PERFORMANCE.md, session 40),
// ~42% of the data sheet's rate per cycle, while neither shared memory nor issue slots
// seem to bind it (session 46). This probe runs the consumers' per-group work on operands
// that stay in shared memory, in variants that take one thing away, so that what the loop
// itself can reach is measured apart from the feeding:
//   full          today's loop: per 128-K group 4 wgmma m64n128k32 (both operands in
//                 shared memory) into a scratch accumulator, commit, 2 scale loads, wait,
//                 64 FFMA of promotion
//   no-promote    the same without the promotion (the wait stays)
//   no-wait       the wgmmas accumulate across groups, a wait<1> per group: the tensor
//                 pipe's own rate for this shape and operand traffic
//   narrow        the narrow tiles' loop (branch s47-narrow's F8Part): 4 m64n64k32 per
//                 group on half the weight rows each, 32 FFMA
//   full+drain    full, with the fourth warpgroup issuing about as many instructions per
//                 group as GEMM1's drain does at M=4096 (~175 per warp: 0.49 G warp
//                 instructions over 25,296 tiles of 28 groups, 4 warps; ncu, session 47),
//                 as independent FFMA chains run straight through (the real drain's come
//                 a tile at a time): does the drain's share of the issue slots leave the
//                 tensor cores idle while the consumers promote? Straight through, the
//                 chains take about the issue slots of a quarter of the run and none after.
//   drain-1chain  as full+drain, but the drain's instructions as one dependent FFMA
//                 chain (one issue per FFMA latency, ~4 cycles), meant to spread them over
//                 the run at ~25% of each scheduler's issue slots. Measured, the chain alone
//                 needs about the consumers' whole run (~1.2 M cycles), so the kernel's
//                 time becomes the chain's: a bound on nothing useful (session 48)
//   drain-2chain  the same as two chains (~50% of the issue slots while they last)
// Two consumer warpgroups per SM (and an idle producer and drain warpgroup, as GEMM1's
// CTA of 512 threads with its register split).
//
// Build (development machine) and run (H200):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda -Iinclude \
//        bench/f8_consumer_probe.cu -o build-gpu/f8_consumer_probe
//   build-gpu/f8_consumer_probe
// Prints one line per variant: median us over 9 runs, TFLOP/s and the fraction of the
// measured FP8 peak (1448 TFLOP/s, ../shared/H200.md).
// Measured (session 47, an H100; PERFORMANCE.md): full 1896-1918 TFLOP/s, ~96% of the data
// sheet's FP8 rate: the loop itself is not what holds the FP8 GEMMs. Session 48 (H200):
// full 1906 / 1780 (two rounds), full+drain 1445 / 1338: a busy fourth warp costs the
// consumers ~25%; but the real GEMM2, with no drain, runs at GEMM1's rate per FLOP.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "probe_check.h"
#include "ptx.cuh"

namespace {
using namespace mxmoe::cuda_detail;

enum Variant { kFull, kNoPromote, kNoWait, kNarrow, kFullDrain, kDrain1Chain, kDrain2Chain };
constexpr const char* kNames[] = {"full", "no-promote", "no-wait", "narrow", "full+drain", "drain-1chain", "drain-2chain"};
__host__ __device__ constexpr bool has_drain(int var) { return var == kFullDrain || var == kDrain1Chain || var == kDrain2Chain; }
/// Independent FFMA chains of the drain variants.
__host__ __device__ constexpr int drain_chains(int var) { return var == kDrain1Chain ? 1 : var == kDrain2Chain ? 2 : 8; }
/// The drain variants: FFMA rounds per group of the fourth warpgroup, 8 FFMA a round (144
/// per warp and group; with the loop unrolled 8 times and its ~3 instructions, ~151 for 8
/// chains and ~198 for one, against the real drain's ~175).
constexpr int kDrainRoundsPerGroup = 18;
constexpr int kGroups = 2048;                  // 128-K groups per CTA
constexpr int kSmemW = 128 * 128;              // 128 weight rows x 128 E4M3, 128-byte swizzled
constexpr int kSmemX = 128 * 128;              // 128 token rows x 128 E4M3
constexpr int kSmemS = 2 * 128 * 4;            // token and weight scales
constexpr int kSmemBytes = 1024 + kSmemW + kSmemX + kSmemS;

/// FLOPs of one CTA's run: per group 128 tokens x 128 weight rows x 128 K (full), or 64
/// tokens x 128 rows (narrow: the tile's real work).
constexpr double flops_per_cta(int var) { return kGroups * 2.0 * (var == kNarrow ? 64 : 128) * 128 * 128; }

template <int kVar>
__global__ void __launch_bounds__(512, 1) probe_kernel(float* out) {
#if defined(MXMOE_SM90A)  // the device pass for sm_90a (ptx.cuh)
  extern __shared__ __align__(1024) uint8_t dyn[];
  uint8_t* base = dyn + ((1024u - (smem_addr(dyn) & 1023u)) & 1023u);
  uint8_t* sw = base;
  uint8_t* sx = base + kSmemW;
  float* sc = reinterpret_cast<float*>(sx + kSmemX);
  // Small finite E4M3 codes everywhere (0x30..0x37: 0.5 .. 0.9375) and scales near 1.
  for (int i = threadIdx.x; i < (kSmemW + kSmemX) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(base)[i] = 0x30303030u + (i & 0x07070707u);
  for (int i = threadIdx.x; i < 256; i += blockDim.x) sc[i] = 1.0f + 0x1p-10f * (i & 7);
  __syncthreads();
  const int wg = static_cast<int>(threadIdx.x) / 128;
  if (wg == 0 || wg == 3) {  // the producer's and the drain's registers, as F8Cta<true>
    setmaxnreg_dec<72>();
    if (has_drain(kVar) && wg == 3) {
      // The same FFMA count (8 per round) in every drain variant, as drain_chains chains.
      constexpr int kChains = drain_chains(kVar);
      float v[kChains];
#pragma unroll
      for (int j = 0; j < kChains; ++j) v[j] = sc[j] + threadIdx.x;
#pragma unroll 8
      for (int r = 0; r < kGroups * kDrainRoundsPerGroup * 8 / kChains; ++r) {
#pragma unroll
        for (int j = 0; j < kChains; ++j) v[j] = fmaf(v[j], 0.999f, 0.5f);
      }
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kChains; ++j) sum += v[j];
      if (sum == 1.0f) out[blockIdx.x * 256] = sum;  // never true: keeps the chains alive
    }
    return;
  }
  setmaxnreg_inc<184>();
  const int c = wg - 1, i = threadIdx.x - 128;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const int tok = (kVar == kNarrow ? 0 : 64 * c) + 16 * warp + g;
  const uint64_t da = smem_desc_k128(sx + (kVar == kNarrow ? 0 : 64 * c) * 128);
  const uint64_t db = smem_desc_k128(sw + (kVar == kNarrow ? 64 * c : 0) * 128);
  float acc[64], part[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = part[j] = 0.0f;
  for (int kg = 0; kg < kGroups; ++kg) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if constexpr (kVar == kNarrow)
        wgmma_m64n64k32_e4m3_ss(*reinterpret_cast<float(*)[32]>(part), da + 2 * ks, db + 2 * ks, ks);
      else
        wgmma_m64n128k32_e4m3_ss(part, da + 2 * ks, db + 2 * ks, kVar == kNoWait || kVar == kNoPromote || ks > 0);
    }
    wgmma_commit();
    const float sx0 = sc[tok], sx1 = sc[tok + 8];
    if constexpr (kVar == kNoWait) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
      acc_fence(part);
    }
    if constexpr (kVar == kFull || kVar == kNarrow || has_drain(kVar)) {
      constexpr int kJ = kVar == kNarrow ? 8 : 16;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        acc[4 * j + 0] = fmaf(part[4 * j + 0], sx0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], sx0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], sx1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], sx1, acc[4 * j + 3]);
      }
    }
  }
  wgmma_wait<0>();
  acc_fence(part);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 64; ++j) sum += acc[j] + part[j];
  out[blockIdx.x * 256 + i] = sum;
#endif
}

template <int kVar>
void run(float* out, int sms) {
  CHECK(cudaFuncSetAttribute(probe_kernel<kVar>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const double us = median_us([&] { probe_kernel<kVar><<<sms, 512, kSmemBytes>>>(out); });
  const double tflops = flops_per_cta(kVar) * sms / (us * 1e-6) / 1e12;
  std::printf("%-12s %9.1f us %7.1f TFLOP/s %5.1f%% of 1448\n", kNames[kVar], us, tflops, 100.0 * tflops / 1448.0);
}

}  // namespace

int main() {
  return probe_main([](float* out, int sms) {
    run<kFull>(out, sms);
    run<kNoPromote>(out, sms);
    run<kNoWait>(out, sms);
    run<kNarrow>(out, sms);
    run<kFullDrain>(out, sms);
    run<kDrain1Chain>(out, sms);
    run<kDrain2Chain>(out, sms);
  });
}
