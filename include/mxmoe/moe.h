// mxmoe/moe.h — the problem description shared by every backend: the layer config,
// expert weights in the kernel layout, activations, routing results, and the one place
// that validates them (src/moe.cpp). The CPU reference (reference.h) and the CUDA
// engine (cuda.h) both take these types. No CUDA types appear here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/formats.h"

namespace mxmoe {

enum class Activation : int { SiTU = 0, SwiGLU_OAI = 1, SiLU_Gated = 2 };
/// Format of the activations GEMM1 consumes (SPEC §7).
enum class InputFormat : int { BF16 = 0, MXFP8 = 1 };
/// Format of the intermediate (after the gated activation) GEMM2 consumes. Auto, the
/// default, follows the input (SPEC §7): MXFP8 for MXFP8 activations, BF16 for BF16 ones
/// (MoeConfig::resolved_intermediate() resolves it); BF16 and MXFP8 ask for one explicitly.
enum class IntermediateFormat : int { BF16 = 0, MXFP8 = 1, Auto = 2 };
enum class OutputFormat : int { BF16 = 0, FP32 = 1 };
/// How the CUDA engine's prefill path multiplies (SPEC §7, docs/FP8_MODE.md). Exact: MX
/// semantics bit for bit in every product. FP8: Hopper FP8 tensor cores on operands
/// re-expressed with one scale per 128 of K (fp8_mode.h), opt-in, with a documented
/// error bound; weights it cannot hold exactly are refused when the layer is built. The
/// decode path and the CPU engine are exact in both.
enum class Precision : int { Exact = 0, FP8 = 1 };

const char* to_string(Activation a);
const char* to_string(InputFormat f);
const char* to_string(IntermediateFormat f);
const char* to_string(OutputFormat f);
const char* to_string(Precision p);
/// Parse "exact" | "fp8"; throws InvalidArgument(argument).
Precision parse_precision(const std::string& s, const char* argument = "precision");
/// Parse "situ" | "swiglu" (SwiGLU-OAI) | "silu"; throws InvalidArgument(argument).
Activation parse_activation(const std::string& s, const char* argument = "activation");

/// Gated activation and its parameters (SPEC §6). Each vector holds either one value
/// (shared by all experts) or one per local expert.
///  SiTU:       alpha*tanh(g/alpha)*sigmoid(g) * beta*tanh(u/beta)   (alpha, beta)
///  SwiGLU_OAI: g=min(g,limit), u=clamp(u,-limit,limit), g*sigmoid(alpha*g)*(u+beta)
///  SiLU_Gated: silu(g)*u                                              (no parameters)
struct ActivationParams {
  Activation kind = Activation::SiTU;
  std::vector<float> alpha{4.0f};
  std::vector<float> beta{25.0f};
  std::vector<float> limit{};  // SwiGLU_OAI only

  static ActivationParams situ(float alpha = 4.0f, float beta = 25.0f);
  static ActivationParams swiglu_oai(float alpha = 1.702f, float beta = 1.0f, float limit = 7.0f);
  static ActivationParams silu_gated();
  /// Parameter of local expert e (one shared value or the per-expert one).
  float alpha_of(int64_t e) const { return alpha.size() == 1 ? alpha[0] : alpha[e]; }
  float beta_of(int64_t e) const { return beta.size() == 1 ? beta[0] : beta[e]; }
  float limit_of(int64_t e) const { return limit.size() == 1 ? limit[0] : limit[e]; }
};

/// Evaluate the gated activation in double (the reference's arithmetic).
double activation_ref(const ActivationParams& p, int64_t local_expert, double g, double u);

/// One MoE layer (routed experts of one EP rank).
struct MoeConfig {
  int64_t num_experts = 0;   // E_global
  int64_t top_k = 0;
  int64_t hidden = 0;        // K: GEMM1 reduction dim and GEMM2 output width
  int64_t intermediate = 0;  // N: GEMM1 produces 2N (gate, up); GEMM2 reduces over N
  int64_t ep_size = 1;
  int64_t ep_rank = 0;
  /// Optional explicit ownership: expert_map[global] = local index or -1. When empty,
  /// this rank owns [ep_rank*E_local, (ep_rank+1)*E_local).
  std::vector<int32_t> expert_map;
  ActivationParams activation;
  InputFormat input_format = InputFormat::MXFP8;
  IntermediateFormat intermediate_format = IntermediateFormat::Auto;  // read resolved_intermediate()
  OutputFormat output_format = OutputFormat::BF16;
  ScaleRule scale_rule = ScaleRule::RoundUp;  // for run-time quantization
  bool has_bias = false;      // GPT-OSS: w13_bias [E][2N], w2_bias [E][K]
  float output_scale = 1.0f;  // routed_scaling_factor when applied on the output
  Precision precision = Precision::Exact;

  int64_t local_experts() const;
  /// The intermediate's format every engine computes with: intermediate_format, with Auto
  /// resolved from input_format (SPEC §7's default).
  IntermediateFormat resolved_intermediate() const;
  /// Local index of global expert id, or -1 when another rank owns it (or id == -1).
  /// Throws InvalidArgument naming `global_id` outside [-1, num_experts) (and the config's
  /// field where its map or ep_size could not answer).
  int32_t local_of(int32_t global_id) const;
  /// Throws InvalidArgument naming the field when the config is inconsistent.
  void validate() const;
  std::string describe() const;
};

/// Weights of the local experts in the kernel layout (layout.h): row-major MXFP4.
///  w13_packed [E_local][2N][K/2]  w13_scale [E_local][2N][K/32]   (kernel row order)
///  w2_packed  [E_local][K][N/2]   w2_scale  [E_local][K][N/32]
///  w13_bias   empty or [E_local][2N] (kernel row order), w2_bias empty or [E_local][K]
struct ExpertWeights {
  int64_t num_local = 0, hidden = 0, intermediate = 0;
  std::vector<uint8_t> w13_packed, w13_scale, w2_packed, w2_scale;
  std::vector<float> w13_bias, w2_bias;

  /// Throws InvalidArgument unless every buffer has the size the config implies.
  void validate(const MoeConfig& cfg) const;
};

/// Token activations [M, K]: BF16 bits, or MXFP8 (E4M3 codes + one scale per 32 of K).
struct Activations {
  InputFormat format = InputFormat::BF16;
  int64_t tokens = 0, hidden = 0;
  std::vector<uint16_t> bf16;    // [M][K] when BF16
  std::vector<uint8_t> fp8;      // [M][K] when MXFP8
  std::vector<uint8_t> scale;    // [M][K/32] when MXFP8

  void validate(const char* argument, int64_t hidden) const;
  /// MXFP8-quantize BF16 activations (rule as given) with formats.h.
  Activations to_mxfp8(ScaleRule rule = ScaleRule::RoundUp) const;
  /// Exact value of element (t, k) as the GEMM consumes it.
  double value(int64_t t, int64_t k) const;
};

/// Routing result: topk_ids [M][k] (global ids, -1 = none), topk_weights [M][k].
struct Routing {
  int64_t tokens = 0, top_k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;

  /// Ids must be in [-1, num_experts); throws InvalidArgument("topk_ids", ...) otherwise.
  void validate(const MoeConfig& cfg) const;
};

/// Layer output [M][K]: BF16 bits or fp32.
struct Output {
  OutputFormat format = OutputFormat::BF16;
  int64_t tokens = 0, hidden = 0;
  std::vector<uint16_t> bf16;
  std::vector<float> fp32;
  float value(int64_t t, int64_t k) const;
};

}  // namespace mxmoe
