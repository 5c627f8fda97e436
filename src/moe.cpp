// moe.cpp — names, activation parameters, the double-precision activation, and the one
// place that validates the problem description (moe.h). Every check throws
// InvalidArgument naming the field ("config.top_k", "weights.w13_packed", "topk_ids", ...)
// and the bad value, so a caller can fix the call from the message alone (SPEC §9).
#include "mxmoe/moe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "mxmoe/error.h"

namespace mxmoe {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<float>& v) {
  std::ostringstream os;
  if (v.size() == 1) {
    os << v[0];
  } else {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  }
  return os.str();
}

// Checked product of non-negative sizes: a huge (malicious or mistaken) shape must
// produce a clear error, not a wrapped size that happens to match a buffer.
int64_t mul(int64_t a, int64_t b, const char* argument) {
  MXMOE_CHECK_ARG(a >= 0 && b >= 0, argument, "negative size ", a, " x ", b);
  MXMOE_CHECK_ARG(a == 0 || b <= std::numeric_limits<int64_t>::max() / a, argument,
                  "size ", a, " x ", b, " overflows");
  return a * b;
}

void check_size(size_t have, int64_t want, const std::string& argument, const char* shape) {
  MXMOE_CHECK_ARG(static_cast<int64_t>(have) == want, argument, "has ", have,
                  " elements, expected ", want, " (", shape, ")");
}

bool activation_valid(Activation a) {
  return a == Activation::SiTU || a == Activation::SwiGLU_OAI || a == Activation::SiLU_Gated;
}

// A parameter vector holds one shared value or one per local expert.
void check_param(const std::vector<float>& v, const char* argument, int64_t e_local,
                 bool positive) {
  MXMOE_CHECK_ARG(v.size() == 1 || static_cast<int64_t>(v.size()) == e_local, argument,
                  "has ", v.size(), " values, expected 1 (shared) or ", e_local,
                  " (one per local expert)");
  for (size_t i = 0; i < v.size(); ++i) {
    MXMOE_CHECK_ARG(std::isfinite(v[i]), argument, "value ", v[i], " at [", i,
                    "] is not finite");
    if (positive)
      MXMOE_CHECK_ARG(v[i] > 0.0f, argument, "value ", v[i], " at [", i, "] must be > 0");
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// ---------------------------------------------------------------- names

const char* to_string(Activation a) {
  switch (a) {
    case Activation::SiTU: return "situ";
    case Activation::SwiGLU_OAI: return "swiglu";
    case Activation::SiLU_Gated: return "silu";
  }
  return "unknown";
}
const char* to_string(InputFormat f) {
  switch (f) {
    case InputFormat::BF16: return "bf16";
    case InputFormat::MXFP8: return "mxfp8";
  }
  return "unknown";
}
const char* to_string(IntermediateFormat f) {
  switch (f) {
    case IntermediateFormat::BF16: return "bf16";
    case IntermediateFormat::MXFP8: return "mxfp8";
    case IntermediateFormat::Auto: return "auto";
  }
  return "unknown";
}
const char* to_string(OutputFormat f) {
  switch (f) {
    case OutputFormat::BF16: return "bf16";
    case OutputFormat::FP32: return "fp32";
  }
  return "unknown";
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Exact: return "exact";
    case Precision::FP8: return "fp8";
  }
  return "unknown";
}

Precision parse_precision(const std::string& s, const char* argument) {
  const std::string l = lower(s);
  if (l == "exact") return Precision::Exact;
  if (l == "fp8") return Precision::FP8;
  throw InvalidArgument(argument ? argument : "precision",
                        detail::cat("unknown precision '", s, "' (expected exact or fp8)"));
}

Activation parse_activation(const std::string& s, const char* argument) {
  const std::string l = lower(s);
  if (l == "situ") return Activation::SiTU;
  if (l == "swiglu" || l == "swiglu_oai" || l == "swiglu-oai") return Activation::SwiGLU_OAI;
  if (l == "silu" || l == "silu_gated" || l == "silu-gated") return Activation::SiLU_Gated;
  throw InvalidArgument(argument ? argument : "activation",
                        detail::cat("unknown activation '", s, "' (expected situ, swiglu or silu)"));
}

// ---------------------------------------------------------------- activation

ActivationParams ActivationParams::situ(float alpha, float beta) {
  ActivationParams p;
  p.kind = Activation::SiTU;
  p.alpha = {alpha};
  p.beta = {beta};
  p.limit = {};
  return p;
}
ActivationParams ActivationParams::swiglu_oai(float alpha, float beta, float limit) {
  ActivationParams p;
  p.kind = Activation::SwiGLU_OAI;
  p.alpha = {alpha};
  p.beta = {beta};
  p.limit = {limit};
  return p;
}
ActivationParams ActivationParams::silu_gated() {
  ActivationParams p;
  p.kind = Activation::SiLU_Gated;
  p.alpha = {};
  p.beta = {};
  p.limit = {};
  return p;
}

double activation_ref(const ActivationParams& p, int64_t e, double g, double u) {
  switch (p.kind) {
    case Activation::SiTU: {
      const double a = p.alpha_of(e), b = p.beta_of(e);
      return a * std::tanh(g / a) * sigmoid(g) * b * std::tanh(u / b);
    }
    case Activation::SwiGLU_OAI: {
      const double a = p.alpha_of(e), b = p.beta_of(e), lim = p.limit_of(e);
      // Written with comparisons that are false for NaN, so a NaN input stays NaN
      // (std::fmin would turn it into the limit and hide a poisoned token).
      if (g > lim) g = lim;
      if (u > lim) u = lim;
      if (u < -lim) u = -lim;
      return g * sigmoid(a * g) * (u + b);
    }
    case Activation::SiLU_Gated:
      return g * sigmoid(g) * u;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// ---------------------------------------------------------------- config

int64_t MoeConfig::local_experts() const {
  if (!expert_map.empty())
    return std::count_if(expert_map.begin(), expert_map.end(), [](int32_t v) { return v >= 0; });
  return ep_size > 0 ? num_experts / ep_size : 0;
}

IntermediateFormat MoeConfig::resolved_intermediate() const {
  if (intermediate_format != IntermediateFormat::Auto) return intermediate_format;
  return input_format == InputFormat::BF16 ? IntermediateFormat::BF16 : IntermediateFormat::MXFP8;
}

int32_t MoeConfig::local_of(int32_t id) const {
  // A public entry point (Python's MoeConfig.local_of too): an id outside the config's
  // range is refused, never looked up (SPEC §9).
  MXMOE_CHECK_ARG(id >= -1 && id < num_experts, "global_id", id, " outside [-1, config.num_experts ",
                  num_experts, ")");
  if (id < 0) return -1;
  if (!expert_map.empty()) {
    MXMOE_CHECK_ARG(static_cast<int64_t>(expert_map.size()) == num_experts, "config.expert_map",
                    "has ", expert_map.size(), " entries for config.num_experts ", num_experts);
    return expert_map[static_cast<size_t>(id)];
  }
  MXMOE_CHECK_ARG(ep_size > 0, "config.ep_size", "must be > 0, got ", ep_size);
  const int64_t el = num_experts / ep_size;
  const int64_t lo = ep_rank * el;
  return (id >= lo && id < lo + el) ? static_cast<int32_t>(id - lo) : -1;
}

void MoeConfig::validate() const {
  MXMOE_CHECK_ARG(num_experts > 0, "config.num_experts", "must be > 0, got ", num_experts);
  MXMOE_CHECK_ARG(num_experts <= std::numeric_limits<int32_t>::max(), "config.num_experts",
                  num_experts, " does not fit the int32 expert ids");
  MXMOE_CHECK_ARG(top_k >= 1 && top_k <= num_experts, "config.top_k", top_k,
                  " is out of range [1, ", num_experts, "]");
  MXMOE_CHECK_ARG(hidden > 0, "config.hidden", "must be > 0, got ", hidden);
  MXMOE_CHECK_ARG(hidden % kMxBlock == 0, "config.hidden", hidden,
                  " is not a multiple of the MX block size ", kMxBlock);
  MXMOE_CHECK_ARG(intermediate > 0, "config.intermediate", "must be > 0, got ", intermediate);
  MXMOE_CHECK_ARG(intermediate % kMxBlock == 0, "config.intermediate", intermediate,
                  " is not a multiple of the MX block size ", kMxBlock);
  MXMOE_CHECK_ARG(ep_size >= 1, "config.ep_size", "must be >= 1, got ", ep_size);
  MXMOE_CHECK_ARG(ep_rank >= 0 && ep_rank < ep_size, "config.ep_rank", ep_rank,
                  " is out of range [0, ", ep_size, ")");
  if (expert_map.empty()) {
    MXMOE_CHECK_ARG(num_experts % ep_size == 0, "config.ep_size", ep_size,
                    " does not divide num_experts ", num_experts);
  } else {
    MXMOE_CHECK_ARG(static_cast<int64_t>(expert_map.size()) == num_experts, "config.expert_map",
                    "has ", expert_map.size(), " entries, expected num_experts = ", num_experts);
    const int64_t el = local_experts();
    MXMOE_CHECK_ARG(el >= 1, "config.expert_map", "maps no expert to this rank");
    std::vector<int64_t> owner(static_cast<size_t>(el), -1);
    for (size_t g = 0; g < expert_map.size(); ++g) {
      const int32_t v = expert_map[g];
      MXMOE_CHECK_ARG(v >= -1 && v < el, "config.expert_map", "value ", v, " at [", g,
                      "] is out of range [-1, ", el, ")");
      if (v < 0) continue;
      MXMOE_CHECK_ARG(owner[static_cast<size_t>(v)] < 0, "config.expert_map", "local index ", v,
                      " is used by global experts ", owner[static_cast<size_t>(v)], " and ", g);
      owner[static_cast<size_t>(v)] = static_cast<int64_t>(g);
    }
    // el non-negative entries, all distinct and in [0, el): every local index is used.
  }
  const int64_t el = local_experts();

  MXMOE_CHECK_ARG(activation_valid(activation.kind), "config.activation.kind", "invalid value ",
                  static_cast<int>(activation.kind));
  switch (activation.kind) {
    case Activation::SiTU:
      check_param(activation.alpha, "config.activation.alpha", el, true);
      check_param(activation.beta, "config.activation.beta", el, true);
      // The activation's one division (activation_math.h div_den_1_to_8_f32) takes
      // numerators up to 2^126, and SiTU's is at most 8 * alpha * beta.
      for (int64_t e = 0; e < el; ++e)
        MXMOE_CHECK_ARG(static_cast<double>(activation.alpha_of(e)) * activation.beta_of(e) <= 0x1p120,
                        "config.activation.beta", "alpha * beta = ", activation.alpha_of(e), " * ",
                        activation.beta_of(e), " for local expert ", e, " is above 2^120");
      break;
    case Activation::SwiGLU_OAI:
      check_param(activation.alpha, "config.activation.alpha", el, false);
      check_param(activation.beta, "config.activation.beta", el, false);
      MXMOE_CHECK_ARG(!activation.limit.empty(), "config.activation.limit",
                      "is required for swiglu (GPT-OSS uses 7.0)");
      check_param(activation.limit, "config.activation.limit", el, true);
      break;
    case Activation::SiLU_Gated:
      break;  // no parameters; any left in the vectors are unused
  }

  MXMOE_CHECK_ARG(input_format == InputFormat::BF16 || input_format == InputFormat::MXFP8,
                  "config.input_format", "invalid value ", static_cast<int>(input_format));
  MXMOE_CHECK_ARG(intermediate_format == IntermediateFormat::BF16 ||
                      intermediate_format == IntermediateFormat::MXFP8 ||
                      intermediate_format == IntermediateFormat::Auto,
                  "config.intermediate_format", "invalid value ",
                  static_cast<int>(intermediate_format));
  MXMOE_CHECK_ARG(output_format == OutputFormat::BF16 || output_format == OutputFormat::FP32,
                  "config.output_format", "invalid value ", static_cast<int>(output_format));
  MXMOE_CHECK_ARG(scale_rule == ScaleRule::RoundUp || scale_rule == ScaleRule::Floor,
                  "config.scale_rule", "invalid value ", static_cast<int>(scale_rule));
  MXMOE_CHECK_ARG(std::isfinite(output_scale), "config.output_scale", "value ", output_scale,
                  " is not finite");
  MXMOE_CHECK_ARG(precision == Precision::Exact || precision == Precision::FP8,
                  "config.precision", "invalid value ", static_cast<int>(precision));
  if (precision == Precision::FP8)
    MXMOE_CHECK_ARG(input_format == InputFormat::MXFP8 && resolved_intermediate() == IntermediateFormat::MXFP8,
                    "config.precision",
                    "fp8 re-expresses MXFP8 activations: it needs input_format and "
                    "intermediate_format mxfp8");
}

std::string MoeConfig::describe() const {
  std::ostringstream os;
  os << "E=" << num_experts << " top_k=" << top_k << " K=" << hidden << " N=" << intermediate
     << " ep=" << ep_rank << "/" << ep_size;
  if (!expert_map.empty()) os << " (expert_map)";
  os << " E_local=" << local_experts() << " act=" << to_string(activation.kind);
  switch (activation.kind) {
    case Activation::SiTU:
      os << "(alpha=" << join(activation.alpha) << ",beta=" << join(activation.beta) << ")";
      break;
    case Activation::SwiGLU_OAI:
      os << "(alpha=" << join(activation.alpha) << ",beta=" << join(activation.beta)
         << ",limit=" << join(activation.limit) << ")";
      break;
    case Activation::SiLU_Gated: break;
  }
  os << " in=" << to_string(input_format) << " mid=" << to_string(resolved_intermediate())
     << " out=" << to_string(output_format)
     << " scale_rule=" << (scale_rule == ScaleRule::Floor ? "floor" : "round_up")
     << " bias=" << (has_bias ? "yes" : "no") << " output_scale=" << output_scale;
  if (precision != Precision::Exact) os << " precision=" << to_string(precision);
  return os.str();
}

// ---------------------------------------------------------------- weights

void ExpertWeights::validate(const MoeConfig& cfg) const {
  const int64_t el = cfg.local_experts();
  MXMOE_CHECK_ARG(num_local == el, "weights.num_local", num_local,
                  " does not match the config's local experts ", el);
  MXMOE_CHECK_ARG(hidden == cfg.hidden, "weights.hidden", hidden,
                  " does not match config.hidden ", cfg.hidden);
  MXMOE_CHECK_ARG(intermediate == cfg.intermediate, "weights.intermediate", intermediate,
                  " does not match config.intermediate ", cfg.intermediate);
  const int64_t k = hidden, n = intermediate;
  const int64_t rows13 = mul(mul(el, 2, "weights"), n, "weights");
  const int64_t rows2 = mul(el, k, "weights");
  check_size(w13_packed.size(), mul(rows13, k / 2, "weights.w13_packed"), "weights.w13_packed",
             "[E_local][2N][K/2]");
  check_size(w13_scale.size(), mul(rows13, k / kMxBlock, "weights.w13_scale"),
             "weights.w13_scale", "[E_local][2N][K/32]");
  check_size(w2_packed.size(), mul(rows2, n / 2, "weights.w2_packed"), "weights.w2_packed",
             "[E_local][K][N/2]");
  check_size(w2_scale.size(), mul(rows2, n / kMxBlock, "weights.w2_scale"), "weights.w2_scale",
             "[E_local][K][N/32]");
  if (cfg.has_bias) {
    check_size(w13_bias.size(), rows13, "weights.w13_bias", "[E_local][2N], config.has_bias");
    check_size(w2_bias.size(), rows2, "weights.w2_bias", "[E_local][K], config.has_bias");
  } else {
    // A bias the config does not use would be silently dropped: say so instead.
    MXMOE_CHECK_ARG(w13_bias.empty(), "weights.w13_bias", "has ", w13_bias.size(),
                    " elements but config.has_bias is false");
    MXMOE_CHECK_ARG(w2_bias.empty(), "weights.w2_bias", "has ", w2_bias.size(),
                    " elements but config.has_bias is false");
  }
}

// ---------------------------------------------------------------- activations

void Activations::validate(const char* argument, int64_t expected_hidden) const {
  const std::string a = argument ? argument : "x";
  MXMOE_CHECK_ARG(format == InputFormat::BF16 || format == InputFormat::MXFP8, a + ".format",
                  "invalid value ", static_cast<int>(format));
  MXMOE_CHECK_ARG(tokens >= 0, a + ".tokens", "must be >= 0, got ", tokens);
  MXMOE_CHECK_ARG(hidden == expected_hidden, a + ".hidden", hidden, " does not match hidden ",
                  expected_hidden);
  MXMOE_CHECK_ARG(hidden > 0 && hidden % kMxBlock == 0, a + ".hidden", hidden,
                  " must be a positive multiple of ", kMxBlock);
  const int64_t n = mul(tokens, hidden, argument ? argument : "x");
  if (format == InputFormat::BF16) {
    check_size(bf16.size(), n, a + ".bf16", "[M][K]");
  } else {
    check_size(fp8.size(), n, a + ".fp8", "[M][K]");
    check_size(scale.size(), n / kMxBlock, a + ".scale", "[M][K/32]");
  }
}

Activations Activations::to_mxfp8(ScaleRule rule) const {
  validate("x", hidden);
  MXMOE_CHECK_ARG(rule == ScaleRule::RoundUp || rule == ScaleRule::Floor, "rule",
                  "invalid value ", static_cast<int>(rule));
  if (format == InputFormat::MXFP8) return *this;  // already quantized: nothing to redo
  Activations q;
  q.format = InputFormat::MXFP8;
  q.tokens = tokens;
  q.hidden = hidden;
  const size_t n = static_cast<size_t>(tokens * hidden);
  q.fp8.resize(n);
  q.scale.resize(n / kMxBlock);
  float blk[kMxBlock];
  for (size_t b = 0; b < n / kMxBlock; ++b) {
    for (int i = 0; i < kMxBlock; ++i) blk[i] = fmt::bf16_to_float(bf16[b * kMxBlock + i]);
    fmt::quantize_block_e4m3(blk, &q.fp8[b * kMxBlock], &q.scale[b], rule);
  }
  return q;
}

// The element accessors check their indices and the buffers they read (a public API may
// be handed an index or a struct it does not expect; never an out-of-bounds read).
double Activations::value(int64_t t, int64_t k) const {
  MXMOE_CHECK_ARG(t >= 0 && t < tokens && k >= 0 && k < hidden, "(t, k)", "(", t, ", ", k,
                  ") is outside the activations' ", tokens, " x ", hidden);
  const size_t i = static_cast<size_t>(t * hidden + k);
  if (format == InputFormat::BF16) {
    MXMOE_CHECK_ARG(i < bf16.size(), "x.bf16", "holds ", bf16.size(), " values, too few for ", tokens, " x ",
                    hidden);
    return static_cast<double>(fmt::bf16_to_float(bf16[i]));
  }
  MXMOE_CHECK_ARG(i < fp8.size() && i / kMxBlock < scale.size(), "x.fp8", "holds ", fp8.size(),
                  " codes and ", scale.size(), " scales, too few for ", tokens, " x ", hidden);
  return fmt::dequant_e4m3(fp8[i], scale[i / kMxBlock]);
}

// ---------------------------------------------------------------- routing

void Routing::validate(const MoeConfig& cfg) const {
  MXMOE_CHECK_ARG(tokens >= 0, "routing.tokens", "must be >= 0, got ", tokens);
  MXMOE_CHECK_ARG(top_k == cfg.top_k, "routing.top_k", top_k, " does not match config.top_k ",
                  cfg.top_k);
  const int64_t n = mul(tokens, top_k, "routing");
  check_size(ids.size(), n, "topk_ids", "[M][top_k]");
  check_size(weights.size(), n, "topk_weights", "[M][top_k]");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const size_t i = static_cast<size_t>(t * top_k + j);
      MXMOE_CHECK_ARG(ids[i] >= -1 && ids[i] < cfg.num_experts, "topk_ids", "id ", ids[i],
                      " at [", t, "][", j, "] is out of range [-1, ", cfg.num_experts, ")");
      MXMOE_CHECK_ARG(std::isfinite(weights[i]), "topk_weights", "weight ", weights[i], " at [",
                      t, "][", j, "] is not finite");
    }
  }
}

// ---------------------------------------------------------------- output

float Output::value(int64_t t, int64_t k) const {
  MXMOE_CHECK_ARG(t >= 0 && t < tokens && k >= 0 && k < hidden, "(t, k)", "(", t, ", ", k,
                  ") is outside the output's ", tokens, " x ", hidden);
  const size_t i = static_cast<size_t>(t * hidden + k);
  const size_t held = format == OutputFormat::BF16 ? bf16.size() : fp32.size();
  MXMOE_CHECK_ARG(i < held, format == OutputFormat::BF16 ? "out.bf16" : "out.fp32", "holds ", held,
                  " values, too few for ", tokens, " x ", hidden);
  return format == OutputFormat::BF16 ? fmt::bf16_to_float(bf16[i]) : fp32[i];
}

}  // namespace mxmoe
