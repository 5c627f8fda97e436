// placement_probe.cu — where does the block scheduler put the CTAs of a launch at two
// CTAs per SM? The exact prefill path's 32-token tile runs 264 CTAs on the H200's 132 SMs
// (heuristics.h prefill_ctas_per_sm) and deals tiles to CTAs in turn (wgmma_mx.cuh
// pf_plan), so an SM's load depends on which two CTAs share it: session 25 measured a
// split plan that assumed CTAs b and b + 132 pair up, and it was not faster
// (docs/PERFORMANCE.md, session 25). This probe launches the same shape (384 threads,
// __launch_bounds__(384, 2), the 32-token tile's dynamic shared memory) and records each
// CTA's %smid while every CTA stays resident, then counts the SM pairs by the distance
// between their two CTAs.
//
// Build (development machine) and run (H200):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda \
//        bench/placement_probe.cu -o build-gpu/placement_probe
//   build-gpu/placement_probe
// Prints, per launch: the SMs used, how many SMs hold CTAs b and b + G/2, b and b + 1, or
// another pair, and the SMs of the first CTAs of each half of the grid.
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <vector>

#include "probe_check.h"

namespace {

// PfGeometry<32>::kSmemBytes (wgmma_mx.cuh): 1 KB of slack, 8 stages of 13 KB, the
// barriers, the GEMM1 epilogue's amax and range-factor arrays, 16 bytes.
constexpr int kSmemBytes = 1024 + 8 * 13 * 1024 + 2 * 8 * 8 + 2 * 4 * 128 * 4 + 2 * 128 * 4 + 16;
constexpr long long kHoldCycles = 2000000;  // ~1 ms: every CTA of the grid is resident at once

__global__ void __launch_bounds__(384, 2) record_sm(int* smid) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) {
    int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    smid[blockIdx.x] = id;
    smem[0] = 1;
    const long long start = clock64();
    while (clock64() - start < kHoldCycles) {
    }
  }
  __syncthreads();
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int grid = 2 * sms;
  CHECK(cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  int* d = nullptr;
  CHECK(cudaMalloc(&d, grid * sizeof(int)));
  for (int launch = 0; launch < 3; ++launch) {
    record_sm<<<grid, 384, kSmemBytes>>>(d);
    CHECK(cudaGetLastError());
    std::vector<int> smid(grid);
    CHECK(cudaMemcpy(smid.data(), d, grid * sizeof(int), cudaMemcpyDeviceToHost));
    std::map<int, std::vector<int>> ctas;  // SM -> its CTAs, in block order
    for (int b = 0; b < grid; ++b) ctas[smid[b]].push_back(b);
    int half = 0, next = 0, other = 0;
    for (const auto& [sm, v] : ctas) {
      if (v.size() == 2 && v[1] - v[0] == sms) ++half;
      else if (v.size() == 2 && v[1] - v[0] == 1) ++next;
      else ++other;
    }
    std::printf("launch %d: %zu SMs; pairs b, b+%d: %d; b, b+1: %d; other: %d | SMs of CTAs 0..7:",
                launch, ctas.size(), sms, half, next, other);
    for (int b = 0; b < 8; ++b) std::printf(" %d", smid[b]);
    std::printf(" | of CTAs %d..%d:", sms, sms + 7);
    for (int b = sms; b < sms + 8; ++b) std::printf(" %d", smid[b]);
    std::printf("\n");
  }
  CHECK(cudaFree(d));
  return 0;
}
