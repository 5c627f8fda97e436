// routing.cpp — top-k routing on the CPU (SPEC §3), the definition the CUDA routing
// kernel is held bit-exact against. Every step is written as the kernel does it, in
// fp32, with the operation order fixed here:
//
// Sigmoid router (Kimi-K3 / DeepSeek):
//   s[e]      = am::sigmoid_f32(logit[e])                 fp32, 1/(1+exp(-x)) with the
//                                                         exp of activation_math.h, which
//                                                         host and device compute bit for
//                                                         bit alike (libm and CUDA expf
//                                                         may differ in the last ulp)
//   biased[e] = s[e] + bias[e]                            fp32 add (bias 0 when absent)
//   group limit (n_group > 1): group g = experts [g*G, (g+1)*G), G = E / n_group;
//     group score = top1 + top2 of the group's biased scores (fp32 add, larger first);
//     the topk_group best groups (ties: lower group index) stay eligible.
//   select top_k eligible experts by biased score, descending, ties to the lower expert
//     index; slot j holds the j-th selected expert.
//   w[j] = s[id_j] (unbiased); renormalize: sum = w[0] + w[1] + ... in slot order (fp32),
//     then w[j] = w[j] / sum (skipped when sum is 0, i.e. every chosen logit < ~-88 and
//     s underflowed to 0: the weights stay 0 instead of becoming 0/0 = NaN);
//   scaling_in_weights: w[j] = w[j] * routed_scaling_factor.
//
// Softmax router (GPT-OSS / Mixtral): select top_k by logit (descending, ties lower
//   index); m = logit of slot 0; e[j] = am::exp_f32(logit[id_j] - m); sum in slot order;
//   w[j] = e[j] / sum; then routed_scaling_factor as above.
//
// Non-finite logits never crash and never pick an out-of-range id. A NaN score ranks
// below every number (as -inf, ties to the lower index), so a token whose logits are all
// NaN still gets k valid ids; the weights of chosen NaN logits are NaN (a NaN is never
// turned into a number), which Routing::validate rejects before any forward. For the
// sigmoid router -inf / +inf logits are ordinary (s = 0 / 1); for the softmax router a
// chosen infinite logit makes the token's weights NaN (inf - inf), likewise rejected.
#include <algorithm>

#include "mxmoe/activation_math.h"
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/routing.h"

namespace mxmoe {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float rank_key(float x) { return std::isnan(x) ? kNegInf : x; }

// Indices of the `k` largest keys among `cand` (descending key, ties: lower index).
void select_top(const std::vector<float>& key, std::vector<int32_t>& cand, int64_t k) {
  std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](int32_t a, int32_t b) {
    const float ka = key[static_cast<size_t>(a)], kb = key[static_cast<size_t>(b)];
    return ka > kb || (ka == kb && a < b);
  });
  cand.resize(static_cast<size_t>(k));
}

}  // namespace

void RoutingParams::validate(int64_t num_experts) const {
  MXMOE_CHECK_ARG(num_experts >= 1, "num_experts", "must be >= 1, got ", num_experts);
  MXMOE_CHECK_ARG(num_experts <= std::numeric_limits<int32_t>::max(), "num_experts",
                  num_experts, " does not fit the int32 expert ids");
  MXMOE_CHECK_ARG(kind == RouterKind::Sigmoid || kind == RouterKind::Softmax, "params.kind",
                  "invalid value ", static_cast<int>(kind));
  MXMOE_CHECK_ARG(top_k >= 1 && top_k <= num_experts, "params.top_k", top_k,
                  " is out of range [1, ", num_experts, "]");
  MXMOE_CHECK_ARG(n_group >= 0, "params.n_group", "must be >= 0, got ", n_group);
  if (n_group > 1) {
    MXMOE_CHECK_ARG(kind == RouterKind::Sigmoid, "params.n_group",
                    "group-limited selection (n_group ", n_group,
                    ") is defined for the sigmoid router only");
    MXMOE_CHECK_ARG(num_experts % n_group == 0, "params.n_group", n_group,
                    " does not divide num_experts ", num_experts);
    MXMOE_CHECK_ARG(num_experts / n_group >= 2, "params.n_group", n_group,
                    " leaves groups of one expert; the group score needs two");
    MXMOE_CHECK_ARG(topk_group >= 1 && topk_group <= n_group, "params.topk_group", topk_group,
                    " is out of range [1, ", n_group, "]");
    MXMOE_CHECK_ARG(topk_group * (num_experts / n_group) >= top_k, "params.topk_group",
                    topk_group, " groups of ", num_experts / n_group,
                    " experts cannot hold top_k ", top_k);
  }
  MXMOE_CHECK_ARG(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f,
                  "params.routed_scaling_factor", "value ", routed_scaling_factor,
                  " must be finite and > 0");
}

Routing route_cpu(const float* logits, int64_t tokens, int64_t num_experts, const float* bias,
                  const RoutingParams& params) {
  MXMOE_CHECK_ARG(tokens >= 0, "tokens", "must be >= 0, got ", tokens);
  params.validate(num_experts);
  MXMOE_CHECK_ARG(logits != nullptr || tokens == 0, "logits", "is null with ", tokens,
                  " tokens");
  if (bias != nullptr) {
    MXMOE_CHECK_ARG(params.kind == RouterKind::Sigmoid, "bias",
                    "a correction bias applies to the sigmoid router only");
    for (int64_t e = 0; e < num_experts; ++e)
      MXMOE_CHECK_ARG(std::isfinite(bias[e]), "bias", "value ", bias[e], " at [", e,
                      "] is not finite");
  }

  const int64_t E = num_experts, k = params.top_k;
  Routing r;
  r.tokens = tokens;
  r.top_k = k;
  r.ids.resize(static_cast<size_t>(tokens * k));
  r.weights.resize(static_cast<size_t>(tokens * k));

  const bool grouped = params.kind == RouterKind::Sigmoid && params.n_group > 1;
  const int64_t G = grouped ? E / params.n_group : E;
  std::vector<float> s(static_cast<size_t>(E)), key(static_cast<size_t>(E));
  std::vector<int32_t> cand;
  cand.reserve(static_cast<size_t>(E));

  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    int32_t* ids = r.ids.data() + t * k;
    float* w = r.weights.data() + t * k;

    if (params.kind == RouterKind::Sigmoid) {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = am::sigmoid_f32(l[e]);
        key[e] = rank_key(bias ? s[e] + bias[e] : s[e]);
      }
    } else {
      for (int64_t e = 0; e < E; ++e) key[e] = rank_key(l[e]);
    }

    cand.clear();
    if (grouped) {
      std::vector<float> gscore(static_cast<size_t>(params.n_group));
      for (int64_t g = 0; g < params.n_group; ++g) {
        float top1 = kNegInf, top2 = kNegInf;
        for (int64_t e = g * G; e < (g + 1) * G; ++e) {
          if (key[e] > top1) {
            top2 = top1;
            top1 = key[e];
          } else if (key[e] > top2) {
            top2 = key[e];
          }
        }
        // Keys are never +inf (s in [0, 1], bias finite), so a -inf (NaN) member makes
        // the sum -inf, never NaN.
        gscore[g] = top1 + top2;
      }
      std::vector<int32_t> groups(static_cast<size_t>(params.n_group));
      std::iota(groups.begin(), groups.end(), 0);
      select_top(gscore, groups, params.topk_group);
      std::sort(groups.begin(), groups.end());
      for (int32_t g : groups)
        for (int64_t e = g * G; e < (g + 1) * G; ++e) cand.push_back(static_cast<int32_t>(e));
    } else {
      for (int64_t e = 0; e < E; ++e) cand.push_back(static_cast<int32_t>(e));
    }
    select_top(key, cand, k);
    for (int64_t j = 0; j < k; ++j) ids[j] = cand[static_cast<size_t>(j)];

    if (params.kind == RouterKind::Sigmoid) {
      for (int64_t j = 0; j < k; ++j) w[j] = s[ids[j]];
      if (params.renormalize) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += w[j];
        if (sum != 0.0f)
          for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
      }
    } else {
      const float m = l[ids[0]];
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        w[j] = am::exp_f32(l[ids[j]] - m);
        sum += w[j];
      }
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
    }
    if (params.scaling_in_weights)
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] * params.routed_scaling_factor;
  }
  return r;
}

Routing route_cpu_bf16(const uint16_t* logits_bf16, int64_t tokens, int64_t num_experts,
                       const float* bias, const RoutingParams& params) {
  // The same checks as route_cpu's, before the size below is computed from them.
  MXMOE_CHECK_ARG(tokens >= 0, "tokens", "must be >= 0, got ", tokens);
  params.validate(num_experts);
  MXMOE_CHECK_ARG(logits_bf16 != nullptr || tokens == 0, "logits", "is null with ", tokens,
                  " tokens");
  MXMOE_CHECK_ARG(tokens <= std::numeric_limits<int64_t>::max() / num_experts, "tokens", tokens,
                  " x num_experts ", num_experts, " logits overflow int64");
  std::vector<float> wide(static_cast<size_t>(tokens * num_experts));
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = fmt::bf16_to_float(logits_bf16[i]);
  return route_cpu(wide.data(), tokens, num_experts, bias, params);
}

}  // namespace mxmoe
