// fp8_mma_probe.cu — is one FP8 `mma.sync` (m16n8k32, E5M2 or E4M3 x E4M3 -> f32) as
// accurate as the decode path's two FP16 MMAs (m16n8k16, f32) over one MX block of 32, and
// would it be cheaper?
//
// Why it was asked: the decode mainloops (mx_mma.cuh) turn every E2M1 weight into FP16
// (nine ops per eight values) and every E4M3 token value into FP16, then reduce each MX
// block with two m16n8k16 MMAs into a fresh f32 partial. Every E2M1 value times 2^-6 is an
// E4M3 value, and every E2M1 value times 2^-14 an E5M2 value (the upper byte of the FP16
// the decode makes), so one m16n8k32 FP8 MMA could take the weights after a cheaper
// decode and the token bytes as they are, with half the MMAs. The DeepSeek-V3 report
// measured Hopper's FP8 *wgmma* accumulation at about 14 bits, hence the accuracy check.
//
// What it found (session 23, H200; PERFORMANCE.md): with E4M3 weights, over the first
// four distributions (33.5M block sums), both forms returned the exact block sum every
// time. The E5M2 weights and the wide distribution were added afterwards; that form of
// the probe timed out at 60 s on its host check (now 16x fewer blocks) and has not run.
// It does not need to: on sm_90a ptxas has no FP8 mma.sync instruction. It compiles one
// into F2FP.F16.E5M2/E4M3.UNPACK_B conversions and two HMMA.16816.F32 (cuobjdump), so the
// FP8 form is the FP16 pair with a conversion per operand word (which is why the sums
// agree), and a decode mainloop written with it had more instructions per chunk, not
// fewer (400 against 366). FP8 tensor cores on Hopper are reached through wgmma only.
//
// The probe: for many random 16 x 32 weight blocks (E2M1 codes as E5M2 values times 2^-14,
// or as E4M3 values times 2^-6) and 32 x 8 token blocks (E4M3 codes from several
// distributions), one warp computes the 16 x 8 block product with (a) one FP8 m16n8k32
// MMA and (b) two FP16 m16n8k16 MMAs as the decode path does; the host compares both with
// the exact sum (double) and counts the results that are not the exact sum rounded to f32,
// and the largest error in units of the largest product's f32 ulp.
//
// Build (development machine) and run (H200):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda -Iinclude \
//        bench/fp8_mma_probe.cu -o build-gpu/fp8_mma_probe
//   build-gpu/fp8_mma_probe
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mx_mma.cuh"  // e4m3x2_to_f16x2, the decode path's token conversion
#include "ptx.cuh"     // mma_f16_16816, the decode path's MMA

namespace {
using mxmoe::cuda_detail::e4m3x2_to_f16x2;
using mxmoe::cuda_detail::mma_f16_16816;

constexpr int kBlocks = 1 << 12;  // block products per distribution

// The weights' bytes: E5M2 (kE5m2) or E4M3.
template <bool kE5m2>
__device__ __forceinline__ uint32_t a8x2_to_f16x2(uint32_t two) {
  if constexpr (kE5m2) return ((two & 0xFFu) << 8) | ((two & 0xFF00u) << 16);
  return e4m3x2_to_f16x2(two);
}

// a: [kBlocks][16][32] E4M3 bytes (row-major); b: [kBlocks][8][32] E4M3 bytes (column n,
// then k); out: [kBlocks][2][16][8] floats (FP8 MMA, then the FP16 pair).
template <bool kE5m2>
__global__ void probe(const uint8_t* a, const uint8_t* b, float* out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int blk = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (blk >= kBlocks) return;
  const uint8_t* A = a + static_cast<size_t>(blk) * 16 * 32;
  const uint8_t* B = b + static_cast<size_t>(blk) * 8 * 32;
  auto a4 = [&](int r, int k) { return *reinterpret_cast<const uint32_t*>(A + r * 32 + k); };
  auto b4 = [&](int n, int k) { return *reinterpret_cast<const uint32_t*>(B + n * 32 + k); };
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  {
    const uint32_t a0 = a4(g, 4 * t), a1 = a4(g + 8, 4 * t), a2 = a4(g, 16 + 4 * t), a3 = a4(g + 8, 16 + 4 * t);
    const uint32_t b0 = b4(g, 4 * t), b1 = b4(g, 16 + 4 * t);
    if constexpr (kE5m2)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float h[4] = {0.f, 0.f, 0.f, 0.f};
  for (int kk = 0; kk < 32; kk += 16) {
    auto a2h = [&](int r, int k) { return a8x2_to_f16x2<kE5m2>(A[r * 32 + k] | (A[r * 32 + k + 1] << 8)); };
    auto b2h = [&](int n, int k) { return e4m3x2_to_f16x2(B[n * 32 + k] | (B[n * 32 + k + 1] << 8)); };
    const uint32_t af[4] = {a2h(g, kk + 2 * t), a2h(g + 8, kk + 2 * t), a2h(g, kk + 2 * t + 8),
                            a2h(g + 8, kk + 2 * t + 8)};
    mma_f16_16816(h, af, b2h(g, kk + 2 * t), b2h(g, kk + 2 * t + 8));
  }
  float* o = out + static_cast<size_t>(blk) * 2 * 128;
  const int r0 = g, r1 = g + 8, c0 = 2 * t, c1 = 2 * t + 1;
  o[r0 * 8 + c0] = d[0], o[r0 * 8 + c1] = d[1], o[r1 * 8 + c0] = d[2], o[r1 * 8 + c1] = d[3];
  o[128 + r0 * 8 + c0] = h[0], o[128 + r0 * 8 + c1] = h[1], o[128 + r1 * 8 + c0] = h[2],
                    o[128 + r1 * 8 + c1] = h[3];
}

double e5m2_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
  const double v = e == 0 ? m * std::ldexp(1.0, -16) : (1.0 + m / 4.0) * std::ldexp(1.0, e - 15);
  return s ? -v : v;
}
// E2M1 code (s e1 e0 m) -> the E4M3 byte of its value times 2^-6, or the E5M2 byte of its
// value times 2^-14.
uint8_t e2m1_as_e4m3(uint8_t q) { return static_cast<uint8_t>(((q & 8) << 4) | ((q & 7) << 2)); }
uint8_t e2m1_as_e5m2(uint8_t q) { return static_cast<uint8_t>(((q & 8) << 4) | ((q & 7) << 1)); }

uint64_t rng_state = 0x9E3779B97F4A7C15ull;
uint32_t rnd() {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return static_cast<uint32_t>(rng_state >> 11);
}
// Token bytes: 0 = any finite E4M3 code; 1 = MXFP8 of Gaussian data (block max near 448);
// 2 = one large value and the rest tiny (2^-9..2^-6); 3 = alternating signs, close magnitudes;
// 4 = one 448 and the rest spread over the whole range (some sums need > 24 bits).
uint8_t token_code(int dist, int k) {
  for (;;) {
    uint8_t c = 0;
    if (dist == 0) c = static_cast<uint8_t>(rnd());
    else if (dist == 1) {
      const double u1 = (rnd() + 1.0) / 4294967297.0, u2 = rnd() / 4294967296.0;
      const double z = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2) * 448.0 / 3.5;
      const __nv_fp8_e4m3 f(static_cast<float>(z));
      c = *reinterpret_cast<const uint8_t*>(&f);
    } else if (dist == 2) c = k == 0 ? static_cast<uint8_t>(0x70 + (rnd() & 0xE)) : static_cast<uint8_t>(rnd() & 0x8F) & 0x8F;
    else if (dist == 3) c = static_cast<uint8_t>(((k & 1) << 7) | (0x40 + (rnd() & 0x7)));
    else c = k == 0 ? 0x7E : static_cast<uint8_t>(rnd() & 0x8F) | (k % 3 == 0 ? 0x30 : 0);
    if ((c & 0x7F) != 0x7F) return c;
  }
}

}  // namespace

int main() {
  const char* names[] = {"uniform codes", "gaussian MXFP8", "one large, rest tiny", "alternating signs",
                         "wide (> 24 bits)"};
  std::vector<uint8_t> a(static_cast<size_t>(kBlocks) * 16 * 32), b(static_cast<size_t>(kBlocks) * 8 * 32);
  std::vector<float> out(static_cast<size_t>(kBlocks) * 256);
  uint8_t *da, *db;
  float* dout;
  cudaMalloc(&da, a.size()), cudaMalloc(&db, b.size()), cudaMalloc(&dout, out.size() * 4);
  int bad_total = 0;
  for (int fmt = 0; fmt < 2; ++fmt) {
    const bool e5m2 = fmt == 0;
    for (int dist = 0; dist < 5; ++dist) {
      for (auto& x : a) {
        const uint8_t q = static_cast<uint8_t>(rnd() & 15);
        x = e5m2 ? e2m1_as_e5m2(q) : e2m1_as_e4m3(q);
      }
      if (dist == 4)  // the largest weight on k = 0, to meet the token's 448
        for (size_t i = 0; i < a.size(); i += 32) a[i] = e5m2 ? e2m1_as_e5m2(7) : e2m1_as_e4m3(7);
      for (size_t i = 0; i < b.size(); ++i) b[i] = token_code(dist, static_cast<int>(i % 32));
      cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
      if (e5m2) probe<true><<<kBlocks / 4, 128>>>(da, db, dout);
      else probe<false><<<kBlocks / 4, 128>>>(da, db, dout);
      if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
      cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
      long n = 0, fp8_inexact = 0, f16_inexact = 0, fp8_ne_f16 = 0;
      double fp8_max = 0, f16_max = 0;  // |result - exact| / ulp_f32(largest |product|)
      for (int blk = 0; blk < kBlocks; ++blk)
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 8; ++c) {
            double exact = 0, pmax = 0;
            for (int k = 0; k < 32; ++k) {
              const uint8_t ac = a[(static_cast<size_t>(blk) * 16 + r) * 32 + k];
              const double p = (e5m2 ? e5m2_value(ac) : double{mxmoe::fmt::e4m3_to_float(ac)}) *
                               double{mxmoe::fmt::e4m3_to_float(b[(static_cast<size_t>(blk) * 8 + c) * 32 + k])};
              exact += p;  // products of <= 8 significant bits over a 2^50 range: exact in double
              pmax = std::fmax(pmax, std::fabs(p));
            }
            const float f8 = out[static_cast<size_t>(blk) * 256 + r * 8 + c];
            const float f16 = out[static_cast<size_t>(blk) * 256 + 128 + r * 8 + c];
            const float ref = static_cast<float>(exact);
            const double ulp = pmax > 0 ? std::ldexp(1.0, std::ilogb(pmax) - 23) : 1.0;
            ++n;
            fp8_inexact += f8 != ref;
            f16_inexact += f16 != ref;
            fp8_ne_f16 += f8 != f16;
            fp8_max = std::fmax(fp8_max, std::fabs(f8 - exact) / ulp);
            f16_max = std::fmax(f16_max, std::fabs(f16 - exact) / ulp);
          }
      std::printf("%s x e4m3, %-20s %ld sums: fp8 != exact(f32) %ld, f16 pair != exact(f32) %ld, fp8 != f16 %ld; "
                  "max err in ulps of the largest product: fp8 %.3g, f16 %.3g\n",
                  e5m2 ? "e5m2" : "e4m3", names[dist], n, fp8_inexact, f16_inexact, fp8_ne_f16, fp8_max, f16_max);
      bad_total += fp8_max > f16_max;
    }
  }
  std::printf("fp8 mma %s the f16 pair's accuracy on every distribution\n", bad_total ? "MISSES" : "matches");
  return bad_total ? 2 : 0;
}
