// layer.cu — CudaMoeLayer (cuda.h): device checks, weight tiling and upload, the shared
// workspace layout, host-side argument validation, and the launch sequence
//   [route] -> [quantize x] -> permute -> gemm1+act -> gemm2 -> finalize (quantize and
// permute are one launch for small problems; heuristics.h picks the GEMM paths),
// all on the caller's stream: no allocation, no host synchronization, graph-capturable.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "mxmoe/activation_math.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/fp8_mode.h"

namespace mxmoe {

using namespace cuda_detail;

// ---------------------------------------------------------------- device queries

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no GPU: not an error for this query
    return 0;
  }
  return n;
}

namespace {

/// A test knob (environment variable) set to a whole number 0..max ("0", "1", ...):
/// that number; unset or anything else: -1 (env_knob). Read when a layer is built.
int knob_digit(const char* name, int max) { return env_knob(name, 0, max, -1); }

/// A test knob set to "0".
bool knob_off(const char* name) { return knob_digit(name, 0) == 0; }

// Why device `dev` cannot run the engine ("" when it can). Assumes dev is current.
std::string unsupported_reason(const cudaDeviceProp& prop) {
  if (prop.major < 8)
    return detail::cat("GPU '", prop.name, "' is sm_", prop.major, prop.minor,
                       "; the engine needs sm_80 or newer (BF16 mma.sync); use backend cpu");
  const cudaError_t e = probe_kernel_image();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return detail::cat("this build has no kernels for GPU '", prop.name, "' (sm_", prop.major,
                       prop.minor, "): ", cudaGetErrorString(e),
                       "; rebuild with -DMXMOE_CUDA_ARCHS including ", prop.major, prop.minor,
                       " (sm_90a for Hopper, sm_120a for RTX Blackwell), or use backend cpu");
  }
  return "";
}

/// What a supported GPU (`prop`, current) runs: gpu_capabilities' answer, the one the
/// capability query reports, so the layer's choice of paths and precisions and the query
/// cannot disagree. The sm_90a kernels count only on Hopper, where they load.
GpuCapabilities capabilities_of(const cudaDeviceProp& prop) {
  return gpu_capabilities(true, prop.major, prop.major == 9 && cuda_detail::prefill_kernels_available());
}

bool lists(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

struct DevFree {
  void operator()(void* p) const {
    if (p) cudaFree(p);
  }
};
using DevPtr = std::unique_ptr<void, DevFree>;

template <typename T>
DevPtr upload(const std::vector<T>& v) {
  if (v.empty()) return DevPtr(nullptr);
  void* p = nullptr;
  MXMOE_CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  DevPtr d(p);
  MXMOE_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

/// The kernels' view of one uploaded FP8-mode weight matrix.
cuda_detail::Fp8MatView fp8_view(const DevPtr& codes, const DevPtr& scales, const cuda_detail::Fp8Dims& d) {
  return {static_cast<const uint8_t*>(codes.get()), static_cast<const float*>(scales.get()),
          static_cast<int>(d.rows), static_cast<int>(d.rows_p), static_cast<int>(d.cols_p),
          static_cast<int>(d.groups), d.row_form};
}

/// The activations' staged scales carry the row form's reference exponent (engine.h).
int fp8_scale_shift(const cuda_detail::Fp8Dims& d) { return d.row_form ? d.row_exp_ref - 127 : 0; }

}  // namespace

std::vector<GpuInfo> cuda_devices() {
  std::vector<GpuInfo> out;
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.sm_major = prop.major;
    g.sm_minor = prop.minor;
    g.sm_count = prop.multiProcessorCount;
    g.memory_bytes = prop.totalGlobalMem;
    try {
      DeviceGuard guard(i);
      g.note = unsupported_reason(prop);
    } catch (const Error& e) {
      g.note = e.what();
    }
    g.supported = g.note.empty();
    if (g.supported) {
      try {
        DeviceGuard guard(i);
        g.capabilities = capabilities_of(prop);
      } catch (const Error&) {
        // The sm_90a kernels could not be checked: the decode path serves every size.
        g.capabilities = gpu_capabilities(true, prop.major, false);
      }
    }
    const bool sm90a = lists(g.capabilities.precisions, "fp8");
    if (g.supported)
      g.note = sm90a ? "precisions exact (BF16 tensor cores, fp32 accumulation) and fp8 (the FP8 mode); "
                       "decode and wgmma prefill paths"
                     : "precision exact (BF16 mma.sync, fp32 accumulation); decode path at every size";
    out.push_back(std::move(g));
  }
  return out;
}

// ---------------------------------------------------------------- tiled weights

namespace cuda_detail {

TiledDims tiled_dims(int64_t rows, int64_t cols) {
  TiledDims d;
  d.rows = rows;
  d.cols = cols;
  d.rg = (rows + kRowsPerWarp - 1) / kRowsPerWarp;
  d.kc = (cols + kKChunk - 1) / kKChunk;
  return d;
}

void tile_mxfp4(const uint8_t* packed, const uint8_t* scale, int64_t experts, int64_t rows,
                int64_t cols, std::vector<uint32_t>& tp, std::vector<uint32_t>& ts) {
  const TiledDims d = tiled_dims(rows, cols);
  const int64_t kb_real = cols / kMxBlock;
  const int64_t row_bytes = cols / 2;
  tp.assign(static_cast<size_t>(experts * d.u32_per_expert()), 0u);
  ts.assign(static_cast<size_t>(experts * d.scale_u32_per_expert()), 0x7F7F7F7Fu);  // 1.0
  // One lane word: the 8 codes of row r, elements [32kb + 8t, +8), bit-scattered so that
  // fp4x8_to_f16 (mx_mma.cuh) decodes pair p = {element 2p, 2p+1} with one or two masks:
  // magnitude bits at kMagPos[p] (+16 for the odd element), sign bit at kSignPos[p].
  auto word = [&](int64_t e, int64_t r, int64_t kb, int t) -> uint32_t {
    if (r >= rows || kb >= kb_real) return 0u;
    uint32_t w;
    std::memcpy(&w, packed + (e * rows + r) * row_bytes + kb * 16 + 4 * t, 4);
    constexpr int kMagPos[4] = {9, 6, 0, 3}, kSignPos[4] = {15, 12, 13, 14};
    uint32_t q = 0;
    for (int j = 0; j < 8; ++j) {
      const uint32_t c = (w >> (4 * j)) & 0xFu;
      const int pair = j / 2, half = 16 * (j % 2);
      q |= (c & 7u) << (kMagPos[pair] + half);
      q |= (c >> 3) << (kSignPos[pair] + half);
    }
    return q;
  };
  auto sbyte = [&](int64_t e, int64_t r, int64_t kb) -> uint32_t {
    if (r >= rows || kb >= kb_real) return 0x7Fu;
    return scale[(e * rows + r) * kb_real + kb];
  };
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t rg = 0; rg < d.rg; ++rg)
      for (int64_t kc = 0; kc < d.kc; ++kc)
        for (int mt = 0; mt < 4; ++mt) {
          const int64_t tile = ((e * d.rg + rg) * d.kc + kc) * 4 + mt;
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            const int64_t r0 = 64 * rg + 16 * mt + g, r1 = r0 + 8;
            uint32_t* o = tp.data() + (tile * 32 + lane) * 4;
            o[0] = word(e, r0, 2 * kc, t);
            o[1] = word(e, r1, 2 * kc, t);
            o[2] = word(e, r0, 2 * kc + 1, t);
            o[3] = word(e, r1, 2 * kc + 1, t);
          }
          for (int g = 0; g < 8; ++g) {
            const int64_t r0 = 64 * rg + 16 * mt + g, r1 = r0 + 8;
            const int64_t chunk = (e * d.rg + rg) * d.kc + kc;
            ts[static_cast<size_t>((chunk * 8 + g) * 4 + mt)] =
                sbyte(e, r0, 2 * kc) | (sbyte(e, r1, 2 * kc) << 8) |
                (sbyte(e, r0, 2 * kc + 1) << 16) | (sbyte(e, r1, 2 * kc + 1) << 24);
          }
        }
}

std::vector<uint8_t> special_scale_groups(const uint8_t* scale, int64_t experts, int64_t rows,
                                          int64_t cols) {
  const TiledDims d = tiled_dims(rows, cols);
  const int64_t kb = cols / kMxBlock;
  std::vector<uint8_t> f(static_cast<size_t>(experts * d.rg), 0u);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* s = scale + (e * rows + r) * kb;
      uint8_t& flag = f[static_cast<size_t>(e * d.rg + r / kRowsPerWarp)];
      for (int64_t b = 0; b < kb && !flag; ++b)
        if (s[b] == 0x00u || s[b] == 0xFFu) flag = 1u;
    }
  return f;
}

Fp8Dims fp8_dims(int64_t rows, int64_t cols) {
  Fp8Dims d;
  d.rows = rows;
  d.cols = cols;
  d.rows_p = (rows + kF8Rows - 1) / kF8Rows * kF8Rows;
  d.groups = (cols + fp8mode::kGroup - 1) / fp8mode::kGroup;
  d.cols_p = d.groups * fp8mode::kGroup;
  return d;
}

int64_t fp8_source_row(int64_t r, bool gate_up) {
  if (!gate_up) return r;
  const int64_t j = r / 64, w = (r % 64) / 16, i = r % 16;
  return 64 * j + (i < 8 ? 8 * w + i : 32 + 8 * w + (i - 8));
}

Fp8Dims fp8_weights(const uint8_t* packed, const uint8_t* scale, int64_t experts, int64_t rows,
                    int64_t cols, bool gate_up, Fp8FormChoice choice, const char* argument,
                    std::vector<uint8_t>& codes, std::vector<float>& scales) {
  Fp8Dims d = fp8_dims(rows, cols);
  const int64_t nb = cols / kMxBlock;
  const auto packed_of = [&](int64_t e) { return packed + e * rows * (cols / 2); };
  const auto scale_of = [&](int64_t e) { return scale + e * rows * nb; };
  // The row form where every row of every expert fits it (fp8_mode.h), else the group form.
  std::string why_row;
  int64_t e_row = -1;  // the first expert that does not fit the row form
  for (int64_t e = 0; e < experts && e_row < 0 && choice != Fp8FormChoice::kGroup; ++e)
    if (!fp8mode::weights_fit_row_form(packed_of(e), scale_of(e), rows, cols, &why_row)) e_row = e;
  d.row_form = choice != Fp8FormChoice::kGroup && e_row < 0;
  if (choice == Fp8FormChoice::kRow && !d.row_form)
    throw Unsupported(detail::cat(argument, ": local expert ", e_row, " ", why_row,
                                  " (MXMOE_F8_ROW=1 demands the FP8 mode's row form)"));
  const auto code_of = [&](const uint8_t* pr, int64_t col) {
    return static_cast<uint8_t>((pr[col / 2] >> (4 * (col % 2))) & 0xF);
  };
  codes.assign(static_cast<size_t>(experts * d.rows_p * d.cols_p), 0u);
  if (d.row_form) {
    // Row scales relative to the matrix's largest row exponent (<= 1, so the fp32
    // accumulator stays at or above the group form's scale); the activations' staged
    // scales carry 2^(row_exp_ref - 127) instead (StageFp8Params.scale_shift).
    d.row_exp_ref = -fp8mode::kRowHeadroom;  // a row of zeros' exponent
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = 0; r < rows; ++r)
        d.row_exp_ref = std::max(d.row_exp_ref,
                                 fp8mode::row_form_of(packed_of(e) + r * (cols / 2), scale_of(e) + r * nb, nb).row_exp());
    scales.assign(static_cast<size_t>(experts * d.rows_p), 0.0f);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t src = fp8_source_row(r, gate_up);
        const uint8_t* pr = packed_of(e) + src * (cols / 2);
        const uint8_t* sr = scale_of(e) + src * nb;
        const fp8mode::RowForm f = fp8mode::row_form_of(pr, sr, nb);
        scales[static_cast<size_t>(e * d.rows_p + r)] =
            f.nan_row ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, f.row_exp() - d.row_exp_ref);
        uint8_t* cr = codes.data() + (e * d.rows_p + r) * d.cols_p;
        for (int64_t b = 0; b < nb; ++b) {
          if (f.nan_row || !fp8mode::weight_block_used(pr + b * 16, sr[b])) continue;
          for (int k = 0; k < kMxBlock; ++k) {
            const int64_t col = b * kMxBlock + k;
            cr[col] = fp8mode::weight_row_code(code_of(pr, col), sr[b], f.row_exp());
          }
        }
      }
    return d;
  }
  scales.assign(static_cast<size_t>(experts * d.groups * d.rows_p), 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    std::string why;
    const uint8_t* pe = packed_of(e);
    const uint8_t* se = scale_of(e);
    if (!fp8mode::weights_fit_fp8_mode(pe, se, rows, cols, &why))
      throw InvalidArgument(argument, detail::cat("local expert ", e, " ", why,
                                                  e_row >= 0 ? detail::cat("; nor do the weights fit the row form (local expert ",
                                                                           e_row, " ", why_row, ")")
                                                             : std::string(),
                                                  ": use precision exact for these weights"));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = fp8_source_row(r, gate_up);
      const uint8_t* pr = pe + src * (cols / 2);
      const uint8_t* sr = se + src * nb;
      uint8_t* cr = codes.data() + (e * d.rows_p + r) * d.cols_p;
      for (int64_t g = 0; g < d.groups; ++g) {
        const int64_t b0 = g * fp8mode::kBlocksPerGroup;
        const int n = static_cast<int>(std::min<int64_t>(fp8mode::kBlocksPerGroup, nb - b0));
        bool used[fp8mode::kBlocksPerGroup] = {};
        for (int i = 0; i < n; ++i) used[i] = fp8mode::weight_block_used(pr + (b0 + i) * 16, sr[b0 + i]);
        const uint8_t gb = fp8mode::group_scale_byte(sr + b0, n, used);
        scales[static_cast<size_t>((e * d.groups + g) * d.rows_p + r)] = fmt::e8m0_to_float(gb);
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < kMxBlock; ++k) {
            const int64_t col = (b0 + i) * kMxBlock + k;
            cr[col] = used[i] ? fp8mode::weight_code(code_of(pr, col), sr[b0 + i], gb) : uint8_t{0};
          }
      }
    }
  }
  return d;
}

WorkspaceLayout WorkspaceLayout::make(const MoeConfig& cfg, int64_t tokens) {
  const size_t M = static_cast<size_t>(tokens), k = static_cast<size_t>(cfg.top_k);
  const size_t K = static_cast<size_t>(cfg.hidden), N = static_cast<size_t>(cfg.intermediate);
  const size_t el = static_cast<size_t>(cfg.local_experts());
  const size_t pairs = M * k;
  const bool fp8_in = cfg.input_format == InputFormat::MXFP8;
  const bool fp8_mid = cfg.resolved_intermediate() == IntermediateFormat::MXFP8;
  WorkspaceLayout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = align256(off);
    const size_t at = off;
    off += bytes;
    return at;
  };
  l.error = take(sizeof(uint32_t));
  l.ids = take(pairs * 4);
  l.weights = take(pairs * 4);
  l.counts = take(el * 4);
  l.offsets = take((el + 1) * 4);
  l.row_map = take(pairs * 4);
  l.pair_row = take(pairs * 4);
  l.permute_seg = take(static_cast<size_t>(permute_seg_words(static_cast<int64_t>(pairs), static_cast<int>(el))) * 4);
  l.xq = take(fp8_in ? M * K : 0);
  l.xq_scale = take(fp8_in ? M * K / kMxBlock : 0);
  l.inter = take(pairs * N * (fp8_mid ? 1 : 2));
  l.inter_scale = take(fp8_mid ? pairs * N / kMxBlock : 0);
  const bool splittable = fp8_mid && !cfg.has_bias;
  l.gemm2_splits = cuda_detail::gemm2_splits(
      tokens, plan_fast(tokens, fp8_mid, cfg.intermediate / kMxBlock, FastGemm::kGemm2).ok,
      cfg.has_bias);
  const size_t y_bytes = static_cast<size_t>(gemm2_y_rows(tokens, splittable)) * k * K * 4;
  l.y = take(y_bytes);
  l.back = take(pairs * 4);
  if (use_fp8_prefill(tokens, cfg.precision == Precision::FP8)) {
    // The FP8 mode replaces the prefill path at these sizes: its buffers instead.
    const size_t Kg = (K + 127) / 128, Ng = (N + 127) / 128;
    // x in routed-row order (GEMM1's token rows by TMA) lives in y's range where it fits:
    // only GEMM1 reads it, and GEMM2, which writes y, starts after GEMM1 ends.
    const size_t scale_rows = static_cast<size_t>(fp8_scale_rows(static_cast<int64_t>(pairs)));
    const size_t xf_bytes = align256(pairs * Kg * 128) + scale_rows * Kg * 4;
    if (xf_bytes <= y_bytes) {
      l.xf = l.y;
      l.xf_scale = l.y + align256(pairs * Kg * 128);
    } else {
      l.xf = take(pairs * Kg * 128);
      l.xf_scale = take(scale_rows * Kg * 4);
    }
    l.if8 = take(pairs * Ng * 128);
    l.if8_scale = take(scale_rows * Ng * 4);
  } else if (use_prefill(tokens, true)) {
    const size_t Kp = (K + 63) / 64 * 64, Np = (N + 63) / 64 * 64;
    l.inexact = take(kPrefillWordsBytes);
    l.split_acc = take(kPfSplitBytes);
    l.xb = take(M * Kp * 2);
    l.xb_back = take(M * 4);
    l.ib = take(pairs * Np * 2);
  }
  l.balanced = fp8_in && use_balanced(tokens);
  // The decode path's per-forward counters, in one range the permutation clears: the
  // expert-ready counters, then the balanced kernel's.
  l.expert_ready = take(sizeof(uint32_t) * (el + (l.balanced ? kBalancedSlots : 0)));
  if (l.balanced) {
    l.balanced_count = l.expert_ready + sizeof(uint32_t) * el;
    l.balanced_acc = take(kBalancedAccBytes);
  }
  l.total = align256(off);
  // The balanced decode kernel's slots: no smaller total above its sizes.
  if (fp8_in && tokens > kBalancedMaxTokens)
    l.total = std::max(l.total, make(cfg, kBalancedMaxTokens).total);
  // FP8 mode: from kFp8PrefillMinTokens its staging buffers replace the exact prefill
  // path's, which are larger. The total stays at least that of the last size that used
  // those, so it never shrinks as M grows (workspace_size(max) covers every M <= max).
  if (use_fp8_prefill(tokens, cfg.precision == Precision::FP8) &&
      use_prefill(kFp8PrefillMinTokens - 1, true))
    l.total = std::max(l.total, make(cfg, kFp8PrefillMinTokens - 1).total);
  return l;
}

}  // namespace cuda_detail

// ---------------------------------------------------------------- the layer

struct CudaMoeLayer::Impl {
  MoeConfig cfg;
  int device = 0;
  int64_t num_local = 0;
  bool has_routing = false;
  RoutingParams routing;
  TiledDims d13, d2;
  bool prefill_ok = false;  // heuristics.h use_prefill: sm_90a kernels and weight scales
  bool programmatic_ok = false;  // sm_90+, MXMOE_PDL not 0 (heuristics.h use_programmatic_launch)
  ReadyMode ready_mode = ReadyMode::kDecode;  // MXMOE_READY (heuristics.h use_expert_ready)
  Fp8Dims f13, f2;          // FP8 mode (config.precision fp8): w13c/w13g, w2c/w2g
  bool f8_fused = true;     // FP8 mode: GEMM1's drain stages GEMM2's input (MXMOE_F8_FUSED=0: stage_fp8 does)
  int f8_scatter = -1;      // FP8 mode: MXMOE_F8_SCATTER (heuristics.h use_scattered_x_staging)
  int f8_split = -1;        // FP8 mode: MXMOE_F8_SPLIT, 1..64 (heuristics.h stage_fp8_split)
  DevPtr w13c, w13g, w2c, w2g;
  DevPtr w13p, w13s, w2p, w2s, w13f, w2f, b13, b2, alpha, beta, limit, expert_map, router_bias;
  int activation = 0;  // Gemm1Params.activation: the kind, SiTU's form resolved where it can be
};

CudaMoeLayer::CudaMoeLayer(const MoeConfig& cfg, const ExpertWeights& weights,
                           const RoutingParams* routing, const std::vector<float>* router_bias,
                           int device)
    : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  // Row indices of the permuted problem are int32 on the device. Checked before the
  // weights, whose buffers at these sizes would be the size of the limit itself.
  MXMOE_CHECK_ARG(cfg.hidden <= (1 << 24), "config.hidden", cfg.hidden, " exceeds the CUDA engine's 2^24 limit");
  MXMOE_CHECK_ARG(cfg.intermediate <= (1 << 24), "config.intermediate", cfg.intermediate,
                  " exceeds the CUDA engine's 2^24 limit");
  weights.validate(cfg);
  Impl& s = *impl_;
  s.cfg = cfg;
  s.num_local = cfg.local_experts();
  const int64_t E = cfg.num_experts;

  if (routing) {
    routing->validate(E);
    MXMOE_CHECK_ARG(routing->top_k == cfg.top_k, "routing.top_k", routing->top_k,
                    " does not match config.top_k ", cfg.top_k);
    if (E > kMaxRouteExperts)
      throw Unsupported(detail::cat("GPU routing: num_experts ", E, " exceeds the kernel's ",
                                    kMaxRouteExperts, "; route on the host (route_cpu) and pass "
                                    "topk_ids/topk_weights"));
    if (routing->top_k > kMaxRouteTopK)
      throw Unsupported(detail::cat("GPU routing: top_k ", routing->top_k, " exceeds ",
                                    kMaxRouteTopK, "; pass topk_ids/topk_weights instead"));
    if (routing->n_group > 32)
      throw Unsupported(detail::cat("GPU routing: n_group ", routing->n_group,
                                    " exceeds 32; pass topk_ids/topk_weights instead"));
    s.has_routing = true;
    s.routing = *routing;
  }
  if (router_bias) {
    MXMOE_CHECK_ARG(routing != nullptr, "router_bias", "given without routing params");
    MXMOE_CHECK_ARG(routing->kind == RouterKind::Sigmoid, "router_bias",
                    "a correction bias applies to the sigmoid router only");
    MXMOE_CHECK_ARG(static_cast<int64_t>(router_bias->size()) == E, "router_bias", "has ",
                    router_bias->size(), " values, expected num_experts = ", E);
    for (size_t i = 0; i < router_bias->size(); ++i)
      MXMOE_CHECK_ARG(std::isfinite((*router_bias)[i]), "router_bias", "value ",
                      (*router_bias)[i], " at [", i, "] is not finite");
  }

  const int count = cuda_device_count();
  if (count == 0)
    throw Unsupported("backend cuda: no CUDA GPU is visible (no driver or no device); use "
                      "backend cpu");
  int dev = device;
  if (dev < 0) MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CHECK_ARG(dev >= 0 && dev < count, "device", dev, " is out of range [0, ", count, ")");
  s.device = dev;
  DeviceGuard guard(dev);
  cudaDeviceProp prop{};
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const std::string why = unsupported_reason(prop);
  if (!why.empty()) throw Unsupported("backend cuda: " + why);
  const GpuCapabilities caps = capabilities_of(prop);

  const int64_t K = cfg.hidden, N = cfg.intermediate;
  s.d13 = tiled_dims(2 * N, K);
  s.d2 = tiled_dims(K, N);
  {
    std::vector<uint32_t> tp, ts;
    tile_mxfp4(weights.w13_packed.data(), weights.w13_scale.data(), s.num_local, 2 * N, K, tp, ts);
    s.w13p = upload(tp);
    s.w13s = upload(ts);
    tile_mxfp4(weights.w2_packed.data(), weights.w2_scale.data(), s.num_local, K, N, tp, ts);
    s.w2p = upload(tp);
    s.w2s = upload(ts);
    s.w13f = upload(special_scale_groups(weights.w13_scale.data(), s.num_local, 2 * N, K));
    s.w2f = upload(special_scale_groups(weights.w2_scale.data(), s.num_local, K, N));
  }
  {
    const auto in_range = [](const std::vector<uint8_t>& v) {
      return std::all_of(v.begin(), v.end(), [](uint8_t b) { return b <= kPrefillMaxWeightScale; });
    };
    // MXMOE_PREFILL=0: a test knob that keeps the decode and generic paths at every size
    // (their kernels still serve GPUs without the sm_90a prefill kernels).
    s.prefill_ok = !knob_off("MXMOE_PREFILL") && lists(caps.paths, "prefill") &&
                   in_range(weights.w13_scale) && in_range(weights.w2_scale);
    if (s.prefill_ok) {
      check_gemm1_prefill_kernels();
      check_gemm2_prefill_kernels();
    }
  }
  // MXMOE_PDL=0: a test knob for plain launches (heuristics.h use_programmatic_launch).
  s.programmatic_ok = prop.major >= 9 && !knob_off("MXMOE_PDL");
  s.f8_fused = !knob_off("MXMOE_F8_FUSED");
  s.f8_scatter = knob_digit("MXMOE_F8_SCATTER", 1);
  s.f8_split = env_knob("MXMOE_F8_SPLIT", 1, 64, -1);  // -1: unset
  // MXMOE_READY=0/1/2: a test knob for the expert-ready counters (heuristics.h use_expert_ready).
  if (const int ready = knob_digit("MXMOE_READY", 2); ready >= 0) s.ready_mode = static_cast<ReadyMode>(ready);
  if (cfg.precision == Precision::FP8) {
    if (!lists(caps.precisions, "fp8"))
      throw Unsupported(detail::cat("config.precision fp8: needs Hopper (sm_90) and this build's "
                                    "sm_90a kernels; device ", dev, " is sm_", prop.major,
                                    prop.minor, ": use precision exact"));
    // The promotion multiplies by the product of a weight and an activation group scale
    // in fp32: weight scales stay in the exact prefill path's range (|w| <= 12).
    const auto check_range = [&](const std::vector<uint8_t>& v, int64_t rows, int64_t cols,
                                 const char* argument) {
      const int64_t nb = cols / kMxBlock;
      for (size_t i = 0; i < v.size(); ++i)
        MXMOE_CHECK_ARG(v[i] == fmt::kE8m0Nan || v[i] <= kPrefillMaxWeightScale, argument,
                        "byte ", int{v[i]}, " of local expert ", static_cast<int64_t>(i) / (rows * nb),
                        " row ", static_cast<int64_t>(i) / nb % rows, " block ", static_cast<int64_t>(i) % nb,
                        " is above ", int{kPrefillMaxWeightScale},
                        ", outside the fp8 precision mode's range: use precision exact");
    };
    check_range(weights.w13_scale, 2 * N, K, "weights.w13_scale");
    check_range(weights.w2_scale, K, N, "weights.w2_scale");
    check_gemm1_fp8_kernel();
    check_gemm2_fp8_kernel();
    // MXMOE_F8_ROW=0 / 1: a test knob that forces the group form / demands the row form
    // (fp8_mode.h); unset, each matrix takes the row form where it fits.
    Fp8FormChoice form = Fp8FormChoice::kAuto;
    if (const int row = knob_digit("MXMOE_F8_ROW", 1); row >= 0) form = row == 0 ? Fp8FormChoice::kGroup : Fp8FormChoice::kRow;
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    s.f13 = fp8_weights(weights.w13_packed.data(), weights.w13_scale.data(), s.num_local, 2 * N, K,
                        true, form, "weights.w13_scale", codes, scales);
    s.w13c = upload(codes);
    s.w13g = upload(scales);
    s.f2 = fp8_weights(weights.w2_packed.data(), weights.w2_scale.data(), s.num_local, K, N, false,
                       form, "weights.w2_scale", codes, scales);
    s.w2c = upload(codes);
    s.w2g = upload(scales);
  }
  if (cfg.has_bias) {
    s.b13 = upload(weights.w13_bias);
    s.b2 = upload(weights.w2_bias);
  }
  std::vector<float> a(static_cast<size_t>(s.num_local)), b(a.size()), l(a.size());
  for (int64_t e = 0; e < s.num_local; ++e) {
    const ActivationParams& ap = cfg.activation;
    a[e] = ap.alpha.empty() ? 0.0f : ap.alpha_of(e);
    b[e] = ap.beta.empty() ? 0.0f : ap.beta_of(e);
    l[e] = ap.limit.empty() ? 0.0f : ap.limit_of(e);
  }
  s.alpha = upload(a);
  s.beta = upload(b);
  s.limit = upload(l);
  // SiTU with alpha 4 for every local expert, or for none, tells the kernels its form once
  // (activation_math.h kActSituAlpha4 / kActSituOtherAlpha); a mix of the two stays kind 0,
  // and the prefill epilogues then read each tile's expert's alpha.
  s.activation = static_cast<int>(cfg.activation.kind);
  if (cfg.activation.kind == Activation::SiTU) {
    const int64_t fours = std::count(a.begin(), a.end(), 4.0f);
    if (fours == s.num_local) s.activation = am::kActSituAlpha4;
    else if (fours == 0) s.activation = am::kActSituOtherAlpha;
  }
  std::vector<int32_t> map(static_cast<size_t>(E));
  for (int64_t g = 0; g < E; ++g) map[g] = cfg.local_of(static_cast<int32_t>(g));
  s.expert_map = upload(map);
  if (router_bias) s.router_bias = upload(*router_bias);
}

CudaMoeLayer::~CudaMoeLayer() {
  if (!impl_) return;
  DeviceGuardNoThrow guard(impl_->device);
  impl_.reset();
}

const MoeConfig& CudaMoeLayer::config() const { return impl_->cfg; }

size_t CudaMoeLayer::workspace_size(int64_t max_tokens) const {
  MXMOE_CHECK_ARG(max_tokens >= 1, "max_tokens", "must be >= 1, got ", max_tokens);
  MXMOE_CHECK_ARG(max_tokens * impl_->cfg.top_k <= std::numeric_limits<int32_t>::max(),
                  "max_tokens", max_tokens, " x top_k ", impl_->cfg.top_k,
                  " routed rows exceed the int32 row index");
  return WorkspaceLayout::make(impl_->cfg, max_tokens).total;
}

void CudaMoeLayer::forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes,
                           void* stream) const {
  const Impl& s = *impl_;
  const MoeConfig& cfg = s.cfg;
  const int64_t M = args.tokens, k = cfg.top_k, K = cfg.hidden, N = cfg.intermediate;

  // ---- every check before the first launch (SPEC §9): nothing is written on error
  // No tokens (an idle data-parallel rank, an empty microbatch) is a valid forward that
  // reads and writes none of the caller's tensors; their pointers are not checked then,
  // since empty tensors may come as null pointers.
  MXMOE_CHECK_ARG(M >= 0, "args.tokens", "must be >= 0, got ", M);
  const bool empty = M == 0;
  MXMOE_CHECK_ARG(M * k <= std::numeric_limits<int32_t>::max(), "args.tokens", M, " x top_k ",
                  k, " routed rows exceed the int32 row index");
  MXMOE_CHECK_ARG(args.x_format == InputFormat::BF16 || args.x_format == InputFormat::MXFP8,
                  "args.x_format", "invalid value ", static_cast<int>(args.x_format));
  MXMOE_CHECK_ARG(!(cfg.input_format == InputFormat::BF16 && args.x_format == InputFormat::MXFP8),
                  "args.x_format",
                  "is mxfp8 but the layer consumes bf16 activations (config.input_format); "
                  "pass bf16 x or build the layer with input_format mxfp8");
  const bool have_ids = args.topk_ids != nullptr || args.topk_weights != nullptr;
  // Router logits come in fp32 or BF16: one pointer, never both (not even with no tokens).
  MXMOE_CHECK_ARG(args.router_logits == nullptr || args.router_logits_bf16 == nullptr,
                  "args.router_logits_bf16",
                  "is given together with args.router_logits: pass the logits once, in one format");
  const bool logits_bf16 = args.router_logits_bf16 != nullptr;
  const void* logits = logits_bf16 ? static_cast<const void*>(args.router_logits_bf16)
                                   : static_cast<const void*>(args.router_logits);
  const char* logits_arg = logits_bf16 ? "args.router_logits_bf16" : "args.router_logits";
  const bool have_logits = logits != nullptr;
  // Exactly one routing input: ids with weights, or logits. With no tokens neither is
  // needed (empty tensors may come as null pointers), but both at once is still an error.
  MXMOE_CHECK_ARG(!(have_ids && have_logits), logits_arg,
                  "is given together with topk_ids/topk_weights: give exactly one routing input");
  MXMOE_CHECK_ARG(empty || have_ids || have_logits, logits_arg,
                  "is null and so are topk_ids/topk_weights: give exactly one routing input");
  MXMOE_CHECK_ARG(!have_logits || s.has_routing, logits_arg,
                  "given, but the layer was built without RoutingParams");
  if (!empty) {
    MXMOE_CHECK_ARG(args.x != nullptr, "args.x", "is null");
    MXMOE_CHECK_ARG(aligned(args.x, 16), "args.x", "pointer ", args.x, " is not 16-byte aligned");
    if (args.x_format == InputFormat::MXFP8) {
      MXMOE_CHECK_ARG(args.x_scale != nullptr, "args.x_scale", "is null but x_format is mxfp8");
    } else {
      MXMOE_CHECK_ARG(args.x_scale == nullptr, "args.x_scale",
                      "is given but x_format is bf16 (no scales)");
    }
    if (have_ids) {
      MXMOE_CHECK_ARG(args.topk_ids != nullptr, "args.topk_ids", "is null but topk_weights is given");
      MXMOE_CHECK_ARG(args.topk_weights != nullptr, "args.topk_weights",
                      "is null but topk_ids is given");
      MXMOE_CHECK_ARG(aligned(args.topk_ids, 4), "args.topk_ids", "is not 4-byte aligned");
      MXMOE_CHECK_ARG(aligned(args.topk_weights, 4), "args.topk_weights", "is not 4-byte aligned");
    } else {
      MXMOE_CHECK_ARG(aligned(logits, logits_bf16 ? 2 : 4), logits_arg, "is not ",
                      logits_bf16 ? 2 : 4, "-byte aligned");
    }
    MXMOE_CHECK_ARG(args.out != nullptr, "args.out", "is null");
  }
  MXMOE_CHECK_ARG(aligned(args.out, cfg.output_format == OutputFormat::FP32 ? 4 : 2), "args.out",
                  "pointer ", args.out, " is misaligned for ", to_string(cfg.output_format));
  // No tokens asks as much as one (workspace_size takes max_tokens >= 1): the error word.
  const WorkspaceLayout L = WorkspaceLayout::make(cfg, std::max<int64_t>(M, 1));
  MXMOE_CHECK_ARG(workspace_bytes >= L.total, "workspace_bytes", workspace_bytes,
                  " is less than the ", L.total, " bytes needed for ", std::max<int64_t>(M, 1),
                  " tokens (workspace_size(max_tokens))");
  MXMOE_CHECK_ARG(workspace != nullptr, "workspace", "is null");
  MXMOE_CHECK_ARG(aligned(workspace, 256), "workspace", "pointer ", workspace,
                  " is not 256-byte aligned");
  int cur = -1;
  MXMOE_CUDA_CHECK(cudaGetDevice(&cur));
  MXMOE_CHECK_ARG(cur == s.device, "stream", "the current device is ", cur,
                  " but the layer lives on device ", s.device, "; cudaSetDevice(", s.device,
                  ") before forward");
  if (!empty) {
    check_device_pointer(args.x, "args.x", s.device);
    if (args.x_scale) check_device_pointer(args.x_scale, "args.x_scale", s.device);
    if (have_ids) {
      check_device_pointer(args.topk_ids, "args.topk_ids", s.device);
      check_device_pointer(args.topk_weights, "args.topk_weights", s.device);
    } else {
      check_device_pointer(logits, logits_arg, s.device);
    }
    check_device_pointer(args.out, "args.out", s.device);
  }
  check_device_pointer(workspace, "workspace", s.device);

  // ---- launches
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  char* ws = static_cast<char*>(workspace);
  if (empty) {
    // Nothing to compute; the error word still speaks for this forward (no bad id).
    MXMOE_CUDA_CHECK(cudaMemsetAsync(ws + L.error, 0, sizeof(uint32_t), st));
    return;
  }
  const int32_t* ids = args.topk_ids;
  const float* wts = args.topk_weights;
  if (have_logits) {
    RouteParams rp;
    rp.logits = args.router_logits;
    rp.logits_bf16 = args.router_logits_bf16;
    rp.bias = static_cast<const float*>(s.router_bias.get());
    rp.tokens = M;
    rp.num_experts = cfg.num_experts;
    rp.params = s.routing;
    rp.ids = reinterpret_cast<int32_t*>(ws + L.ids);
    rp.weights = reinterpret_cast<float*>(ws + L.weights);
    launch_route(rp, st);
    ids = rp.ids;
    wts = rp.weights;
  }
  const void* x = args.x;
  const uint8_t* xs = args.x_scale;
  bool x_fp8 = args.x_format == InputFormat::MXFP8;
  const bool quantize = cfg.input_format == InputFormat::MXFP8 && !x_fp8;
  uint8_t* q = reinterpret_cast<uint8_t*>(ws + L.xq);
  uint8_t* qs = reinterpret_cast<uint8_t*>(ws + L.xq_scale);

  // FP8 mode (config.precision fp8) at prefill sizes; otherwise the exact paths.
  const bool fp8 = use_fp8_prefill(M, cfg.precision == Precision::FP8);
  const bool prefill = !fp8 && use_prefill(M, s.prefill_ok);
  const bool balanced = L.balanced && !prefill && !fp8;

  PermuteParams pp;
  pp.ids = ids;
  pp.expert_map = static_cast<const int32_t*>(s.expert_map.get());
  pp.tokens = M;
  pp.top_k = k;
  pp.num_experts = cfg.num_experts;
  pp.num_local = static_cast<int>(s.num_local);
  pp.counts = reinterpret_cast<int32_t*>(ws + L.counts);
  pp.offsets = reinterpret_cast<int32_t*>(ws + L.offsets);
  pp.row_map = reinterpret_cast<int32_t*>(ws + L.row_map);
  pp.pair_row = reinterpret_cast<int32_t*>(ws + L.pair_row);
  pp.error = reinterpret_cast<uint32_t*>(ws + L.error);
  pp.seg = reinterpret_cast<int32_t*>(ws + L.permute_seg);
  // The expert-ready counters, then the balanced decode GEMM1's (its sizes on the decode
  // path only: from kPrefillMinTokens the layout holds the prefill path's buffers too).
  pp.clear = reinterpret_cast<uint32_t*>(ws + L.expert_ready);
  pp.clear_words = pp.num_local + (balanced ? kBalancedSlots : 0);
  uint32_t* inexact = reinterpret_cast<uint32_t*>(ws + L.inexact);
  // Before the permutation: x's staging below may run beside it (and set the inexact bit).
  if (prefill) MXMOE_CUDA_CHECK(cudaMemsetAsync(inexact, 0, kPrefillWordsBytes, st));
  if (quantize) {
    launch_quantize_permute(pp, static_cast<const uint16_t*>(args.x), K, cfg.scale_rule, q, qs, st);
    x = q;
    xs = qs;
    x_fp8 = true;
  } else {
    launch_permute(pp, st);
  }

  const bool mid_fp8 = cfg.resolved_intermediate() == IntermediateFormat::MXFP8;
  StageBf16Params sx;
  StageFp8Params fx;
  if (fp8) {
    // In routed-row order (GEMM1 takes the tile's token rows by TMA): scattered by token or
    // gathered by routed row.
    const bool scatter = use_scattered_x_staging(M, s.f8_scatter);
    fx = StageFp8Params{.src = static_cast<const uint8_t*>(x), .scale = xs, .rows = scatter ? M : M * k,
                        .live_rows = scatter ? nullptr : pp.offsets + pp.num_local,
                        .row_map = scatter ? nullptr : pp.row_map, .top_k = k,
                        .cols = K, .stride = s.f13.cols_p, .dst = reinterpret_cast<uint8_t*>(ws + L.xf),
                        .dst_scale = reinterpret_cast<float*>(ws + L.xf_scale),
                        .scale_rows = fp8_scale_rows(M * k), .scale_shift = fp8_scale_shift(s.f13),
                        .pair_row = scatter ? pp.pair_row : nullptr,
                        .split = scatter ? stage_fp8_split(M, s.f13.groups, s.f8_split) : 1};
    launch_stage_fp8(fx, st);
  }
  if (prefill) {
    // Beside the permutation: a programmatic dependent of it (the kernel before it here).
    sx = StageBf16Params{.src = x, .scale = xs, .fp8 = x_fp8, .rows = M, .cols = K,
                         .stride = s.d13.kc * kKChunk,
                         .dst = reinterpret_cast<uint16_t*>(ws + L.xb),
                         .back = reinterpret_cast<float*>(ws + L.xb_back),
                         .flag = inexact, .flag_bit = kInexactX,
                         .programmatic = s.programmatic_ok,
                         .src_after_predecessor = quantize};
    launch_stage_bf16(sx, st);
  }
  Gemm1Params g1;
  g1.w13 = MatView{static_cast<const uint4*>(s.w13p.get()), static_cast<const uint32_t*>(s.w13s.get()),
                   static_cast<int>(s.d13.rows), static_cast<int>(s.d13.cols),
                   static_cast<int>(s.d13.rg), static_cast<int>(s.d13.kc),
                   static_cast<const uint8_t*>(s.w13f.get())};
  g1.bias = static_cast<const float*>(s.b13.get());
  g1.activation = s.activation;
  g1.alpha = static_cast<const float*>(s.alpha.get());
  g1.beta = static_cast<const float*>(s.beta.get());
  g1.limit = static_cast<const float*>(s.limit.get());
  g1.x = x;
  g1.x_scale = xs;
  g1.x_fp8 = x_fp8;
  g1.counts = pp.counts;
  g1.offsets = pp.offsets;
  g1.row_map = pp.row_map;
  g1.tokens = M;
  g1.top_k = k;
  g1.hidden = K;
  g1.intermediate = N;
  g1.num_local = pp.num_local;
  g1.inter = ws + L.inter;
  g1.inter_scale = reinterpret_cast<uint8_t*>(ws + L.inter_scale);
  g1.inter_fp8 = mid_fp8;
  g1.rule = cfg.scale_rule;
  if (prefill) {
    g1.prefill = true;
    g1.xb = sx.dst;
    g1.xb_stride = sx.stride;
    g1.xb_back = sx.back;
    g1.inexact = inexact;
    g1.split_acc = reinterpret_cast<float*>(ws + L.split_acc);
    g1.split_count = inexact + 1;
    g1.ib = reinterpret_cast<uint16_t*>(ws + L.ib);
    g1.ib_stride = s.d2.kc * kKChunk;
    g1.fallback_programmatic = s.programmatic_ok;
  }
  // FP8 mode: GEMM2's staged intermediate, made by GEMM1's drain (s.f8_fused) or by
  // stage_fp8 from GEMM1's MXFP8 intermediate.
  const StageFp8Params fi{.src = static_cast<const uint8_t*>(g1.inter), .scale = g1.inter_scale,
                          .rows = M * k, .live_rows = pp.offsets + pp.num_local,
                          .cols = N, .stride = s.f2.cols_p,
                          .dst = reinterpret_cast<uint8_t*>(ws + L.if8),
                          .dst_scale = reinterpret_cast<float*>(ws + L.if8_scale),
                          .scale_rows = fp8_scale_rows(M * k), .scale_shift = fp8_scale_shift(s.f2)};
  if (fp8) {
    g1.fp8 = true;
    g1.w13f8 = fp8_view(s.w13c, s.w13g, s.f13);
    g1.xf = fx.dst;
    g1.xf_scale = fx.dst_scale;
    if (s.f8_fused) {
      g1.if8 = fi.dst;
      g1.if8_scale = fi.dst_scale;
      g1.if8_stride = fi.stride;
      g1.if8_scale_rows = fi.scale_rows;
      g1.if8_shift = fi.scale_shift;
    }
  }
  g1.programmatic = !prefill && !fp8 && use_programmatic_gemm1(s.programmatic_ok, balanced, M * k);
  if (g1.programmatic) {
    g1.ids = ids;
    g1.expert_map = pp.expert_map;
    g1.num_experts = static_cast<int>(cfg.num_experts);
  }
  if (balanced) {
    g1.split_acc = reinterpret_cast<float*>(ws + L.balanced_acc);
    g1.split_count = reinterpret_cast<uint32_t*>(ws + L.balanced_count);
  }
  // GEMM2's blocks wait per expert (heuristics.h use_expert_ready).
  const bool expert_ready =
      !prefill && !fp8 &&
      use_expert_ready(s.ready_mode, s.programmatic_ok, M,
                       plan_fast(M, x_fp8, K / kMxBlock, FastGemm::kGemm1).ok,
                       plan_fast(M, mid_fp8, N / kMxBlock, FastGemm::kGemm2).ok);
  if (expert_ready) g1.expert_ready = pp.clear;
  launch_gemm1(g1, st);

  Gemm2Params g2;
  g2.w2 = MatView{static_cast<const uint4*>(s.w2p.get()), static_cast<const uint32_t*>(s.w2s.get()),
                  static_cast<int>(s.d2.rows), static_cast<int>(s.d2.cols),
                  static_cast<int>(s.d2.rg), static_cast<int>(s.d2.kc),
                  static_cast<const uint8_t*>(s.w2f.get())};
  g2.bias = static_cast<const float*>(s.b2.get());
  g2.inter = g1.inter;
  g2.inter_scale = g1.inter_scale;
  g2.inter_fp8 = mid_fp8;
  g2.counts = pp.counts;
  g2.offsets = pp.offsets;
  g2.tokens = M;
  g2.top_k = k;
  g2.hidden = K;
  g2.intermediate = N;
  g2.num_local = pp.num_local;
  g2.y = reinterpret_cast<float*>(ws + L.y);
  g2.splits = L.gemm2_splits;
  g2.split_stride = M * k * K;
  g2.back = L.gemm2_splits > 1 ? reinterpret_cast<float*>(ws + L.back) : nullptr;
  // The decode kernel right after GEMM1 (launch_gemm2; the FP8 path stages the
  // intermediate in between).
  g2.programmatic = !prefill && !fp8 && use_programmatic_launch(s.programmatic_ok, L.gemm2_splits, expert_ready);
  g2.expert_ready = g1.expert_ready;
  g2.ready_row_groups = g1.w13.rg;
  if (prefill) {
    g2.prefill = true;
    g2.splits = 1;  // the decode path's split reduction (WorkspaceLayout) does not apply
    g2.back = nullptr;
    g2.ib = g1.ib;  // staged by GEMM1's epilogue
    g2.ib_stride = g1.ib_stride;
    g2.inexact = inexact;
    g2.split_acc = g1.split_acc;  // GEMM1's last parts left every counter at zero
    g2.split_count = g1.split_count;
    g2.fallback_programmatic = s.programmatic_ok;
  }
  if (fp8) {
    if (!s.f8_fused) launch_stage_fp8(fi, st);
    g2.fp8 = true;
    g2.splits = 1;
    g2.back = nullptr;
    g2.w2f8 = fp8_view(s.w2c, s.w2g, s.f2);
    g2.if8 = fi.dst;
    g2.if8_scale = fi.dst_scale;
    g2.y_bf16 = reinterpret_cast<uint16_t*>(g2.y);  // y's range, half of it (docs/FP8_MODE.md)
  }
  launch_gemm2(g2, st);

  FinalizeParams fp;
  fp.y = g2.y;
  fp.y_bf16 = g2.y_bf16;
  fp.pair_row = pp.pair_row;
  fp.weights = wts;
  fp.tokens = M;
  fp.top_k = k;
  fp.hidden = K;
  fp.output_scale = cfg.output_scale;
  fp.out = args.out;
  fp.out_fp32 = cfg.output_format == OutputFormat::FP32;
  fp.splits = g2.splits;
  fp.split_stride = g2.split_stride;
  fp.back = g2.back;
  fp.programmatic = g2.programmatic;
  launch_finalize(fp, st);
}

}  // namespace mxmoe
