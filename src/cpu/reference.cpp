// The float64 oracle (SPEC §8) and the unquantized "ideal" (reference.h).
//
// Both run one engine (forward_f64) that differs only in where its numbers come from:
// the oracle dequantizes the same MXFP4/MXFP8/BF16 bytes the kernels read (exactly:
// every MX value is a small integer times a power of two, which a double holds) and
// mirrors the intermediate quantization; the ideal reads float weights and never rounds.
//
// Work is split so that the answer cannot depend on the thread count:
//   * (token, slot) pairs are grouped by local expert, in (token, slot) order;
//   * GEMM1 items are (expert, 64 kernel rows) = 32 whole intermediate columns (gate and
//     up side by side, layout.h), so the activation and the 32-wide MXFP8 block of the
//     intermediate are finished inside one item; GEMM2 items are (expert, 32 rows of W2);
//   * every dot product has one fixed summation order (dot_tile), whatever item or
//     thread computes it; finalize sums slots 0..k-1 per element.
// Each item dequantizes only its own weight rows, so every expert's weights are
// dequantized once per token batch and memory stays at one row chunk per thread plus
// the per-pair activations (token batches bound those to ~256 MiB).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "parallel.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/reference.h"

namespace mxmoe {

void validate_forward_inputs(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                             const Routing& routing) {
  cfg.validate();
  w.validate(cfg);
  x.validate("x", cfg.hidden);
  MXMOE_CHECK_ARG(x.format == cfg.input_format, "x", "format ", to_string(x.format),
                  " differs from config.input_format ", to_string(cfg.input_format),
                  " (quantize with Activations::to_mxfp8 or change the config)");
  routing.validate(cfg);
  MXMOE_CHECK_ARG(routing.tokens == x.tokens, "routing.tokens", routing.tokens,
                  " does not match x.tokens ", x.tokens);
}

namespace {

// Four doubles; GCC/Clang lower it to whatever SIMD the target has. Plain multiply and
// add, never FMA (the baseline x86-64 target has none, and the AVX2 clone below does not
// enable it), so both code paths give the same bits on every x86-64 machine.
typedef double v4d __attribute__((vector_size(32)));
// The same with 1-element alignment, for loads from and stores to plain double arrays.
typedef double v4d_u __attribute__((vector_size(32), aligned(sizeof(double))));

// The one summation order of every dot product here: lane l accumulates the elements
// k = l (mod 4) in increasing k, then (l0 + l1) + (l2 + l3). Tiling (R x C dots) and
// K-chunking (lane sums parked in `acc` between chunks) only reuse loads and cache;
// neither changes any dot's order.
template <int R, int C>
[[gnu::always_inline]] inline void dot_tile(const double* const* a, const double* const* b,
                                            int64_t k0, int64_t k1, double* acc, int64_t ld) {
  // Fully unrolled so the R*C accumulators live in registers.
  v4d s[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) s[r][c] = *reinterpret_cast<const v4d_u*>(acc + r * ld + 4 * c);
  for (int64_t k = k0; k < k1; k += 4) {
    v4d bv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) bv[c] = *reinterpret_cast<const v4d_u*>(b[c] + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const v4d av = *reinterpret_cast<const v4d_u*>(a[r] + k);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) s[r][c] += av * bv[c];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) *reinterpret_cast<v4d_u*>(acc + r * ld + 4 * c) = s[r][c];
}

// out[p][c] = dot(a[p], b[c]) for p < np (row pointers) and c < nb (rows of b, stride
// len); nb a multiple of 4 (64 or 32 rows), len a multiple of 32. acc: np*nb*4 doubles.
// K is walked in 4 KiB chunks so a chunk of the weight rows and of the routed rows
// stays in L2 while all tiles use it.
[[gnu::always_inline]] inline void dot_block_body(const double* const* a, int64_t np,
                                                  const double* b, int64_t nb, int64_t len,
                                                  double* out, int64_t ldo, double* acc) {
  constexpr int64_t kChunk = 512;
  const int64_t ld = nb * 4;
  std::fill(acc, acc + np * ld, 0.0);
  for (int64_t k0 = 0; k0 < len; k0 += kChunk) {
    const int64_t k1 = std::min(len, k0 + kChunk);
    for (int64_t c = 0; c < nb; c += 4) {
      const double* bp[4] = {b + c * len, b + (c + 1) * len, b + (c + 2) * len, b + (c + 3) * len};
      int64_t p = 0;
      for (; p + 2 <= np; p += 2) dot_tile<2, 4>(a + p, bp, k0, k1, acc + p * ld + 4 * c, ld);
      for (; p < np; ++p) dot_tile<1, 4>(a + p, bp, k0, k1, acc + p * ld + 4 * c, ld);
    }
  }
  for (int64_t p = 0; p < np; ++p)
    for (int64_t c = 0; c < nb; ++c) {
      const double* l = acc + p * ld + 4 * c;
      out[p * ldo + c] = (l[0] + l[1]) + (l[2] + l[3]);
    }
}

void dot_block_generic(const double* const* a, int64_t np, const double* b, int64_t nb,
                       int64_t len, double* out, int64_t ldo, double* acc) {
  dot_block_body(a, np, b, nb, len, out, ldo, acc);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same code with 256-bit registers where the CPU has them (about 3x faster here).
__attribute__((target("avx2"))) void dot_block_avx2(const double* const* a, int64_t np,
                                                    const double* b, int64_t nb, int64_t len,
                                                    double* out, int64_t ldo, double* acc) {
  dot_block_body(a, np, b, nb, len, out, ldo, acc);
}
#endif

void dot_block(const double* const* a, int64_t np, const double* b, int64_t nb, int64_t len,
               double* out, int64_t ldo, double* acc) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return dot_block_avx2(a, np, b, nb, len, out, ldo, acc);
#endif
  dot_block_generic(a, np, b, nb, len, out, ldo, acc);
}

// Where the engine's numbers come from (quantized bytes or ideal floats).
struct F64Problem {
  const MoeConfig* cfg = nullptr;
  const Routing* routing = nullptr;
  int64_t tokens = 0, num_local = 0;
  // dst[r][0..cols) = rows [row0, row0+nrows) of W13 (kernel order, cols K) or W2 (cols N)
  // of local expert e, exactly.
  std::function<void(int64_t e, int64_t row0, int64_t nrows, double* dst)> w13_rows, w2_rows;
  std::function<void(int64_t t, double* dst)> x_row;  // K values of token t
  const float* w13_bias = nullptr;                   // [E_local][2N] or null
  const float* w2_bias = nullptr;                    // [E_local][K] or null
  bool mirror_intermediate = false;
  std::vector<NearTie>* near_ties = nullptr;  // with mirror_intermediate: collected here
};

// One near-tie of the mirrored intermediate: routed pair `pair` (expert e) may hold, at
// intermediate columns n, the values differing by delta[n] (reference.h, NearTie).
struct Alternative {
  int64_t pair = 0, e = 0;
  std::vector<std::pair<int64_t, double>> delta;  // (column, other value - mirrored value)
};

// A value within this relative distance of a rounding boundary of the intermediate (an
// E4M3 or BF16 midpoint, or the amax of an MX block at a scale step) is a near-tie. A
// backend's fp32 GEMM1 sum and activation differ from the float64 ones by ~1e-6
// relative for well-conditioned sums; 2^-16 leaves a wide margin, and flags ~0.05% of
// E4M3 values (~0.8% of BF16 ones).
constexpr double kNearTie = 1.0 / 65536.0;

// Rounds the activation output the way the kernels store the intermediate, then returns
// the exact value GEMM2 consumes. v holds one 32-wide block (a whole MXFP8 block).
// `alts` (optional) receives the block's near-ties (kNearTie): single values that round
// the other way at f * (1 +- kNearTie), and for MXFP8 the whole block quantized with the
// scale byte that amax * (1 +- kNearTie) would choose. Columns are block-relative here.
void mirror_block(const MoeConfig& cfg, double* v,
                  std::vector<std::vector<std::pair<int64_t, double>>>* alts = nullptr) {
  float f[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) f[i] = static_cast<float>(v[i]);
  auto nudged = [](float x, double by) { return static_cast<float>(static_cast<double>(x) * by); };
  double q[kMxBlock];  // the mirrored values
  if (cfg.resolved_intermediate() == IntermediateFormat::MXFP8) {
    uint8_t codes[kMxBlock], scale;
    fmt::quantize_block_e4m3(f, codes, &scale, cfg.scale_rule);
    for (int i = 0; i < kMxBlock; ++i) q[i] = fmt::dequant_e4m3(codes[i], scale);
    if (alts && scale != fmt::kE8m0Nan) {
      const float inv = fmt::mx_inv_scale(scale);
      for (int i = 0; i < kMxBlock; ++i)
        for (double by : {1.0 - kNearTie, 1.0 + kNearTie}) {
          const uint8_t other = fmt::float_to_e4m3(nudged(f[i], by) * inv);
          const double d = fmt::dequant_e4m3(other, scale) - q[i];
          if (other != codes[i] && std::isfinite(d)) alts->push_back({{i, d}});
        }
      const float amax = fmt::block_amax(f, kMxBlock);
      for (double by : {1.0 - kNearTie, 1.0 + kNearTie}) {
        const uint8_t other = fmt::mx_scale_byte(nudged(amax, by), fmt::kE4m3Max, fmt::kE4m3Emax, cfg.scale_rule);
        if (other == scale || other == fmt::kE8m0Nan) continue;
        const float oinv = fmt::mx_inv_scale(other);
        std::vector<std::pair<int64_t, double>> block;
        for (int i = 0; i < kMxBlock; ++i) {
          const double d = fmt::dequant_e4m3(fmt::float_to_e4m3(f[i] * oinv), other) - q[i];
          if (d != 0 && std::isfinite(d)) block.push_back({i, d});
        }
        if (!block.empty()) alts->push_back(std::move(block));
      }
    }
  } else {
    for (int i = 0; i < kMxBlock; ++i) {
      q[i] = static_cast<double>(fmt::bf16_to_float(fmt::float_to_bf16(f[i])));
      if (alts)
        for (double by : {1.0 - kNearTie, 1.0 + kNearTie}) {
          const double other = static_cast<double>(fmt::bf16_to_float(fmt::float_to_bf16(nudged(f[i], by))));
          if (other != q[i] && std::isfinite(other - q[i])) alts->push_back({{i, other - q[i]}});
        }
    }
  }
  for (int i = 0; i < kMxBlock; ++i) v[i] = q[i];
}

// out64 [M][K] (unrounded, output_scale applied).
void forward_f64(const F64Problem& p, std::vector<double>& out64, int threads) {
  const MoeConfig& cfg = *p.cfg;
  const Routing& rt = *p.routing;
  const int64_t M = p.tokens, K = cfg.hidden, N = cfg.intermediate, E = p.num_local;
  const int64_t top_k = cfg.top_k;
  const int nt = cpu::resolve_threads(threads);
  out64.assign(static_cast<size_t>(M * K), 0.0);

  // Token batches keep the per-pair buffers (act [P][N], y [P][K]) near 256 MiB.
  const int64_t cap_pairs = std::max<int64_t>(top_k, (int64_t{256} << 20) / ((N + K) * 8));
  const int64_t batch = std::max<int64_t>(1, cap_pairs / top_k);

  constexpr int64_t kRows1 = 2 * kGateUpChunk;  // GEMM1 item: 64 kernel rows
  constexpr int64_t kRows2 = kMxBlock;              // GEMM2 item: 32 rows of W2
  std::vector<std::vector<double>> wbuf(static_cast<size_t>(nt));
  std::vector<std::vector<double>> hbuf(static_cast<size_t>(nt));
  std::vector<std::vector<const double*>> abuf(static_cast<size_t>(nt));
  std::vector<std::vector<double>> accbuf(static_cast<size_t>(nt));
  std::vector<std::vector<Alternative>> altbuf(static_cast<size_t>(nt));  // per worker

  for (int64_t t0 = 0; t0 < M; t0 += batch) {
    const int64_t t1 = std::min(M, t0 + batch), mb = t1 - t0;

    // Group this batch's (token, slot) pairs by local expert, in (token, slot) order.
    std::vector<int64_t> start(static_cast<size_t>(E + 1), 0);
    std::vector<int64_t> pair_of(static_cast<size_t>(mb * top_k), -1);
    std::vector<int32_t> local(static_cast<size_t>(mb * top_k), -1);
    for (int64_t i = 0; i < mb * top_k; ++i) {
      local[i] = cfg.local_of(rt.ids[static_cast<size_t>(t0 * top_k + i)]);
      if (local[i] >= 0) ++start[local[i] + 1];
    }
    for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
    const int64_t P = start[E];
    std::vector<int64_t> pair_token(static_cast<size_t>(P)), pair_slot(static_cast<size_t>(P));
    {
      std::vector<int64_t> cursor(start.begin(), start.end() - 1);
      for (int64_t i = 0; i < mb * top_k; ++i) {
        if (local[i] < 0) continue;
        const int64_t pos = cursor[local[i]]++;
        pair_of[i] = pos;
        pair_token[pos] = i / top_k;  // batch-relative token
        pair_slot[pos] = i;           // batch-relative token * top_k + slot
      }
    }
    if (P == 0) continue;  // every row of the batch stays zero

    std::vector<double> xb(static_cast<size_t>(mb * K));
    cpu::parallel_for(mb, nt, [&](int64_t t, int) { p.x_row(t0 + t, &xb[t * K]); });

    std::vector<int64_t> experts;
    for (int64_t e = 0; e < E; ++e)
      if (start[e + 1] > start[e]) experts.push_back(e);
    const int64_t ne = static_cast<int64_t>(experts.size());

    // Per-worker scratch, sized for either GEMM's piece (kRows1 W13 rows or kRows2 W2
    // rows, np routed rows).
    auto size_scratch = [&](int worker, int64_t np) {
      wbuf[worker].resize(static_cast<size_t>(std::max(kRows1 * K, kRows2 * N)));
      hbuf[worker].resize(static_cast<size_t>(std::max(np * kRows1, np * kRows2)));
      abuf[worker].resize(static_cast<size_t>(np));
    };

    // GEMM1 + bias + activation + intermediate mirror.
    std::vector<double> act(static_cast<size_t>(P * N));
    const int64_t chunks1 = N / kGateUpChunk;
    cpu::parallel_for(ne * chunks1, nt, [&](int64_t item, int worker) {
      const int64_t e = experts[item / chunks1], c = item % chunks1;
      const int64_t p0 = start[e], np = start[e + 1] - p0;
      std::vector<double>& w = wbuf[worker];
      std::vector<double>& h = hbuf[worker];
      std::vector<const double*>& a = abuf[worker];
      size_scratch(worker, np);
      p.w13_rows(e, c * kRows1, kRows1, w.data());
      for (int64_t q = 0; q < np; ++q) a[q] = &xb[pair_token[p0 + q] * K];
      accbuf[worker].resize(static_cast<size_t>(np * kRows1 * 4));
      dot_block(a.data(), np, w.data(), kRows1, K, h.data(), kRows1, accbuf[worker].data());
      const float* bias = p.w13_bias ? p.w13_bias + (e * 2 * N + c * kRows1) : nullptr;
      double v[kMxBlock];
      for (int64_t q = 0; q < np; ++q) {
        const double* hq = &h[q * kRows1];
        for (int i = 0; i < kMxBlock; ++i) {
          double g = hq[i], u = hq[kGateUpChunk + i];
          if (bias) {
            g += static_cast<double>(bias[i]);
            u += static_cast<double>(bias[kGateUpChunk + i]);
          }
          v[i] = activation_ref(cfg.activation, e, g, u);
        }
        if (p.mirror_intermediate) {
          std::vector<std::vector<std::pair<int64_t, double>>> block_alts;
          auto* alts = p.near_ties ? &block_alts : nullptr;
          mirror_block(cfg, v, alts);
          if (alts)
            for (auto& a : *alts) {
              for (auto& [col, d] : a) col += c * kGateUpChunk;
              altbuf[worker].push_back(Alternative{p0 + q, e, std::move(a)});
            }
        }
        std::memcpy(&act[(p0 + q) * N + c * kGateUpChunk], v, sizeof v);
      }
    });
    // Near-ties of this batch, in a fixed order (by pair, then column): their effect on
    // y is computed with GEMM2's weight rows below.
    std::vector<Alternative> alts;
    for (auto& b : altbuf) {
      for (auto& a : b) alts.push_back(std::move(a));
      b.clear();
    }
    std::sort(alts.begin(), alts.end(), [](const Alternative& a, const Alternative& b) {
      if (a.pair != b.pair) return a.pair < b.pair;
      if (a.delta.front().first != b.delta.front().first) return a.delta.front().first < b.delta.front().first;
      if (a.delta.size() != b.delta.size()) return a.delta.size() < b.delta.size();
      return a.delta.front().second < b.delta.front().second;
    });
    std::vector<int64_t> alts_of_expert(static_cast<size_t>(E + 1), 0);  // alts sorted by pair
    for (const Alternative& a : alts) ++alts_of_expert[a.e + 1];           // = by expert
    for (int64_t e = 0; e < E; ++e) alts_of_expert[e + 1] += alts_of_expert[e];
    std::vector<double> alt_y(alts.size() * static_cast<size_t>(K), 0.0);

    // GEMM2 + bias.
    std::vector<double> y(static_cast<size_t>(P * K));
    const int64_t chunks2 = K / kRows2;
    cpu::parallel_for(ne * chunks2, nt, [&](int64_t item, int worker) {
      const int64_t e = experts[item / chunks2], c = item % chunks2;
      const int64_t p0 = start[e], np = start[e + 1] - p0;
      std::vector<double>& w = wbuf[worker];
      std::vector<double>& h = hbuf[worker];
      std::vector<const double*>& a = abuf[worker];
      size_scratch(worker, np);
      p.w2_rows(e, c * kRows2, kRows2, w.data());
      for (int64_t q = 0; q < np; ++q) a[q] = &act[(p0 + q) * N];
      accbuf[worker].resize(static_cast<size_t>(np * kRows2 * 4));
      dot_block(a.data(), np, w.data(), kRows2, N, h.data(), kRows2, accbuf[worker].data());
      const float* bias = p.w2_bias ? p.w2_bias + (e * K + c * kRows2) : nullptr;
      for (int64_t q = 0; q < np; ++q)
        for (int64_t r = 0; r < kRows2; ++r)
          y[(p0 + q) * K + c * kRows2 + r] =
              h[q * kRows2 + r] + (bias ? static_cast<double>(bias[r]) : 0.0);
      // This expert's near-ties: their change of y on these rows (W2 rows = y columns).
      for (int64_t i = alts_of_expert[e]; i < alts_of_expert[e + 1]; ++i)
        for (int64_t r = 0; r < kRows2; ++r) {
          double d = 0;
          for (const auto& [col, dv] : alts[i].delta) d += w[r * N + col] * dv;
          alt_y[i * K + c * kRows2 + r] = d;
        }
    });

    // Finalize: slots in order 0..k-1, then the output scale.
    const double oscale = static_cast<double>(cfg.output_scale);
    cpu::parallel_for(mb, nt, [&](int64_t t, int) {
      double* o = &out64[(t0 + t) * K];
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t pos = pair_of[t * top_k + j];
        if (pos < 0) continue;
        const double wt = static_cast<double>(rt.weights[static_cast<size_t>((t0 + t) * top_k + j)]);
        const double* yp = &y[pos * K];
        for (int64_t k = 0; k < K; ++k) o[k] += wt * yp[k];
      }
      for (int64_t k = 0; k < K; ++k) o[k] *= oscale;
    });
    if (p.near_ties)
      for (size_t i = 0; i < alts.size(); ++i) {
        const int64_t slot = pair_slot[alts[i].pair];
        const double wt = static_cast<double>(rt.weights[static_cast<size_t>(t0 * top_k + slot)]);
        NearTie tie;
        tie.row = t0 + slot / top_k;
        tie.delta.resize(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) tie.delta[k] = wt * alt_y[i * K + k] * oscale;
        p.near_ties->push_back(std::move(tie));
      }
  }
}

// Exact dequantization of MXFP4 rows (row-major, `cols` along K): element value is
// E2M1(code) * 2^(scale-127), the same double fmt::dequant_e2m1 returns, computed once
// per block for the scale (NaN for a 0xFF scale, so NaN reaches every element of it).
void dequant_mxfp4_rows(const uint8_t* packed, const uint8_t* scale, int64_t nrows, int64_t cols,
                        double* dst) {
  double lut[16];
  for (int c = 0; c < 16; ++c) lut[c] = fmt::dequant_e2m1(static_cast<uint8_t>(c), 0, 127);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* pr = packed + r * (cols / 2);
    const uint8_t* sr = scale + r * (cols / kMxBlock);
    double* d = dst + r * cols;
    for (int64_t b = 0; b < cols / kMxBlock; ++b) {
      const double s = fmt::dequant_e2m1(0x2, 0, sr[b]);  // 1.0 * 2^(s-127), or NaN
      uint8_t bytes[kMxBlock / 2];  // a local copy: stores to d cannot alias it
      std::memcpy(bytes, pr + b * (kMxBlock / 2), sizeof bytes);
      for (int i = 0; i < kMxBlock / 2; ++i) {
        d[b * kMxBlock + 2 * i] = lut[bytes[i] & 0xF] * s;
        d[b * kMxBlock + 2 * i + 1] = lut[bytes[i] >> 4] * s;
      }
    }
  }
}

void round_output(const MoeConfig& cfg, int64_t M, const std::vector<double>& v, Output& out) {
  Output o;
  o.format = cfg.output_format;
  o.tokens = M;
  o.hidden = cfg.hidden;
  if (cfg.output_format == OutputFormat::BF16) {
    o.bf16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) o.bf16[i] = fmt::float_to_bf16(static_cast<float>(v[i]));
  } else {
    o.fp32.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) o.fp32[i] = static_cast<float>(v[i]);
  }
  out = std::move(o);
}

void validate_ideal(const MoeConfig& cfg, const IdealWeights& w, const std::vector<float>& x,
                    const Routing& routing) {
  cfg.validate();
  const int64_t el = cfg.local_experts(), K = cfg.hidden, N = cfg.intermediate;
  MXMOE_CHECK_ARG(w.num_local == el, "weights.num_local", w.num_local,
                  " does not match the config's local experts ", el);
  MXMOE_CHECK_ARG(w.hidden == K, "weights.hidden", w.hidden, " does not match config.hidden ", K);
  MXMOE_CHECK_ARG(w.intermediate == N, "weights.intermediate", w.intermediate,
                  " does not match config.intermediate ", N);
  MXMOE_CHECK_ARG(static_cast<int64_t>(w.w13.size()) == el * 2 * N * K, "weights.w13", "has ",
                  w.w13.size(), " elements, expected ", el * 2 * N * K, " ([E_local][2N][K])");
  MXMOE_CHECK_ARG(static_cast<int64_t>(w.w2.size()) == el * K * N, "weights.w2", "has ",
                  w.w2.size(), " elements, expected ", el * K * N, " ([E_local][K][N])");
  const int64_t b13 = cfg.has_bias ? el * 2 * N : 0, b2 = cfg.has_bias ? el * K : 0;
  MXMOE_CHECK_ARG(static_cast<int64_t>(w.w13_bias.size()) == b13, "weights.w13_bias", "has ",
                  w.w13_bias.size(), " elements, expected ", b13, " (config.has_bias ",
                  cfg.has_bias, ")");
  MXMOE_CHECK_ARG(static_cast<int64_t>(w.w2_bias.size()) == b2, "weights.w2_bias", "has ",
                  w.w2_bias.size(), " elements, expected ", b2, " (config.has_bias ",
                  cfg.has_bias, ")");
  routing.validate(cfg);
  MXMOE_CHECK_ARG(static_cast<int64_t>(x.size()) == routing.tokens * K, "x", "has ", x.size(),
                  " elements, expected routing.tokens * hidden = ", routing.tokens * K);
}

}  // namespace

void reference_forward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                       const Routing& routing, Output& out, std::vector<double>* out64,
                       int threads, std::vector<NearTie>* near_ties) {
  validate_forward_inputs(cfg, w, x, routing);
  const int64_t K = cfg.hidden, N = cfg.intermediate;
  F64Problem p;
  p.cfg = &cfg;
  p.routing = &routing;
  p.tokens = x.tokens;
  p.num_local = w.num_local;
  p.w13_rows = [&](int64_t e, int64_t row0, int64_t nrows, double* dst) {
    const int64_t row = e * 2 * N + row0;
    dequant_mxfp4_rows(&w.w13_packed[row * (K / 2)], &w.w13_scale[row * (K / kMxBlock)], nrows,
                       K, dst);
  };
  p.w2_rows = [&](int64_t e, int64_t row0, int64_t nrows, double* dst) {
    const int64_t row = e * K + row0;
    dequant_mxfp4_rows(&w.w2_packed[row * (N / 2)], &w.w2_scale[row * (N / kMxBlock)], nrows, N,
                       dst);
  };
  p.x_row = [&](int64_t t, double* dst) {
    for (int64_t k = 0; k < K; ++k) dst[k] = x.value(t, k);
  };
  if (cfg.has_bias) {
    p.w13_bias = w.w13_bias.data();
    p.w2_bias = w.w2_bias.data();
  }
  p.mirror_intermediate = true;
  if (near_ties) near_ties->clear();
  p.near_ties = near_ties;
  std::vector<double> v;
  forward_f64(p, v, threads);
  round_output(cfg, x.tokens, v, out);
  if (out64) *out64 = std::move(v);
}

std::vector<double> reference_toward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                                     const Routing& routing, const std::vector<double>& actual,
                                     TieCounts* counts, int threads) {
  // A BF16 output whose float64 value lies within this relative distance of a rounding
  // midpoint may round either way in a backend: its fp32 sums and the intermediate's
  // near-ties move an output by ~2e-5 relative at our shapes; 2^-14 leaves a margin.
  constexpr double kOutputTieWindow = 1.0 / 16384.0;
  Output out;
  std::vector<double> ref64;
  std::vector<NearTie> ties;
  reference_forward(cfg, w, x, routing, out, &ref64, threads, &ties);
  MXMOE_CHECK_ARG(actual.size() == ref64.size(), "actual", "has ", actual.size(), " elements, expected ",
                  x.tokens, " x ", cfg.hidden);
  TieCounts c;
  c.offered = static_cast<int64_t>(ties.size());
  c.taken = take_near_ties(actual, ref64, cfg.hidden, ties, cfg.output_format);
  // The taken ties moved ref64: round it to the output format again.
  round_output(cfg, x.tokens, ref64, out);
  std::vector<double> ref = output_values(out);
  if (cfg.output_format == OutputFormat::BF16) c.output_taken = take_output_ties(actual, ref, ref64, kOutputTieWindow);
  if (counts) *counts = c;
  return ref;
}

void ideal_forward(const MoeConfig& cfg, const IdealWeights& w, const std::vector<float>& x,
                   const Routing& routing, std::vector<double>& out, int threads) {
  validate_ideal(cfg, w, x, routing);
  const int64_t K = cfg.hidden, N = cfg.intermediate;
  F64Problem p;
  p.cfg = &cfg;
  p.routing = &routing;
  p.tokens = routing.tokens;
  p.num_local = w.num_local;
  p.w13_rows = [&](int64_t e, int64_t row0, int64_t nrows, double* dst) {
    const float* src = &w.w13[(e * 2 * N + row0) * K];
    for (int64_t i = 0; i < nrows * K; ++i) dst[i] = static_cast<double>(src[i]);
  };
  p.w2_rows = [&](int64_t e, int64_t row0, int64_t nrows, double* dst) {
    const float* src = &w.w2[(e * K + row0) * N];
    for (int64_t i = 0; i < nrows * N; ++i) dst[i] = static_cast<double>(src[i]);
  };
  p.x_row = [&](int64_t t, double* dst) {
    for (int64_t k = 0; k < K; ++k) dst[k] = static_cast<double>(x[t * K + k]);
  };
  if (cfg.has_bias) {
    p.w13_bias = w.w13_bias.data();
    p.w2_bias = w.w2_bias.data();
  }
  p.mirror_intermediate = false;
  std::vector<double> v;
  forward_f64(p, v, threads);
  out = std::move(v);
}

}  // namespace mxmoe
