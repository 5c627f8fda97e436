// tma_probe.cu — does a TMA load fault when its box starts off a 16-byte boundary in the
// innermost dimension? The FP8 GEMM1 producer's three loads (u8 128x128 swizzled x2, f32
// 128x1 unswizzled) on one mbarrier, into a stage laid out as wgmma_fp8.cuh's, the maps after
// a parameter struct of Gemm1Params' size (376 bytes) or before it, the scales' box from
// row 256 (aligned) and row 73 (not). Session 43 (docs/pending/README.md); not part of the build.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
template <int N> struct Pad { unsigned char b[N]; };
__device__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ void load(void* dst, const void* m, int x, int y, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(sa(dst)), "l"(m), "r"(x), "r"(y), "r"(sa(bar)) : "memory");
}
__device__ void run(const CUtensorMap* w, const CUtensorMap* b, const CUtensorMap* bs, int mask, int brow0, int kg, float* out) {
  extern __shared__ uint8_t smem[];
  uint8_t* st = smem + ((1024u - (sa(smem) & 1023u)) & 1023u);
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;");
    uint32_t bytes = ((mask & 1) ? 16384 : 0) + ((mask & 2) ? 16384 : 0) + ((mask & 4) ? 512 : 0);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)), "r"(bytes));
    if (mask & 1) load(st, w, kg * 128, 0, &bar);
    if (mask & 2) load(st + 16384, b, kg * 128, brow0, &bar);
    if (mask & 4) load(st + 33280, bs, brow0, kg, &bar);
    uint32_t done = 0;
    while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(sa(&bar)));
    out[0] = reinterpret_cast<float*>(st + 33280)[1];
  }
}
__global__ void after_pad(const Pad<376> p, const __grid_constant__ CUtensorMap w, const __grid_constant__ CUtensorMap b,
                          const __grid_constant__ CUtensorMap bs, int mask, int brow0, int kg, float* out) {
  run(&w, &b, &bs, mask, brow0, kg, out);
}
__global__ void before_pad(const __grid_constant__ CUtensorMap w, const __grid_constant__ CUtensorMap b,
                           const __grid_constant__ CUtensorMap bs, const Pad<376> p, int mask, int brow0, int kg, float* out) {
  run(&w, &b, &bs, mask, brow0, kg, out);
}
int main() {
  void* fnp = nullptr; cudaDriverEntryPointQueryResult q{};
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fnp, 12000, cudaEnableDefault, &q);
  auto enc = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fnp);
  const int rows = 2048, groups = 56;
  auto make = [&](CUtensorMapDataType t, void* g, uint64_t d0, uint64_t d1, uint64_t stride, uint32_t b0, uint32_t b1, bool sw) {
    CUtensorMap m{}; cuuint64_t dims[2] = {d0, d1}; cuuint64_t st[1] = {stride}; cuuint32_t box[2] = {b0, b1}; cuuint32_t es[2] = {1, 1};
    CUresult r = enc(&m, t, 2, g, dims, st, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r) printf("encode failed %d\n", (int)r);
    return m;
  };
  uint8_t *wc, *xc; float *sc, *out;
  cudaMalloc(&wc, size_t(28 * 4096) * groups * 128); cudaMalloc(&xc, size_t(rows) * groups * 128); cudaMalloc(&sc, size_t(rows) * groups * 4); cudaMalloc(&out, 64);
  CUtensorMap w = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, wc, groups * 128, 28 * 4096, groups * 128, 128, 128, true);
  CUtensorMap b = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, xc, groups * 128, rows, groups * 128, 128, 128, true);
  CUtensorMap s = make(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sc, rows, groups, rows * 4, 128, 1, false);
  Pad<376> pad{};
  const int smem = 1024 + 33 * 1024 + 1024;
  cudaFuncSetAttribute(after_pad, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(before_pad, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  for (int brow0 : {256, 73})
  for (int order = 0; order < 2; ++order)
    for (int mask : {1, 2, 4, 7}) {
      if (order == 0) after_pad<<<1, 128, smem>>>(pad, w, b, s, mask, brow0, 5, out);
      else before_pad<<<1, 128, smem>>>(w, b, s, pad, mask, brow0, 5, out);
      cudaError_t e = cudaDeviceSynchronize();
      printf("row %d, maps %s the params, loads %d%d%d: %s\n", brow0, order == 0 ? "after" : "before", mask & 1, (mask >> 1) & 1, (mask >> 2) & 1, cudaGetErrorString(e));
      if (e != cudaSuccess) {
        cudaDeviceReset();
        cudaMalloc(&wc, size_t(28 * 4096) * groups * 128); cudaMalloc(&xc, size_t(rows) * groups * 128); cudaMalloc(&sc, size_t(rows) * groups * 4); cudaMalloc(&out, 64);
        w = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, wc, groups * 128, 28 * 4096, groups * 128, 128, 128, true);
        b = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, xc, groups * 128, rows, groups * 128, 128, 128, true);
        s = make(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sc, rows, groups, rows * 4, 128, 1, false);
        cudaFuncSetAttribute(after_pad, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        cudaFuncSetAttribute(before_pad, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      }
    }
}
