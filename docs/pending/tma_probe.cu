// tma_probe.cu — the FP8 producer's TMA loads in isolation, to decide 0007 on the device
// before its kernels run (docs/pending/README.md; not part of the build). Session 43's
// question: does a box fault when it starts off a 16-byte boundary in the innermost
// dimension (fp32 scales box 128 x 1 from row 73)? Session 45 adds 0007's own form, each
// case checked for its values too, not only for a fault:
//  - the scales' box 132 x 1 from the tile's first row rounded down to a multiple of 4
//    (row 72), and the last tile's box running past the map's end (dim0 1044, not a
//    multiple of 128: zeros past it);
//  - issued by lane 0 of warp 0 and of warp 3 (0007's producer warps take turns), after
//    thread 0 initialized the barrier, as wgmma_fp8.cuh does;
//  - with the two 16 KB swizzled u8 boxes (weights, token rows) on the same barrier.
// The stage is laid out as wgmma_fp8.cuh's (scales at byte 33280); the maps follow a
// parameter struct of Gemm1Params' size (376 bytes).
// Build: nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o tma_probe tma_probe.cu
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

template <int N> struct Pad { unsigned char b[N]; };
constexpr int kGroups = 56, kScalesAt = 33280, kMaxBox = 132;

__device__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ void load(void* dst, const CUtensorMap* m, int x, int y, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(sa(dst)), "l"(m), "r"(x), "r"(y), "r"(sa(bar)) : "memory");
}

struct Case {
  int mask;       // loads: 1 weights box, 2 token rows box, 4 scales box
  int row0;       // the boxes' first row (token rows and scales)
  int box;        // the scales box's width (128 or 132)
  int warp;       // the issuing warp (its lane 0)
  int kg;         // the 128-K group
};

__global__ void probe(const Pad<376> pad, const __grid_constant__ CUtensorMap w, const __grid_constant__ CUtensorMap b,
                      const __grid_constant__ CUtensorMap s, const Case c, float* out) {
  extern __shared__ uint8_t smem[];
  uint8_t* st = smem + ((1024u - (sa(smem) & 1023u)) & 1023u);
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;");
    for (int i = 0; i < kMaxBox; ++i) reinterpret_cast<float*>(st + kScalesAt)[i] = -1.0f;  // poison
  }
  __syncthreads();
  if (threadIdx.x == c.warp * 32) {
    const uint32_t bytes = ((c.mask & 1) ? 16384u : 0u) + ((c.mask & 2) ? 16384u : 0u) +
                           ((c.mask & 4) ? 4u * c.box : 0u);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)), "r"(bytes));
    if (c.mask & 1) load(st, &w, c.kg * 128, 0, &bar);
    if (c.mask & 2) load(st + 16384, &b, c.kg * 128, c.row0, &bar);
    if (c.mask & 4) load(st + kScalesAt, &s, c.row0, c.kg, &bar);
    uint32_t done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(sa(&bar)));
    for (int i = 0; i < c.box; ++i) out[i] = reinterpret_cast<const float*>(st + kScalesAt)[i];
  }
}

int main() {
  void* fnp = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fnp, 12000, cudaEnableDefault, &q);
  auto enc = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fnp);
  auto make = [&](CUtensorMapDataType t, void* g, uint64_t d0, uint64_t d1, uint64_t stride, uint32_t b0,
                  uint32_t b1, bool sw) {
    CUtensorMap m{};
    cuuint64_t dims[2] = {d0, d1};
    cuuint64_t str[1] = {stride};
    cuuint32_t box[2] = {b0, b1};
    cuuint32_t es[2] = {1, 1};
    CUresult r = enc(&m, t, 2, g, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     sw ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r) printf("encode failed %d (dims %llu x %llu, box %u x %u)\n", (int)r, (unsigned long long)d0,
                  (unsigned long long)d1, b0, b1);
    return m;
  };
  const int smem = 1024 + 34 * 1024 + 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  // Each case: the scales map's rows (dim0) and box, then the loads.
  struct Run { int rows; Case c; const char* what; };  // `what` starting "0007" decides
  const Run runs[] = {
      {2048, {4, 256, 128, 0, 5}, "session 43: box 128 from an aligned row"},
      {2048, {4, 72, 132, 0, 5}, "0007: box 132 from row 72 (73 rounded down)"},
      {2048, {7, 72, 132, 0, 5}, "0007: the three loads, warp 0"},
      {2048, {7, 72, 132, 3, 5}, "0007: the three loads, warp 3"},
      {1044, {4, 1020, 132, 0, 5}, "0007: the last tile, box past dim0 1044"},
      {1044, {7, 1020, 132, 2, 5}, "0007: the last tile, three loads, warp 2"},
      // Last: a fault leaves the device unusable to this process (session 45's run: every
      // case after it failed with "busy or unavailable", a reset notwithstanding).
      {2048, {4, 73, 128, 0, 5}, "session 43: box 128 from row 73 (the first form's fault?)"},
  };
  int failures = 0;
  for (const Run& r : runs) {
    uint8_t *wc = nullptr, *xc = nullptr;
    float *sc = nullptr, *out = nullptr;
    cudaMalloc(&wc, size_t(28 * 4096) * kGroups * 128);
    cudaMalloc(&xc, size_t(r.rows) * kGroups * 128);
    cudaMalloc(&sc, size_t(r.rows) * kGroups * 4);
    cudaMalloc(&out, kMaxBox * 4);
    std::vector<float> hs(size_t(r.rows) * kGroups);  // scale (group g, row i) = g * 10000 + i
    for (int g = 0; g < kGroups; ++g)
      for (int i = 0; i < r.rows; ++i) hs[size_t(g) * r.rows + i] = float(g * 10000 + i);
    cudaMemcpy(sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice);
    const CUtensorMap w = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, wc, kGroups * 128, 28 * 4096, kGroups * 128, 128, 128, true);
    const CUtensorMap b = make(CU_TENSOR_MAP_DATA_TYPE_UINT8, xc, kGroups * 128, r.rows, kGroups * 128, 128, 128, true);
    const CUtensorMap s = make(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sc, r.rows, kGroups, uint64_t(r.rows) * 4, r.c.box, 1, false);
    probe<<<1, 128, smem>>>(Pad<376>{}, w, b, s, r.c, out);
    const cudaError_t e = cudaDeviceSynchronize();
    int wrong = -1;
    if (e == cudaSuccess && (r.c.mask & 4)) {
      std::vector<float> got(r.c.box);
      cudaMemcpy(got.data(), out, r.c.box * 4, cudaMemcpyDeviceToHost);
      wrong = 0;
      for (int i = 0; i < r.c.box; ++i) {
        const int row = r.c.row0 + i;
        const float want = row < r.rows ? float(r.c.kg * 10000 + row) : 0.0f;  // zero fill past dim0
        wrong += got[i] != want;
      }
    }
    if (std::string(r.what).rfind("0007", 0) == 0) failures += e != cudaSuccess || wrong != 0;
    printf("%-58s %s, %d of %d scales wrong\n", r.what, cudaGetErrorString(e), wrong, r.c.box);
    if (e != cudaSuccess) {
      cudaDeviceReset();  // a fault leaves the context unusable
      cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    } else {
      cudaFree(wc);
      cudaFree(xc);
      cudaFree(sc);
      cudaFree(out);
    }
  }
  printf("tma_probe: %d of 0007's 5 cases faulted or read wrong scales\n", failures);
  return failures != 0;
}
