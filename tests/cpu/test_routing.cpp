// Tests of route_cpu (SPEC §3): hand-worked small cases, the documented fp32 arithmetic
// (bit-exact, since the GPU kernel is held to it), argument rejection, and a Kimi-size
// random case against a brute-force full sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/routing.h"

namespace {

using namespace mxmoe;

// Logits of one token over 8 experts. Sigmoid scores (rounded):
//   e:      0      1      2      3      4      5      6      7
//   s:  0.525  0.881  0.269  0.953  0.622  0.881  0.047  0.731
// Experts 1 and 5 tie exactly.
const std::vector<float> kLogits8 = {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 2.0f, -3.0f, 1.0f};

float sig(float x) { return 1.0f / (1.0f + expf(-x)); }
double sig64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

RoutingParams sigmoid_params(int64_t k) {
  RoutingParams p;
  p.kind = RouterKind::Sigmoid;
  p.top_k = k;
  return p;
}
RoutingParams softmax_params(int64_t k) {
  RoutingParams p;
  p.kind = RouterKind::Softmax;
  p.top_k = k;
  return p;
}

std::vector<int32_t> ids_of(const Routing& r, int64_t t = 0) {
  return {r.ids.begin() + t * r.top_k, r.ids.begin() + (t + 1) * r.top_k};
}

// The argument an InvalidArgument names, or "" when `f` does not throw one.
template <typename F>
std::string rejected_argument(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "";
}

// ---------------------------------------------------------------- sigmoid, hand-worked

TEST(RoutingSigmoid, Top2PicksHighestScoresAndTieGoesToLowerIndex) {
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(r.tokens, 1);
  EXPECT_EQ(r.top_k, 2);
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1}));  // 1 and 5 tie: 1 wins
  // Hand values: s3 = 0.9525741, s1 = 0.8807971, renormalized.
  EXPECT_NEAR(r.weights[0], 0.9525741 / (0.9525741 + 0.8807971), 1e-6);
  EXPECT_NEAR(r.weights[1], 0.8807971 / (0.9525741 + 0.8807971), 1e-6);
  // The documented fp32 arithmetic, bit for bit.
  const float s3 = sig(3.0f), s1 = sig(2.0f), sum = s3 + s1;
  EXPECT_EQ(r.weights[0], s3 / sum);
  EXPECT_EQ(r.weights[1], s1 / sum);
}

TEST(RoutingSigmoid, Top3OrdersSlotsByDescendingScore) {
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, sigmoid_params(3));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1, 5}));
  const float s3 = sig(3.0f), s1 = sig(2.0f), sum = (s3 + s1) + s1;
  EXPECT_EQ(r.weights[0], s3 / sum);
  EXPECT_EQ(r.weights[1], s1 / sum);
  EXPECT_EQ(r.weights[2], s1 / sum);
  EXPECT_NEAR(r.weights[0] + r.weights[1] + r.weights[2], 1.0, 1e-6);
}

TEST(RoutingSigmoid, BiasChangesSelectionButWeightsUseUnbiasedScores) {
  std::vector<float> bias(8, 0.0f);
  bias[7] = 1.0f;   // 0.731 + 1 = 1.731: expert 7 now ranks first
  bias[3] = 0.05f;  // 1.003: second; unbiased the top 2 would be {3, 1}
  const Routing r = route_cpu(kLogits8.data(), 1, 8, bias.data(), sigmoid_params(2));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{7, 3}));
  const float s7 = sig(1.0f), s3 = sig(3.0f), sum = s7 + s3;
  EXPECT_EQ(r.weights[0], s7 / sum);
  EXPECT_EQ(r.weights[1], s3 / sum);
  EXPECT_NEAR(r.weights[0], 0.7310586 / (0.7310586 + 0.9525741), 1e-6);
}

TEST(RoutingSigmoid, NegativeBiasDemotesAnExpert) {
  std::vector<float> bias(8, 0.0f);
  bias[3] = -2.0f;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, bias.data(), sigmoid_params(2));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(r.weights[0], 0.5f);
  EXPECT_EQ(r.weights[1], 0.5f);
}

TEST(RoutingSigmoid, RenormalizeOffKeepsRawSigmoidScores) {
  RoutingParams p = sigmoid_params(2);
  p.renormalize = false;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, p);
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(r.weights[0], sig(3.0f));
  EXPECT_EQ(r.weights[1], sig(2.0f));
  EXPECT_NEAR(r.weights[0], sig64(3.0), 1e-7);
}

TEST(RoutingSigmoid, ScalingFactorInWeightsMultipliesAfterRenormalize) {
  RoutingParams p = sigmoid_params(2);
  p.routed_scaling_factor = 2.5f;
  p.scaling_in_weights = true;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, p);
  const float s3 = sig(3.0f), s1 = sig(2.0f), sum = s3 + s1;
  EXPECT_EQ(r.weights[0], (s3 / sum) * 2.5f);
  EXPECT_EQ(r.weights[1], (s1 / sum) * 2.5f);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6);
}

TEST(RoutingSigmoid, ScalingFactorOnOutputLeavesWeightsUnscaled) {
  RoutingParams p = sigmoid_params(2);
  p.routed_scaling_factor = 2.5f;
  p.scaling_in_weights = false;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, p);
  const float s3 = sig(3.0f), s1 = sig(2.0f), sum = s3 + s1;
  EXPECT_EQ(r.weights[0], s3 / sum);
  EXPECT_EQ(r.weights[1], s1 / sum);
}

TEST(RoutingSigmoid, GroupLimitExcludesExpertsOfLosingGroups) {
  // Groups of 2: {0,1} 1.406, {2,3} 1.222, {4,5} 1.503, {6,7} 0.778. The best two
  // groups are {4,5} and {0,1}: expert 3, the single highest score, is not eligible.
  RoutingParams p = sigmoid_params(3);
  p.n_group = 4;
  p.topk_group = 2;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, p);
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{1, 5, 4}));
  const float s1 = sig(2.0f), s4 = sig(0.5f), sum = (s1 + s1) + s4;
  EXPECT_EQ(r.weights[0], s1 / sum);
  EXPECT_EQ(r.weights[2], s4 / sum);
  // n_group 1 disables the limit.
  p.n_group = 1;
  EXPECT_EQ(ids_of(route_cpu(kLogits8.data(), 1, 8, nullptr, p)),
            (std::vector<int32_t>{3, 1, 5}));
}

TEST(RoutingSigmoid, GroupScoreIsSumOfTopTwoNotMax) {
  // Group {0..3} has the single best expert but a weak runner-up; group {4..7} has two
  // good experts. With topk_group 1 the sum-of-top-2 rule picks group {4..7}.
  const std::vector<float> l = {5.0f, -5.0f, -5.0f, -5.0f, 1.0f, 1.5f, -4.0f, -4.0f};
  RoutingParams p = sigmoid_params(2);
  p.n_group = 2;
  p.topk_group = 1;
  EXPECT_EQ(ids_of(route_cpu(l.data(), 1, 8, nullptr, p)), (std::vector<int32_t>{5, 4}));
}

TEST(RoutingSigmoid, GroupTiesGoToLowerGroupIndex) {
  const std::vector<float> l(8, 0.0f);
  RoutingParams p = sigmoid_params(2);
  p.n_group = 4;
  p.topk_group = 1;
  EXPECT_EQ(ids_of(route_cpu(l.data(), 1, 8, nullptr, p)), (std::vector<int32_t>{0, 1}));
  std::vector<float> l2(8, 0.0f);
  l2[6] = l2[7] = 1.0f;
  l2[2] = l2[3] = 1.0f;
  EXPECT_EQ(ids_of(route_cpu(l2.data(), 1, 8, nullptr, p)), (std::vector<int32_t>{2, 3}));
}

TEST(RoutingSigmoid, EqualScoresTieTowardLowerExpertIndex) {
  std::vector<float> l(8, -1.0f);
  l[6] = 0.5f;
  l[2] = 0.5f;
  EXPECT_EQ(ids_of(route_cpu(l.data(), 1, 8, nullptr, sigmoid_params(2))),
            (std::vector<int32_t>{2, 6}));
  const std::vector<float> flat(8, 0.25f);
  EXPECT_EQ(ids_of(route_cpu(flat.data(), 1, 8, nullptr, sigmoid_params(4))),
            (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(RoutingSigmoid, TokensAreRoutedIndependently) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> l(5 * 8);
  for (float& v : l) v = n(rng);
  const Routing all = route_cpu(l.data(), 5, 8, nullptr, sigmoid_params(3));
  for (int t = 0; t < 5; ++t) {
    const Routing one = route_cpu(l.data() + t * 8, 1, 8, nullptr, sigmoid_params(3));
    EXPECT_EQ(ids_of(all, t), ids_of(one));
    for (int j = 0; j < 3; ++j) EXPECT_EQ(all.weights[t * 3 + j], one.weights[j]);
  }
}

TEST(RoutingSigmoid, NaNLogitRanksLastAndAllNaNTokenGetsValidIdsAndNaNWeights) {
  std::vector<float> l = kLogits8;
  l[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> two(16);
  std::copy(l.begin(), l.end(), two.begin());
  std::fill(two.begin() + 8, two.end(), std::numeric_limits<float>::quiet_NaN());
  const Routing r = route_cpu(two.data(), 2, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(ids_of(r, 0), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(r.weights[0], 0.5f);
  EXPECT_EQ(ids_of(r, 1), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(std::isnan(r.weights[2]));
  EXPECT_TRUE(std::isnan(r.weights[3]));
}

TEST(RoutingSigmoid, InfiniteLogitsAreOrdinary) {
  std::vector<float> l = kLogits8;
  l[6] = std::numeric_limits<float>::infinity();
  l[3] = -std::numeric_limits<float>::infinity();
  const Routing r = route_cpu(l.data(), 1, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{6, 1}));
  EXPECT_TRUE(std::isfinite(r.weights[0]) && std::isfinite(r.weights[1]));
}

TEST(RoutingSigmoid, AllScoresUnderflowedGivesZeroWeightsNotNaN) {
  const std::vector<float> l(8, -200.0f);  // expf(200) = inf: s = 0 exactly
  const Routing r = route_cpu(l.data(), 1, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(r.weights[0], 0.0f);
  EXPECT_EQ(r.weights[1], 0.0f);
}

TEST(RoutingSigmoid, ZeroTokensGivesEmptyResult) {
  const Routing r = route_cpu(nullptr, 0, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(r.tokens, 0);
  EXPECT_EQ(r.top_k, 2);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

// ---------------------------------------------------------------- softmax

TEST(RoutingSoftmax, Top2IsSoftmaxOverChosenLogits) {
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, softmax_params(2));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);  // 0.7310586
  EXPECT_NEAR(r.weights[1], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-6);
  const float e1 = expf(2.0f - 3.0f), sum = expf(0.0f) + e1;
  EXPECT_EQ(r.weights[0], 1.0f / sum);
  EXPECT_EQ(r.weights[1], e1 / sum);
}

TEST(RoutingSoftmax, Top3WithTieAndScaling) {
  RoutingParams p = softmax_params(3);
  p.routed_scaling_factor = 2.0f;
  const Routing r = route_cpu(kLogits8.data(), 1, 8, nullptr, p);
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1, 5}));
  const double d = 1.0 + 2.0 * std::exp(-1.0);
  EXPECT_NEAR(r.weights[0], 2.0 / d, 2e-6);
  EXPECT_NEAR(r.weights[1], 2.0 * std::exp(-1.0) / d, 2e-6);
  EXPECT_EQ(r.weights[1], r.weights[2]);
}

TEST(RoutingSoftmax, LargeLogitsDoNotOverflow) {
  std::vector<float> l = kLogits8;
  for (float& v : l) v += 1000.0f;
  const Routing r = route_cpu(l.data(), 1, 8, nullptr, softmax_params(2));
  EXPECT_EQ(ids_of(r), (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weights[0], 0.7310586, 1e-4);
}

// ---------------------------------------------------------------- bad arguments

TEST(RoutingArgs, RejectsEachBadArgumentNamingIt) {
  const float* l = kLogits8.data();
  auto with = [](auto mod) {
    RoutingParams p = sigmoid_params(2);
    mod(p);
    return p;
  };
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.top_k = 0; })); }),
            "params.top_k");
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.top_k = 9; })); }),
            "params.top_k");
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, 1, 0, nullptr, sigmoid_params(2)); }),
            "num_experts");
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, -1, 8, nullptr, sigmoid_params(2)); }), "tokens");
  EXPECT_EQ(rejected_argument([&] { route_cpu(nullptr, 1, 8, nullptr, sigmoid_params(2)); }),
            "logits");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.kind = static_cast<RouterKind>(7); }));
            }),
            "params.kind");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.n_group = 3; p.topk_group = 1; }));
            }),
            "params.n_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.n_group = 8; p.topk_group = 1; }));
            }),
            "params.n_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.n_group = -2; }));
            }),
            "params.n_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.n_group = 4; p.topk_group = 0; }));
            }),
            "params.topk_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.n_group = 4; p.topk_group = 5; }));
            }),
            "params.topk_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) {
                          p.top_k = 3;
                          p.n_group = 4;
                          p.topk_group = 1;  // 1 group of 2 experts cannot hold 3
                        }));
            }),
            "params.topk_group");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) {
                          p.routed_scaling_factor = std::numeric_limits<float>::quiet_NaN();
                        }));
            }),
            "params.routed_scaling_factor");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu(l, 1, 8, nullptr, with([](auto& p) { p.routed_scaling_factor = 0.0f; }));
            }),
            "params.routed_scaling_factor");
  EXPECT_EQ(rejected_argument([&] {
              RoutingParams p = softmax_params(2);
              p.n_group = 4;
              p.topk_group = 2;
              route_cpu(l, 1, 8, nullptr, p);
            }),
            "params.n_group");
  std::vector<float> bias(8, 0.0f);
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, 1, 8, bias.data(), softmax_params(2)); }), "bias");
  bias[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(rejected_argument([&] { route_cpu(l, 1, 8, bias.data(), sigmoid_params(2)); }), "bias");
}

TEST(RoutingArgs, MessageNamesTheBadValue) {
  try {
    route_cpu(kLogits8.data(), 1, 8, nullptr, sigmoid_params(9));
    FAIL() << "top_k 9 of 8 experts was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "params.top_k: 9 is out of range [1, 8]");
  }
}

TEST(RoutingArgs, ParamsValidateAcceptsGoodConfigurations) {
  RoutingParams p = sigmoid_params(16);
  EXPECT_NO_THROW(p.validate(896));
  p.n_group = 8;
  p.topk_group = 4;
  EXPECT_NO_THROW(p.validate(896));
  EXPECT_NO_THROW(softmax_params(4).validate(128));
}

// ---------------------------------------------------------------- Kimi size vs brute force

// Brute force: full sort of every eligible expert, written independently of route_cpu.
std::vector<int32_t> brute_force_ids(const float* l, const float* bias, int64_t E, int64_t k,
                                     int64_t n_group, int64_t topk_group) {
  std::vector<float> key(E);
  for (int64_t e = 0; e < E; ++e) key[e] = sig(l[e]) + bias[e];
  std::vector<bool> eligible(E, true);
  if (n_group > 1) {
    const int64_t G = E / n_group;
    std::vector<std::pair<float, int64_t>> gs;
    for (int64_t g = 0; g < n_group; ++g) {
      std::vector<float> m(key.begin() + g * G, key.begin() + (g + 1) * G);
      std::sort(m.begin(), m.end(), std::greater<float>());
      gs.push_back({m[0] + m[1], g});
    }
    std::stable_sort(gs.begin(), gs.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::fill(eligible.begin(), eligible.end(), false);
    for (int64_t i = 0; i < topk_group; ++i)
      for (int64_t e = gs[i].second * G; e < (gs[i].second + 1) * G; ++e) eligible[e] = true;
  }
  std::vector<int32_t> all;
  for (int64_t e = 0; e < E; ++e)
    if (eligible[e]) all.push_back(static_cast<int32_t>(e));
  std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return key[a] > key[b]; });
  all.resize(k);
  return all;
}

void check_kimi(int64_t n_group, int64_t topk_group, uint32_t seed) {
  const int64_t M = 64, E = 896, k = 16;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f), nb(0.0f, 0.05f);
  std::vector<float> l(M * E), bias(E);
  for (float& v : l) v = n(rng);
  for (float& v : bias) v = nb(rng);
  // Force exact ties in a few tokens so the tie rule is exercised at this size.
  for (int64_t t = 0; t < M; t += 7) l[t * E + 500] = l[t * E + 20] = 9.0f;
  bias[500] = bias[20];
  RoutingParams p = sigmoid_params(k);
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.routed_scaling_factor = 2.827f;
  const Routing r = route_cpu(l.data(), M, E, bias.data(), p);
  for (int64_t t = 0; t < M; ++t) {
    const float* lt = l.data() + t * E;
    const std::vector<int32_t> want = brute_force_ids(lt, bias.data(), E, k, n_group, topk_group);
    ASSERT_EQ(ids_of(r, t), want) << "token " << t;
    double sum64 = 0;
    for (int32_t e : want) sum64 += sig64(lt[e]);
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double w = r.weights[t * k + j];
      EXPECT_NEAR(w, 2.827 * sig64(lt[want[j]]) / sum64, 2e-6) << "token " << t << " slot " << j;
      wsum += w;
    }
    EXPECT_NEAR(wsum, 2.827, 1e-5);
  }
}

TEST(RoutingKimi, Random896ExpertsTop16MatchesBruteForceSort) { check_kimi(0, 0, 2024); }

TEST(RoutingKimi, Random896ExpertsTop16GroupLimitedMatchesBruteForce) { check_kimi(8, 4, 2025); }

// ---------------------------------------------------------------- bf16 logits

// A BF16 logit is the fp32 with its upper 16 bits; widened here by hand, apart from the
// formats.h conversion route_cpu_bf16 uses. What this holds is the wrapper (every
// argument passed through, the widening exact); the GPU test Routing.Bf16Logits* holds the
// kernel's own widening to route_cpu_bf16.
std::vector<float> widened(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &u, sizeof u);
  }
  return out;
}

void expect_same_routing(const Routing& got, const Routing& want, const char* what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.top_k, want.top_k) << what;
  EXPECT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (size_t i = 0; i < got.weights.size(); ++i) {
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got.weights[i], 4);
    std::memcpy(&w, &want.weights[i], 4);
    EXPECT_EQ(g, w) << what << ": weight " << i << " " << got.weights[i] << " vs " << want.weights[i];
  }
}

TEST(RoutingBf16, EqualsFp32RoutingOfTheWidenedLogitsBitForBit) {
  const int64_t M = 11, E = 896, k = 16;
  std::mt19937 rng(2026);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<uint16_t> l(static_cast<size_t>(M * E));
  for (auto& v : l) {  // BF16 bits of a normal logit, rounded down (the low half dropped)
    const float f = nd(rng);
    uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  l[2 * E + 7] = 0x7FC0;   // NaN
  l[3 * E + 1] = 0x7F80;   // +Inf
  l[3 * E + 2] = 0xFF80;   // -Inf
  for (int64_t e = 0; e < E; ++e) l[5 * E + e] = 0x3F80;  // a token of ties (1.0 everywhere)
  std::vector<float> bias(static_cast<size_t>(E));
  for (auto& b : bias) b = nd(rng) * 0.05f;
  const std::vector<float> wide = widened(l);

  RoutingParams p = sigmoid_params(k);
  p.routed_scaling_factor = 2.5f;
  expect_same_routing(route_cpu_bf16(l.data(), M, E, bias.data(), p),
                      route_cpu(wide.data(), M, E, bias.data(), p), "sigmoid + bias");
  p.n_group = 8;
  p.topk_group = 4;
  expect_same_routing(route_cpu_bf16(l.data(), M, E, bias.data(), p),
                      route_cpu(wide.data(), M, E, bias.data(), p), "group-limited");
  RoutingParams sm = softmax_params(4);
  expect_same_routing(route_cpu_bf16(l.data(), M, E, nullptr, sm),
                      route_cpu(wide.data(), M, E, nullptr, sm), "softmax");
}

TEST(RoutingBf16, RejectsBadArgumentsAsTheFp32FormDoes) {
  const std::vector<uint16_t> l(8, 0x3F80);
  EXPECT_EQ(rejected_argument([&] { route_cpu_bf16(l.data(), -1, 8, nullptr, sigmoid_params(2)); }),
            "tokens");
  EXPECT_EQ(rejected_argument([&] { route_cpu_bf16(nullptr, 1, 8, nullptr, sigmoid_params(2)); }),
            "logits");
  EXPECT_EQ(rejected_argument([&] { route_cpu_bf16(l.data(), 1, 0, nullptr, sigmoid_params(2)); }),
            "num_experts");
  EXPECT_EQ(rejected_argument([&] { route_cpu_bf16(l.data(), 1, 8, nullptr, sigmoid_params(9)); }),
            "params.top_k");
  EXPECT_EQ(rejected_argument([&] {
              route_cpu_bf16(l.data(), std::numeric_limits<int64_t>::max() / 4, 8, nullptr, sigmoid_params(2));
            }),
            "tokens");  // tokens x num_experts past int64: refused before any allocation
  const std::vector<float> bad_bias(8, std::numeric_limits<float>::infinity());
  EXPECT_EQ(rejected_argument([&] { route_cpu_bf16(l.data(), 1, 8, bad_bias.data(), sigmoid_params(2)); }),
            "bias");
  const Routing none = route_cpu_bf16(nullptr, 0, 8, nullptr, sigmoid_params(2));
  EXPECT_EQ(none.tokens, 0);
  EXPECT_TRUE(none.ids.empty());
}

}  // namespace
