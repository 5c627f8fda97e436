// mxmoe/routing.h — top-k routing on the CPU (SPEC §3). The CUDA routing kernel is
// held bit-exact against route_cpu on the same logits.
#pragma once

#include <cstdint>

#include "mxmoe/moe.h"

namespace mxmoe {

enum class RouterKind : int { Sigmoid = 0, Softmax = 1 };

struct RoutingParams {
  RouterKind kind = RouterKind::Sigmoid;
  int64_t top_k = 16;
  bool renormalize = true;  // sigmoid only: chosen weights sum to 1
  /// Group-limited selection (sigmoid): experts split into n_group equal groups;
  /// group score = sum of the group's two largest biased scores; only experts of the
  /// topk_group best groups are eligible. n_group <= 1 disables it.
  int64_t n_group = 0, topk_group = 0;
  float routed_scaling_factor = 1.0f;
  /// true: multiply the weights by the factor; false: caller applies it on the
  /// output (MoeConfig::output_scale).
  bool scaling_in_weights = true;

  void validate(int64_t num_experts) const;
};

/// Route M tokens over E experts. logits [M][E] fp32; bias [E] or nullptr (selection
/// only). Ties break toward the lower expert index. Weights are computed in fp32 the
/// same way the GPU kernel does (documented in routing.cpp).
Routing route_cpu(const float* logits, int64_t tokens, int64_t num_experts,
                  const float* bias, const RoutingParams& params);
/// The same on BF16 logits (bits, [M][E]), as a model's router often gives them: each
/// logit widened to fp32 (exactly), then route_cpu. SPEC §3 takes fp32 or bf16 logits.
Routing route_cpu_bf16(const uint16_t* logits_bf16, int64_t tokens, int64_t num_experts,
                       const float* bias, const RoutingParams& params);

}  // namespace mxmoe
