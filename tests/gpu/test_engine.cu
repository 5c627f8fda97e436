// GPU engine tests: each stage bit for bit against its CPU definition on inputs whose
// arithmetic is exact (routing vs route_cpu, quantization vs formats.h, permutation
// order, GEMM1+activation+requantization, GEMM2, finalize), then the whole layer
// against the float64 reference, NaN/Inf handling, determinism, graph replay and
// argument validation. Every test skips visibly without a usable GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../src/cuda/engine.h"
#include "../../src/cuda/heuristics.h"
#include "../../src/cuda/mx_mma.cuh"
#include "../../src/cuda/wgmma_fp8.cuh"
#include "../expect_invalid.h"
#include "mxmoe/activation_math.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/fp8_mode.h"
#include "mxmoe/layout.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "mxmoe/routing.h"
#include "mxmoe/suite.h"

using namespace mxmoe;
namespace cd = mxmoe::cuda_detail;
using mxmoe_test::expect_invalid;

namespace {

bool gpu_usable(std::string* why) {
  if (cuda_device_count() == 0) {
    *why = "cuda_device_count() == 0 (no driver or no device)";
    return false;
  }
  const auto d = cuda_devices();
  if (d.empty() || !d[0].supported) {
    *why = d.empty() ? "device 0 not queryable" : d[0].note;
    return false;
  }
  return true;
}
#define REQUIRE_GPU()                                                \
  do {                                                               \
    std::string why_;                                                \
    if (!gpu_usable(&why_)) GTEST_SKIP() << "no CUDA GPU visible: " << why_; \
  } while (0)

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { up(v); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  void up(const std::vector<T>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> down() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

uint32_t fbits(float f) { return fmt::float_bits(f); }

// A staging's outputs, poisoned (codes 0xAA, scales NaN bits 0xFFFFFFFF) so that a test
// sees what a kernel wrote and what it left.
struct PoisonedStaging {
  Dev<uint8_t> codes;
  Dev<float> scales;
  PoisonedStaging(size_t code_bytes, size_t scale_count) : codes(code_bytes), scales(scale_count) {
    cudaMemset(codes.p, 0xAA, codes.n);
    cudaMemset(scales.p, 0xFF, scales.n * sizeof(float));
  }
  /// Runs the staging `p` into these outputs (its dst and dst_scale replaced) and waits.
  void run(cd::StageFp8Params p) {
    p.dst = codes.p;
    p.dst_scale = scales.p;
    cd::launch_stage_fp8(p, nullptr);
    CK(cudaDeviceSynchronize());
  }
};

// ---------------------------------------------------------------- shared math

constexpr int kMathFns = 8;

// alpha, beta: SiTU's parameters from a kernel argument as in the epilogues (-2/alpha,
// -2/beta and alpha*beta inside situ_f32 computed at run time, not folded by the compiler).
__global__ void math_kernel(const float* x, int n, float alpha, float beta, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i], u = x[(i * 7 + 3) % n];
  float* o = out + kMathFns * i;
  o[0] = am::exp_f32(v);
  o[1] = am::sigmoid_f32(v);
  o[2] = am::tanh_f32(v);
  o[3] = am::situ_f32(v, u, 4.0f, 25.0f);
  o[4] = am::swiglu_oai_f32(v, u, 1.702f, 1.0f, 7.0f);
  o[5] = am::silu_gated_f32(v, u);
  o[6] = am::exp_nonpos_f32(-fabsf(v));
  o[7] = am::situ_f32(v, u, alpha, beta);
}

TEST(SharedMath, ExpSigmoidTanhActivationsBitExactHostVsDevice) {
  REQUIRE_GPU();
  Rng rng(11);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(static_cast<float>((rng.uniform() - 0.5) * 240.0));
  for (int i = 0; i < 50000; ++i) x.push_back(static_cast<float>(rng.normal() * 3.0));
  for (float s : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.7f, 88.8f, -103.9f, -104.0f, INFINITY, -INFINITY, NAN})
    x.push_back(s);
  const int n = static_cast<int>(x.size());
  Dev<float> dx(x), dout(kMathFns * x.size());
  const float alpha = 1.7f, beta = 7.3f;
  math_kernel<<<(n + 255) / 256, 256>>>(dx.p, n, alpha, beta, dout.p);
  CK(cudaDeviceSynchronize());
  const auto out = dout.down();
  int64_t bad = 0;
  for (int i = 0; i < n; ++i) {
    const float v = x[i], u = x[(i * 7 + 3) % n];
    const float want[kMathFns] = {am::exp_f32(v), am::sigmoid_f32(v), am::tanh_f32(v),
                                  am::situ_f32(v, u, 4.0f, 25.0f),
                                  am::swiglu_oai_f32(v, u, 1.702f, 1.0f, 7.0f),
                                  am::silu_gated_f32(v, u), am::exp_nonpos_f32(-std::fabs(v)),
                                  am::situ_f32(v, u, alpha, beta)};
    for (int j = 0; j < kMathFns; ++j) {
      const float got = out[kMathFns * i + j];
      if (fbits(got) != fbits(want[j]) && !(std::isnan(got) && std::isnan(want[j]))) {
        if (bad++ < 5)
          ADD_FAILURE() << "fn " << j << " x=" << v << " u=" << u << " gpu " << got
                        << " host " << want[j];
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---------------------------------------------------------------- E2M1 decode

// The decode mainloops' nine-op E2M1 -> FP16 decode (fp4x8_to_f16_mul) against the
// prefill path's shift-and-mask form, over every 32-bit weight word.
__global__ void fp4_decode_forms_kernel(unsigned long long* mismatches) {
  unsigned long long bad = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q = blockIdx.x * blockDim.x + threadIdx.x; q <= 0xFFFFFFFFull; q += stride) {
    uint32_t a[4], b[4];
    mxmoe::cuda_detail::fp4x8_to_f16(static_cast<uint32_t>(q), a);
    mxmoe::cuda_detail::fp4x8_to_f16_mul(static_cast<uint32_t>(q), b);
    bad += (a[0] != b[0]) + (a[1] != b[1]) + (a[2] != b[2]) + (a[3] != b[3]);
  }
  if (bad) atomicAdd(mismatches, bad);
}

TEST(E2m1Decode, MultiplyFormEqualsShiftFormForEveryWord) {
  REQUIRE_GPU();
  Dev<unsigned long long> d(std::vector<unsigned long long>{0ull});
  fp4_decode_forms_kernel<<<132 * 16, 256>>>(d.p);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(d.down()[0], 0ull);
}

// The prefill path's E2M1 -> BF16 decode (fp4x8_to_bf16_scaled, fields placed straight
// into BF16's bits), both of its forms, against the route through the FP16 fields
// (fp4x8_to_f16, then each magnitude down 3 bits), over every 32-bit weight word at the
// scale bytes 0 (subnormal products) and kPrefillMaxWeightScale (the largest the prefill
// path takes).
template <bool kSharedShift>
__global__ void fp4_bf16_forms_kernel(uint32_t scale_byte, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  const uint32_t m = (scale_byte + 126u) * 0x00800080u;
  const __nv_bfloat162 mul = *reinterpret_cast<const __nv_bfloat162*>(&m);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q = blockIdx.x * blockDim.x + threadIdx.x; q <= 0xFFFFFFFFull; q += stride) {
    uint32_t h[4], got[4];
    mxmoe::cuda_detail::fp4x8_to_f16(static_cast<uint32_t>(q), h);
    mxmoe::cuda_detail::fp4x8_to_bf16_scaled<kSharedShift>(static_cast<uint32_t>(q), scale_byte, got);
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = ((h[i] >> 3) | h[i]) & 0x81C081C0u;
      const __nv_bfloat162 x = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v), mul);
      bad += *reinterpret_cast<const uint32_t*>(&x) != got[i];
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

TEST(E2m1Decode, Bf16PlacementEqualsFp16RouteForEveryWord) {
  REQUIRE_GPU();
  for (const bool shared_shift : {false, true})
    for (const uint32_t b : {0u, static_cast<uint32_t>(cd::kPrefillMaxWeightScale)}) {
      Dev<unsigned long long> d(std::vector<unsigned long long>{0ull});
      if (shared_shift) fp4_bf16_forms_kernel<true><<<132 * 16, 256>>>(b, d.p);
      else fp4_bf16_forms_kernel<false><<<132 * 16, 256>>>(b, d.p);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      EXPECT_EQ(d.down()[0], 0ull) << "scale byte " << b << (shared_shift ? ", shared-shift form" : "");
    }
}

// ---------------------------------------------------------------- routing

// The routing kernel on `logits` (fp32, or BF16 bits) against route_cpu (route_cpu_bf16)
// on the same values, ids and weights bit for bit.
template <typename Logit>
void check_routing(const std::vector<Logit>& logits, int64_t M, int64_t E,
                   const std::vector<float>* bias, const RoutingParams& rp) {
  static_assert(std::is_same_v<Logit, float> || std::is_same_v<Logit, uint16_t>);
  constexpr bool kBf16 = std::is_same_v<Logit, uint16_t>;
  const float* b = bias ? bias->data() : nullptr;
  Routing want;
  if constexpr (kBf16) want = route_cpu_bf16(logits.data(), M, E, b, rp);
  else want = route_cpu(logits.data(), M, E, b, rp);
  Dev<Logit> dl(logits);
  Dev<float> db(bias ? *bias : std::vector<float>{0.0f});
  Dev<int32_t> ids(M * rp.top_k);
  Dev<float> w(M * rp.top_k);
  cd::RouteParams p;
  if constexpr (kBf16) p.logits_bf16 = dl.p;
  else p.logits = dl.p;
  p.bias = bias ? db.p : nullptr;
  p.tokens = M;
  p.num_experts = E;
  p.params = rp;
  p.ids = ids.p;
  p.weights = w.p;
  cd::launch_route(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gi = ids.down();
  const auto gw = w.down();
  int64_t bad = 0;
  for (size_t i = 0; i < gi.size(); ++i) {
    const bool same_w = fbits(gw[i]) == fbits(want.weights[i]) ||
                        (std::isnan(gw[i]) && std::isnan(want.weights[i]));
    if (gi[i] != want.ids[i] || !same_w) {
      if (bad++ < 5)
        ADD_FAILURE() << "token " << i / rp.top_k << " slot " << i % rp.top_k << ": gpu id "
                      << gi[i] << " w " << gw[i] << " (bits " << std::hex << fbits(gw[i])
                      << "), cpu id " << std::dec << want.ids[i] << " w " << want.weights[i]
                      << " (bits " << std::hex << fbits(want.weights[i]) << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "routing mismatches of " << gi.size();
}

TEST(Routing, KimiSigmoidBias896Top16MatchesRouteCpuBitExact) {
  REQUIRE_GPU();
  const int64_t M = 67, E = 896;
  Rng rng(3);
  std::vector<float> l(M * E), b(E);
  for (auto& v : l) v = static_cast<float>(rng.normal() * 2.0);
  for (auto& v : b) v = static_cast<float>(rng.normal() * 0.1);
  RoutingParams rp;
  rp.top_k = 16;
  rp.routed_scaling_factor = 2.5f;
  check_routing(l, M, E, &b, rp);
  rp.scaling_in_weights = false;
  rp.renormalize = false;
  check_routing(l, M, E, nullptr, rp);
}

TEST(Routing, TiesBreakTowardLowerIdMatchesRouteCpu) {
  REQUIRE_GPU();
  const int64_t M = 40, E = 100;
  Rng rng(4);
  std::vector<float> l(M * E);
  for (auto& v : l) v = static_cast<float>(rng.below(3)) * 0.5f;  // massive ties
  for (int64_t e = 0; e < E; ++e) l[5 * E + e] = NAN;             // a NaN token
  RoutingParams rp;
  rp.top_k = 8;
  check_routing(l, M, E, nullptr, rp);
  rp.kind = RouterKind::Softmax;
  rp.renormalize = false;
  for (int64_t e = 0; e < E; ++e) l[5 * E + e] = 0.25f;
  check_routing(l, M, E, nullptr, rp);
}

TEST(Routing, GroupLimitedAndSoftmaxMatchRouteCpu) {
  REQUIRE_GPU();
  const int64_t M = 33, E = 256;
  Rng rng(5);
  std::vector<float> l(M * E), b(E);
  for (auto& v : l) v = static_cast<float>(rng.normal());
  for (auto& v : b) v = static_cast<float>(rng.normal() * 0.05);
  RoutingParams rp;
  rp.top_k = 8;
  rp.n_group = 8;
  rp.topk_group = 4;
  check_routing(l, M, E, &b, rp);
  RoutingParams sm;
  sm.kind = RouterKind::Softmax;
  sm.top_k = 4;
  sm.renormalize = false;
  check_routing(l, M, E, nullptr, sm);
  sm.top_k = 32;
  check_routing(l, M, E, nullptr, sm);
}

TEST(Routing, Bf16LogitsMatchRouteCpuBf16BitExact) {
  REQUIRE_GPU();
  const int64_t M = 45, E = 896;
  Rng rng(15);
  std::vector<uint16_t> l(M * E);
  for (auto& v : l) v = fmt::float_to_bf16(static_cast<float>(rng.normal() * 2.0));  // BF16's ties too
  l[3 * E + 5] = 0x7FC0;  // NaN
  l[4 * E + 6] = 0x7F80;  // +Inf
  l[4 * E + 7] = 0xFF80;  // -Inf
  std::vector<float> b(E);
  for (auto& v : b) v = static_cast<float>(rng.normal() * 0.1);
  RoutingParams rp;
  rp.top_k = 16;
  rp.routed_scaling_factor = 2.5f;
  check_routing(l, M, E, &b, rp);
  rp.n_group = 8;
  rp.topk_group = 4;
  check_routing(l, M, E, &b, rp);
  RoutingParams sm;
  sm.kind = RouterKind::Softmax;
  sm.top_k = 4;
  sm.renormalize = false;
  check_routing(l, M, E, nullptr, sm);
}

// ---------------------------------------------------------------- quantization

TEST(Quantize, Bf16ToMxfp8BitExactWithFormatsIncludingInfNanZero) {
  REQUIRE_GPU();
  const int64_t M = 6, K = 256;
  Rng rng(6);
  std::vector<uint16_t> x(M * K);
  for (auto& v : x) v = fmt::float_to_bf16(static_cast<float>(rng.normal() * 3.0));
  auto blk = [&](int64_t t, int64_t b) { return x.data() + t * K + b * 32; };
  std::fill(blk(0, 1), blk(0, 1) + 32, uint16_t{0});            // zero block
  blk(0, 2)[3] = fmt::float_to_bf16(INFINITY);                   // +Inf saturates
  blk(1, 0)[7] = fmt::float_to_bf16(NAN);                        // NaN stays NaN
  blk(1, 3)[0] = fmt::float_to_bf16(-INFINITY);
  blk(1, 3)[1] = fmt::float_to_bf16(NAN);
  for (int i = 0; i < 32; ++i) blk(2, 4)[i] = fmt::float_to_bf16(1e-38f * (i + 1));  // tiny
  for (int i = 0; i < 32; ++i) blk(3, 5)[i] = fmt::float_to_bf16(3e38f * ((i & 1) ? 1 : -1));
  for (int i = 0; i < 32; ++i) blk(4, 6)[i] = fmt::float_to_bf16(NAN);  // all NaN
  for (ScaleRule rule : {ScaleRule::RoundUp, ScaleRule::Floor}) {
    Dev<uint16_t> dx(x);
    Dev<uint8_t> codes(M * K), scales(M * K / 32);
    cd::launch_quantize_x(dx.p, M, K, rule, codes.p, scales.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto gc = codes.down();
    const auto gs = scales.down();
    for (int64_t b = 0; b < M * K / 32; ++b) {
      float v[32];
      for (int i = 0; i < 32; ++i) v[i] = fmt::bf16_to_float(x[b * 32 + i]);
      uint8_t c[32], s;
      fmt::quantize_block_e4m3(v, c, &s, rule);
      ASSERT_EQ(gs[b], s) << "block " << b << " rule " << static_cast<int>(rule);
      for (int i = 0; i < 32; ++i)
        ASSERT_EQ(gc[b * 32 + i], c[i]) << "block " << b << " element " << i;
    }
  }
}

// ---------------------------------------------------------------- permutation

struct PermuteExpect {
  std::vector<int32_t> counts, offsets, row_map, pair_row;
  uint32_t error = 0;
};
PermuteExpect permute_cpu(const std::vector<int32_t>& ids, int64_t E, const std::vector<int32_t>& map,
                          int el) {
  PermuteExpect x;
  x.counts.assign(el, 0);
  x.pair_row.assign(ids.size(), -1);
  std::vector<int32_t> loc(ids.size(), -1);
  for (size_t p = 0; p < ids.size(); ++p) {
    if (ids[p] >= 0 && ids[p] < E) loc[p] = map[ids[p]];
    else if (ids[p] != -1) x.error = cd::kErrorIdOutOfRange;
    if (loc[p] >= 0) ++x.counts[loc[p]];
  }
  x.offsets.assign(el + 1, 0);
  for (int e = 0; e < el; ++e) x.offsets[e + 1] = x.offsets[e] + x.counts[e];
  x.row_map.assign(x.offsets[el], -1);
  std::vector<int32_t> fill(x.offsets.begin(), x.offsets.end() - 1);
  for (size_t p = 0; p < ids.size(); ++p)
    if (loc[p] >= 0) {
      x.row_map[fill[loc[p]]] = static_cast<int32_t>(p);
      x.pair_row[p] = fill[loc[p]]++;
    }
  return x;
}

constexpr int kPermuteClearWords = 1100;  // more than a 1024-thread block's one pass

void check_permute(const std::vector<int32_t>& ids, int64_t M, int64_t k, int64_t E,
                   const std::vector<int32_t>& map, int el) {
  const PermuteExpect want = permute_cpu(ids, E, map, el);
  Dev<int32_t> dids(ids), dmap(map), counts(el), offsets(el + 1), row_map(M * k), pair_row(M * k);
  Dev<uint32_t> err(1), clear(kPermuteClearWords);
  cudaMemset(clear.p, 0x7F, kPermuteClearWords * 4);  // every form zeroes them
  const int64_t seg_words = cd::permute_seg_words(M * k, el);
  Dev<int32_t> seg(seg_words);
  cudaMemset(row_map.p, 0xFF, M * k * 4);
  cudaMemset(pair_row.p, 0x7F, M * k * 4);  // must all be overwritten
  cudaMemset(seg.p, 0x7F, seg_words * 4);   // scratch: written before it is read
  cudaMemset(counts.p, 0x7F, el * 4);
  cudaMemset(err.p, 0x7F, 4);
  cd::PermuteParams p;
  p.ids = dids.p;
  p.expert_map = dmap.p;
  p.tokens = M;
  p.top_k = k;
  p.num_experts = E;
  p.num_local = el;
  p.counts = counts.p;
  p.offsets = offsets.p;
  p.row_map = row_map.p;
  p.pair_row = pair_row.p;
  p.error = err.p;
  p.seg = seg.p;
  p.clear = clear.p;
  p.clear_words = kPermuteClearWords;
  cd::launch_permute(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(clear.down(), std::vector<uint32_t>(kPermuteClearWords, 0u));
  EXPECT_EQ(counts.down(), want.counts);
  EXPECT_EQ(offsets.down(), want.offsets);
  auto rm = row_map.down();
  rm.resize(want.row_map.size());
  EXPECT_EQ(rm, want.row_map);
  EXPECT_EQ(pair_row.down(), want.pair_row);
  EXPECT_EQ(err.down()[0], want.error);
}

TEST(Permute, OrderCountsEpMapMinusOneAndBadIds) {
  REQUIRE_GPU();
  Rng rng(7);
  const int64_t E = 16, k = 4;
  for (int64_t M : {1, 37, 300}) {
    std::vector<int32_t> ids(M * k);
    for (auto& v : ids) v = static_cast<int32_t>(rng.below(E + 1)) - 1;  // includes -1
    // EP2 rank 1 (range ownership), expert 12 never used: an empty expert.
    std::vector<int32_t> map(E, -1);
    for (int e = 8; e < 16; ++e) map[e] = e - 8;
    for (auto& v : ids)
      if (v == 12) v = 13;
    check_permute(ids, M, k, E, map, 8);
    // Explicit scattered map and invalid ids (flagged, skipped, never dereferenced).
    std::vector<int32_t> map2(E, -1);
    for (int e = 0; e < E; e += 2) map2[e] = (e / 2 * 3) % 8;
    ids[0] = 16;
    ids[M * k - 1] = -7;
    ids[M * k / 2] = 1 << 30;
    check_permute(ids, M, k, E, map2, 8);
  }
  std::vector<int32_t> none(5 * 4, -1);
  std::vector<int32_t> map(E, -1);
  for (int e = 0; e < 4; ++e) map[e] = e;
  check_permute(none, 5, 4, E, map, 4);
  // The large-problem kernels (heuristics.h permute_segments: 5 segments of 3584 pairs
  // at 2500 x 7, 16 of 4096 at 4096 x 16; 40000 x 16 takes 16 of 40448, several block
  // steps of 8192 pairs each, with a tail), and 70 local experts (above the one-block
  // path's 64) with two of them empty.
  const int64_t E2 = 96;
  std::vector<int32_t> map3(E2, -1);
  for (int e = 0; e < 70; ++e) map3[(e * 37) % E2] = e;
  for (const auto& [M2, k2] : {std::pair<int64_t, int64_t>{2500, 7}, {4096, 16}, {40000, 16}, {3, 5}}) {
    std::vector<int32_t> ids(M2 * k2);
    for (auto& v : ids) {
      v = static_cast<int32_t>(rng.below(E2 + 1)) - 1;
      if (v >= 0 && (map3[v] == 5 || map3[v] == 69)) v = -1;
    }
    check_permute(ids, M2, k2, E2, map3, 70);
    ids[M2 * k2 - 1] = static_cast<int32_t>(E2);
    ids[M2 * k2 / 3] = -2;
    check_permute(ids, M2, k2, E2, map3, 70);
  }
}

// The block form's plan on this device (launch_permute's, with the knobs unset).
cd::BlockPermutePlan device_block_plan(int64_t pairs, int el, int64_t E) {
  return cd::block_permute_plan(pairs, el, E, cd::block_permute_coresident());
}

TEST(Permute, BlockFormAtKimiShapesOneBlockAndGridsAndItsBounds) {
  REQUIRE_GPU();
  // heuristics.h block_permute_plan: past the small form's 512 pairs, up to 64 local
  // experts and 4096 global ones; one block to 3072 pairs, then grids of co-resident
  // blocks (a cooperative launch) of one step each, more steps past 64 blocks (or past
  // what fits at once); past any bound the other forms. Kimi-K3 at EP32 (896 experts, 28 local, top-16),
  // routed by hand so that an expert's pairs span all steps, warps and blocks, and 64
  // local experts.
  Rng rng(11);
  const int64_t E = 896, k = 16;
  // Routing: 0 uniform over all global ids and -1; 1 half the pairs on local expert 1
  // (prefixes past 8 bits) and expert el - 1 never used; 2 every pair on local expert 1
  // (at 256 x 16 a prefix of 4095 in one block).
  auto check_at = [&](int el, int64_t M, int routing) {
    std::vector<int32_t> map(E, -1);
    for (int e = 0; e < el; ++e) map[(e * 29 + 3) % E] = e;  // scattered local ids
    const int32_t one = (1 * 29 + 3) % E;                   // local expert 1
    std::vector<int32_t> ids(M * k);
    for (auto& v : ids) {
      const bool to_one = routing == 2 || (routing == 1 && rng.below(2) == 0);
      v = to_one ? one : static_cast<int32_t>(rng.below(E + 1)) - 1;
      if (routing == 1 && v >= 0 && map[v] == el - 1) v = -1;
    }
    const cd::BlockPermutePlan plan = device_block_plan(M * k, el, E);
    SCOPED_TRACE(testing::Message() << "E_local " << el << " M " << M << " routing " << routing << " blocks "
                                    << plan.blocks << " steps " << plan.steps << " knobs "
                                    << (std::getenv("MXMOE_PERMUTE_ONE_BLOCK_STEPS") ? "one-block " : "")
                                    << (std::getenv("MXMOE_PERMUTE_GRID_STEPS") ? "grid-steps" : ""));
    check_permute(ids, M, k, E, map, el);
    if (routing == 2) return;
    ids[(M * k) / 2] = static_cast<int32_t>(E);  // flagged, skipped
    ids[M * k - 1] = -5;
    ids[k + 3] = -9;  // in block 0 of a grid
    check_permute(ids, M, k, E, map, el);
  };
  for (int64_t M : {32, 33, 64, 100, 128, 129, 192, 193, 256, 257, 1024, 1100})
    for (int routing : {0, 1}) check_at(28, M, routing);
  for (int64_t M : {100, 256, 1024}) check_at(28, M, 2);
  for (int64_t M : {33, 256, 700}) check_at(64, M, 1);
  check_at(65, 200, 0);
  check_at(28, 4096, 0);
  // The knobs: several blocks of one step from 513 pairs, one block of up to 4 steps, and
  // grids of 2, 3 or 4 steps per block.
  setenv("MXMOE_PERMUTE_ONE_BLOCK_STEPS", "0", 1);
  for (int64_t M : {33, 100, 256}) check_at(28, M, 1);
  setenv("MXMOE_PERMUTE_ONE_BLOCK_STEPS", "4", 1);
  for (int64_t M : {200, 256}) check_at(28, M, 1);
  check_at(28, 256, 2);
  unsetenv("MXMOE_PERMUTE_ONE_BLOCK_STEPS");
  for (const char* steps : {"2", "3", "4"}) {
    setenv("MXMOE_PERMUTE_GRID_STEPS", steps, 1);
    check_at(28, 1024, 0);
    check_at(28, 300, 1);
  }
  unsetenv("MXMOE_PERMUTE_GRID_STEPS");
  // Two blocks per SM (__launch_bounds__(1024, 2): 32 registers, at most 36 KB of shared
  // memory each); the largest grid, 64 blocks of 4 steps (Kimi M=16384), and past it the
  // two kernels.
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  EXPECT_EQ(cd::block_permute_coresident(), int64_t{2} * sms);
  const int64_t largest = cd::kBlockPermuteMaxBlocks * cd::kBlockPermutePairs / k;
  EXPECT_EQ(device_block_plan(largest * k, 28, E).blocks, cd::kBlockPermuteMaxBlocks);
  EXPECT_EQ(device_block_plan(largest * k, 28, E).steps, cd::kBlockPermuteMaxSteps);
  check_at(28, largest, 0);
  EXPECT_EQ(device_block_plan((largest + 1) * k, 28, E).blocks, 0);
  check_at(28, largest + 1, 0);
  EXPECT_EQ(device_block_plan(32 * 16, 28, E).blocks, 0);
  EXPECT_EQ(device_block_plan(33 * 16, 28, E).blocks, 1);
  EXPECT_EQ(device_block_plan(128 * 16, 64, 4096).blocks, 1);
  EXPECT_EQ(device_block_plan(192 * 16, 28, E).blocks, 1);
  EXPECT_EQ(device_block_plan(193 * 16, 28, E).blocks, 4);
  EXPECT_EQ(device_block_plan(1024 * 16, 28, E).blocks, 16);
  EXPECT_EQ(device_block_plan(256 * 16, 28, 4097).blocks, 0);
  EXPECT_EQ(device_block_plan(200 * 16, 65, E).blocks, 0);
}

// ---------------------------------------------------------------- exact-grid weights

// MXFP4 weights whose products with small-integer activations and sums are exact in fp32:
// random codes, scales 2^-2..2^2.
ExpertWeights exact_grid_weights(const MoeConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  ExpertWeights w;
  const int64_t el = cfg.local_experts(), K = cfg.hidden, N = cfg.intermediate;
  w.num_local = el;
  w.hidden = K;
  w.intermediate = N;
  w.w13_packed.resize(el * 2 * N * K / 2);
  w.w13_scale.resize(el * 2 * N * K / 32);
  w.w2_packed.resize(el * K * N / 2);
  w.w2_scale.resize(el * K * N / 32);
  for (auto& v : w.w13_packed) v = static_cast<uint8_t>(rng.below(256));
  for (auto& v : w.w2_packed) v = static_cast<uint8_t>(rng.below(256));
  // 2^-3..2^1: inside the prefill path's weight range (heuristics.h kPrefillMaxWeightScale)
  for (auto& v : w.w13_scale) v = static_cast<uint8_t>(124 + rng.below(5));
  for (auto& v : w.w2_scale) v = static_cast<uint8_t>(124 + rng.below(5));
  if (cfg.has_bias) {
    w.w13_bias.resize(el * 2 * N);
    w.w2_bias.resize(el * K);
    for (auto& v : w.w13_bias) v = static_cast<float>(static_cast<int>(rng.below(33)) - 16) * 0.25f;
    for (auto& v : w.w2_bias) v = static_cast<float>(static_cast<int>(rng.below(33)) - 16) * 0.25f;
  }
  return w;
}

uint8_t e4m3_of_int(int v) { return fmt::float_to_e4m3(static_cast<float>(v)); }

double w_value(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scale, int64_t row,
               int64_t col, int64_t cols) {
  return fmt::dequant_e2m1(packed[row * (cols / 2) + col / 2], col & 1, scale[row * (cols / 32) + col / 32]);
}

// Routing where every token picks k distinct experts among `used` global ids, some -1.
Routing random_routing(int64_t M, int64_t k, const std::vector<int32_t>& used, uint64_t seed,
                       bool minus_one) {
  Rng rng(seed);
  Routing r;
  r.tokens = M;
  r.top_k = k;
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> pool = used;
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = rng.below(pool.size());
      int32_t id = pool[i];
      pool.erase(pool.begin() + static_cast<long>(i));
      if (minus_one && rng.below(5) == 0) id = -1;
      r.ids.push_back(id);
      r.weights.push_back(static_cast<float>(0.25 + rng.uniform()));
    }
  }
  return r;
}

// ---------------------------------------------------------------- E4M3 rounding

__global__ void e4m3_all_floats_kernel(uint32_t hi, unsigned long long* mismatches) {
  const uint32_t u = (hi << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  const float x = fmt::bits_float(u);
  if (fmt::float_to_e4m3(x) != fmt::float_to_e4m3_sw(x)) atomicAdd(mismatches, 1ull);
}

// The device's float_to_e4m3 (the hardware conversion on sm_89+) against the formats.h
// definition, for every one of the 2^32 floats (NaNs, infinities, subnormals, ties).
TEST(Formats, DeviceE4m3ConversionEqualsDefinitionForEveryFloat) {
  REQUIRE_GPU();
  Dev<unsigned long long> bad(1);
  cudaMemset(bad.p, 0, sizeof(unsigned long long));
  for (uint32_t hi = 0; hi < 256; ++hi) e4m3_all_floats_kernel<<<(1u << 24) / 256, 256>>>(hi, bad.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bad.down()[0], 0ull);
}

__global__ void bf16_all_floats_kernel(uint32_t hi, unsigned long long* mismatches) {
  const uint32_t u = (hi << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  const float x = fmt::bits_float(u), y = fmt::bits_float(u ^ 0x80000000u);
  const uint32_t pair = cd::bf16x2_rn(x, y);
  const uint16_t got[2] = {static_cast<uint16_t>(pair), static_cast<uint16_t>(pair >> 16)};
  const float in[2] = {x, y};
  for (int h = 0; h < 2; ++h) {
    const uint16_t want = fmt::float_to_bf16(in[h]);
    const bool nan_want = (want & 0x7FFFu) > 0x7F80u, nan_got = (got[h] & 0x7FFFu) > 0x7F80u;
    if (nan_want ? !nan_got : got[h] != want) atomicAdd(mismatches, 1ull);
  }
}

// The FP8 GEMM2's BF16 y (bf16x2_rn, the hardware's pair conversion) against formats.h's
// float_to_bf16 for every one of the 2^32 floats, each lane (ties to even, subnormals,
// overflow to infinity, infinities; a NaN stays a NaN, its payload not compared).
TEST(Formats, DeviceBf16PairConversionEqualsDefinitionForEveryFloat) {
  REQUIRE_GPU();
  Dev<unsigned long long> bad(1);
  cudaMemset(bad.p, 0, sizeof(unsigned long long));
  for (uint32_t hi = 0; hi < 256; ++hi) bf16_all_floats_kernel<<<(1u << 24) / 256, 256>>>(hi, bad.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bad.down()[0], 0ull);
}

// ---------------------------------------------------------------- prefill operands

// blockIdx.z: fp4x8_to_bf16_times' form (1: shared-shift), its words after form 0's.
__global__ void fp4_bf16_kernel(const uint32_t* words, int nwords, uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // word
  const uint32_t b = blockIdx.y;                        // scale byte
  if (i >= nwords) return;
  uint32_t r[4];
  if (blockIdx.z) cd::fp4x8_to_bf16_scaled<true>(words[i], b, r);
  else cd::fp4x8_to_bf16_scaled<false>(words[i], b, r);
  const size_t at = (static_cast<size_t>(blockIdx.z) * gridDim.y + b) * nwords + i;
  for (int j = 0; j < 4; ++j) out[at * 4 + j] = r[j];
}

// The prefill path's weight decode, both forms: every E2M1 code of a tiled matrix times
// every scale byte 0..kPrefillMaxWeightScale, bit for bit against formats.h (BF16 of the
// exact value; byte 0 gives BF16 subnormals).
TEST(Prefill, Fp4ToBf16ScaledExactForAllCodesAndScaleBytes) {
  REQUIRE_GPU();
  const int64_t rows = 64, cols = 64;
  Rng rng(77);
  std::vector<uint8_t> packed(rows * cols / 2), scale(rows * cols / 32, 127);
  for (auto& v : packed) v = static_cast<uint8_t>(rng.below(256));
  std::vector<uint32_t> tp, ts;
  cd::tile_mxfp4(packed.data(), scale.data(), 1, rows, cols, tp, ts);
  const int nwords = static_cast<int>(tp.size());  // [mt 4][lane 32][4]
  const int nb = cd::kPrefillMaxWeightScale + 1;
  Dev<uint32_t> dw(tp), dout(static_cast<size_t>(2 * nb) * nwords * 4);
  cudaMemset(dout.p, 0xFF, dout.n * sizeof(uint32_t));  // poison: NaN, never a wanted value
  fp4_bf16_kernel<<<dim3((nwords + 127) / 128, nb, 2), 128>>>(dw.p, nwords, dout.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto out = dout.down();
  int64_t bad = 0;
  for (int b = 0; b < 2 * nb; ++b)
    for (int w = 0; w < nwords; ++w) {
      const int mt = w / 128, lane = (w / 4) % 32, wi = w % 4;
      const int g = lane / 4, t = lane % 4;
      const int64_t row = 16 * mt + g + (wi & 1 ? 8 : 0), blk = wi >> 1;
      for (int e = 0; e < 8; ++e) {
        const int64_t col = blk * 32 + 8 * t + e;
        const double v = fmt::dequant_e2m1(packed[row * cols / 2 + col / 2], col & 1, static_cast<uint8_t>(b % nb));
        const uint16_t want = fmt::float_to_bf16(static_cast<float>(v));
        const uint32_t word = out[(static_cast<size_t>(b) * nwords + w) * 4 + e / 2];
        const uint16_t got = static_cast<uint16_t>(e & 1 ? word >> 16 : word);
        if (got != want && bad++ < 5)
          ADD_FAILURE() << "form " << b / nb << " scale byte " << b % nb << " row " << row << " col " << col << ": "
                        << got << " vs " << want;
      }
    }
  EXPECT_EQ(bad, 0);
}

struct StageCase {
  Activation act;
  bool x_fp8, mid_fp8, bias;
  int64_t M, K, N;
  bool tiny_block = false;  // token 1's first MX block scaled 2^-127: not exact in BF16
  int prefill_ctas = 0;     // > 0: MXMOE_PREFILL_CTAS (several tiles per CTA)
  int token_tile = 0;       // > 0: MXMOE_PREFILL_TOKEN_TILE (32 / 64 / 96 / 128), else the heuristic
  bool decode_only = false; // MXMOE_PREFILL=0: the decode / generic paths at this size
  int split_gemm = 0;       // 1 / 2: MXMOE_PREFILL_CTAS picked so that this GEMM's tail
                            // splits: >= 2 tiles in >= 3 parts each, after whole tiles
                            // (heuristics.h pf_split)
  bool tiny_mid = false;    // x scaled 2^-64 (exact in BF16): intermediate blocks under
                            // scale byte 10, which GEMM2's staged rows do not take
  int decode_blocks = 0;    // > 0: MXMOE_DECODE_BLOCKS (the balanced decode GEMM1's grid,
                            // small enough that warps share row groups or blocks loop)
  bool few_rows = false;    // local experts 4 and 5 keep their first 6 and 12 routed rows
                            // (the rest -1): above 32 tokens, the 16-row kernel's 8- and
                            // 16-row bodies beside the 32-row class
  bool huge_mid = false;    // MXFP8 x scaled 2^56 (every GEMM1 sum exact still): SiLU-gated
                            // g * u beyond fp32 in part, so intermediate blocks hold ±Inf
                            // beside finite values (an Inf saturates at the finite values'
                            // scale, fmt::block_amax); scale bytes past the staged rows' 191
  bool inf_mid = false;     // x scaled 2^72 instead: every g * u is ±Inf or ±0, so blocks of
                            // amax 0 (byte 0) hold ±Inf, saturated to ±448 * 2^-127, which
                            // the prefill path stages (a normal BF16)
};

/// What the balanced decode GEMM1's partition does with a stage case's routing (local
/// experts 4..7 of run_gemm1_stage's config): row groups cut between warps, and whether
/// blocks loop over units.
struct BalancedUse {
  int cuts = 0;
  bool loops = false;
  bool multi_unit = false;  // an expert of more than 8 rows (several units)
};
BalancedUse balanced_use(const Routing& routing, int blocks, int64_t K, int64_t N) {
  int count[4] = {0, 0, 0, 0};
  for (int32_t id : routing.ids)
    if (id >= 4) ++count[id - 4];
  int units = 0;
  for (int c : count) units += (c + 7) / 8;
  const int rg = static_cast<int>(2 * N / 64), kc = static_cast<int>((K + 63) / 64);
  BalancedUse use;
  use.multi_unit = *std::max_element(count, count + 4) > 8;
  use.loops = units > blocks;
  for (int b = 0; b < blocks; ++b) {
    const cd::BalancedBlock bb = cd::balanced_block(units, blocks, rg, b);
    if (bb.unit < 0) continue;
    for (int w = 0; w < cd::kFastWarps; ++w) {
      int lo = 0, hi = 0;
      cd::balanced_range(rg, kc, bb.blocks, cd::kFastWarps * bb.index + w, &lo, &hi);
      use.cuts += lo < hi && hi % kc != 0;  // per unit of the block: the same ranges
    }
  }
  return use;
}
/// The stage cases of the balanced decode GEMM1 on shrunk grids (Gemm1Act test, below).
Routing stage_routing(int64_t M) { return random_routing(M, 3, {0, 2, 4, 5, 7, 3}, 300 + M, true); }

/// The test knob MXMOE_PDL=0 (plain launches; then no expert-ready counters either).
bool pdl_knob_off() {
  const char* v = std::getenv("MXMOE_PDL");
  return v != nullptr && std::string(v) == "0";
}

bool prefill_expected(int64_t M, bool decode_only = false) {
  if (decode_only) return false;
  cudaDeviceProp prop{};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  return M >= cd::kPrefillMinTokens && prop.major == 9 && cd::prefill_kernels_available();
}

// Output position o of an MX block in a staged BF16 row <- element (stage_bf16.cu).
int staged_source(int o) {
  const int s = o >> 4, k = o & 15;
  return 8 * ((k & 7) >> 1) + 4 * s + 2 * (k >> 3) + (k & 1);
}

// The staged BF16 block of 32 (engine.h StageBf16Params), one element at a time: value =
// code * 2^(scale - 127 - D) rounded to BF16; position 16 s + k' holds element
// 8 ((k' % 8) / 2) + 4 s + 2 (k' / 8) + k' % 2. `exact` is cleared where BF16 cannot hold
// a value (under 2^-126, or rounded).
struct StagedRow {
  std::vector<uint16_t> bf16;  // [stride]
  float back = 1.0f;
  bool exact = true;
};
StagedRow stage_row_model(const uint8_t* codes, const uint8_t* scale, const uint16_t* bf16_src, int64_t cols,
                          int64_t stride) {
  StagedRow r;
  r.bf16.assign(stride, 0);
  const int64_t kb = cols / 32;
  float adj = 1.0f;
  if (codes) {
    int mx = 0;
    for (int64_t b = 0; b < kb; ++b)
      if (scale[b] != 0xFF) mx = std::max<int>(mx, scale[b]);
    const int d = std::max(0, mx - 127 - 64);
    adj = std::ldexp(1.0f, -d);
    r.back = std::ldexp(1.0f, d);
  }
  for (int64_t b = 0; b < kb; ++b)
    for (int o = 0; o < 32; ++o) {
      const int64_t src = 32 * b + staged_source(o);
      uint16_t v;
      if (codes) {
        const float f = fmt::e4m3_to_float(codes[src]) * (fmt::e8m0_to_float(scale[b]) * adj);
        v = fmt::float_to_bf16(f);
        const bool ok = f == 0.0f ? (codes[src] & 0x7F) == 0
                                  : std::isnan(f) || (std::fabs(f) >= 0x1p-126f && fmt::bf16_to_float(v) == f);
        r.exact = r.exact && ok;
      } else {
        v = bf16_src[src];
      }
      r.bf16[32 * b + o] = v;
    }
  return r;
}

// Prefill GEMMs (GEMM1, GEMM2) of the stage cases whose launch split its tail
// (heuristics.h pf_split), so that the test can tell it covered that path.
int g_split_launches = 0;

// The tiles of a prefill GEMM with `rows` weight rows, for the 4 local experts' row
// counts and a `tile`-token tile (wgmma_mx.cuh pf_plan), and its 64-K chunks for `cols`.
int prefill_tiles(const int (&count)[4], int tile, int64_t rows) {
  int tiles = 0;
  for (int n : count) tiles += (n + tile - 1) / tile * static_cast<int>(((rows + 63) / 64 + 3) / 4);
  return tiles;
}
int k_chunks(int64_t cols) { return static_cast<int>((cols + 63) / 64); }

// GEMM1 + activation + intermediate quantization, bit for bit, by running the whole
// layer and reading the intermediate out of the workspace (layout from the same
// WorkspaceLayout the engine carves).
/// A stage case's problem, made on the host: config (local experts 4..7 of 8), exact-grid
/// weights, x on the grid (E4M3 codes and scales, and the same integers in BF16), routing.
struct StageData {
  MoeConfig cfg;
  ExpertWeights w;
  std::vector<uint8_t> xc, xs;
  std::vector<uint16_t> xb;
  Routing routing;
};
StageData make_stage_data(const StageCase& sc) {
  StageData d;
  MoeConfig& cfg = d.cfg;
  cfg.num_experts = 8;
  cfg.top_k = 3;
  cfg.hidden = sc.K;
  cfg.intermediate = sc.N;
  cfg.ep_size = 2;
  cfg.ep_rank = 1;  // local experts 4..7
  cfg.activation = sc.act == Activation::SiTU ? ActivationParams::situ()
                   : sc.act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai()
                                                      : ActivationParams::silu_gated();
  if (sc.act == Activation::SiTU) cfg.activation.alpha = {4.0f, 3.0f, 2.0f, 5.0f};  // per expert
  cfg.input_format = sc.x_fp8 ? InputFormat::MXFP8 : InputFormat::BF16;
  cfg.intermediate_format = sc.mid_fp8 ? IntermediateFormat::MXFP8 : IntermediateFormat::BF16;
  cfg.has_bias = sc.bias;
  d.w = exact_grid_weights(cfg, 100 + sc.M);
  const int64_t M = sc.M, K = sc.K;
  Rng rng(200 + M);
  // Activations on the grid: small integers times a power-of-two scale.
  std::vector<uint8_t>& xc = d.xc;
  std::vector<uint8_t>& xs = d.xs;
  std::vector<uint16_t>& xb = d.xb;
  xc.resize(M * K);
  xs.resize(M * K / 32);
  xb.resize(M * K);
  for (int64_t i = 0; i < M * K; ++i) {
    const int v = static_cast<int>(rng.below(17)) - 8;
    xc[i] = e4m3_of_int(v);
    xb[i] = fmt::float_to_bf16(static_cast<float>(v));
  }
  for (auto& v : xs) v = static_cast<uint8_t>(126 + rng.below(3));
  if (sc.tiny_block) xs[1 * K / 32] = 0;  // int * 2^-127: under BF16's normal range
  if (sc.tiny_mid)
    for (auto& v : xs) v = static_cast<uint8_t>(v - 64);  // every GEMM1 sum is exact still
  if (sc.huge_mid || sc.inf_mid)
    for (auto& v : xs) v = static_cast<uint8_t>(v + (sc.huge_mid ? 56 : 72));  // likewise
  d.routing = stage_routing(M);  // 6 unused
  if (sc.few_rows) {
    int seen[2] = {0, 0};
    for (int32_t& id : d.routing.ids)
      if ((id == 4 && ++seen[0] > 6) || (id == 5 && ++seen[1] > 12)) id = -1;
  }
  return d;
}

/// GEMM1 and the activation of token t for local expert e (0..3) on the host: the
/// intermediate row the kernels must quantize (float64 sums, exact on the grid).
std::vector<float> stage_activation(const StageCase& sc, const StageData& d, int e, int64_t t) {
  const int64_t K = sc.K, N = sc.N;
  std::vector<float> h(N);
  for (int64_t n = 0; n < N; ++n) {
    double acc[2] = {0, 0};
    for (int gu = 0; gu < 2; ++gu) {
      const int64_t kr = gu == 0 ? kernel_row_of_gate(n) : kernel_row_of_up(n);
      const int64_t r = e * 2 * N + kr;
      for (int64_t c = 0; c < K; ++c) {
        const double xv = sc.x_fp8 ? fmt::dequant_e4m3(d.xc[t * K + c], d.xs[t * K / 32 + c / 32])
                                   : fmt::bf16_to_float(d.xb[t * K + c]);
        acc[gu] += w_value(d.w.w13_packed, d.w.w13_scale, r, c, K) * xv;
      }
      if (sc.bias) acc[gu] += d.w.w13_bias[r];
    }
    const ActivationParams& a = d.cfg.activation;
    h[n] = am::gated_activation_f32(static_cast<int>(sc.act), static_cast<float>(acc[0]), static_cast<float>(acc[1]),
                                    a.alpha.empty() ? 0.f : a.alpha_of(e), a.beta.empty() ? 0.f : a.beta_of(e),
                                    a.limit.empty() ? 0.f : a.limit_of(e));
  }
  return h;
}

/// Blocks of 32 holding ±Inf beside finite nonzero values (mixed), and ±Inf beside zeros
/// only, over every routed row of a stage case (what huge_mid and inf_mid are for).
struct InfBlocks {
  int64_t mixed = 0, inf_only = 0;
};
InfBlocks stage_inf_blocks(const StageCase& sc, const StageData& d) {
  InfBlocks n;
  for (size_t p = 0; p < d.routing.ids.size(); ++p) {
    if (d.routing.ids[p] < 4) continue;
    const std::vector<float> h = stage_activation(sc, d, d.routing.ids[p] - 4, static_cast<int64_t>(p) / d.cfg.top_k);
    for (int64_t b = 0; b < sc.N / 32; ++b) {
      bool inf = false, finite = false;
      for (int i = 0; i < 32; ++i) {
        const float v = h[b * 32 + i];
        if (std::isinf(v)) inf = true;
        else if (v != 0.0f) finite = true;
      }
      n.mixed += inf && finite;
      n.inf_only += inf && !finite;
    }
  }
  return n;
}

void run_gemm1_stage(const StageCase& sc) {
  const StageData d = make_stage_data(sc);
  const MoeConfig& cfg = d.cfg;
  const ExpertWeights& w = d.w;
  const std::vector<uint8_t>& xc = d.xc;
  const std::vector<uint8_t>& xs = d.xs;
  const std::vector<uint16_t>& xb = d.xb;
  const Routing& routing = d.routing;
  const int64_t M = sc.M, K = sc.K, N = sc.N, k = cfg.top_k;

  if (sc.decode_only) setenv("MXMOE_PREFILL", "0", 1);  // read when the layer is built
  // Every decode size with the expert-ready counters (heuristics.h use_expert_ready; set
  // here so that the cases do not depend on the default), so that GEMM2 waits per expert
  // wherever it can.
  setenv("MXMOE_READY", "2", 1);
  CudaMoeLayer layer(cfg, w);
  unsetenv("MXMOE_PREFILL");
  unsetenv("MXMOE_READY");
  const cd::WorkspaceLayout L = cd::WorkspaceLayout::make(cfg, M);
  Dev<uint8_t> ws(layer.workspace_size(M)), dxc(xc), dxs(xs);
  Dev<uint16_t> dxb(xb), out(M * K);
  Dev<int32_t> ids(routing.ids);
  Dev<float> wts(routing.weights);
  ForwardArgs a;
  a.tokens = M;
  a.x_format = sc.x_fp8 ? InputFormat::MXFP8 : InputFormat::BF16;
  a.x = sc.x_fp8 ? static_cast<const void*>(dxc.p) : static_cast<const void*>(dxb.p);
  a.x_scale = sc.x_fp8 ? dxs.p : nullptr;
  a.topk_ids = ids.p;
  a.topk_weights = wts.p;
  a.out = out.p;
  if (sc.prefill_ctas > 0) setenv("MXMOE_PREFILL_CTAS", std::to_string(sc.prefill_ctas).c_str(), 1);
  if (sc.token_tile > 0) setenv("MXMOE_PREFILL_TOKEN_TILE", std::to_string(sc.token_tile).c_str(), 1);
  if (sc.decode_blocks > 0) setenv("MXMOE_DECODE_BLOCKS", std::to_string(sc.decode_blocks).c_str(), 1);
  const int tile = cd::prefill_tile_tokens(M, cfg.top_k, 4);
  if (sc.split_gemm > 0) {
    // The split GEMM's tiles from the routing's rows per local expert; the smallest CTA
    // count whose tail has >= 2 tiles, cut in >= 3 parts each, after whole tiles (so the
    // CTAs claim several whole tiles each, then parts).
    int count[4] = {0, 0, 0, 0};
    for (int32_t id : routing.ids)
      if (id >= 4) ++count[id - 4];
    const int tiles = prefill_tiles(count, tile, sc.split_gemm == 1 ? 2 * N : K);
    const int kc = k_chunks(sc.split_gemm == 1 ? K : N);
    int g = 2;
    auto splits_well = [&](int ctas_try) {
      const cd::PfSplit split = cd::pf_split(cd::prefill_claims(sc.split_gemm == 1, tile), tiles, ctas_try, kc, tile);
      return split.tiles >= 2 && split.parts >= 3 && split.tiles < tiles;
    };
    while (g < tiles && !splits_well(g)) ++g;
    ASSERT_LT(g, tiles) << "no CTA count splits this case's GEMM" << sc.split_gemm;
    setenv("MXMOE_PREFILL_CTAS", std::to_string(g).c_str(), 1);
  }
  const int ctas = cd::prefill_ctas(cd::prefill_ctas_per_sm(tile));
  layer.forward(a, ws.p, ws.n, nullptr);
  unsetenv("MXMOE_PREFILL_CTAS");
  unsetenv("MXMOE_PREFILL_TOKEN_TILE");
  unsetenv("MXMOE_DECODE_BLOCKS");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto wsh = ws.down();
  // The balanced decode GEMM1: the second part of every cut row group reset its counter.
  if (sc.x_fp8 && cd::use_balanced(M)) {
    ASSERT_TRUE(L.balanced);
    ASSERT_NE(L.balanced_count, 0u);
    for (int i = 0; i < cd::kBalancedSlots; ++i) {
      uint32_t c = 0;
      std::memcpy(&c, wsh.data() + L.balanced_count + 4 * i, 4);
      if (c != 0u) {
        ADD_FAILURE() << "balanced counter " << i << " is " << c;
        break;
      }
    }
  }

  // The expert-ready counters: each local expert's holds GEMM1's row groups times its
  // 8-row tiles exactly (every warp of every tile counted once; GEMM2's blocks waited for
  // that sum), and stays zero where the forward does not use them.
  {
    int count[4] = {0, 0, 0, 0};
    for (int32_t id : routing.ids)
      if (id >= 4) ++count[id - 4];
    cudaDeviceProp prop{};
    int dev = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
    const bool used =
        !prefill_expected(M, sc.decode_only) &&
        cd::use_expert_ready(cd::ReadyMode::kDecode, prop.major >= 9 && !pdl_knob_off(), M,
                             cd::plan_fast(M, sc.x_fp8, K / 32, cd::FastGemm::kGemm1).ok,
                             cd::plan_fast(M, sc.mid_fp8, N / 32, cd::FastGemm::kGemm2).ok);
    for (int e = 0; e < 4; ++e) {
      uint32_t c = 0;
      std::memcpy(&c, wsh.data() + L.expert_ready + 4 * e, 4);
      EXPECT_EQ(c, used ? cd::expert_ready_target(static_cast<int>(2 * N / 64), count[e]) : 0u)
          << "expert-ready counter of local expert " << e << " (" << count[e] << " rows)";
    }
  }

  // Prefill path (sm_90): x staged exactly, or flagged and run on the generic path.
  const bool prefill = prefill_expected(M, sc.decode_only);
  if (prefill) {
    uint32_t inexact = 0;
    std::memcpy(&inexact, wsh.data() + L.inexact, 4);
    EXPECT_EQ(inexact & cd::kInexactX, sc.tiny_block ? cd::kInexactX : 0u) << "x inexact bit";
    // The split tail (wgmma_mx.cuh pf_plan): every split tile's last part reset its
    // counter, and GEMM1's last claim the item counter (pf_claim), so GEMM2 and the
    // next forward find them at zero; and whether this case's GEMMs split (the
    // same function on the device counts).
    for (int i = 0; i <= cd::kPfSplitTiles; ++i) {
      uint32_t c = 0;
      std::memcpy(&c, wsh.data() + L.inexact + 4 * (1 + i), 4);
      EXPECT_EQ(c, 0u) << (i < cd::kPfSplitTiles ? "split counter " : "item counter ") << i;
    }
    int count[4];
    std::memcpy(count, wsh.data() + L.counts, sizeof count);  // i32 per local expert
    // (GEMM2 runs generic when GEMM1 did, or when the intermediate could not be staged.)
    if (!sc.tiny_block)
      g_split_launches += cd::pf_split(cd::prefill_claims(true, tile), prefill_tiles(count, tile, 2 * N), ctas, k_chunks(K), tile).parts > 1;
    if (!sc.tiny_block && !sc.tiny_mid && !sc.huge_mid)
      g_split_launches += cd::pf_split(cd::prefill_claims(false, tile), prefill_tiles(count, tile, K), ctas, k_chunks(N), tile).parts > 1;
    // The staged x rows and their range factors, bit for bit against stage_row_model.
    const int64_t Kp = (K + 63) / 64 * 64;
    int64_t stage_bad = 0;
    for (int64_t t = 0; t < M && !sc.tiny_block; ++t) {
      const StagedRow want = stage_row_model(sc.x_fp8 ? &xc[t * K] : nullptr, sc.x_fp8 ? &xs[t * K / 32] : nullptr,
                                             sc.x_fp8 ? nullptr : &xb[t * K], K, Kp);
      float back = 0.0f;
      std::memcpy(&back, wsh.data() + L.xb_back + t * 4, 4);
      if (back != want.back && stage_bad++ < 3)
        ADD_FAILURE() << "staged x token " << t << " range factor " << back << " vs " << want.back;
      for (int64_t c = 0; c < Kp; ++c) {
        uint16_t got;
        std::memcpy(&got, wsh.data() + L.xb + (t * Kp + c) * 2, 2);
        if (got != want.bf16[c] && stage_bad++ < 3)
          ADD_FAILURE() << "staged x token " << t << " col " << c << ": " << got << " vs " << want.bf16[c];
      }
    }
    EXPECT_EQ(stage_bad, 0);
    // GEMM1's prefill epilogue writes the intermediate only as GEMM2's staged rows (checked
    // below), or sets the bit where those cannot hold it (tiny_mid); then, as after an
    // inexact x (tiny_block), the generic GEMM1 writes the intermediate and GEMM2 runs generic.
    EXPECT_EQ(inexact & cd::kInexactInter, sc.tiny_block || sc.tiny_mid || sc.huge_mid ? cd::kInexactInter : 0u)
        << "intermediate inexact bit";
  }

  // Where GEMM1 left the intermediate: in GEMM2's staged BF16 rows (prefill path: the
  // staging layout, stage_row_model, with range factor 1), or as MXFP8 / BF16 rows.
  const bool staged_mid = prefill && !sc.tiny_block && !sc.tiny_mid && !sc.huge_mid;
  const int64_t Np = (N + 63) / 64 * 64;
  int staged_pos[32];  // position of element i in a staged block
  for (int o = 0; o < 32; ++o) staged_pos[staged_source(o)] = o;
  auto staged_bits = [&](int64_t row, int64_t n) {
    uint16_t b;
    std::memcpy(&b, wsh.data() + L.ib + (row * Np + n / 32 * 32 + staged_pos[n % 32]) * 2, 2);
    return b;
  };

  // CPU: rows per local expert in (token, slot) order.
  const int el = 4;
  std::vector<std::vector<int64_t>> rows(el);
  for (int64_t p = 0; p < M * k; ++p)
    if (routing.ids[p] >= 4) rows[routing.ids[p] - 4].push_back(p);
  int64_t row = 0, bad = 0;
  for (int e = 0; e < el; ++e)
    for (int64_t p : rows[e]) {
      const std::vector<float> h = stage_activation(sc, d, e, p / k);
      if (staged_mid) {
        // The staged row of this intermediate, bit for bit (NaN as NaN), padding included.
        std::vector<uint8_t> codes(N), scale(N / 32);
        std::vector<uint16_t> b16(N);
        for (int64_t b = 0; b < N / 32; ++b) fmt::quantize_block_e4m3(h.data() + b * 32, &codes[b * 32], &scale[b]);
        for (int64_t n = 0; n < N; ++n) b16[n] = fmt::float_to_bf16(h[n]);
        const StagedRow want = stage_row_model(sc.mid_fp8 ? codes.data() : nullptr,
                                               sc.mid_fp8 ? scale.data() : nullptr, b16.data(), N, Np);
        EXPECT_TRUE(want.exact && want.back == 1.0f) << "row " << row << ": the case needs the generic path";
        for (int64_t o = 0; o < Np; ++o) {
          uint16_t got;
          std::memcpy(&got, wsh.data() + L.ib + (row * Np + o) * 2, 2);
          const uint16_t w16 = want.bf16[o];
          const bool same = fmt::is_nan(fmt::bf16_to_float(w16)) ? fmt::is_nan(fmt::bf16_to_float(got)) : got == w16;
          if (!same && bad++ < 3)
            ADD_FAILURE() << "staged intermediate row " << row << " position " << o << ": 0x" << std::hex << got
                          << " vs 0x" << w16;
        }
        ++row;
        continue;
      }
      for (int64_t b = 0; b < N / 32; ++b) {
        if (sc.mid_fp8) {
          uint8_t c[32], s;
          fmt::quantize_block_e4m3(h.data() + b * 32, c, &s);
          const uint8_t* gc = wsh.data() + L.inter + row * N + b * 32;
          const uint8_t gs = wsh[L.inter_scale + row * (N / 32) + b];
          if (gs != s || std::memcmp(gc, c, 32) != 0)
            if (bad++ < 3) ADD_FAILURE() << "row " << row << " block " << b << " scale " << int(gs) << " vs " << int(s);
        } else {
          for (int i = 0; i < 32; ++i) {
            uint16_t g;
            std::memcpy(&g, wsh.data() + L.inter + (row * N + b * 32 + i) * 2, 2);
            if (g != fmt::float_to_bf16(h[b * 32 + i]))
              if (bad++ < 3) ADD_FAILURE() << "row " << row << " col " << b * 32 + i << " gpu " << fmt::bf16_to_float(g) << " cpu " << h[b * 32 + i];
          }
        }
      }
      ++row;
    }
  EXPECT_EQ(bad, 0);

  // GEMM2 of the same forward, from the GPU's own intermediate, in float64: the prefill
  // and the other paths sum in fp32 in their own order, so this bound is relative to the
  // sum of |terms| (a wrong row, column or K permutation errs by O(1) of it).
  int64_t y_bad = 0;
  row = 0;
  // (Split GEMM2 leaves partials: its own test below. huge_mid's y overflows fp32.)
  if (L.gemm2_splits == 1 && !sc.huge_mid)
  for (int e = 0; e < el; ++e)
    for (size_t i = 0; i < rows[e].size(); ++i, ++row)
      for (int64_t c = 0; c < K; ++c) {
        double ref = sc.bias ? w.w2_bias[e * K + c] : 0.0, mag = std::fabs(ref);
        for (int64_t n = 0; n < N; ++n) {
          double h;
          if (staged_mid) {
            h = fmt::bf16_to_float(staged_bits(row, n));
          } else if (sc.mid_fp8) {
            h = fmt::dequant_e4m3(wsh[L.inter + row * N + n], wsh[L.inter_scale + row * (N / 32) + n / 32]);
          } else {
            uint16_t b;
            std::memcpy(&b, wsh.data() + L.inter + (row * N + n) * 2, 2);
            h = fmt::bf16_to_float(b);
          }
          const double term = h * w_value(w.w2_packed, w.w2_scale, e * K + c, n, N);
          ref += term;
          mag += std::fabs(term);
        }
        float got;
        std::memcpy(&got, wsh.data() + L.y + (row * K + c) * 4, 4);
        if (!(std::fabs(got - ref) <= 1e-6 * mag + 1e-30) && y_bad++ < 3)
          ADD_FAILURE() << "GEMM2 row " << row << " col " << c << ": " << got << " vs " << ref;
      }
  EXPECT_EQ(y_bad, 0);
}

// Host only (no GPU): the balanced decode GEMM1's partition (heuristics.h). Every chunk
// of every unit is taken by exactly one warp; a warp's range is empty or at least one
// row group long, so a row group has at most two parts, and the two parts' warps agree
// on a slot (the first part's warp index) that no other cut row group uses at the same
// time (with more units than blocks a block reuses its slots one unit after another).
TEST(Balanced, PartitionCoversEveryChunkOnceAndCutsRowGroupsAtMostOnce) {
  for (int units : {1, 2, 3, 7, 28, 44, 100})
    for (int blocks : {1, 2, 5, 27, 96, 660})
      for (int rg : {1, 2, 5, 6, 96})
        for (int kc : {1, 3, 56}) {
          SCOPED_TRACE(testing::Message() << "units " << units << " blocks " << blocks << " rg " << rg << " kc " << kc);
          std::vector<int> taken(static_cast<size_t>(units) * rg * kc, 0);
          std::map<std::pair<int, int>, int> part0_slot, part1_slot;  // (unit, rg) -> slot
          std::map<int, std::set<int>> units_of_slot;
          for (int b = 0; b < blocks; ++b) {
            const cd::BalancedBlock bb = cd::balanced_block(units, blocks, rg, b);
            if (bb.unit < 0) continue;
            ASSERT_LE(bb.blocks, (rg + cd::kFastWarps - 1) / cd::kFastWarps);
            ASSERT_LT(bb.index, bb.blocks);
            for (int u = bb.unit; u < units; u += bb.unit_stride)
              for (int w = 0; w < cd::kFastWarps; ++w) {
                const int wi = cd::kFastWarps * bb.index + w;
                int lo = 0, hi = 0;
                cd::balanced_range(rg, kc, bb.blocks, wi, &lo, &hi);
                if (lo == hi) continue;
                ASSERT_GE(hi - lo, kc);
                ASSERT_LT(bb.first_slot + wi, cd::kFastWarps * blocks);
                for (int c = lo; c < hi; ++c) ++taken[(static_cast<size_t>(u) * rg) * kc + c];
                const int r0 = static_cast<int>(lo / kc), r1 = static_cast<int>((hi - 1) / kc);
                if (lo % kc != 0) {  // part 1 of row group r0: the previous warp's slot
                  ASSERT_EQ(part1_slot.count({u, r0}), 0u);
                  part1_slot[{u, r0}] = bb.first_slot + wi - 1;
                }
                if (hi % kc != 0) {  // part 0 of row group r1: this warp's slot
                  ASSERT_EQ(part0_slot.count({u, r1}), 0u);
                  part0_slot[{u, r1}] = bb.first_slot + wi;
                  units_of_slot[bb.first_slot + wi].insert(u);
                }
              }
          }
          for (size_t i = 0; i < taken.size(); ++i) ASSERT_EQ(taken[i], 1) << "chunk " << i;
          ASSERT_EQ(part0_slot.size(), part1_slot.size());
          for (const auto& [key, slot] : part0_slot) {
            ASSERT_EQ(part1_slot.count(key), 1u) << "unit " << key.first << " rg " << key.second;
            EXPECT_EQ(part1_slot[key], slot) << "unit " << key.first << " rg " << key.second;
          }
          // A slot serves one cut row group; several units only when blocks loop over
          // units (one block's, in turn, a block barrier apart).
          for (const auto& [slot, us] : units_of_slot)
            if (units <= blocks) EXPECT_EQ(us.size(), 1u) << "slot " << slot;
        }
}

// The balanced decode GEMM1 (2..32 tokens) on grids small enough that row groups (5-10
// per unit here) are cut between warps. With stage_routing's local rows (M=8: 3, 2, 0, 5
// per local expert; M=5: 2, 0, 0, 4; M=3: 2, 0, 0, 1; M=6: 1, 6, 0, 2; M=28: 14, 9, 0,
// 8; M=24: 10, 7, 0, 7): 4 blocks for 3 units (K % 64 == 32); one block looping over 2
// units (biases); 3 blocks for 2 units, one unit's 2 blocks cutting nothing beside one
// block that cuts (BF16 intermediate); 3 blocks for 3 units of 5 row groups; then the
// decode path above kPrefillMinTokens (MXMOE_PREFILL=0) with experts of two units: 3
// blocks looping over 5 units, and 9 blocks for 4 units of 10 row groups (biases). Run
// by the Gemm1Act test below; the next test checks on the host that they cut, loop and
// hold experts of several units.
const StageCase kBalancedCases[] = {
    {Activation::SiTU, true, true, false, 8, 160, 192, false, 0, 0, false, 0, false, 4},
    {Activation::SwiGLU_OAI, true, true, true, 5, 288, 192, false, 0, 0, false, 0, false, 1},
    {Activation::SiLU_Gated, true, false, false, 3, 160, 192, false, 0, 0, false, 0, false, 3},
    {Activation::SiTU, true, true, false, 6, 224, 160, false, 0, 0, false, 0, false, 3},
    {Activation::SiTU, true, true, false, 28, 160, 192, false, 0, 0, true, 0, false, 3},
    {Activation::SwiGLU_OAI, true, true, true, 24, 224, 320, false, 0, 0, true, 0, false, 9},
};

// Host only (no GPU): the cases above exercise what they are for.
TEST(Balanced, StageCasesCutRowGroupsAndLoopOverUnits) {
  bool loops = false, multi_unit = false;
  for (const auto& c : kBalancedCases) {
    const BalancedUse use = balanced_use(stage_routing(c.M), c.decode_blocks, c.K, c.N);
    EXPECT_GT(use.cuts, 0) << "M " << c.M << ": no row group cut";
    loops = loops || use.loops;
    multi_unit = multi_unit || use.multi_unit;
  }
  EXPECT_TRUE(loops) << "no case makes blocks loop over units";
  EXPECT_TRUE(multi_unit) << "no case has an expert of several units (more than 8 rows)";
}

// Host only (no GPU): the huge_mid stage cases below put ±Inf beside finite values in
// intermediate blocks, and the inf_mid ones ±Inf beside zeros only, so their GPU runs
// test the saturation they are for.
TEST(Gemm1Act, HugeMidStageCasesHoldInfBesideFiniteValues) {
  for (int64_t M : {8, 150})
    for (bool inf_only : {false, true}) {
      StageCase sc{Activation::SiLU_Gated, true, true, false, M, 128, 64};
      (inf_only ? sc.inf_mid : sc.huge_mid) = true;
      const InfBlocks n = stage_inf_blocks(sc, make_stage_data(sc));
      std::printf("[%s] M=%lld: intermediate blocks with Inf and finite values %lld, Inf and zeros only %lld\n",
                  inf_only ? "inf_mid" : "huge_mid", static_cast<long long>(M), static_cast<long long>(n.mixed),
                  static_cast<long long>(n.inf_only));
      if (inf_only) {
        EXPECT_GT(n.inf_only, 0) << "M=" << M;
        EXPECT_EQ(n.mixed, 0) << "M=" << M << ": a finite value would set a block's scale past the staged rows' range";
      } else {
        EXPECT_GT(n.mixed, 0) << "M=" << M;
      }
    }
}

TEST(Gemm1Act, ExactGridBitExactAllActivationsFormatsTilesAndTails) {
  REQUIRE_GPU();
  const StageCase cases[] = {
      {Activation::SiTU, true, true, false, 8, 128, 64},      // decode tile (NT=1)
      {Activation::SiTU, true, true, false, 12, 160, 64},     // balanced decode at 12 tokens
      // The decode path at 20 tokens (local rows 8, 11, 0, 8): 8-row units, the expert of
      // 11 rows as two (balanced kernel), K % 64 == 32.
      {Activation::SiTU, true, true, false, 20, 96, 96, false, 0, 0, true},
      // Block-diagonal decode (warp_mma_diag) for experts of 1, 2 and 3-4 rows: a partial
      // cycle (5 and 9 MX blocks), K % 64 == 32 with biases, BF16 intermediate.
      {Activation::SiTU, true, true, false, 1, 160, 64},
      {Activation::SwiGLU_OAI, true, true, true, 2, 96, 96},
      {Activation::SiTU, true, false, false, 3, 288, 64},
      // Above 32 tokens (decode path; stage_routing's local rows at M=40: 20, 18, 0, 17):
      // the 16-row kernel serving experts of 6 and 12 rows (8-row, diagonal and 16-row
      // bodies) beside the 32-row class; then biases, every expert in the 32-row class.
      {Activation::SiTU, true, true, false, 40, 128, 64, false, 0, 0, true, 0, false, 0, true},
      {Activation::SwiGLU_OAI, true, true, true, 40, 128, 96, false, 0, 0, true},
      {Activation::SiLU_Gated, false, false, false, 5, 64, 64},
      {Activation::SiTU, false, true, false, 33, 160, 64},
      {Activation::SwiGLU_OAI, true, false, true, 2, 96, 32},
      // Prefill path on sm_90 (M >= kPrefillMinTokens): several token tiles, a row block
      // with missing row groups (N 96: 3 of 4), K % 64 == 32, BF16 x and intermediate,
      // and a token whose x block is not exact in BF16 (generic fallback).
      {Activation::SiTU, true, true, false, 300, 128, 64},
      {Activation::SwiGLU_OAI, true, true, true, 160, 96, 96},
      {Activation::SiLU_Gated, false, false, false, 140, 64, 160},
      {Activation::SiTU, false, true, false, 129, 192, 64},
      {Activation::SiTU, true, false, false, 150, 128, 64, true},
      // An intermediate too small for the staged rows (SiLU-gated, g * u / 2 ~ 2^-116: block
      // amax under 2^-109, i.e. scale byte < 10; a few values are fp32 subnormals):
      // the prefill GEMM1 flags it, the generic GEMM1 writes it, GEMM2 runs generic.
      {Activation::SiLU_Gated, true, true, false, 150, 128, 64, false, 0, 0, false, 0, true},
      // Intermediate blocks holding ±Inf beside finite values (SiLU-gated g * u past fp32):
      // the Inf saturates at the finite values' scale, on the decode kernels (8 tokens; 150
      // with the prefill path off) and on the generic GEMM1 after the prefill epilogue
      // flags the blocks (scale bytes past the staged rows' range).
      {Activation::SiLU_Gated, true, true, false, 8, 128, 64, false, 0, 0, false, 0, false, 0, false, true},
      {Activation::SiLU_Gated, true, true, false, 150, 128, 64, false, 0, 0, true, 0, false, 0, false, true},
      {Activation::SiLU_Gated, true, true, false, 150, 128, 64, false, 0, 0, false, 0, false, 0, false, true},
      // Blocks of ±Inf and zeros only (amax 0, byte 0): saturated to ±448 * 2^-127, which
      // the prefill epilogue stages for GEMM2 (its multiplier 2^-127, not 0); decode too.
      {Activation::SiLU_Gated, true, true, false, 8, 128, 64, false, 0, 0, false, 0, false, 0, false, false, true},
      {Activation::SiLU_Gated, true, true, false, 150, 128, 64, false, 0, 0, false, 0, false, 0, false, false, true},
      // 2 and 3 CTAs over 8-16 tiles of 18-28 chunks (more than the ring holds): both
      // consumers' turns and the ring's wrap-around inside and across tiles.
      {Activation::SiTU, true, true, false, 300, 1152, 64, false, 2},
      {Activation::SwiGLU_OAI, true, true, true, 260, 1792, 128, false, 3},
      // The 32- and 64-token tiles (wgmma N 32 / 64, fewer producer rows, fewer epilogue
      // token blocks): the same coverage, every expert holding several of those tiles.
      {Activation::SiTU, true, true, false, 300, 128, 64, false, 0, 32},
      {Activation::SwiGLU_OAI, true, true, true, 160, 96, 96, false, 0, 64},
      {Activation::SiLU_Gated, false, false, false, 140, 64, 160, false, 0, 32},
      {Activation::SiTU, false, true, false, 129, 192, 64, false, 0, 64},
      {Activation::SiTU, true, false, false, 150, 128, 64, true, 0, 32},
      {Activation::SiTU, true, true, false, 300, 1152, 64, false, 2, 64},
      {Activation::SwiGLU_OAI, true, true, true, 260, 1792, 128, false, 3, 32},
      // The 96-token tile (wgmma N 96, 6 producer rows per thread, 12 epilogue token
      // blocks, GEMM2's B rows by TMA boxes of 96): the same coverage.
      {Activation::SiTU, true, true, false, 300, 128, 64, false, 0, 96},
      {Activation::SwiGLU_OAI, true, true, true, 160, 96, 96, false, 0, 96},
      {Activation::SiLU_Gated, false, false, false, 140, 64, 160, false, 0, 96},
      {Activation::SiTU, false, true, false, 129, 192, 64, false, 0, 96},
      {Activation::SiTU, true, false, false, 150, 128, 64, true, 0, 96},
      {Activation::SiTU, true, true, false, 300, 1152, 64, false, 2, 96},
      {Activation::SwiGLU_OAI, true, true, true, 260, 1792, 128, false, 3, 96},
      // The split tail (wgmma_mx.cuh pf_plan): GEMM1's or GEMM2's last tiles cut into >= 3
      // K ranges whose last part adds the others' sums (uneven ranges, K tail); GEMM1 at
      // the 32-token tile claims its items, so a few CTAs claim several whole tiles each,
      // then the parts.
      {Activation::SiTU, true, true, false, 300, 1152, 512, false, 0, 0, false, 1},
      {Activation::SiTU, false, false, false, 150, 736, 512, false, 0, 32, false, 1},
      {Activation::SwiGLU_OAI, true, true, true, 200, 1024, 736, false, 0, 64, false, 2},
      {Activation::SiTU, true, true, false, 300, 1152, 512, false, 0, 96, false, 1},
      {Activation::SiTU, true, true, false, 200, 1024, 736, false, 0, 96, false, 2},
      {Activation::SiTU, true, true, false, 40, 160, 64},  // the heuristic's own tile at M=40
      {Activation::SiTU, true, true, false, 20, 160, 64},  // prefill from kPrefillMinTokens
  };
  std::vector<StageCase> all(std::begin(cases), std::end(cases));
  all.insert(all.end(), std::begin(kBalancedCases), std::end(kBalancedCases));
  for (const auto& c : all) {
    SCOPED_TRACE(testing::Message() << "act " << static_cast<int>(c.act) << " x_fp8 " << c.x_fp8
                                    << " mid_fp8 " << c.mid_fp8 << " M " << c.M << " K " << c.K
                                    << " N " << c.N << " token tile " << c.token_tile
                                    << " decode blocks " << c.decode_blocks);
    run_gemm1_stage(c);
  }
  if (prefill_expected(300)) {
    EXPECT_GE(g_split_launches, 3) << "the split cases did not split";
    std::printf("[ split    ] %d prefill GEMM launches split their tail\n", g_split_launches);
  }
}

// ---------------------------------------------------------------- GEMM2 (direct launch)

// splits > 1: the decode path's split reduction (partials + range factors, summed here
// in split order as finalize does). flags: pass the load-time special-scale flags (the
// two-op scale conversion for normal groups) instead of none (every group exact-slow).
// special: put a NaN scale byte (0xFF) and a 2^-127 byte (0x00) into two W2 rows.
// rows: the three experts' rows (default tokens / 2, 0, tokens - tokens / 2 + 3).
// wide_row: row 0's first MX block holds zero codes at scale byte 90. Its values are 0, so
// the sums stay on the grid, but its scales span more than stage_b_scales' narrow form
// holds: the tile holding row 0 takes the wide form, the others (above 2 tokens, unsplit:
// heuristics.h gemm2_narrow_b) the narrow one.
void run_gemm2_stage(bool fp8, int64_t tokens, int64_t K, int64_t N, bool bias, int splits = 1,
                     bool flags = false, bool special = false, std::vector<int32_t> rows_of = {},
                     bool wide_row = false) {
  const int el = 3;
  const std::vector<int32_t> counts =
      rows_of.empty() ? std::vector<int32_t>{static_cast<int32_t>(tokens / 2), 0,
                                             static_cast<int32_t>(tokens - tokens / 2 + 3)}
                      : rows_of;
  std::vector<int32_t> offsets = {0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t rows = offsets[3];
  MoeConfig cfg;
  cfg.num_experts = el;
  cfg.top_k = 1;
  cfg.hidden = K;
  cfg.intermediate = N;
  cfg.has_bias = bias;
  ExpertWeights w = exact_grid_weights(cfg, 77 + K);
  if (special) {
    w.w2_scale[(2 * K + 5) * (N / 32) + (N / 32 - 1)] = 0xFF;  // expert 2, column 5: NaN
    for (int64_t b = 0; b < N / 32; ++b)  // expert 0, last column: all 2^-127 (exact sums)
      w.w2_scale[(0 * K + K - 1) * (N / 32) + b] = 0x00;
  }
  std::vector<uint32_t> tp, ts;
  cd::tile_mxfp4(w.w2_packed.data(), w.w2_scale.data(), el, K, N, tp, ts);
  const cd::TiledDims d = cd::tiled_dims(K, N);
  Rng rng(55);
  std::vector<uint8_t> ic(rows * N), isc(rows * N / 32);
  std::vector<uint16_t> ib(rows * N);
  for (int64_t i = 0; i < rows * N; ++i) {
    const int v = static_cast<int>(rng.below(17)) - 8;
    ic[i] = e4m3_of_int(v);
    ib[i] = fmt::float_to_bf16(static_cast<float>(v));
  }
  for (auto& v : isc) v = static_cast<uint8_t>(126 + rng.below(3));
  if (wide_row) {
    isc[0] = 90;
    for (int64_t n = 0; n < 32; ++n) ic[n] = 0, ib[n] = 0;
  }
  Dev<uint32_t> dtp(tp), dts(ts);
  Dev<uint8_t> dic(ic), disc(isc);
  Dev<uint16_t> dib(ib);
  Dev<int32_t> dc(counts), doff(offsets);
  Dev<float> db(bias ? w.w2_bias : std::vector<float>{0.f}), y(rows * K * splits), back(rows);
  Dev<uint8_t> dflags(cd::special_scale_groups(w.w2_scale.data(), el, K, N));
  cudaMemset(y.p, 0xFF, rows * K * splits * 4);
  cd::Gemm2Params p;
  p.w2 = cd::MatView{reinterpret_cast<const uint4*>(dtp.p), dts.p, static_cast<int>(K),
                     static_cast<int>(N), static_cast<int>(d.rg), static_cast<int>(d.kc),
                     flags ? dflags.p : nullptr};
  p.splits = splits;
  p.split_stride = rows * K;
  p.back = splits > 1 ? back.p : nullptr;
  p.bias = bias ? db.p : nullptr;
  p.inter = fp8 ? static_cast<const void*>(dic.p) : static_cast<const void*>(dib.p);
  p.inter_scale = fp8 ? disc.p : nullptr;
  p.inter_fp8 = fp8;
  p.counts = dc.p;
  p.offsets = doff.p;
  p.tokens = tokens;
  p.top_k = 1;
  p.hidden = K;
  p.intermediate = N;
  p.num_local = el;
  p.y = y.p;
  cd::launch_gemm2(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto gy = y.down();
  if (splits > 1) {
    const auto gb = back.down();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < K; ++c) {
        float v = gy[r * K + c];
        for (int sp = 1; sp < splits; ++sp) v = v + gy[sp * rows * K + r * K + c];
        gy[r * K + c] = v * gb[r];
      }
  }
  int64_t bad = 0, nans = 0;
  for (int e = 0; e < el; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int64_t c = 0; c < K; ++c) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double iv = fp8 ? fmt::dequant_e4m3(ic[r * N + n], isc[r * (N / 32) + n / 32])
                                : fmt::bf16_to_float(ib[r * N + n]);
          acc += w_value(w.w2_packed, w.w2_scale, e * K + c, n, N) * iv;
        }
        float want = static_cast<float>(acc);
        if (bias) want = want + w.w2_bias[e * K + c];
        if (std::isnan(want)) {
          ++nans;
          if (!std::isnan(gy[r * K + c]) && bad++ < 3)
            ADD_FAILURE() << "row " << r << " col " << c << " gpu " << gy[r * K + c] << " cpu NaN";
        } else if (fbits(gy[r * K + c]) != fbits(want)) {
          if (bad++ < 3) ADD_FAILURE() << "row " << r << " col " << c << " gpu " << gy[r * K + c] << " cpu " << want;
        }
      }
  EXPECT_EQ(bad, 0);
  // The NaN scale poisons exactly its column (W2 row) for the rows of its expert.
  EXPECT_EQ(nans, special ? counts[2] : 0);
}

TEST(Gemm2, ExactGridBitExactFormatsTilesTailsAndEmptyExpert) {
  REQUIRE_GPU();
  run_gemm2_stage(true, 6, 128, 64, false);   // decode tile
  run_gemm2_stage(true, 12, 128, 160, false); // 8-row tiles, grid z 2 (a 9-row expert), ring wraps
  run_gemm2_stage(true, 20, 96, 96, true);    // grid z 3 (two tiles each), K tail, a slot idle
  run_gemm2_stage(true, 40, 96, 96, true);    // > 32 tokens: NT=4, row tail and K tail, bias
  run_gemm2_stage(false, 7, 64, 128, false);
  run_gemm2_stage(false, 70, 160, 32, true);
}

TEST(Gemm2, DecodeSplitReductionAndScaleFlagsBitExactIncludingSpecialBytes) {
  REQUIRE_GPU();
  run_gemm2_stage(true, 6, 128, 64, false, 1, true);        // two-op scales, no split
  run_gemm2_stage(true, 6, 128, 256, false, 4, true);       // 4 splits of 2 chunks
  run_gemm2_stage(true, 12, 128, 160, false, 2, true);      // grid z 2 x uneven split (3 chunks)
  run_gemm2_stage(true, 20, 96, 96, false, 4, true);        // grid z 3 x 4, K tail, empty splits
  run_gemm2_stage(true, 30, 96, 160, false, 3, true);       // grid z 4 x 3, 18 rows (3 tiles)
  run_gemm2_stage(true, 40, 96, 160, false, 3, true);       // > 32 tokens: NT=4, 3 splits
  run_gemm2_stage(true, 6, 128, 256, false, 4, true, true);  // NaN / 2^-127 bytes: exact path
  run_gemm2_stage(true, 6, 128, 256, false, 1, false, true); // same, no flags at all
  // Block-diagonal decode (warp_mma_diag): experts of 1 and 4 rows (R = 1, 4), of 2 and
  // 5 rows (R = 2); split cycles, partial cycles (5 blocks), K tails, special bytes.
  run_gemm2_stage(true, 2, 128, 256, false, 4, true);        // R=1 and R=4, 4 splits
  run_gemm2_stage(true, 4, 96, 160, false, 1, true);         // R=2, 5 blocks
  run_gemm2_stage(true, 4, 96, 96, false, 2, true);          // R=2, K tail, 2 splits
  run_gemm2_stage(true, 2, 128, 256, false, 4, true, true);  // NaN / 2^-127 bytes, R=1/4
  run_gemm2_stage(true, 2, 64, 288, true);                   // R=1 and R=4, bias, 9 blocks
  // One token: the one-row kernel (heuristics.h gemm2_one_row) takes an expert's rows one
  // at a time (more than one only when a token names an expert twice): 4 rows over 3
  // uneven splits; 1 and 2 rows unsplit with a K tail; special bytes; a bias.
  run_gemm2_stage(true, 1, 128, 256, false, 3, true);        // rows 0, 0, 4
  run_gemm2_stage(true, 1, 96, 160, false, 1, true, false, {1, 0, 2});
  run_gemm2_stage(true, 1, 128, 256, false, 3, true, true, {1, 0, 2});
  run_gemm2_stage(true, 1, 128, 256, false, 1, false, true, {2, 1, 1});
  run_gemm2_stage(true, 1, 64, 288, true, 1, false, false, {1, 1, 1});
  // Above 32 tokens the 16-row kernel also runs the experts of <= 8 rows: 4 rows (diagonal
  // R=4), 8 rows and 12 beside an empty 32-row class launch; then 8 and 12 rows beside 24
  // in the 32-row class.
  run_gemm2_stage(true, 40, 128, 160, false, 1, true, false, {4, 8, 12});
  run_gemm2_stage(true, 40, 96, 128, false, 2, true, false, {8, 12, 24});
  // At 9..32 tokens 8-row tiles only: experts of 4 and 8 rows (a grid z slot idle), and
  // 8 and 12 rows over grid z 3 with 2 splits.
  run_gemm2_stage(true, 9, 128, 160, false, 1, true);
  run_gemm2_stage(true, 17, 96, 128, false, 2, true);
  // The narrow B form (12 tokens, unsplit: rows 6, 0, 9) beside the wide one in the same
  // kernel: expert 0's 6-row tile holds the wide row 0, expert 2's 8-row tile is narrow.
  run_gemm2_stage(true, 12, 128, 160, false, 1, true, false, {}, true);
}

// GEMM2's unsplit decode grid under the expert-ready counters keeps at most
// kGemm2ReadyBlocksPerSm blocks per SM (heuristics.h gemm2_ready_capped), at Kimi-K3's
// intermediate size; without the counters, or split, it keeps the ring's own occupancy.
TEST(Gemm2, ReadyGridHoldsAtMostItsBlocksPerSm) {
  REQUIRE_GPU();
  uint32_t counter = 0;  // only its presence matters here
  cd::Gemm2Params p;
  p.intermediate = 3072;
  p.tokens = 8;
  p.splits = 1;
  p.expert_ready = &counter;
  EXPECT_EQ(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2ReadyBlocksPerSm);
  p.tokens = 12;  // the narrow B form's kernel
  EXPECT_EQ(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2ReadyBlocksPerSm);
  p.expert_ready = nullptr;
  EXPECT_GT(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2ReadyBlocksPerSm);
  p.expert_ready = &counter;
  p.tokens = 4;
  p.splits = 2;
  EXPECT_GT(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2ReadyBlocksPerSm);
}

// At one token GEMM2's one-row kernel fits kGemm2OneRowBlocksPerSm blocks per SM at
// Kimi-K3's intermediate size (registers and shared memory), so that every block of its
// 3 splits is resident at once on the H200 (heuristics.h gemm2_one_row, gemm2_splits).
TEST(Gemm2, OneRowKernelHoldsItsBlocksPerSm) {
  REQUIRE_GPU();
  int dev = 0, sm_bytes = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), cudaSuccess);
  if (sm_bytes < 228 * 1024)
    GTEST_SKIP() << "the 6 blocks per SM need Hopper's 228 KB of shared memory per SM; this GPU has "
                 << sm_bytes / 1024 << " KB";
  uint32_t counter = 0;
  cd::Gemm2Params p;
  p.intermediate = 3072;
  p.tokens = 1;
  p.splits = cd::gemm2_splits(1, true, false);
  p.expert_ready = &counter;
  EXPECT_EQ(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2OneRowBlocksPerSm);
  p.expert_ready = nullptr;
  EXPECT_EQ(cd::gemm2_decode_blocks_per_sm(p), cd::kGemm2OneRowBlocksPerSm);
}

// Issue 4: the decode kernels (on Hopper the path below 16 tokens, heuristics.h
// use_prefill) keep nothing in local memory (no spills, no stack): every class,
// activation and intermediate format that launch_gemm1 / launch_gemm2 can pick, as this
// binary compiled them (ptxas's figure, read back through the runtime).
TEST(DecodeKernels, KeepNothingInLocalMemory) {
  REQUIRE_GPU();
  EXPECT_EQ(cd::gemm1_decode_local_bytes(), 0u);
  EXPECT_EQ(cd::gemm2_decode_local_bytes(), 0u);
}

// Issue 4 as well: from 16 tokens the exact prefill path runs (its 32-token tile takes
// 16..54), and its kernels keep nothing in local memory for Kimi-K3's activation (SiTU
// at alpha 4, the kind layer.cu resolves when every local expert has alpha 4), SiTU of
// mixed alphas and SiLU-gated, every tile and intermediate format; GEMM2's neither.
// SwiGLU-OAI (kind 1) and SiTU at one other alpha (kind 4) still keep 4 / 16 bytes in
// the 32-token tile with an MXFP8 intermediate (PERFORMANCE.md session 59).
TEST(PrefillKernels, KeepNothingInLocalMemory) {
  REQUIRE_GPU();
  if (!cd::prefill_kernels_available()) GTEST_SKIP() << "the exact prefill kernels are built for sm_90a only";
  for (int kind : {0, 2, am::kActSituAlpha4}) EXPECT_EQ(cd::gemm1_prefill_local_bytes(kind), 0u) << "kind " << kind;
  EXPECT_EQ(cd::gemm2_prefill_local_bytes(), 0u);
}

// Stage timings on Kimi-K3 decode shapes (E_local 28, K 3584, N 3072, top-16) with
// synthetic weights (all scale bytes normal). Not a check: run on the device with
//   test_engine --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing*'
// to see how the forward's time splits between GEMM1, GEMM2 (unsplit and split) and
// finalize.
TEST(DISABLED_Timing, KimiDecodeStages) {
  REQUIRE_GPU();
  const int el = 28, k = 16;
  const int64_t K = 3584, N = 3072;
  const cd::TiledDims d13 = cd::tiled_dims(2 * N, K), d2 = cd::tiled_dims(K, N);
  Dev<uint32_t> w13p(el * d13.u32_per_expert()), w13s(el * d13.scale_u32_per_expert());
  Dev<uint32_t> w2p(el * d2.u32_per_expert()), w2s(el * d2.scale_u32_per_expert());
  cudaMemset(w13p.p, 0x5A, w13p.n * 4);
  cudaMemset(w2p.p, 0x3C, w2p.n * 4);
  cudaMemset(w13s.p, 0x7E, w13s.n * 4);
  cudaMemset(w2s.p, 0x7F, w2s.n * 4);
  Dev<uint8_t> f13(std::vector<uint8_t>(el * d13.rg, 0)), f2(std::vector<uint8_t>(el * d2.rg, 0));
  std::vector<float> ones(el, 1.0f);
  Dev<float> alpha(ones), beta(ones), limit(ones);
  for (int64_t M : {1, 2, 4, 8, 16, 32}) {
    const int64_t pairs = M * k;
    std::vector<int32_t> counts(el, 0), offsets(el + 1, 0), row_map(pairs);
    // Token t's 16 experts: (t * 5 + j) % 28 (distinct for one token); rows by expert.
    std::vector<std::vector<int32_t>> by(el);
    for (int64_t t = 0; t < M; ++t)
      for (int j = 0; j < k; ++j) by[(t * 5 + j) % el].push_back(static_cast<int32_t>(t * k + j));
    int32_t r = 0;
    for (int e = 0; e < el; ++e) {
      counts[e] = static_cast<int32_t>(by[e].size());
      offsets[e] = r;
      for (int32_t pr : by[e]) row_map[r++] = pr;
    }
    offsets[el] = r;
    int used = 0;
    for (int e = 0; e < el; ++e) used += counts[e] > 0;
    Rng rng(5 + M);
    std::vector<uint8_t> xc(M * K), xs(M * K / 32, 127);
    for (auto& v : xc) v = e4m3_of_int(static_cast<int>(rng.below(17)) - 8);
    Dev<uint8_t> dx(xc), dxs(xs), inter(pairs * N), inter_s(pairs * N / 32);
    Dev<int32_t> dc(counts), doff(offsets), drm(row_map);
    Dev<float> y(pairs * K * 4), back(pairs);
    cd::Gemm1Params g1;
    g1.w13 = cd::MatView{reinterpret_cast<const uint4*>(w13p.p), w13s.p, static_cast<int>(2 * N),
                         static_cast<int>(K), static_cast<int>(d13.rg), static_cast<int>(d13.kc), f13.p};
    g1.activation = static_cast<int>(Activation::SiLU_Gated);
    g1.alpha = alpha.p;
    g1.beta = beta.p;
    g1.limit = limit.p;
    g1.x = dx.p;
    g1.x_scale = dxs.p;
    g1.x_fp8 = true;
    g1.counts = dc.p;
    g1.offsets = doff.p;
    g1.row_map = drm.p;
    g1.tokens = M;
    g1.top_k = k;
    g1.hidden = K;
    g1.intermediate = N;
    g1.num_local = el;
    g1.inter = inter.p;
    g1.inter_scale = inter_s.p;
    g1.inter_fp8 = true;
    // The balanced kernel's slots (2..32 tokens); its counters start at zero and every
    // launch leaves them there.
    Dev<float> split_acc(cd::kBalancedAccBytes / sizeof(float));
    Dev<uint32_t> split_count(std::vector<uint32_t>(cd::kBalancedSlots, 0u));
    g1.split_acc = split_acc.p;
    g1.split_count = split_count.p;
    cd::Gemm2Params g2;
    g2.w2 = cd::MatView{reinterpret_cast<const uint4*>(w2p.p), w2s.p, static_cast<int>(K),
                        static_cast<int>(N), static_cast<int>(d2.rg), static_cast<int>(d2.kc), f2.p};
    g2.inter = inter.p;
    g2.inter_scale = inter_s.p;
    g2.inter_fp8 = true;
    g2.counts = dc.p;
    g2.offsets = doff.p;
    g2.tokens = M;
    g2.top_k = k;
    g2.hidden = K;
    g2.intermediate = N;
    g2.num_local = el;
    g2.y = y.p;
    g2.split_stride = pairs * K;
    g2.back = back.p;
    cudaEvent_t a0, a1;
    cudaEventCreate(&a0);
    cudaEventCreate(&a1);
    auto time_us = [&](auto&& fn) {
      std::vector<float> v;
      for (int i = 0; i < 23; ++i) {
        cudaEventRecord(a0);
        fn();
        cudaEventRecord(a1);
        cudaEventSynchronize(a1);
        float ms = 0;
        cudaEventElapsedTime(&ms, a0, a1);
        if (i >= 3) v.push_back(ms * 1000.0f);
      }
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double b1 = used * (d13.u32_per_expert() + d13.scale_u32_per_expert()) * 4.0;
    const double b2 = used * (d2.u32_per_expert() + d2.scale_u32_per_expert()) * 4.0;
    const float t1 = time_us([&] { cd::launch_gemm1(g1, nullptr); });
    std::printf("[timing] M=%lld experts=%d gemm1 %.1f us (%.2f TB/s)\n", static_cast<long long>(M),
                used, t1, b1 / t1 * 1e-6);
    for (int sp : {1, 2, 4}) {
      g2.splits = sp;
      const float t2 = time_us([&] { cd::launch_gemm2(g2, nullptr); });
      std::printf("[timing] M=%lld gemm2 splits=%d %.1f us (%.2f TB/s)\n", static_cast<long long>(M),
                  sp, t2, b2 / t2 * 1e-6);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaEventDestroy(a0);
    cudaEventDestroy(a1);
  }
}

// ---------------------------------------------------------------- finalize

TEST(Finalize, SlotOrderFmaChainBitExactBf16AndFp32) {
  REQUIRE_GPU();
  // K = 300 with aligned outputs takes the 16-byte column kernel (fp32 y); K = 304 that
  // kernel for a BF16 y too (FinalizeParams::y_bf16, 8 columns a thread); K = 301, a BF16
  // y at K = 300, or an output one element off alignment, the one-column kernel; k = 17
  // runs two slot batches.
  struct Shape {
    int64_t K, k, out_offset;
  };
  const Shape shapes[] = {{300, 5, 0}, {301, 17, 0}, {300, 5, 1}, {304, 16, 0}, {304, 17, 1}};
  for (int run = 0; run < 2 * 5; ++run) {
    const Shape sh = shapes[run / 2];
    const bool bf16_y = run % 2 == 1;
    SCOPED_TRACE(bf16_y ? "bf16 y" : "fp32 y");
    const int64_t M = 9, k = sh.k, K = sh.K, off = sh.out_offset;
    Rng rng(9 + K + k + off);
    std::vector<int32_t> pair_row(M * k);
    int32_t next = 0;
    for (auto& v : pair_row) v = rng.below(4) == 0 ? -1 : next++;
    for (int64_t j = 0; j < k; ++j) pair_row[3 * k + j] = -1;  // token without local expert
    std::vector<float> y(static_cast<size_t>(next) * K), wts(M * k);
    std::vector<uint16_t> y16(y.size());
    for (size_t i = 0; i < y.size(); ++i) {
      y16[i] = fmt::float_to_bf16(static_cast<float>(rng.normal()));
      // A BF16 y holds exactly y16's values; a fp32 one full floats.
      y[i] = bf16_y ? fmt::bf16_to_float(y16[i]) : static_cast<float>(rng.normal());
    }
    for (auto& v : wts) v = static_cast<float>(rng.uniform());
    Dev<float> dy(y), dw(wts), out32(M * K + off);
    Dev<uint16_t> dy16(y16);
    Dev<int32_t> dpr(pair_row);
    Dev<uint16_t> out16(M * K + off);
    for (bool fp32 : {false, true}) {
      cudaMemset(fp32 ? static_cast<void*>(out32.p) : static_cast<void*>(out16.p), 0xFF,
                 (M * K + off) * (fp32 ? 4 : 2));
      cd::FinalizeParams p;
      p.y = bf16_y ? nullptr : dy.p;
      p.y_bf16 = bf16_y ? dy16.p : nullptr;
      p.pair_row = dpr.p;
      p.weights = dw.p;
      p.tokens = M;
      p.top_k = k;
      p.hidden = K;
      p.output_scale = 1.5f;
      p.out = fp32 ? static_cast<void*>(out32.p + off) : static_cast<void*>(out16.p + off);
      p.out_fp32 = fp32;
      cd::launch_finalize(p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto g32 = out32.down();
      const auto g16 = out16.down();
      for (int64_t t = 0; t < M; ++t)
        for (int64_t c = 0; c < K; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t r = pair_row[t * k + j];
            if (r >= 0) acc = std::fmaf(wts[t * k + j], y[r * K + c], acc);
          }
          acc = acc * 1.5f;
          const int64_t o = off + t * K + c;
          if (fp32) ASSERT_EQ(fbits(g32[o]), fbits(acc)) << K << " " << k << " " << off << ": " << t << "," << c;
          else ASSERT_EQ(g16[o], fmt::float_to_bf16(acc)) << K << " " << k << " " << off << ": " << t << "," << c;
        }
    }
  }
}

// ---------------------------------------------------------------- whole layer

MoeConfig small_cfg(Activation act, InputFormat in, IntermediateFormat mid) {
  MoeConfig cfg;
  cfg.num_experts = 16;
  cfg.top_k = 4;
  cfg.hidden = 256;
  cfg.intermediate = 192;
  cfg.ep_size = 2;
  cfg.ep_rank = 1;
  cfg.activation = act == Activation::SiTU ? ActivationParams::situ()
                   : act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai()
                                                   : ActivationParams::silu_gated();
  cfg.has_bias = act == Activation::SwiGLU_OAI;
  cfg.input_format = in;
  cfg.intermediate_format = mid;
  return cfg;
}

/// The float64 reference on the same inputs (x quantized as the layer does) and its RMS
/// over the finite values (the element bounds' scale).
struct ReferenceOut {
  std::vector<double> values;  // [tokens][hidden]
  int64_t tokens = 0;
  double rms = 0;
};
ReferenceOut reference_of(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x, const Routing& r) {
  Output ref;
  reference_forward(cfg, w, cfg.input_format == InputFormat::MXFP8 ? x.to_mxfp8(cfg.scale_rule) : x, r, ref);
  ReferenceOut out{output_values(ref), x.tokens, 0.0};
  int64_t finite = 0;
  for (double v : out.values)
    if (std::isfinite(v)) {
      out.rms += v * v;
      ++finite;
    }
  out.rms = std::sqrt(out.rms / std::max<int64_t>(finite, 1));
  return out;
}
/// `got` against it, element bounds from tolerance_for(cfg).
Comparison compare_to(const ReferenceOut& ref, const MoeConfig& cfg, const Output& got) {
  const Tolerance tol = tolerance_for(cfg);
  return compare_outputs(output_values(got), ref.values, ref.tokens, cfg.hidden, tol.atol_rms * ref.rms, tol.rtol);
}

void expect_matches_reference(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                              const Routing& r, const Output& got, const char* what) {
  const Tolerance tol = tolerance_for(cfg);
  const Comparison c = compare_to(reference_of(cfg, w, x, r), cfg, got);
  EXPECT_TRUE(c.pass(tol.max_rel_l2, tol.min_cosine) && c.bound_violations == 0)
      << what << ": " << c.summary();
}

TEST(Layer, MatchesReferenceDeterministicAndGraphReplayIdentical) {
  REQUIRE_GPU();
  int seed = 1;
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated})
    for (auto fm : {std::pair{InputFormat::MXFP8, IntermediateFormat::MXFP8},
                    std::pair{InputFormat::BF16, IntermediateFormat::BF16},
                    std::pair{InputFormat::BF16, IntermediateFormat::MXFP8}})
      for (int64_t M : {1, 2, 8, 32, 160}) {  // 160: the prefill path on sm_90
        const MoeConfig cfg = small_cfg(act, fm.first, fm.second);
        SCOPED_TRACE(cfg.describe() + " M=" + std::to_string(M));
        const SyntheticLayer syn = make_synthetic_layer(cfg, 1000 + seed);
        const Activations x = make_activations(M, cfg.hidden, 2000 + seed);
        // Skewed routing onto few experts, one local expert never used, -1 slots.
        const Routing r = random_routing(M, cfg.top_k, {8, 9, 10, 11, 13, 14, 2, 5}, 3000 + seed, true);
        ++seed;
        CudaMoeLayer layer(cfg, syn.weights);
        CudaHostSession s(layer, std::max<int64_t>(32, M));
        // An MXFP8 layer gets BF16 x (quantized on the GPU) or pre-quantized x in turns.
        const Activations xin = (fm.first == InputFormat::MXFP8 && M % 2 == 0) ? x.to_mxfp8() : x;
        s.set_inputs(xin, &r, nullptr);
        const Output o1 = s.run_eager(), o2 = s.run_eager(), o3 = s.run_eager();
        expect_matches_reference(cfg, syn.weights, x, r, o1, "eager");
        EXPECT_TRUE(o1.bf16 == o2.bf16 && o1.bf16 == o3.bf16) << "three eager runs differ";
        const auto g = s.run_graph(2);
        ASSERT_EQ(g.size(), 2u);
        EXPECT_TRUE(g[0].bf16 == o1.bf16 && g[1].bf16 == o1.bf16) << "graph replay differs from eager";
      }
}

// The prefill path's programmatic launches: x staged beside the permutation (one-block
// prologue, block form, cooperative grid; x pre-quantized or quantized in the prologue,
// which the staging then waits for first) and the generic fallbacks dispatched in the
// prefill kernels' tails, against plain launches (MXMOE_PDL=0, read when the layer is
// built): the same bits eager and under graph replay, also when an x block is not exact
// in BF16 and the fallbacks do the work.
TEST(Layer, PrefillProgrammaticLaunchesBitIdenticalToPlainOnes) {
  REQUIRE_GPU();
  const MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 5151);
  CudaMoeLayer pdl(cfg, syn.weights);
  setenv("MXMOE_PDL", "0", 1);
  CudaMoeLayer plain(cfg, syn.weights);
  unsetenv("MXMOE_PDL");
  int seed = 0;
  for (int64_t M : {16, 32, 64, 160, 800})
    for (int form = 0; form < 3; ++form) {  // 0: MXFP8 x, 1: BF16 x quantized on the GPU, 2: a tiny x block
      if (form == 2 && M != 32 && M != 160) continue;
      SCOPED_TRACE("M=" + std::to_string(M) + " form " + std::to_string(form));
      ASSERT_TRUE(prefill_expected(M));
      const Activations x = make_activations(M, cfg.hidden, 5200 + seed);
      const Routing r = random_routing(M, cfg.top_k, {8, 9, 10, 11, 13, 14, 2, 5}, 5300 + seed, true);
      ++seed;
      Activations xin = form == 1 ? x : x.to_mxfp8();
      if (form == 2) xin.scale[3 * cfg.hidden / 32] = 0;  // token 3's first block: int * 2^-127
      std::vector<Output> outs;
      for (CudaMoeLayer* layer : {&pdl, &plain}) {
        CudaHostSession s(*layer, M);
        s.set_inputs(xin, &r, nullptr);
        outs.push_back(s.run_eager());
        const auto g = s.run_graph(2);
        ASSERT_EQ(g.size(), 2u);
        outs.insert(outs.end(), g.begin(), g.end());
      }
      expect_matches_reference(cfg, syn.weights, xin, r, outs[3], "plain launches");
      for (size_t i = 0; i < outs.size(); ++i)
        EXPECT_TRUE(outs[i].bf16 == outs[3].bf16) << "run " << i << " (0-2 programmatic eager / graph, 3-5 plain) differs";
    }
}

// The block permutation's grid (more than 3072 routed pairs: co-resident blocks waiting
// for each other, a cooperative launch) inside a captured graph: the reference's result,
// and the same bits replayed twice as eager.
TEST(Layer, PermutationGridMatchesReferenceUnderGraphReplay) {
  REQUIRE_GPU();
  const MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 4242);
  CudaMoeLayer layer(cfg, syn.weights);
  for (int64_t M : {800, 1500}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    EXPECT_GT(cd::block_permute_plan(M * cfg.top_k, 8, cfg.num_experts, cd::block_permute_coresident()).blocks, 1);
    const Activations x = make_activations(M, cfg.hidden, 4243 + static_cast<int>(M));
    const Routing r = random_routing(M, cfg.top_k, {8, 9, 10, 11, 13, 14, 2, 5}, 4244 + M, true);
    CudaHostSession s(layer, M);
    s.set_inputs(x, &r, nullptr);
    const Output o1 = s.run_eager();
    expect_matches_reference(cfg, syn.weights, x, r, o1, "eager");
    const auto g = s.run_graph(2);
    ASSERT_EQ(g.size(), 2u);
    EXPECT_TRUE(g[0].bf16 == o1.bf16 && g[1].bf16 == o1.bf16) << "graph replay differs from eager";
  }
}

TEST(Layer, GpuRouterMatchesHostRoutedReference) {
  REQUIRE_GPU();
  MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.num_experts = 64;
  cfg.top_k = 6;
  cfg.ep_size = 4;
  cfg.ep_rank = 2;
  cfg.output_format = OutputFormat::FP32;
  RoutingParams rp;
  rp.top_k = 6;
  rp.routed_scaling_factor = 2.0f;
  const SyntheticLayer syn = make_synthetic_layer(cfg, 5);
  const int64_t M = 24;
  const Activations x = make_activations(M, cfg.hidden, 6);
  Rng rng(7);
  std::vector<float> logits(M * cfg.num_experts), bias(cfg.num_experts);
  for (auto& v : logits) v = static_cast<float>(rng.normal());
  for (auto& v : bias) v = static_cast<float>(rng.normal() * 0.1);
  CudaMoeLayer layer(cfg, syn.weights, &rp, &bias);
  CudaHostSession s(layer, M);
  s.set_inputs(x, nullptr, &logits);
  const Output o = s.run_eager();
  const Routing r = route_cpu(logits.data(), M, cfg.num_experts, bias.data(), rp);
  expect_matches_reference(cfg, syn.weights, x, r, o, "gpu router");
  const auto g = s.run_graph(2);
  EXPECT_TRUE(g[0].fp32 == o.fp32 && g[1].fp32 == o.fp32);
}

TEST(Layer, Bf16RouterLogitsEqualTheirFp32WideningBitForBit) {
  REQUIRE_GPU();
  MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.num_experts = 64;
  cfg.top_k = 6;
  cfg.ep_size = 4;
  cfg.ep_rank = 1;
  RoutingParams rp;
  rp.top_k = 6;
  const SyntheticLayer syn = make_synthetic_layer(cfg, 25);
  const int64_t M = 19;
  const Activations x = make_activations(M, cfg.hidden, 26);
  Rng rng(27);
  std::vector<uint16_t> l16(M * cfg.num_experts);
  for (auto& v : l16) v = fmt::float_to_bf16(static_cast<float>(rng.normal()));
  std::vector<float> l32(l16.size()), bias(cfg.num_experts);
  for (size_t i = 0; i < l16.size(); ++i) l32[i] = fmt::bf16_to_float(l16[i]);
  for (auto& v : bias) v = static_cast<float>(rng.normal() * 0.1);
  CudaMoeLayer layer(cfg, syn.weights, &rp, &bias);
  CudaHostSession wide(layer, M), narrow(layer, M);
  wide.set_inputs(x, nullptr, &l32);
  narrow.set_inputs(x, l16);
  const Output o32 = wide.run_eager(), o16 = narrow.run_eager();
  EXPECT_TRUE(o16.bf16 == o32.bf16) << "BF16 logits routed otherwise than their fp32 widening";
  expect_matches_reference(cfg, syn.weights, x, route_cpu_bf16(l16.data(), M, cfg.num_experts, bias.data(), rp),
                           o16, "bf16 router logits");
  const auto g = narrow.run_graph(2);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_TRUE(g[0].bf16 == o16.bf16 && g[1].bf16 == o16.bf16) << "graph replay differs from eager";

  // Bad arguments, each named: both formats at once, ids beside BF16 logits, misaligned.
  const size_t wsb = layer.workspace_size(M);
  Dev<uint8_t> ws(wsb);
  Dev<uint16_t> dx(M * cfg.hidden), out(M * cfg.hidden), d16(l16);
  Dev<uint8_t> dxs(M * cfg.hidden / 32);
  Dev<float> d32(l32);
  Dev<int32_t> ids(M * cfg.top_k);
  Dev<float> wts(M * cfg.top_k);
  ForwardArgs a;
  a.tokens = M;
  a.x = dx.p;
  a.out = out.p;
  auto expect_bad = [&](const ForwardArgs& bad, const std::string& argument) {
    try {
      layer.forward(bad, ws.p, wsb, nullptr);
      ADD_FAILURE() << "accepted bad " << argument;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  ForwardArgs b = a;
  b.router_logits = d32.p;
  b.router_logits_bf16 = d16.p;
  expect_bad(b, "args.router_logits_bf16");
  b.tokens = 0;  // refused with no tokens too
  expect_bad(b, "args.router_logits_bf16");
  b = a;
  b.router_logits_bf16 = d16.p;
  b.topk_ids = ids.p;
  b.topk_weights = wts.p;
  expect_bad(b, "args.router_logits_bf16");
  b = a;
  b.router_logits_bf16 = reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(d16.p) + 1);
  expect_bad(b, "args.router_logits_bf16");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(Layer, NanTokenStaysInItsRowAndInfSaturates) {
  REQUIRE_GPU();
  for (auto mid : {IntermediateFormat::MXFP8, IntermediateFormat::BF16}) {
    const MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, mid);
    const SyntheticLayer syn = make_synthetic_layer(cfg, 8);
    const int64_t M = 8;
    Activations x = make_activations(M, cfg.hidden, 9);
    x.bf16[3 * cfg.hidden + 17] = fmt::float_to_bf16(NAN);
    x.bf16[5 * cfg.hidden + 40] = fmt::float_to_bf16(INFINITY);
    x.bf16[6 * cfg.hidden + 0] = fmt::float_to_bf16(-INFINITY);
    // Opposite infinities in two blocks of one token: their ~2^135 products must be
    // summed in range (mx_mma.cuh range guard), not saturate in the order they come.
    x.bf16[6 * cfg.hidden + 100] = fmt::float_to_bf16(INFINITY);
    Routing r = random_routing(M, cfg.top_k, {8, 9, 10, 11, 12, 13, 14, 15}, 10, false);
    CudaMoeLayer layer(cfg, syn.weights);
    CudaHostSession s(layer, M);
    s.set_inputs(x, &r, nullptr);
    const Output o = s.run_eager();
    for (int64_t t = 0; t < M; ++t) {
      int64_t nans = 0;
      for (int64_t c = 0; c < cfg.hidden; ++c) nans += std::isnan(o.value(t, c));
      if (t == 3) EXPECT_EQ(nans, cfg.hidden) << "the NaN token's row must be all NaN";
      else EXPECT_EQ(nans, 0) << "token " << t << " was reached by another token's NaN";
    }
    expect_matches_reference(cfg, syn.weights, x, r, o, "nan/inf");
  }
}

TEST(Layer, BadArgumentsRejectedBeforeAnyLaunch) {
  REQUIRE_GPU();
  const MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 12);
  CudaMoeLayer layer(cfg, syn.weights);
  const int64_t M = 4;
  const size_t wsb = layer.workspace_size(M);
  Dev<uint8_t> ws(wsb), xs(M * cfg.hidden / 32);
  Dev<uint16_t> x(M * cfg.hidden), out(M * cfg.hidden);
  Dev<int32_t> ids(M * cfg.top_k);
  Dev<float> wts(M * cfg.top_k), logits(M * cfg.num_experts);
  cudaMemset(out.p, 0x5A, M * cfg.hidden * 2);
  auto good = [&] {
    ForwardArgs a;
    a.tokens = M;
    a.x = x.p;
    a.topk_ids = ids.p;
    a.topk_weights = wts.p;
    a.out = out.p;
    return a;
  };
  std::vector<uint16_t> host_x(M * cfg.hidden);
  auto expect_bad = [&](ForwardArgs a, void* w, size_t b, const std::string& argument) {
    try {
      layer.forward(a, w, b, nullptr);
      ADD_FAILURE() << "accepted bad " << argument;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  ForwardArgs a = good();
  a.tokens = -1;
  expect_bad(a, ws.p, wsb, "args.tokens");
  a = good();
  a.tokens = M + 1;  // workspace sized for M
  expect_bad(a, ws.p, wsb, "workspace_bytes");
  a = good();
  a.x = nullptr;
  expect_bad(a, ws.p, wsb, "args.x");
  a = good();
  a.x = reinterpret_cast<const char*>(x.p) + 2;
  expect_bad(a, ws.p, wsb, "args.x");
  a = good();
  a.x = host_x.data();  // pageable host memory
  expect_bad(a, ws.p, wsb, "args.x");
  a = good();
  a.router_logits = logits.p;
  expect_bad(a, ws.p, wsb, "args.router_logits");  // both routing modes
  a = good();
  a.topk_weights = nullptr;
  expect_bad(a, ws.p, wsb, "args.topk_weights");
  a = good();
  a.topk_ids = nullptr;
  a.topk_weights = nullptr;
  a.router_logits = logits.p;  // layer has no RoutingParams
  expect_bad(a, ws.p, wsb, "args.router_logits");
  a = good();
  a.x_format = InputFormat::MXFP8;  // no scales
  expect_bad(a, ws.p, wsb, "args.x_scale");
  a = good();
  a.x_scale = xs.p;  // scales for bf16 x
  expect_bad(a, ws.p, wsb, "args.x_scale");
  a = good();
  a.out = nullptr;
  expect_bad(a, ws.p, wsb, "args.out");
  a = good();
  expect_bad(a, nullptr, wsb, "workspace");
  expect_bad(a, ws.p + 16, wsb, "workspace");  // misaligned (rejected before use)
  expect_bad(a, ws.p, wsb - 1, "workspace_bytes");
  {
    const MoeConfig bcfg = small_cfg(Activation::SiTU, InputFormat::BF16, IntermediateFormat::BF16);
    const SyntheticLayer bsyn = make_synthetic_layer(bcfg, 13);
    CudaMoeLayer blayer(bcfg, bsyn.weights);
    ForwardArgs b = good();
    b.x_format = InputFormat::MXFP8;
    b.x_scale = xs.p;
    EXPECT_THROW(blayer.forward(b, ws.p, wsb, nullptr), InvalidArgument);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o = out.down();
  for (uint16_t v : o) ASSERT_EQ(v, 0x5A5A) << "output written despite a rejected call";
  // Constructor checks.
  RoutingParams rp;
  rp.top_k = cfg.top_k + 1;
  EXPECT_THROW(CudaMoeLayer(cfg, syn.weights, &rp), InvalidArgument);
  EXPECT_THROW(CudaMoeLayer(cfg, syn.weights, nullptr, nullptr, 999), InvalidArgument);
  EXPECT_THROW(layer.workspace_size(0), InvalidArgument);
}

// No tokens (an idle data-parallel rank, an empty microbatch) is a valid forward: with
// null pointers (empty tensors may come so) or real ones, eager and captured in a graph;
// it writes nothing of the caller's and clears the error word (a forward without bad ids).
TEST(Layer, NoTokensIsAValidForwardThatWritesNothing) {
  REQUIRE_GPU();
  const MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 21);
  CudaMoeLayer layer(cfg, syn.weights);
  const size_t wsb = layer.workspace_size(1);
  Dev<uint8_t> ws(wsb);
  Dev<uint16_t> x(cfg.hidden), out(cfg.hidden);
  Dev<int32_t> ids(cfg.top_k);
  Dev<float> wts(cfg.top_k), logits(cfg.num_experts);
  cudaMemset(out.p, 0x5A, out.n * 2);
  const uint32_t* word = layer.error_flags_device(ws.p);
  auto poison_word = [&] {
    cudaMemset(const_cast<uint32_t*>(word), 0xFF, 4);
    cudaDeviceSynchronize();  // before work on another stream (st is non-blocking)
  };
  ForwardArgs none;  // tokens 0, every pointer null
  poison_word();
  layer.forward(none, ws.p, wsb, nullptr);
  EXPECT_EQ(layer.read_error_flags(ws.p, nullptr), 0u);
  ForwardArgs real = none;
  real.x = x.p;
  real.topk_ids = ids.p;
  real.topk_weights = wts.p;
  real.out = out.p;
  poison_word();
  layer.forward(real, ws.p, wsb, nullptr);
  EXPECT_EQ(layer.read_error_flags(ws.p, nullptr), 0u);
  // Still refused with no tokens: what does not depend on the caller's tensors.
  ForwardArgs bad = none;
  bad.router_logits = logits.p;  // the layer has no RoutingParams
  EXPECT_THROW(layer.forward(bad, ws.p, wsb, nullptr), InvalidArgument);
  ForwardArgs both = real;  // ids and logits at once
  both.router_logits = logits.p;
  EXPECT_THROW(layer.forward(both, ws.p, wsb, nullptr), InvalidArgument);
  EXPECT_THROW(layer.forward(none, nullptr, wsb, nullptr), InvalidArgument);
  EXPECT_THROW(layer.forward(none, ws.p, 4, nullptr), InvalidArgument);
  // Captured and replayed twice.
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  layer.forward(real, ws.p, wsb, st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison_word();
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_EQ(layer.read_error_flags(ws.p, st), 0u) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint16_t v : out.down()) ASSERT_EQ(v, 0x5A5A) << "output written by a forward with no tokens";
}

TEST(Layer, OutOfRangeIdsAreSkippedAndFlagged) {
  REQUIRE_GPU();
  const MoeConfig cfg = small_cfg(Activation::SiLU_Gated, InputFormat::BF16, IntermediateFormat::BF16);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 14);
  const int64_t M = 3;
  const Activations x = make_activations(M, cfg.hidden, 15);
  Routing r = random_routing(M, cfg.top_k, {8, 9, 10, 11, 12}, 16, false);
  std::vector<int32_t> ids = r.ids;
  ids[1] = 1000;  // garbage from a caller: must not be dereferenced
  ids[6] = -9;
  CudaMoeLayer layer(cfg, syn.weights);
  Dev<uint8_t> ws(layer.workspace_size(M));
  Dev<uint16_t> dx(x.bf16), out(M * cfg.hidden);
  Dev<int32_t> dids(ids);
  Dev<float> dw(r.weights);
  ForwardArgs a;
  a.tokens = M;
  a.x = dx.p;
  a.topk_ids = dids.p;
  a.topk_weights = dw.p;
  a.out = out.p;
  layer.forward(a, ws.p, ws.n, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint32_t err = 0;
  cudaMemcpy(&err, ws.p + cd::WorkspaceLayout::make(cfg, M).error, 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(err, cd::kErrorIdOutOfRange);
  // Same as the reference with those slots as -1.
  Routing r2 = r;
  r2.ids[1] = -1;
  r2.ids[6] = -1;
  Output o;
  o.format = OutputFormat::BF16;
  o.tokens = M;
  o.hidden = cfg.hidden;
  o.bf16 = out.down();
  expect_matches_reference(cfg, syn.weights, x, r2, o, "bad ids skipped");
}

// ---------------------------------------------------------------- prefill operand staging

// stage_bf16 against stage_row_model: MXFP8 rows with scales that take the fast path and
// the checked one (tiny scales: values under 2^-126, flagged), rows whose scales need a
// range factor (D > 0), NaN codes and NaN scales, all-zero blocks; BF16 rows; a row
// split over two warps (> 32 blocks) with padding to `stride`. NaN compares as NaN (the
// GPU's multiply gives the canonical NaN).
TEST(StageBf16, BitExactAgainstScalarModel) {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    bool fp8;
    int64_t cols, stride;
    bool tiny;  // some blocks under a scale that lets values fall under 2^-126
  };
  const Case cases[] = {{"fp8 normal scales, 2 warps per row", true, 1120, 1152, false},
                        {"fp8 tiny scales", true, 352, 384, true},
                        {"fp8 one block", true, 32, 64, false},
                        {"bf16", false, 1120, 1152, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t rows = 45, kb = c.cols / 32;
    Rng rng(static_cast<uint64_t>(c.cols) * 7 + c.tiny);
    std::vector<uint8_t> codes(rows * c.cols), scale(rows * kb);
    std::vector<uint16_t> bsrc(rows * c.cols);
    for (auto& v : codes) v = static_cast<uint8_t>(rng.below(256));
    for (auto& v : bsrc) v = fmt::float_to_bf16(static_cast<float>(rng.normal()));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < kb; ++b) {
        int sb = 100 + static_cast<int>(rng.below(60));
        if (r % 7 == 3) sb = 180 + static_cast<int>(rng.below(75));  // D > 0 on most such rows
        if (c.tiny && rng.below(3) == 0) sb = static_cast<int>(rng.below(12));
        scale[r * kb + b] = static_cast<uint8_t>(sb);
        if (rng.below(9) == 0)
          for (int i = 0; i < 32; ++i) codes[r * c.cols + b * 32 + i] = rng.below(2) ? 0x80 : 0x00;
      }
    scale[2 * kb + 1] = 0xFF;  // NaN scale
    codes[4 * c.cols + 5] = 0x7F;
    codes[4 * c.cols + 6] = 0xFF;  // NaN codes
    Dev<uint8_t> dcodes(codes), dscale(scale);
    Dev<uint16_t> dbsrc(bsrc), dst(rows * c.stride);
    Dev<float> dback(rows);
    Dev<uint32_t> dflag(1);
    cudaMemset(dst.p, 0xAA, dst.n * 2);
    cudaMemset(dback.p, 0xFF, dback.n * 4);
    cudaMemset(dflag.p, 0, 4);
    const cd::StageBf16Params p{.src = c.fp8 ? static_cast<const void*>(dcodes.p) : dbsrc.p,
                                .scale = c.fp8 ? dscale.p : nullptr, .fp8 = c.fp8, .rows = rows,
                                .cols = c.cols, .stride = c.stride, .dst = dst.p,
                                .back = dback.p, .flag = dflag.p, .flag_bit = 4};
    cd::launch_stage_bf16(p, nullptr);
    CK(cudaDeviceSynchronize());
    const auto got = dst.down();
    const auto back = dback.down();
    bool exact = true;
    int64_t bad = 0, nans = 0, ranged = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const StagedRow want = stage_row_model(c.fp8 ? &codes[r * c.cols] : nullptr, c.fp8 ? &scale[r * kb] : nullptr,
                                             &bsrc[r * c.cols], c.cols, c.stride);
      exact = exact && want.exact;
      ranged += want.back != 1.0f;
      EXPECT_EQ(fbits(back[r]), fbits(want.back)) << "row " << r;
      for (int64_t i = 0; i < c.stride; ++i) {
        const uint16_t g = got[r * c.stride + i], w = want.bf16[i];
        const bool w_nan = fmt::is_nan(fmt::bf16_to_float(w));
        const bool same = w_nan ? fmt::is_nan(fmt::bf16_to_float(g)) : g == w;
        nans += w_nan;
        if (!same && ++bad <= 5)
          ADD_FAILURE() << "row " << r << " position " << i << ": got 0x" << std::hex << g << " want 0x" << w;
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(dflag.down()[0], exact ? 0u : 4u);
    if (c.fp8) {
      EXPECT_GT(nans, 32) << "the NaN scale and NaN codes must be reached";
      EXPECT_GT(ranged, 2) << "rows with a range factor must be reached";
      EXPECT_EQ(exact, !c.tiny) << "tiny scales must reach the checked path's flag, and only they";
    }
  }
}

// ---------------------------------------------------------------- FP8 precision mode

bool fp8_mode_available(std::string* why) {
  if (!gpu_usable(why)) return false;
  const auto d = cuda_devices();
  if (d[0].sm_major != 9 || !cd::prefill_kernels_available()) {
    *why = "the FP8 mode needs an sm_90 GPU and this build's sm_90a kernels (device is sm_" +
           std::to_string(d[0].sm_major) + std::to_string(d[0].sm_minor) + ")";
    return false;
  }
  return true;
}
#define REQUIRE_FP8_MODE()                                           \
  do {                                                               \
    std::string why_;                                                \
    if (!fp8_mode_available(&why_)) GTEST_SKIP() << why_;            \
  } while (0)

// stage_fp8 bit for bit against fp8_mode.h: spreads 0..20 inside groups (exact codes,
// codes rounded onto the subnormal grid, codes lost), all-zero blocks under any scale
// byte, NaN codes, NaN scale bytes (with and without nonzero codes), a K tail.
TEST(Fp8Mode, StageBitExactAgainstFp8ModeHeader) {
  REQUIRE_GPU();
  // 2208: 18 groups, so the kernel's second chunk of 16 groups, ending in a partial group.
  for (int64_t cols : {256, 352, 2208}) {
    SCOPED_TRACE("cols=" + std::to_string(cols));
    const int64_t rows = 41, kb = cols / 32, groups = (cols + 127) / 128, stride = groups * 128;
    const int64_t srows = cd::fp8_scale_rows(rows);  // the scales are [groups][srows]
    Rng rng(static_cast<uint64_t>(cols));
    std::vector<uint8_t> codes(rows * cols), scale(rows * kb);
    for (auto& c : codes) c = static_cast<uint8_t>(rng.below(256));
    for (int64_t r = 0; r < rows; ++r) {
      const int base = 100 + static_cast<int>(rng.below(40));
      for (int64_t b = 0; b < kb; ++b) {
        scale[r * kb + b] = static_cast<uint8_t>(base - static_cast<int>(rng.below(21)));
        if (rng.below(6) == 0) {  // an all-zero block (some negative zeros), any scale
          for (int i = 0; i < 32; ++i) codes[r * cols + b * 32 + i] = rng.below(2) ? 0x80 : 0x00;
          scale[r * kb + b] = static_cast<uint8_t>(rng.below(256));
        }
      }
    }
    scale[3 * kb + 1] = 0xFF;  // NaN scale over nonzero codes
    for (int i = 0; i < 32; ++i) codes[5 * cols + 2 * 32 + i] = 0;
    scale[5 * kb + 2] = 0xFF;  // NaN scale over zeros: still NaN (0 x NaN)
    Dev<uint8_t> dsrc(codes), dsc(scale), dst(rows * stride);
    Dev<float> dscale(groups * srows);
    cudaMemset(dst.p, 0xAA, dst.n);
    cudaMemset(dscale.p, 0xFF, dscale.n * 4);
    cd::StageFp8Params p{.src = dsrc.p, .scale = dsc.p, .rows = rows, .cols = cols, .stride = stride,
                         .dst = dst.p, .dst_scale = dscale.p, .scale_rows = srows};
    cd::launch_stage_fp8(p, nullptr);
    CK(cudaDeviceSynchronize());
    const auto got = dst.down();
    const auto got_s = dscale.down();
    int64_t bad = 0, rounded = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const int n = static_cast<int>(std::min<int64_t>(4, kb - 4 * g));
        bool used[4] = {};
        for (int i = 0; i < n; ++i) {
          const int64_t b = 4 * g + i;
          used[i] = scale[r * kb + b] == 0xFF;
          for (int k = 0; k < 32; ++k) used[i] = used[i] || (codes[r * cols + b * 32 + k] & 0x7F) != 0;
        }
        const uint8_t T = fp8mode::group_scale_byte(&scale[r * kb + 4 * g], n, used);
        EXPECT_EQ(fbits(got_s[g * srows + r]), fbits(fmt::e8m0_to_float(T))) << "row " << r << " group " << g;
        for (int k = 0; k < 128; ++k) {
          const int64_t col = 128 * g + k;
          uint8_t want = 0;
          if (col < cols && used[k / 32]) {
            const uint8_t c = codes[r * cols + col];
            want = fp8mode::activation_code(c, scale[r * kb + col / 32], T);
            rounded += T != 0xFF && fmt::e4m3_to_float(want) * fmt::e8m0_to_float(T) !=
                                        fmt::e4m3_to_float(c) * fmt::e8m0_to_float(scale[r * kb + col / 32]);
          }
          if (got[r * stride + col] != want && ++bad <= 5)
            ADD_FAILURE() << "row " << r << " col " << col << ": got " << int{got[r * stride + col]}
                          << " want " << int{want};
        }
      }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(rounded, 100) << "the cases must reach the rounding path";

    // Bytes and scales of a routed-row staging `out` (n rows, scale_rows apart) that are not
    // what they must be: row r is source row src_of(r)'s staging above, bit for bit, or,
    // where src_of(r) is -1, the poison (not written).
    const auto routed_mismatches = [&](const PoisonedStaging& out, int64_t n, int64_t scale_rows, auto src_of) {
      const auto c = out.codes.down();
      const auto sc = out.scales.down();
      int64_t bad_bytes = 0;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t src = src_of(r);
        for (int64_t k = 0; k < stride; ++k)
          bad_bytes += c[r * stride + k] != (src >= 0 ? got[src * stride + k] : uint8_t{0xAA});
        for (int64_t g = 0; g < groups; ++g)
          bad_bytes += fbits(sc[g * scale_rows + r]) != (src >= 0 ? fbits(got_s[g * srows + src]) : 0xFFFFFFFFu);
      }
      return bad_bytes;
    };

    // Gathered (GEMM1's x in routed-row order): row r is source row row_map[r] / top_k's
    // staging above, bit for bit; rows from *live_rows on are not written.
    const int64_t top_k = 3, routed = rows * top_k, live = routed - 5;
    std::vector<int32_t> row_map(routed);
    for (auto& v : row_map) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(routed)));
    Dev<int32_t> dmap(row_map), dlive(std::vector<int32_t>{static_cast<int32_t>(live)});
    const int64_t gsrows = cd::fp8_scale_rows(routed);
    PoisonedStaging gout(routed * stride, groups * gsrows);
    cd::StageFp8Params gp = p;
    gp.rows = routed;
    gp.live_rows = dlive.p;
    gp.row_map = dmap.p;
    gp.top_k = top_k;
    gp.scale_rows = gsrows;
    ASSERT_NO_FATAL_FAILURE(gout.run(gp));
    const int64_t gbad =
        routed_mismatches(gout, routed, gsrows, [&](int64_t r) { return r < live ? row_map[r] / top_k : int64_t{-1}; });
    EXPECT_EQ(gbad, 0) << "gathered staging";

    // Scattered (rows by token, StageFp8Params::pair_row): routed row pair_row[pair] is
    // token pair / top_k's staging above, bit for bit, codes and scales; pairs on no local
    // expert (-1) are skipped, and the routed rows no pair names are not written. top_k 3,
    // and 40 (slots past the 32 a warp holds in its lanes); a warp per token, and 2, 3 and
    // 5 per token (StageFp8Params::split: at 2208 columns, 18 groups, parts of 12 + 6,
    // 8 + 8 + 2 and 4 x 4 + 2; at 256 columns parts past the row).
    for (const auto [tk, split] : {std::pair<int64_t, int>{top_k, 1}, {top_k, 3}, {40, 1}, {40, 2}, {40, 5}}) {
      SCOPED_TRACE("scattered, top_k " + std::to_string(tk) + ", split " + std::to_string(split));
      const int64_t pairs = rows * tk, ssrows = cd::fp8_scale_rows(pairs);
      std::vector<int32_t> pair_row(pairs);
      for (int64_t i = 0; i < pairs; ++i) pair_row[i] = static_cast<int32_t>(i);
      for (int64_t i = pairs - 1; i > 0; --i) std::swap(pair_row[i], pair_row[rng.below(static_cast<uint64_t>(i + 1))]);
      for (int64_t i = 0; i < pairs; i += 7) pair_row[i] = -1;
      std::vector<int64_t> pair_of(pairs, -1);
      for (int64_t i = 0; i < pairs; ++i)
        if (pair_row[i] >= 0) pair_of[pair_row[i]] = i;
      Dev<int32_t> dpair(pair_row);
      PoisonedStaging sout(pairs * stride, groups * ssrows);
      cd::StageFp8Params sp = p;
      sp.top_k = tk;
      sp.pair_row = dpair.p;
      sp.scale_rows = ssrows;
      sp.split = split;
      ASSERT_NO_FATAL_FAILURE(sout.run(sp));
      const int64_t sbad = routed_mismatches(
          sout, pairs, ssrows, [&](int64_t r) { return pair_of[r] >= 0 ? pair_of[r] / tk : int64_t{-1}; });
      EXPECT_EQ(sbad, 0);
    }
  }
}

// The FP8 mode's bound (suite.h tolerance_for) is stated for shapes like the validation
// suite's (top-16, N >= 2048): its error is flips of intermediate E4M3 codes, and one flip
// moves a row by about 1 / sqrt(top_k * N) (suite.cpp small_config). At small_cfg's
// top-4, N = 192 the same flips measured up to 3.2e-2 (docs/FP8_MODE.md).
MoeConfig fp8_cfg(Activation act) {
  MoeConfig cfg = small_cfg(act, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.num_experts = 32;
  cfg.top_k = 16;
  cfg.hidden = 384;
  cfg.intermediate = 2048;
  cfg.ep_size = 1;
  cfg.ep_rank = 0;
  cfg.precision = Precision::FP8;
  return cfg;
}
std::vector<int32_t> iota_ids(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// The whole layer in the FP8 mode against the float64 reference, judged by the mode's
// documented bound (suite.h tolerance_for), all activations, with and without bias; below
// kFp8PrefillMinTokens (128) it runs the exact paths (bitwise equal to precision exact:
// the decode path at M=8, the exact prefill path at M=24, 96 and 127), from it the FP8
// kernels (M=128, 160). The measured metrics are printed for docs/FP8_MODE.md.
TEST(Fp8Mode, LayerWithinItsBoundOfTheReferenceAndExactBelowPrefill) {
  REQUIRE_FP8_MODE();
  int seed = 11;
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated}) {
    const MoeConfig cfg = fp8_cfg(act);
    MoeConfig exact_cfg = cfg;
    exact_cfg.precision = Precision::Exact;
    const SyntheticLayer syn = make_synthetic_layer(cfg, 500 + seed);
    CudaMoeLayer layer(cfg, syn.weights), exact(exact_cfg, syn.weights);
    int fp8_cases = 0;
    for (int64_t M : {8, 24, 96, 127, 128, 160}) {
      SCOPED_TRACE(cfg.describe() + " M=" + std::to_string(M));
      const Activations x = make_activations(M, cfg.hidden, 600 + seed);
      const Routing r = random_routing(M, cfg.top_k, iota_ids(28), 700 + seed, true);
      ++seed;
      CudaHostSession s(layer, M), se(exact, M);
      s.set_inputs(x, &r, nullptr);
      se.set_inputs(x, &r, nullptr);
      const Output o = s.run_eager(), o2 = s.run_eager(), oe = se.run_eager();
      EXPECT_TRUE(o.bf16 == o2.bf16) << "two runs differ";
      const auto g = s.run_graph(1);
      EXPECT_TRUE(g[0].bf16 == o.bf16) << "graph replay differs from eager";
      if (!cd::use_fp8_prefill(M, true)) {
        EXPECT_TRUE(o.bf16 == oe.bf16) << "below its sizes the FP8 mode must run the exact paths";
        continue;
      }
      ++fp8_cases;
      const Tolerance tol = tolerance_for(cfg);
      const ReferenceOut ref = reference_of(cfg, syn.weights, x, r);
      const Comparison c = compare_to(ref, cfg, o);
      const Comparison ce = compare_to(ref, cfg, oe);
      std::printf("[fp8 mode] %s M=%lld: fp8 %s | exact %s\n", to_string(act), static_cast<long long>(M),
                  c.summary().c_str(), ce.summary().c_str());
      EXPECT_TRUE(c.pass(tol.max_rel_l2, tol.min_cosine)) << c.summary();
      EXPECT_EQ(c.nonfinite, 0);
    }
    EXPECT_EQ(fp8_cases, 2) << "M=128 and 160 must run the FP8 kernels";
  }
}

// The prefill kernels find each item's tile by walking the local experts' row counts 32
// at a time (wgmma_mx.cuh pf_tile), resuming where the last item's walk ended. 80 local
// experts (three windows of 32, empty experts at the windows' edges), with the grid
// shrunk so that every CTA walks through all three windows and tiles of 32 (claimed
// items), 96 and 128 (dealt): the exact prefill path against the float64 reference, and the
// FP8 mode's kernels (their own loop over pf_tile) against theirs.
TEST(Layer, PrefillPastThirtyTwoLocalExpertsMatchesReference) {
  REQUIRE_FP8_MODE();  // an sm_90 GPU with this build's prefill kernels
  MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.num_experts = 160;
  cfg.ep_size = 2;
  cfg.ep_rank = 1;  // local experts 80..159
  const int64_t M = 160;
  ASSERT_TRUE(prefill_expected(M));
  std::vector<int32_t> used;
  for (int32_t g = 0; g < cfg.num_experts; ++g)
    if (g < 80 || (g - 80 != 3 && g - 80 != 31 && g - 80 != 32 && g - 80 != 33 && g - 80 != 64 && g - 80 != 79))
      used.push_back(g);
  const Routing r = random_routing(M, cfg.top_k, used, 4100, true);
  int local_rows = 0, seen[80] = {};
  for (int32_t id : r.ids)
    if (id >= 80) ++local_rows, seen[id - 80] = 1;
  ASSERT_GT(local_rows, 100);
  ASSERT_TRUE(seen[30] && seen[34] && seen[63] && seen[78]) << "routing must reach every window";
  // One eager forward with the prefill knobs set while it runs ("": the default).
  auto run_with = [&](const MoeConfig& c, const ExpertWeights& w, const Activations& x, const Routing& rr,
                      const char* tile, const char* ctas) {
    if (*tile) setenv("MXMOE_PREFILL_TOKEN_TILE", tile, 1);
    if (*ctas) setenv("MXMOE_PREFILL_CTAS", ctas, 1);
    CudaMoeLayer layer(c, w);
    CudaHostSession s(layer, M);
    s.set_inputs(x, &rr, nullptr);
    const Output o = s.run_eager();
    unsetenv("MXMOE_PREFILL_TOKEN_TILE");
    unsetenv("MXMOE_PREFILL_CTAS");
    return o;
  };
  const SyntheticLayer syn = make_synthetic_layer(cfg, 4200);
  const Activations x = make_activations(M, cfg.hidden, 4300);
  const ReferenceOut ref = reference_of(cfg, syn.weights, x, r);
  const Tolerance tol = tolerance_for(cfg);
  for (const char* tile : {"32", "96", "128"})
    for (const char* ctas : {"3", ""}) {  // 3 CTAs walk every window; "": the whole grid
      SCOPED_TRACE(std::string("tile ") + tile + " ctas " + (*ctas ? ctas : "all"));
      const Comparison c = compare_to(ref, cfg, run_with(cfg, syn.weights, x, r, tile, ctas));
      EXPECT_TRUE(c.pass(tol.max_rel_l2, tol.min_cosine) && c.bound_violations == 0) << c.summary();
    }
  MoeConfig f8 = cfg;
  f8.hidden = 384;
  f8.intermediate = 2048;
  f8.top_k = 16;
  f8.precision = Precision::FP8;
  ASSERT_TRUE(cd::use_fp8_prefill(M, true));
  const Routing r8 = random_routing(M, f8.top_k, used, 4400, true);
  const SyntheticLayer syn8 = make_synthetic_layer(f8, 4500);
  const Activations x8 = make_activations(M, f8.hidden, 4600);
  const ReferenceOut ref8 = reference_of(f8, syn8.weights, x8, r8);
  const Tolerance tol8 = tolerance_for(f8);
  for (const char* ctas : {"3", ""}) {
    SCOPED_TRACE(std::string("fp8 mode, ctas ") + (*ctas ? ctas : "all"));
    const Comparison c = compare_to(ref8, f8, run_with(f8, syn8.weights, x8, r8, "", ctas));
    EXPECT_TRUE(c.pass(tol8.max_rel_l2, tol8.min_cosine)) << c.summary();
    EXPECT_EQ(c.nonfinite, 0);
  }
}

// Activations whose MX blocks inside each 128-group sit `spread` binades apart: the
// re-expression is exact up to a spread of 3 for the whole E4M3 range of a block, then
// drops low bits of the small blocks. Error against the reference, per spread, printed
// (docs/FP8_MODE.md); judged by the same bound.
TEST(Fp8Mode, ActivationScaleSpreadsWithinItsBound) {
  REQUIRE_FP8_MODE();
  const MoeConfig cfg = fp8_cfg(Activation::SiTU);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 901);
  CudaMoeLayer layer(cfg, syn.weights);
  const int64_t M = 128;
  ASSERT_TRUE(cd::use_fp8_prefill(M, true)) << "M=" << M << " must run the FP8 kernels";
  CudaHostSession s(layer, M);
  const Routing r = random_routing(M, cfg.top_k, iota_ids(32), 902, false);
  for (int spread : {0, 2, 4, 6, 8, 12, 16}) {
    SCOPED_TRACE("spread " + std::to_string(spread));
    Activations x = make_activations(M, cfg.hidden, 903 + spread);
    for (int64_t t = 0; t < M; ++t)
      for (int64_t k = 0; k < cfg.hidden; ++k)  // odd blocks of a group 2^-spread smaller
        if ((k / 32) % 2 == 1)
          x.bf16[t * cfg.hidden + k] = fmt::float_to_bf16(std::ldexp(fmt::bf16_to_float(x.bf16[t * cfg.hidden + k]), -spread));
    s.set_inputs(x, &r, nullptr);
    const Output o = s.run_eager();
    const Tolerance tol = tolerance_for(cfg);
    const Comparison c = compare_to(reference_of(cfg, syn.weights, x, r), cfg, o);
    std::printf("[fp8 mode] activation spread %d: %s\n", spread, c.summary().c_str());
    EXPECT_TRUE(c.pass(tol.max_rel_l2, tol.min_cosine)) << c.summary();
  }
}

// The tile edges the Kimi-like cases never reach: K = 352 (groups of 4, 4 and 3 blocks),
// N = 160 (2N = 320: GEMM1's last 128-row block half padding; GEMM2's K tail), an expert
// with more than 128 rows (a second token tile), an empty local expert, EP rank 1 of 2,
// biases. At top-4, N = 160 the mode's flips weigh more per row than its stated bound
// assumes (FP8_MODE.md), so this judges structure: an indexing error moves a row by
// order 1; the flips measured up to 3.2e-2 at a similar shape.
TEST(Fp8Mode, TailsPaddingSecondTokenTileAndEpRankAgainstTheReference) {
  REQUIRE_FP8_MODE();
  MoeConfig cfg = small_cfg(Activation::SwiGLU_OAI, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.hidden = 352;
  cfg.intermediate = 160;
  cfg.precision = Precision::FP8;
  ASSERT_TRUE(cfg.has_bias);
  const SyntheticLayer syn = make_synthetic_layer(cfg, 1201);
  const int64_t M = 200;
  Routing r;
  r.tokens = M;
  r.top_k = cfg.top_k;
  Rng rng(1202);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> pool = {9, 10, 11, 13, 14, 2, 5};  // 12 and 15: never used
    r.ids.push_back(8);                                     // every token: 200 rows
    r.weights.push_back(0.5f);
    for (int64_t j = 1; j < cfg.top_k; ++j) {
      const size_t i = rng.below(pool.size());
      r.ids.push_back(pool[i]);
      pool.erase(pool.begin() + static_cast<long>(i));
      r.weights.push_back(static_cast<float>(0.25 + rng.uniform()));
    }
  }
  const Activations x = make_activations(M, cfg.hidden, 1203);
  CudaMoeLayer layer(cfg, syn.weights);
  CudaHostSession s(layer, M);
  s.set_inputs(x, &r, nullptr);
  const Output o = s.run_eager();
  const Comparison c = compare_to(reference_of(cfg, syn.weights, x, r), cfg, o);
  std::printf("[fp8 mode] K 352, N 160, top-4, EP 2/1, bias, M=200: %s\n", c.summary().c_str());
  EXPECT_LT(c.max_row_rel_l2, 0.1) << c.summary();
  EXPECT_GT(c.min_cosine, 0.995) << c.summary();
  EXPECT_EQ(c.nonfinite, 0);
}

// The promotion's scale product at its largest (docs/HARDENING.md §8): an activation
// group whose largest block byte is 254 (2^127, caller-supplied MXFP8 only) against weight
// groups whose largest byte is 128 (2^1, the largest the mode takes). Every token's first
// K group is block 0 huge (weights zero there) and blocks 1..3 zero (weights not), so the
// group's FP8 sum is exactly 0 and the reference's finite: promoted as sum * (s_x * s_w)
// it was 0 x Inf = NaN in every output; as (sum * s_w) * s_x it is 0.
TEST(Fp8Mode, HugeActivationGroupScaleTimesTheLargestWeightScaleStaysFinite) {
  REQUIRE_FP8_MODE();
  const MoeConfig cfg = fp8_cfg(Activation::SiTU);
  SyntheticLayer syn = make_synthetic_layer(cfg, 1301);
  const int64_t K = cfg.hidden, kb = K / 32, M = 128;
  ASSERT_TRUE(cd::use_fp8_prefill(M, true)) << "M=" << M << " must run the FP8 kernels";
  for (int64_t row = 0; row < cfg.num_experts * 2 * cfg.intermediate; ++row) {
    for (int64_t j = 0; j < 16; ++j) syn.weights.w13_packed[row * K / 2 + j] = 0;  // block 0: zeros
    syn.weights.w13_scale[row * kb + 1] = 128;  // the group's largest byte: s_w = 2
    syn.weights.w13_scale[row * kb + 2] = 127;
    syn.weights.w13_scale[row * kb + 3] = 127;
  }
  Activations x = make_activations(M, K, 1302).to_mxfp8();
  for (int64_t t = 0; t < M; ++t) {
    x.scale[t * kb] = 254;                                      // s_x = 2^127
    for (int64_t k = 32; k < 128; ++k) x.fp8[t * K + k] = 0;   // blocks 1..3: zeros
  }
  const Routing r = random_routing(M, cfg.top_k, iota_ids(32), 1303, false);
  const ReferenceOut ref = reference_of(cfg, syn.weights, x, r);
  for (const char* form : {"0", "1"}) {  // the group form; the row form (fp8_mode.h)
    SCOPED_TRACE(std::string("MXMOE_F8_ROW=") + form);
    setenv("MXMOE_F8_ROW", form, 1);
    CudaMoeLayer layer(cfg, syn.weights);
    unsetenv("MXMOE_F8_ROW");
    CudaHostSession s(layer, M);
    s.set_inputs(x, &r, nullptr);
    const Output o = s.run_eager();
    const Tolerance tol = tolerance_for(cfg);
    const Comparison c = compare_to(ref, cfg, o);
    std::printf("[fp8 mode] activation group byte 254 x weight group byte 128, MXMOE_F8_ROW=%s: %s\n",
                form, c.summary().c_str());
    EXPECT_EQ(c.nonfinite, 0) << c.summary();
    EXPECT_TRUE(c.pass(tol.max_rel_l2, tol.min_cosine)) << c.summary();
  }
}

// The workspace carve (host only, no GPU needed): in FP8 mode the prefill sizes hold the
// FP8 staging buffers instead of the exact path's BF16 ones, and in both precisions the
// total never shrinks as M grows (workspace_size(max_tokens) covers every M <= max).
TEST(Fp8Mode, HostWorkspaceHoldsTheFp8BuffersAndGrowsWithM) {
  MoeConfig exact = fp8_cfg(Activation::SiTU);
  exact.precision = Precision::Exact;
  const MoeConfig fp8 = fp8_cfg(Activation::SiTU);
  for (const MoeConfig* cfg : std::vector<const MoeConfig*>{&exact, &fp8}) {
    size_t prev = 0;
    for (int64_t M : {1, 2, 8, 15, 16, 17, 31, 32, 33, 64, 96, 127, 128, 129, 160, 256, 1000, 4096}) {
      const cd::WorkspaceLayout L = cd::WorkspaceLayout::make(*cfg, M);
      EXPECT_GE(L.total, prev) << to_string(cfg->precision) << " M=" << M;
      prev = L.total;
      const bool f8 = cfg->precision == Precision::FP8;
      // FP8 mode from kFp8PrefillMinTokens; the exact prefill path from kPrefillMinTokens
      // below that (and in precision exact).
      const bool fp8_prefill = f8 && M >= cd::kFp8PrefillMinTokens;
      const bool exact_prefill = !fp8_prefill && M >= cd::kPrefillMinTokens;
      EXPECT_EQ(L.xf != 0, fp8_prefill) << "M=" << M;
      EXPECT_EQ(L.if8 != 0, fp8_prefill) << "M=" << M;
      EXPECT_EQ(L.xb != 0, exact_prefill) << "M=" << M;
      EXPECT_EQ(L.ib != 0, exact_prefill) << "M=" << M;
      if (fp8_prefill) {
        const size_t pairs = static_cast<size_t>(M * cfg->top_k);
        EXPECT_GE(L.if8_scale - L.if8, pairs * static_cast<size_t>(cfg->intermediate)) << "M=" << M;
        const size_t srows = static_cast<size_t>(cd::fp8_scale_rows(M * cfg->top_k));
        EXPECT_GE(L.total - L.if8_scale, srows * static_cast<size_t>(cfg->intermediate / 128) * 4) << "M=" << M;
        // x staged in routed-row order, inside y's range (free until GEMM2) where it fits.
        const size_t kg = static_cast<size_t>((cfg->hidden + 127) / 128);
        EXPECT_GE(L.xf_scale - L.xf, pairs * kg * 128) << "M=" << M;
        EXPECT_EQ(L.xf, L.y) << "M=" << M;
        EXPECT_LE(L.xf_scale + srows * kg * 4, L.back) << "M=" << M;
      }
    }
  }
}

// The load-time conversion on the host (no GPU needed): every FP8 row is one kernel-layout
// row (a permutation; each 16 rows = the gate rows of 8 columns, then their up rows), and
// every converted value times its group scale equals the MXFP4 value exactly, including
// a K tail (5 blocks: groups of 4 and 1), a half-padded last row block and a NaN scale
// over zero codes (its whole group NaN); padding is zero.
TEST(Fp8Mode, HostWeightConversionExactAndInTheGateUpRowOrder) {
  const int64_t E = 2, N = 96, rows = 2 * N, K = 160, nb = K / 32;
  Rng rng(77);
  std::vector<uint8_t> packed(E * rows * K / 2), scale(E * rows * nb);
  for (auto& b : packed) b = static_cast<uint8_t>(rng.below(256));
  for (auto& b : scale) b = static_cast<uint8_t>(119 + rng.below(9));  // spreads <= 8
  const int64_t nan_row = 70, nan_block = 4;  // expert 1: the partial group 1
  scale[(1 * rows + nan_row) * nb + nan_block] = fmt::kE8m0Nan;
  for (int j = 0; j < 16; ++j) packed[(1 * rows + nan_row) * (K / 2) + nan_block * 16 + j] = 0;
  std::vector<uint8_t> codes;
  std::vector<float> gs;
  const cd::Fp8Dims d = cd::fp8_weights(packed.data(), scale.data(), E, rows, K, true,
                                        cd::Fp8FormChoice::kGroup, "w", codes, gs);
  ASSERT_FALSE(d.row_form);
  ASSERT_EQ(d.rows_p, 256);
  ASSERT_EQ(d.cols_p, 256);
  ASSERT_EQ(codes.size(), static_cast<size_t>(E * d.rows_p * d.cols_p));
  ASSERT_EQ(gs.size(), static_cast<size_t>(E * d.groups * d.rows_p));
  std::vector<int> seen(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = cd::fp8_source_row(r, true);
    ASSERT_TRUE(src >= 0 && src < rows);
    ++seen[src];
    const int64_t i = r % 16;  // rows i and i + 8 of a 16: gate and up of one column
    EXPECT_EQ(src % 64 < 32, i < 8) << "fp8 row " << r;
    if (i < 8) EXPECT_EQ(cd::fp8_source_row(r + 8, true), src + 32) << "fp8 row " << r;
  }
  for (int64_t k = 0; k < rows; ++k) EXPECT_EQ(seen[k], 1) << "kernel row " << k;
  int64_t bad = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < d.rows_p; ++r)
      for (int64_t col = 0; col < d.cols_p; ++col) {
        const uint8_t c = codes[(e * d.rows_p + r) * d.cols_p + col];
        const float g = gs[(e * d.groups + col / 128) * d.rows_p + r];
        if (r >= rows || col >= K) {
          bad += c != 0 || (col < K && g != 0.0f);
          continue;
        }
        const int64_t src = cd::fp8_source_row(r, true);
        const bool nan_group = e == 1 && src == nan_row && col / 128 == nan_block / 4;
        const double want = nan_group ? std::nan("") : w_value(packed, scale, e * rows + src, col, K);
        const double got = static_cast<double>(fmt::e4m3_to_float(c)) * static_cast<double>(g);
        const bool ok = std::isnan(want) ? std::isnan(got) : got == want;
        if (!ok && ++bad <= 5)
          ADD_FAILURE() << "expert " << e << " fp8 row " << r << " col " << col << ": " << got << " vs " << want;
      }
  EXPECT_EQ(bad, 0);
}

// The row form (fp8_mode.h; host only): one scale per row, codes exact, the matrix's
// reference exponent the largest row's, a NaN row NaN; taken by default where every row
// fits, the group form where one row does not (its spread 15 > kMaxRowSpread), and refused
// when asked for then.
TEST(Fp8Mode, HostRowFormConversionExactAndChosenWhereItFits) {
  const int64_t E = 2, N = 96, rows = 2 * N, K = 352, nb = K / 32;
  Rng rng(78);
  std::vector<uint8_t> packed(E * rows * K / 2), scale(E * rows * nb);
  for (auto& b : packed) b = static_cast<uint8_t>(rng.below(256));
  for (int64_t r = 0; r < E * rows; ++r) {  // each row its own level, spreads up to 14
    const int level = 100 + static_cast<int>(rng.below(20));
    for (int64_t b = 0; b < nb; ++b) scale[r * nb + b] = static_cast<uint8_t>(level + rng.below(15));
  }
  const int64_t nan_row = 70, nan_block = 9;  // expert 1
  scale[(1 * rows + nan_row) * nb + nan_block] = fmt::kE8m0Nan;
  std::vector<uint8_t> codes;
  std::vector<float> rs;
  const cd::Fp8Dims d = cd::fp8_weights(packed.data(), scale.data(), E, rows, K, true,
                                        cd::Fp8FormChoice::kAuto, "w", codes, rs);
  ASSERT_TRUE(d.row_form);
  ASSERT_EQ(rs.size(), static_cast<size_t>(E * d.rows_p));
  int max_byte = 0;
  for (uint8_t b : scale)
    if (b != fmt::kE8m0Nan) max_byte = std::max<int>(max_byte, b);
  EXPECT_EQ(d.row_exp_ref, max_byte - fp8mode::kRowHeadroom);
  int64_t bad = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < d.rows_p; ++r) {
      const float s = rs[static_cast<size_t>(e * d.rows_p + r)];
      for (int64_t col = 0; col < d.cols_p; ++col) {
        const uint8_t c = codes[(e * d.rows_p + r) * d.cols_p + col];
        if (r >= rows || col >= K) {
          bad += c != 0 || (r >= rows && s != 0.0f);
          continue;
        }
        const int64_t src = cd::fp8_source_row(r, true);
        const bool nan = e == 1 && src == nan_row;
        const double want = nan ? std::nan("") : w_value(packed, scale, e * rows + src, col, K);
        const double got = static_cast<double>(fmt::e4m3_to_float(c)) * static_cast<double>(s) *
                           std::ldexp(1.0, d.row_exp_ref - 127);
        const bool ok = std::isnan(want) ? std::isnan(got) : got == want;
        if (!ok && ++bad <= 5)
          ADD_FAILURE() << "expert " << e << " fp8 row " << r << " col " << col << ": " << got << " vs " << want;
      }
    }
  EXPECT_EQ(bad, 0);
  // The group form of the same weights (spreads up to 14 inside a group) does not fit.
  EXPECT_THROW(cd::fp8_weights(packed.data(), scale.data(), E, rows, K, true, cd::Fp8FormChoice::kGroup,
                               "w", codes, rs),
               InvalidArgument);
  // One row 15 binades apart (and groups within 8): the group form, by default.
  for (int64_t r = 0; r < E * rows; ++r)
    for (int64_t b = 0; b < nb; ++b) scale[r * nb + b] = static_cast<uint8_t>(118 + (b % 4 == 0 ? 8 : 0));
  for (int64_t b = 0; b < 4; ++b) scale[(1 * rows + 5) * nb + b] = 111;  // first group: 15 below
  for (int j = 0; j < 64; ++j) packed[(1 * rows + 5) * (K / 2) + j] = 0x11;  // used
  const cd::Fp8Dims g = cd::fp8_weights(packed.data(), scale.data(), E, rows, K, true,
                                        cd::Fp8FormChoice::kAuto, "w", codes, rs);
  EXPECT_FALSE(g.row_form);
  EXPECT_EQ(rs.size(), static_cast<size_t>(E * g.groups * g.rows_p));
  try {
    cd::fp8_weights(packed.data(), scale.data(), E, rows, K, true, cd::Fp8FormChoice::kRow, "w", codes, rs);
    ADD_FAILURE() << "the row form was made for a row spread of 15";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("local expert 1 row 5"), std::string::npos) << e.what();
  }
}

// The row form against the group form on the GPU, bit for bit: the same E4M3 products;
// in fp32 the row form's sums are the group form's times a power of two, exact while they
// stay in fp32's normal range (fp8_mode.h), as with these weights and activations. Both
// activations' GEMM1 epilogues, and M = 200: a second token tile and a partial one.
TEST(Fp8Mode, RowFormBitIdenticalToGroupForm) {
  REQUIRE_FP8_MODE();
  int seed = 1400;
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI}) {
    const MoeConfig cfg = fp8_cfg(act);
    const SyntheticLayer syn = make_synthetic_layer(cfg, seed++);
    for (int64_t M : {128, 200}) {
      SCOPED_TRACE(std::string(to_string(act)) + " M=" + std::to_string(M));
      ASSERT_TRUE(cd::use_fp8_prefill(M, true));
      const Activations x = make_activations(M, cfg.hidden, seed++);
      const Routing r = random_routing(M, cfg.top_k, iota_ids(28), seed++, true);
      Output out[2];
      for (int row : {0, 1}) {
        setenv("MXMOE_F8_ROW", row ? "1" : "0", 1);
        CudaMoeLayer layer(cfg, syn.weights);
        unsetenv("MXMOE_F8_ROW");
        CudaHostSession s(layer, M);
        s.set_inputs(x, &r, nullptr);
        out[row] = s.run_eager();
      }
      ASSERT_EQ(out[0].bf16.size(), out[1].bf16.size());
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < out[0].bf16.size(); ++i)
        if (out[0].bf16[i] != out[1].bf16[i] && differ++ == 0) first = static_cast<int64_t>(i);
      EXPECT_EQ(differ, 0) << "first at output " << first << " of " << out[0].bf16.size();
      const Comparison c = compare_to(reference_of(cfg, syn.weights, x, r), cfg, out[1]);
      std::printf("[fp8 mode] row form %s M=%lld: %s\n", to_string(act), static_cast<long long>(M), c.summary().c_str());
      EXPECT_TRUE(c.pass(tolerance_for(cfg).max_rel_l2, tolerance_for(cfg).min_cosine)) << c.summary();
    }
  }
}

// GEMM2's staged intermediate made by GEMM1's drain (the default) against stage_fp8's
// (MXMOE_F8_FUSED=0, GEMM1 writing the MXFP8 intermediate), and x's routed rows staged
// scattered by token (MXMOE_F8_SCATTER=1; the default at these M gathers them), bit for bit
// in the output.
// Shapes: Kimi-like N = 2048 (16 groups: every pair of row blocks whole), N = 160 (three
// row blocks: the last group one tile alone, with one real block of four) and N = 96 (the
// group's second tile one real block); M with a second and a partial token tile. The
// inputs reach the regrouping's rare paths: the up rows of every group's second block 20
// binades smaller (its codes lowered by ~20 binades: activation_code itself, past the
// f16 path's 15), and x NaN or Inf in a few tokens (NaN codes; NaN and Inf intermediates).
TEST(Fp8Mode, FusedIntermediateAndScatteredRowsBitIdenticalToStagedOnes) {
  REQUIRE_FP8_MODE();
  struct Case {
    Activation act;
    int64_t hidden, intermediate, top_k, M;
    bool bias;
  };
  int seed = 1500;
  for (const Case& cs : {Case{Activation::SiTU, 384, 2048, 16, 128, false},
                         Case{Activation::SiTU, 384, 2048, 16, 300, false},
                         Case{Activation::SwiGLU_OAI, 352, 160, 4, 200, true},
                         Case{Activation::SiLU_Gated, 256, 96, 4, 260, false}}) {
    MoeConfig cfg = fp8_cfg(cs.act);
    cfg.hidden = cs.hidden;
    cfg.intermediate = cs.intermediate;
    cfg.top_k = cs.top_k;
    cfg.has_bias = cs.bias;
    SCOPED_TRACE(cfg.describe() + " M=" + std::to_string(cs.M));
    ASSERT_TRUE(cd::use_fp8_prefill(cs.M, true));
    SyntheticLayer syn = make_synthetic_layer(cfg, seed++);
    const int64_t kb = cfg.hidden / 32;
    for (int64_t row = 0; row < cfg.num_experts * 2 * cfg.intermediate; ++row) {
      const int64_t j = (row % (2 * cfg.intermediate)) / 64, i = row % 64;  // layout.h: group j
      if (j % 4 == 1 && i >= 32)                                             // up rows of block 1 mod 4
        for (int64_t b = 0; b < kb; ++b) syn.weights.w13_scale[row * kb + b] -= 20;
    }
    Activations x = make_activations(cs.M, cfg.hidden, seed++);
    x.bf16[3 * cfg.hidden + 5] = 0x7FC0;   // NaN
    x.bf16[7 * cfg.hidden + 40] = 0x7F80;  // +Inf
    const Routing r = random_routing(cs.M, cfg.top_k, iota_ids(28), seed++, true);
    // out[0]: the defaults; out[v]: knobs[v] set to values[v] (the staging kernel's
    // intermediate, and x scattered where the default at these M gathers it).
    ASSERT_FALSE(cd::use_scattered_x_staging(cs.M, -1));
    const char* const knobs[3] = {nullptr, "MXMOE_F8_FUSED", "MXMOE_F8_SCATTER"};
    const char* const values[3] = {nullptr, "0", "1"};
    Output out[3];
    for (int v = 0; v < 3; ++v) {
      if (knobs[v] != nullptr) setenv(knobs[v], values[v], 1);
      CudaMoeLayer layer(cfg, syn.weights);
      if (knobs[v] != nullptr) unsetenv(knobs[v]);
      CudaHostSession s(layer, cs.M);
      s.set_inputs(x, &r, nullptr);
      out[v] = s.run_eager();
      if (v != 1) {
        const auto g = s.run_graph(1);
        EXPECT_TRUE(g[0].bf16 == out[v].bf16) << "graph replay differs from eager (variant " << v << ")";
      }
    }
    for (int v = 1; v < 3; ++v) {
      ASSERT_EQ(out[0].bf16.size(), out[v].bf16.size());
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < out[0].bf16.size(); ++i)
        if (out[0].bf16[i] != out[v].bf16[i] && differ++ == 0) first = static_cast<int64_t>(i);
      EXPECT_EQ(differ, 0) << knobs[v] << "=" << values[v] << ": first at output " << first << " of "
                           << out[0].bf16.size();
    }
    int64_t nan = 0;
    for (const uint16_t b : out[0].bf16) nan += (b & 0x7FFF) > 0x7F80;
    EXPECT_GT(nan, 0) << "the NaN token must reach the output";
    EXPECT_LT(nan, static_cast<int64_t>(out[0].bf16.size()) / 4) << "NaN must stay in its tokens";
  }
}

// A token tile of at most 64 routed rows leaves the FP8 kernels' second consumer
// warpgroup only padding tokens: it passes the stages on without a wgmma and stores
// nothing (wgmma_fp8.cuh f8_run). A token's output does not depend on the other tokens,
// so the first M tokens' outputs must be bit for bit the same when 64 more tokens, routed
// to experts 0..15, move those experts' last tiles across the 64-row line both ways (1 ->
// 65 rows, 64 -> 128, 63 -> 127, 129 -> 193; 65 -> 129, 128 -> 192, 127 -> 191, ...).
// The first forward is also judged against the float64 reference. SiTU, and SwiGLU-OAI
// with biases (the epilogues' bias reads).
TEST(Fp8Mode, NarrowTilesBitIdenticalToFullTiles) {
  REQUIRE_FP8_MODE();
  int seed = 1700;
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI}) {
    const MoeConfig cfg = fp8_cfg(act);
    SCOPED_TRACE(cfg.describe());
    const int64_t M = 160, extra = 64, E = cfg.num_experts, k = cfg.top_k, K = cfg.hidden;
    ASSERT_EQ(E, 32);
    ASSERT_EQ(k, 16);
    // Rows of experts 0..15; the other 16 share the rest (81 or 82 each). Each token takes
    // the k experts with the most rows left to deal (ties: the lower id), which meets every
    // count here.
    std::vector<int64_t> left = {1, 40, 64, 65, 128, 129, 63, 100, 150, 160, 2, 70, 127, 30, 96, 33};
    int64_t rest = M * k;
    for (int64_t v : left) rest -= v;
    for (int64_t e = 16; e < E; ++e) left.push_back(rest / 16 + (e - 16 < rest % 16 ? 1 : 0));
    Rng rng(static_cast<uint64_t>(seed++));
    Routing r;
    r.tokens = M + extra;
    r.top_k = k;
    for (int64_t t = 0; t < M; ++t) {
      std::vector<int32_t> by_left(static_cast<size_t>(E));
      for (int32_t e = 0; e < E; ++e) by_left[static_cast<size_t>(e)] = e;
      std::stable_sort(by_left.begin(), by_left.end(), [&](int32_t a, int32_t b) { return left[a] > left[b]; });
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = by_left[static_cast<size_t>(j)];
        ASSERT_GT(left[e], 0) << "token " << t;
        --left[e];
        r.ids.push_back(e);
        r.weights.push_back(static_cast<float>(0.25 + rng.uniform()));
      }
    }
    for (int64_t v : left) ASSERT_EQ(v, 0);
    for (int64_t t = 0; t < extra; ++t)  // experts 0..15, in turns
      for (int64_t j = 0; j < k; ++j) {
        r.ids.push_back(static_cast<int32_t>((t + j) % 16));
        r.weights.push_back(static_cast<float>(0.25 + rng.uniform()));
      }
    Routing first = r;
    first.tokens = M;
    first.ids.resize(static_cast<size_t>(M * k));
    first.weights.resize(static_cast<size_t>(M * k));
    const Activations x = make_activations(M + extra, K, static_cast<uint64_t>(seed++));
    Activations x_first = x;
    x_first.tokens = M;
    x_first.bf16.resize(static_cast<size_t>(M * K));
    const SyntheticLayer syn = make_synthetic_layer(cfg, static_cast<uint64_t>(seed++));
    CudaMoeLayer layer(cfg, syn.weights);
    ASSERT_TRUE(cd::use_fp8_prefill(M, true));
    CudaHostSession narrow(layer, M), full(layer, M + extra);
    narrow.set_inputs(x_first, &first, nullptr);
    full.set_inputs(x, &r, nullptr);
    const Output on = narrow.run_eager(), of = full.run_eager();
    const auto g = narrow.run_graph(1);
    EXPECT_TRUE(g[0].bf16 == on.bf16) << "graph replay differs from eager";
    int64_t differ = 0, at = -1;
    for (int64_t i = 0; i < M * K; ++i)
      if (on.bf16[static_cast<size_t>(i)] != of.bf16[static_cast<size_t>(i)] && differ++ == 0) at = i;
    EXPECT_EQ(differ, 0) << "first at token " << at / K << ", column " << at % K;
    const Comparison c = compare_to(reference_of(cfg, syn.weights, x_first, first), cfg, on);
    EXPECT_TRUE(c.pass(tolerance_for(cfg).max_rel_l2, tolerance_for(cfg).min_cosine)) << c.summary();
    EXPECT_EQ(c.nonfinite, 0);
  }
}

// Weights the mode cannot hold exactly are refused when the layer is built, naming the
// argument, the expert, the row and the group; weights scaled outside its range too.
TEST(Fp8Mode, RefusesWeightsItCannotRepresent) {
  REQUIRE_FP8_MODE();
  MoeConfig cfg = small_cfg(Activation::SiTU, InputFormat::MXFP8, IntermediateFormat::MXFP8);
  cfg.precision = Precision::FP8;
  SyntheticLayer syn = make_synthetic_layer(cfg, 31);
  // A block `spread` binades below the largest byte of its row's group (expert 1).
  const auto spread_block = [&](int spread) {
    ExpertWeights w = syn.weights;
    const int64_t K = cfg.hidden, row = 70, block = 5;
    const int64_t r0 = (1 * 2 * cfg.intermediate + row) * (K / 32);
    uint8_t top = 0;
    for (int64_t b = 0; b < K / 32; ++b) top = std::max(top, w.w13_scale[r0 + b]);
    w.w13_scale[r0 + 4] = top;
    w.w13_scale[r0 + block] = static_cast<uint8_t>(top - spread);
    w.w13_packed[(1 * 2 * cfg.intermediate + row) * (K / 2) + block * 16] = 0x22;  // nonzero codes
    return w;
  };
  {
    // A spread of 9: beyond the group form, within the row form (taken by default).
    const ExpertWeights w = spread_block(9);
    EXPECT_NO_THROW(CudaMoeLayer layer(cfg, w));
    setenv("MXMOE_F8_ROW", "0", 1);
    try {
      CudaMoeLayer layer(cfg, w);
      ADD_FAILURE() << "a group spread of 9 was accepted in the group form";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "weights.w13_scale");
      EXPECT_NE(std::string(e.what()).find("expert 1 row 70"), std::string::npos) << e.what();
    }
    unsetenv("MXMOE_F8_ROW");
  }
  {
    // A spread of 15 fits neither form: refused, naming both.
    const ExpertWeights w = spread_block(15);
    try {
      CudaMoeLayer layer(cfg, w);
      ADD_FAILURE() << "a spread of 15 was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "weights.w13_scale");
      EXPECT_NE(std::string(e.what()).find("expert 1 row 70"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("row form"), std::string::npos) << e.what();
    }
    setenv("MXMOE_F8_ROW", "1", 1);
    EXPECT_THROW(CudaMoeLayer layer(cfg, w), Unsupported);
    unsetenv("MXMOE_F8_ROW");
  }
  {
    ExpertWeights w = syn.weights;
    w.w2_scale[17] = 140;
    try {
      CudaMoeLayer layer(cfg, w);
      ADD_FAILURE() << "a weight scale of 2^13 was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "weights.w2_scale");
    }
  }
}

// The FP8 mode's weight codes reach the producer through a TMA map (tensor_map.cu
// fp8_codes_map) of whole 128-row blocks of whole 128-byte groups, as fp8_weights lays
// them out; anything else is refused, naming the codes, before the driver sees it.
TEST(Fp8Mode, CodesMapTakesWholeBlocksAndGroupsOnly) {
  REQUIRE_FP8_MODE();
  uint8_t* codes = nullptr;
  ASSERT_EQ(cudaMalloc(&codes, 256 * 384), cudaSuccess);
  EXPECT_NO_THROW(cd::fp8_codes_map(codes, 256, 384));
  struct Bad {
    const uint8_t* codes;
    int64_t rows, cols_p;
  };
  for (const Bad& b : {Bad{nullptr, 256, 384}, Bad{codes, 200, 384}, Bad{codes, 0, 384},
                       Bad{codes, 256, 320}, Bad{codes, 256, 0}, Bad{codes, int64_t{1} << 31, 128}}) {
    SCOPED_TRACE(std::to_string(b.rows) + " rows of " + std::to_string(b.cols_p) + " bytes");
    expect_invalid([&] { (void)cd::fp8_codes_map(b.codes, b.rows, b.cols_p); }, "FP8 weight codes");
  }
  ASSERT_EQ(cudaFree(codes), cudaSuccess);
}

// GEMM2's staged intermediate reaches the FP8 producer through a TMA map too (tensor_map.cu
// fp8_staged_rows_map): any number of routed rows (the last tile's box reads zeros past
// them), whole 128-byte groups only; anything else is refused, naming the rows.
TEST(Fp8Mode, StagedRowsMapTakesAnyRowCountAndWholeGroupsOnly) {
  REQUIRE_FP8_MODE();
  uint8_t* rows = nullptr;
  ASSERT_EQ(cudaMalloc(&rows, 200 * 384), cudaSuccess);
  EXPECT_NO_THROW(cd::fp8_staged_rows_map(rows, 200, 384));
  EXPECT_NO_THROW(cd::fp8_staged_rows_map(rows, 1, 128));
  struct Bad {
    const uint8_t* rows;
    int64_t count, cols_p;
  };
  for (const Bad& b : {Bad{nullptr, 200, 384}, Bad{rows, 0, 384}, Bad{rows, -1, 384}, Bad{rows, 200, 320},
                       Bad{rows, 200, 0}, Bad{rows, int64_t{1} << 31, 128}}) {
    SCOPED_TRACE(std::to_string(b.count) + " rows of " + std::to_string(b.cols_p) + " bytes");
    expect_invalid([&] { (void)cd::fp8_staged_rows_map(b.rows, b.count, b.cols_p); }, "FP8 staged rows");
  }
  ASSERT_EQ(cudaFree(rows), cudaSuccess);
}

}  // namespace
