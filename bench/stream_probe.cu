// stream_probe.cu — how fast can the decode path's weight streams read HBM, with nothing
// else in the loop? GEMM1 at M=1 (Kimi-K3: 16 experts x 96 row groups x 56 chunks of
// 2 KB, one warp per row group, 4 warps per block, 3 blocks per SM, an 8-deep cp.async
// ring per warp) reads its 187 MB in about 66 us (ncu). This probe runs the same grid and
// ring with the MMAs taken out, over several weight orders, copy mechanisms, ring depths,
// K splits and blocks per SM, so the memory side's share of that time is measured apart
// from the math. Results: docs/data/stream_probe_session9_2026-11-30.txt, discussed in
// docs/PERFORMANCE.md (session 9).
//
// Build (development machine) and run (H200):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda \
//        bench/stream_probe.cu -o build-gpu/stream_probe
//   build-gpu/stream_probe
// Prints one line per variant: median us over 15 cold-L2 runs and TB/s (weight bytes,
// plus the scale words where a variant copies them).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"
#include "ptx.cuh"

namespace {
using namespace mxmoe::cuda_detail;

constexpr int kExperts = 16, kRowGroups = 96, kChunks = 56, kWarps = 4;
constexpr int kChunkU4 = 128;  // 2 KB: one warp's 64-K chunk of 4 row tiles
constexpr size_t kTotalU4 = size_t{kExperts} * kRowGroups * kChunks * kChunkU4;
// The M = 2..8 grid (all 28 local experts: 672 blocks) for the wave-tail cases.
constexpr int kAllExperts = 28;
constexpr size_t kAllU4 = size_t{kAllExperts} * kRowGroups * kChunks * kChunkU4;

// Where chunk kc of row group rg of expert e lies (in uint4):
//   0 warp-private: each row group's 56 chunks contiguous (today's layout)
//   1 block-interleaved: the 4 row groups of a block side by side per chunk (8 KB runs)
//   2 expert-interleaved: chunk kc of all 96 row groups of the expert side by side
template <int kOrder>
__device__ __forceinline__ size_t chunk_at(int e, int rg, int kc) {
  if constexpr (kOrder == 0) return ((size_t(e) * kRowGroups + rg) * kChunks + kc) * kChunkU4;
  if constexpr (kOrder == 1) {
    const int blk = rg / kWarps, w = rg % kWarps;
    return (((size_t(e) * (kRowGroups / kWarps) + blk) * kChunks + kc) * kWarps + w) * kChunkU4;
  }
  return ((size_t(e) * kChunks + kc) * kRowGroups + rg) * kChunkU4;
}

// The decode ring without the math: each lane copies its 16 bytes of the chunk's four
// row tiles, waits for chunk kc, reads them back and folds them into a checksum.
// With kSplit > 1 the chunks are split over grid z (a K split: more, shorter warps).
// kScales: each chunk also copies its 128 bytes of scale words (lanes 0..7), 1 from a
// separate array as the engine's layout keeps them (scales[e][rg][kc][128 B]), 2 from
// right after the chunk's weights (a 2176-byte chunk).
template <int kOrder, int D, int kMinBlocks, int kSplit = 1, int kScales = 0>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) ring_kernel(const uint4* w, uint32_t* sink) {
  extern __shared__ uint4 ring[];
  constexpr int kStageU4 = kChunkU4 + 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.y, rg = blockIdx.x * kWarps + warp;
  const int kc0 = blockIdx.z * kChunks / kSplit, kc1 = (blockIdx.z + 1) * kChunks / kSplit;
  uint4* my = ring + warp * D * kStageU4;
  const size_t row_chunk = (size_t(e) * kRowGroups + rg) * kChunks;  // for the scale arrays
  auto issue = [&](int kc) {
    if (kc < kc1) {
      uint4* d = my + (kc % D) * kStageU4 + lane;
      const uint4* s = w + (kScales == 2 ? (row_chunk + kc) * kStageU4 : chunk_at<kOrder>(e, rg, kc)) + lane;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) cp_async_16(d + 32 * mt, s + 32 * mt);
      if (kScales != 0 && lane < 8)
        cp_async_16(d + 128, kScales == 2 ? s + 128 : w + kAllU4 + (row_chunk + kc) * 8 + lane);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < D - 1; ++i) issue(kc0 + i);
  uint32_t acc = 0;
#pragma unroll 1
  for (int kc = kc0; kc < kc1; ++kc) {
    issue(kc + D - 1);
    cp_async_wait<D - 1>();
    const uint4* st = my + (kc % D) * kStageU4 + lane;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const uint4 v = st[32 * mt];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (kScales) {
      __syncwarp();
      acc ^= st[128 - lane + (lane >> 2)].x;
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

// The same stream with one bulk copy (TMA engine, no per-lane addresses) per chunk,
// completed on a per-stage mbarrier.
template <int kOrder, int D, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) bulk_kernel(const uint4* w, uint32_t* sink) {
#if defined(MXMOE_SM90A)
  extern __shared__ uint4 ring[];
  __shared__ uint64_t bars[kWarps][D];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.y, rg = blockIdx.x * kWarps + warp;
  uint4* my = ring + warp * D * kChunkU4;
  if (lane == 0)
    for (int i = 0; i < D; ++i) mbar_init(&bars[warp][i], 1);
  fence_mbarrier_init();
  __syncwarp();
  auto issue = [&](int kc) {
    if (kc < kChunks && lane == 0)
      bulk_copy_g2s(my + (kc % D) * kChunkU4, w + chunk_at<kOrder>(e, rg, kc), kChunkU4 * 16, &bars[warp][kc % D]);
  };
  for (int i = 0; i < D - 1; ++i) issue(i);
  uint32_t acc = 0;
#pragma unroll 1
  for (int kc = 0; kc < kChunks; ++kc) {
    __syncwarp();  // every lane is done with the stage the next issue refills
    issue(kc + D - 1);
    mbar_wait(&bars[warp][kc % D], static_cast<uint32_t>((kc / D) & 1));
    const uint4* st = my + (kc % D) * kChunkU4 + lane;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const uint4 v = st[32 * mt];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;
#endif
}

// Plain grid-stride read of the same bytes (the ceiling H200.md measured).
__global__ void plain_kernel(const uint4* w, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = i + j * stride < n ? ldg_stream_u4(w + i + j * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

struct Bench {
  uint4* w;
  uint32_t* sink;
  void* flush;
  size_t flush_bytes = size_t{256} << 20;
  cudaEvent_t a, b;

  template <typename Launch>
  void time(const char* name, Launch launch, size_t bytes = kTotalU4 * 16) {
    std::vector<float> us;
    for (int r = 0; r < 16; ++r) {
      CHECK(cudaMemsetAsync(flush, r, flush_bytes));  // cold L2
      CHECK(cudaEventRecord(a));
      launch();
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      CHECK(cudaGetLastError());
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (r > 0) us.push_back(ms * 1000.0f);
    }
    std::sort(us.begin(), us.end());
    const float med = us[us.size() / 2];
    std::printf("%-40s %8.1f us %6.2f TB/s (min %.1f)\n", name, med, bytes / med * 1e-6, us.front());
  }
};

// experts > 16: the 28-expert grid; smem_bytes > 0 sets the block's shared memory (and
// so how many blocks an SM holds) instead of the ring's size.
template <int kOrder, int D, int kMinBlocks, int kSplit = 1, int kScales = 0>
void ring_case(Bench& B, const char* name, int experts = kExperts, int smem_bytes = 0) {
  const int smem = smem_bytes > 0 ? smem_bytes : kWarps * D * (kChunkU4 + 8) * 16;
  auto* k = ring_kernel<kOrder, D, kMinBlocks, kSplit, kScales>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  B.time(
      name, [&] { k<<<dim3(kRowGroups / kWarps, experts, kSplit), kWarps * 32, smem>>>(B.w, B.sink); },
      kTotalU4 * 16 / kExperts * experts * (kScales ? 17 : 16) / 16);
}
template <int kOrder, int D, int kMinBlocks>
void bulk_case(Bench& B, const char* name) {
  const int smem = kWarps * D * kChunkU4 * 16;
  CHECK(cudaFuncSetAttribute(bulk_kernel<kOrder, D, kMinBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  B.time(name, [&] {
    bulk_kernel<kOrder, D, kMinBlocks><<<dim3(kRowGroups / kWarps, kExperts), kWarps * 32, smem>>>(B.w, B.sink);
  });
}

}  // namespace

int main() {
  Bench B;
  CHECK(cudaMalloc(&B.w, kAllU4 * 16 * 17 / 16));  // weights, then their scale words
  CHECK(cudaMalloc(&B.sink, 4));
  CHECK(cudaMalloc(&B.flush, B.flush_bytes));
  CHECK(cudaMemset(B.w, 0x5A, kAllU4 * 16 * 17 / 16));
  CHECK(cudaEventCreate(&B.a));
  CHECK(cudaEventCreate(&B.b));
  std::printf("%zu MB, 16 experts x 96 row groups x 56 chunks of 2 KB; grid 24 x 16 x 4 warps\n",
              kTotalU4 * 16 >> 20);
  B.time("plain grid-stride ldg (528 x 512 thr)", [&] {
    plain_kernel<<<132 * 4, 512>>>(B.w, kTotalU4, B.sink);
  });
  // M = 2..8: 672 blocks; at 5 per SM (660 slots) 12 run as a second wave.
  ring_case<0, 4, 5, 1, 1>(B, "28 experts D4+scales, 5/SM (1.02 waves)", 28, 42 * 1024);
  ring_case<0, 4, 5, 1, 1>(B, "28 experts D4+scales, 6/SM (1 wave)", 28, 36 * 1024);
  ring_case<0, 4, 5, 1, 1>(B, "28 experts D4+scales, 4/SM (1.27 waves)", 28, 54 * 1024);
  ring_case<0, 8, 3>(B, "cp.async ring D8 3/SM, warp-private");
  ring_case<0, 8, 3, 1, 1>(B, "  + scale words from their own array");
  ring_case<0, 8, 3, 1, 2>(B, "  + scale words after the chunk's weights");
  ring_case<0, 4, 5, 1, 1>(B, "D4 + scale words from their own array");
  ring_case<0, 4, 5, 1, 2>(B, "D4 + scale words after the chunk's weights");
  ring_case<1, 8, 3>(B, "cp.async ring D8 3/SM, block-interleaved");
  ring_case<2, 8, 3>(B, "cp.async ring D8 3/SM, expert-interleaved");
  ring_case<0, 4, 5>(B, "cp.async ring D4, warp-private");
  ring_case<1, 4, 5>(B, "cp.async ring D4, block-interleaved");
  ring_case<0, 4, 5, 2>(B, "cp.async ring D4 K-split 2, warp-private");
  ring_case<0, 8, 3, 2>(B, "cp.async ring D8 K-split 2, warp-private");
  ring_case<0, 4, 5, 4>(B, "cp.async ring D4 K-split 4, warp-private");
  ring_case<1, 4, 5, 2>(B, "cp.async ring D4 K-split 2, block-interl.");
  bulk_case<0, 8, 3>(B, "bulk copy D8 3/SM, warp-private");
  bulk_case<1, 8, 3>(B, "bulk copy D8 3/SM, block-interleaved");
  bulk_case<0, 4, 5>(B, "bulk copy D4, warp-private");
  return 0;
}
