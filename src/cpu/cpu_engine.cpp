// The fp32 CPU backend (reference.h: cpu_forward): the GPU pipeline's arithmetic on the
// CPU, so `--backend cpu` is a genuine second implementation judged by the float64
// reference, not a copy of it.
//
//   permute   (token, slot) pairs sorted by local expert, stable in (token, slot) order
//   GEMM1     operands dequantized to float (exact for MX values), fp32 accumulation
//   epilogue  bias, gated activation in fp32 with the kernels' code (activation_math.h),
//             requantization of each 32-column block with formats.h
//   GEMM2     fp32 accumulation over the requantized intermediate, bias
//   finalize  per token, slots 0..k-1 in fp32, output_scale, round
//
// Work items (expert x 64 kernel rows for GEMM1, expert x 32 W2 rows for GEMM2, tokens
// for finalize) write disjoint outputs and every sum has a fixed order, so the result
// is bitwise the same for any thread count.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "parallel.h"
#include "mxmoe/activation_math.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/reference.h"

namespace mxmoe {

namespace {

// Eight fp32 lanes, lane l accumulating k = l (mod 8) in increasing k; lanes then
// combine as a fixed pairwise tree. Like the tensor-core kernels: fp32 partial sums in
// a fixed order. Multiply and add stay separate (no FMA in either code path), so the
// AVX2 clone and the baseline code give the same bits.
typedef float v8f __attribute__((vector_size(32)));
// The same with 1-element alignment, for loads from and stores to plain float arrays.
typedef float v8f_u __attribute__((vector_size(32), aligned(sizeof(float))));

template <int R, int C>
[[gnu::always_inline]] inline void gemm_tile(const float* const* a, const float* const* b,
                                             int64_t k0, int64_t k1, float* acc, int64_t ld) {
  // Fully unrolled so the R*C accumulators live in registers.
  v8f s[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) s[r][c] = *reinterpret_cast<const v8f_u*>(acc + r * ld + 8 * c);
  for (int64_t k = k0; k < k1; k += 8) {
    v8f bv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) bv[c] = *reinterpret_cast<const v8f_u*>(b[c] + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const v8f av = *reinterpret_cast<const v8f_u*>(a[r] + k);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) s[r][c] += av * bv[c];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) *reinterpret_cast<v8f_u*>(acc + r * ld + 8 * c) = s[r][c];
}

// out[p][c] = sum_k a[p][k] * b[c][k] for p < np, c < nb (a multiple of 4); len a
// multiple of 32; acc holds np*nb*8 floats. K is walked in 4 KiB chunks (cache blocking,
// lane sums parked in acc in between: the order of every sum is unchanged).
[[gnu::always_inline]] inline void gemm_rows_body(const float* const* a, int64_t np,
                                                  const float* b, int64_t nb, int64_t len,
                                                  float* out, int64_t ldo, float* acc) {
  constexpr int64_t kChunk = 1024;
  const int64_t ld = nb * 8;
  std::fill(acc, acc + np * ld, 0.0f);
  for (int64_t k0 = 0; k0 < len; k0 += kChunk) {
    const int64_t k1 = std::min(len, k0 + kChunk);
    for (int64_t c = 0; c < nb; c += 4) {
      const float* bp[4] = {b + c * len, b + (c + 1) * len, b + (c + 2) * len, b + (c + 3) * len};
      int64_t p = 0;
      for (; p + 2 <= np; p += 2) gemm_tile<2, 4>(a + p, bp, k0, k1, acc + p * ld + 8 * c, ld);
      for (; p < np; ++p) gemm_tile<1, 4>(a + p, bp, k0, k1, acc + p * ld + 8 * c, ld);
    }
  }
  for (int64_t p = 0; p < np; ++p)
    for (int64_t c = 0; c < nb; ++c) {
      const float* l = acc + p * ld + 8 * c;
      out[p * ldo + c] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
}

void gemm_rows_generic(const float* const* a, int64_t np, const float* b, int64_t nb,
                       int64_t len, float* out, int64_t ldo, float* acc) {
  gemm_rows_body(a, np, b, nb, len, out, ldo, acc);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void gemm_rows_avx2(const float* const* a, int64_t np,
                                                    const float* b, int64_t nb, int64_t len,
                                                    float* out, int64_t ldo, float* acc) {
  gemm_rows_body(a, np, b, nb, len, out, ldo, acc);
}
#endif

void gemm_rows(const float* const* a, int64_t np, const float* b, int64_t nb, int64_t len,
               float* out, int64_t ldo, float* acc) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return gemm_rows_avx2(a, np, b, nb, len, out, ldo, acc);
#endif
  gemm_rows_generic(a, np, b, nb, len, out, ldo, acc);
}

// MXFP4 rows -> floats: E2M1 value times the E8M0 scale, both exact floats, so their
// product is exact (a 0xFF scale gives NaN for the whole block). One table entry per
// byte (both nibbles) keeps this a plain load-multiply-store loop.
void dequant_rows_f32(const uint8_t* packed, const uint8_t* scale, int64_t nrows, int64_t cols,
                      float* dst) {
  static const auto table = [] {
    std::array<std::array<float, 2>, 256> t{};
    for (int v = 0; v < 256; ++v) {
      t[v][0] = fmt::e2m1_to_float(static_cast<uint8_t>(v & 0xF));
      t[v][1] = fmt::e2m1_to_float(static_cast<uint8_t>(v >> 4));
    }
    return t;
  }();
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t b = 0; b < cols / kMxBlock; ++b) {
      const float s = fmt::e8m0_to_float(scale[r * (cols / kMxBlock) + b]);
      uint8_t bytes[kMxBlock / 2];
      std::memcpy(bytes, packed + r * (cols / 2) + b * (kMxBlock / 2), sizeof bytes);
      float* d = dst + r * cols + b * kMxBlock;
      for (int i = 0; i < kMxBlock / 2; ++i) {
        d[2 * i] = table[bytes[i]][0] * s;
        d[2 * i + 1] = table[bytes[i]][1] * s;
      }
    }
}

// The gated activation with the kernels' own fp32 code (activation_math.h), so the CPU
// backend computes it exactly as the GPU does.
inline float activation_f32(const ActivationParams& p, int64_t e, float g, float u) {
  const float limit = p.kind == Activation::SwiGLU_OAI ? p.limit_of(e) : 0.0f;
  const float alpha = p.kind == Activation::SiLU_Gated ? 0.0f : p.alpha_of(e);
  const float beta = p.kind == Activation::SiLU_Gated ? 0.0f : p.beta_of(e);
  return am::gated_activation_f32(static_cast<int>(p.kind), g, u, alpha, beta, limit);
}

// Store one 32-column block of the intermediate as the kernel does and return what
// GEMM2 reads back.
inline void requantize_block(const MoeConfig& cfg, float* v) {
  if (cfg.resolved_intermediate() == IntermediateFormat::MXFP8) {
    uint8_t codes[kMxBlock], scale;
    fmt::quantize_block_e4m3(v, codes, &scale, cfg.scale_rule);
    const float s = fmt::e8m0_to_float(scale);
    for (int i = 0; i < kMxBlock; ++i) v[i] = fmt::e4m3_to_float(codes[i]) * s;
  } else {
    for (int i = 0; i < kMxBlock; ++i) v[i] = fmt::bf16_to_float(fmt::float_to_bf16(v[i]));
  }
}

}  // namespace

void cpu_forward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                 const Routing& routing, Output& out, int threads) {
  validate_forward_inputs(cfg, w, x, routing);
  const int64_t M = x.tokens, K = cfg.hidden, N = cfg.intermediate, E = w.num_local;
  const int64_t top_k = cfg.top_k;
  const int nt = cpu::resolve_threads(threads);

  std::vector<float> result(static_cast<size_t>(M * K), 0.0f);
  // Token batches bound the per-pair buffers (act [P][N], y [P][K] floats) to ~256 MiB;
  // routed rows are read in place through row pointers, never copied.
  const int64_t cap_pairs = std::max<int64_t>(top_k, (int64_t{256} << 20) / ((N + K) * 4));
  const int64_t batch = std::max<int64_t>(1, cap_pairs / top_k);

  constexpr int64_t kTile1 = 2 * kGateUpChunk;  // 64 kernel rows = 32 intermediate columns
  constexpr int64_t kTile2 = kMxBlock;          // 32 rows of W2
  std::vector<std::vector<float>> wscratch(static_cast<size_t>(nt)), oscratch(static_cast<size_t>(nt));
  std::vector<std::vector<const float*>> rows(static_cast<size_t>(nt));
  std::vector<std::vector<float>> lanes(static_cast<size_t>(nt));

  for (int64_t t0 = 0; t0 < M; t0 += batch) {
    const int64_t t1 = std::min(M, t0 + batch), mb = t1 - t0, slots = mb * top_k;

    // ---- permute: counting sort of the (token, slot) pairs by local expert.
    std::vector<int32_t> expert_of(static_cast<size_t>(slots));
    std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int64_t i = 0; i < slots; ++i) {
      expert_of[i] = cfg.local_of(routing.ids[static_cast<size_t>(t0 * top_k + i)]);
      if (expert_of[i] >= 0) ++offsets[expert_of[i] + 1];
    }
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
    const int64_t P = offsets[E];
    if (P == 0) continue;
    std::vector<int64_t> perm_token(static_cast<size_t>(P)), slot_pos(static_cast<size_t>(slots), -1);
    {
      std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
      for (int64_t i = 0; i < slots; ++i)
        if (expert_of[i] >= 0) {
          const int64_t pos = fill[expert_of[i]]++;
          perm_token[pos] = i / top_k;
          slot_pos[i] = pos;
        }
    }

    // ---- activations of the batch as floats (exact: E4M3 x E8M0 or BF16).
    std::vector<float> xf(static_cast<size_t>(mb * K));
    cpu::parallel_for(mb, nt, [&](int64_t t, int) {
      const int64_t base = (t0 + t) * K;
      float* d = &xf[t * K];
      if (x.format == InputFormat::BF16) {
        for (int64_t k = 0; k < K; ++k) d[k] = fmt::bf16_to_float(x.bf16[base + k]);
      } else {
        for (int64_t k = 0; k < K; ++k)
          d[k] = fmt::e4m3_to_float(x.fp8[base + k]) * fmt::e8m0_to_float(x.scale[(base + k) / kMxBlock]);
      }
    });

    std::vector<int64_t> active;
    for (int64_t e = 0; e < E; ++e)
      if (offsets[e + 1] > offsets[e]) active.push_back(e);
    const int64_t na = static_cast<int64_t>(active.size());

    // ---- GEMM1 + activation + requantization, one 64-row tile of W13 per item.
    std::vector<float> act(static_cast<size_t>(P * N));
    const int64_t tiles1 = N / kGateUpChunk;
    cpu::parallel_for(na * tiles1, nt, [&](int64_t item, int worker) {
      const int64_t e = active[item / tiles1], tile = item % tiles1;
      const int64_t p0 = offsets[e], np = offsets[e + 1] - p0;
      std::vector<float>& wt = wscratch[worker];
      std::vector<float>& acc = oscratch[worker];
      std::vector<const float*>& a = rows[worker];
      wt.resize(static_cast<size_t>(kTile1 * K));  // capacity persists across items
      acc.resize(static_cast<size_t>(np * kTile1));
      a.resize(static_cast<size_t>(np));
      const int64_t row0 = e * 2 * N + tile * kTile1;
      dequant_rows_f32(&w.w13_packed[row0 * (K / 2)], &w.w13_scale[row0 * (K / kMxBlock)], kTile1, K,
                       wt.data());
      for (int64_t q = 0; q < np; ++q) a[q] = &xf[perm_token[p0 + q] * K];
      lanes[worker].resize(static_cast<size_t>(np * kTile1 * 8));
      gemm_rows(a.data(), np, wt.data(), kTile1, K, acc.data(), kTile1, lanes[worker].data());
      const float* bias = cfg.has_bias ? &w.w13_bias[row0] : nullptr;
      float v[kMxBlock];
      for (int64_t q = 0; q < np; ++q) {
        const float* h = &acc[q * kTile1];
        for (int i = 0; i < kMxBlock; ++i) {
          float g = h[i], u = h[kGateUpChunk + i];
          if (bias) {
            g += bias[i];
            u += bias[kGateUpChunk + i];
          }
          v[i] = activation_f32(cfg.activation, e, g, u);
        }
        requantize_block(cfg, v);
        std::memcpy(&act[(p0 + q) * N + tile * kGateUpChunk], v, sizeof v);
      }
    });

    // ---- GEMM2, one 32-row tile of W2 per item.
    std::vector<float> y(static_cast<size_t>(P * K));
    const int64_t tiles2 = K / kTile2;
    cpu::parallel_for(na * tiles2, nt, [&](int64_t item, int worker) {
      const int64_t e = active[item / tiles2], tile = item % tiles2;
      const int64_t p0 = offsets[e], np = offsets[e + 1] - p0;
      std::vector<float>& wt = wscratch[worker];
      std::vector<float>& acc = oscratch[worker];
      std::vector<const float*>& a = rows[worker];
      wt.resize(static_cast<size_t>(kTile2 * N));
      acc.resize(static_cast<size_t>(np * kTile2));
      a.resize(static_cast<size_t>(np));
      const int64_t row0 = e * K + tile * kTile2;
      dequant_rows_f32(&w.w2_packed[row0 * (N / 2)], &w.w2_scale[row0 * (N / kMxBlock)], kTile2, N,
                       wt.data());
      for (int64_t q = 0; q < np; ++q) a[q] = &act[(p0 + q) * N];
      lanes[worker].resize(static_cast<size_t>(np * kTile2 * 8));
      gemm_rows(a.data(), np, wt.data(), kTile2, N, acc.data(), kTile2, lanes[worker].data());
      const float* bias = cfg.has_bias ? &w.w2_bias[row0] : nullptr;
      for (int64_t q = 0; q < np; ++q)
        for (int64_t r = 0; r < kTile2; ++r)
          y[(p0 + q) * K + tile * kTile2 + r] = acc[q * kTile2 + r] + (bias ? bias[r] : 0.0f);
    });

    // ---- finalize: fixed slot order, fp32.
    cpu::parallel_for(mb, nt, [&](int64_t t, int) {
      float* o = &result[(t0 + t) * K];
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t pos = slot_pos[t * top_k + j];
        if (pos < 0) continue;
        const float wgt = routing.weights[static_cast<size_t>((t0 + t) * top_k + j)];
        const float* yp = &y[pos * K];
        for (int64_t k = 0; k < K; ++k) o[k] += wgt * yp[k];
      }
      for (int64_t k = 0; k < K; ++k) o[k] *= cfg.output_scale;
    });
  }

  Output o;
  o.format = cfg.output_format;
  o.tokens = M;
  o.hidden = K;
  if (cfg.output_format == OutputFormat::BF16) {
    o.bf16.resize(result.size());
    for (size_t i = 0; i < result.size(); ++i) o.bf16[i] = fmt::float_to_bf16(result[i]);
  } else {
    o.fp32 = std::move(result);
  }
  out = std::move(o);
}

}  // namespace mxmoe
