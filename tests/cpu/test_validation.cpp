// Tests of moe.h: the one place that validates arguments (SPEC §9) — one test per bad
// condition, each checking that InvalidArgument names the field — plus the helpers that
// live beside it (names, activation parameters, activation_ref, EP ownership, MXFP8
// conversion of activations, exact element values).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"
#include "mxmoe/cuda.h"
#include "mxmoe/moe.h"
#include "mxmoe/suite.h"

namespace {

using namespace mxmoe;

const float kNaNF = std::numeric_limits<float>::quiet_NaN();
const float kInfF = std::numeric_limits<float>::infinity();

// E 16 over EP2 (rank 1 owns 8..15), K 64, N 64, top-4, SiTU.
MoeConfig good_config() {
  MoeConfig c;
  c.num_experts = 16;
  c.top_k = 4;
  c.hidden = 64;
  c.intermediate = 64;
  c.ep_size = 2;
  c.ep_rank = 1;
  c.activation = ActivationParams::situ();
  return c;
}

ExpertWeights good_weights(const MoeConfig& c, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  ExpertWeights w;
  const int64_t el = c.local_experts(), K = c.hidden, N = c.intermediate;
  w.num_local = el;
  w.hidden = K;
  w.intermediate = N;
  w.w13_packed.resize(el * 2 * N * K / 2);
  w.w13_scale.resize(el * 2 * N * K / 32);
  w.w2_packed.resize(el * K * N / 2);
  w.w2_scale.resize(el * K * N / 32);
  for (auto* v : {&w.w13_packed, &w.w13_scale, &w.w2_packed, &w.w2_scale})
    for (auto& b : *v) b = static_cast<uint8_t>(rng());
  if (c.has_bias) {
    w.w13_bias.assign(el * 2 * N, 0.5f);
    w.w2_bias.assign(el * K, -0.25f);
  }
  return w;
}

Activations good_bf16(int64_t M, int64_t K, uint32_t seed = 2) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Activations a;
  a.format = InputFormat::BF16;
  a.tokens = M;
  a.hidden = K;
  a.bf16.resize(M * K);
  for (auto& b : a.bf16) b = fmt::float_to_bf16(nd(rng));
  return a;
}

Routing good_routing(const MoeConfig& c, int64_t M, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(-1, static_cast<int32_t>(c.num_experts - 1));
  std::uniform_real_distribution<float> w(0.0f, 1.0f);
  Routing r;
  r.tokens = M;
  r.top_k = c.top_k;
  r.ids.resize(M * c.top_k);
  r.weights.resize(M * c.top_k);
  for (auto& v : r.ids) v = id(rng);
  for (auto& v : r.weights) v = w(rng);
  return r;
}

template <typename F>
std::string rejected_argument(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "";
}
template <typename F>
std::string rejected_message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// The field a config mutation is rejected for ("" when it is accepted).
template <typename Mod>
std::string config_rejects(Mod mod) {
  MoeConfig c = good_config();
  mod(c);
  return rejected_argument([&] { c.validate(); });
}

// ---------------------------------------------------------------- MoeConfig

TEST(ConfigValidate, AcceptsGoodConfigs) {
  EXPECT_NO_THROW(good_config().validate());
  MoeConfig kimi;
  kimi.num_experts = 896;
  kimi.top_k = 16;
  kimi.hidden = 3584;
  kimi.intermediate = 3072;
  kimi.ep_size = 32;
  kimi.ep_rank = 7;
  EXPECT_NO_THROW(kimi.validate());
  MoeConfig oss = good_config();
  oss.activation = ActivationParams::swiglu_oai();
  oss.has_bias = true;
  EXPECT_NO_THROW(oss.validate());
  MoeConfig silu = good_config();
  silu.activation = ActivationParams::silu_gated();
  EXPECT_NO_THROW(silu.validate());
}

TEST(ConfigValidate, RejectsNonPositiveNumExperts) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.num_experts = 0; }), "config.num_experts");
}
TEST(ConfigValidate, RejectsTopKZero) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.top_k = 0; }), "config.top_k");
}
TEST(ConfigValidate, RejectsTopKAboveNumExperts) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.top_k = 17; }), "config.top_k");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.top_k = 16; }), "");
}
TEST(ConfigValidate, RejectsNonPositiveHidden) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.hidden = 0; }), "config.hidden");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.hidden = -64; }), "config.hidden");
}
TEST(ConfigValidate, RejectsHiddenNotMultipleOf32) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.hidden = 80; }), "config.hidden");
}
TEST(ConfigValidate, RejectsNonPositiveIntermediate) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.intermediate = 0; }), "config.intermediate");
}
TEST(ConfigValidate, RejectsIntermediateNotMultipleOf32) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.intermediate = 48; }), "config.intermediate");
}
TEST(ConfigValidate, RejectsEpSizeZero) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.ep_size = 0; }), "config.ep_size");
}
TEST(ConfigValidate, RejectsEpSizeNotDividingExperts) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.ep_size = 3; }), "config.ep_size");
}
TEST(ConfigValidate, RejectsNegativeEpRank) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.ep_rank = -1; }), "config.ep_rank");
}
TEST(ConfigValidate, RejectsEpRankNotBelowEpSize) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.ep_rank = 2; }), "config.ep_rank");
}
TEST(ConfigValidate, RejectsExpertMapOfWrongSize) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.expert_map.assign(15, -1); }), "config.expert_map");
}
TEST(ConfigValidate, RejectsExpertMapValueBelowMinusOne) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.expert_map.assign(16, -1);
              c.expert_map[0] = 0;
              c.expert_map[4] = -2;
            }),
            "config.expert_map");
}
TEST(ConfigValidate, RejectsExpertMapValueNotBelowLocalCount) {
  // Two local experts mapped to 0 and 2: index 2 is out of range [-1, 2).
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.expert_map.assign(16, -1);
              c.expert_map[3] = 0;
              c.expert_map[9] = 2;
            }),
            "config.expert_map");
}
TEST(ConfigValidate, RejectsExpertMapWithDuplicateLocalIndex) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.expert_map.assign(16, -1);
              c.expert_map[3] = 0;
              c.expert_map[9] = 0;
            }),
            "config.expert_map");
}
TEST(ConfigValidate, RejectsExpertMapOwningNothing) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.expert_map.assign(16, -1); }), "config.expert_map");
}
TEST(ConfigValidate, AcceptsExpertMapIgnoringEpSizeDivisibility) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.ep_size = 3;
              c.ep_rank = 2;
              c.expert_map.assign(16, -1);
              c.expert_map[15] = 0;
              c.expert_map[1] = 1;
              c.expert_map[7] = 2;
            }),
            "");
}
TEST(ConfigValidate, RejectsActivationParamVectorOfWrongLength) {
  // E_local is 8: 1 or 8 values are fine, 3 are not.
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha.assign(3, 4.0f); }),
            "config.activation.alpha");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.beta.assign(16, 25.0f); }),
            "config.activation.beta");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha.assign(8, 4.0f); }), "");
}
TEST(ConfigValidate, RejectsEmptySiTUParams) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha.clear(); }),
            "config.activation.alpha");
}
TEST(ConfigValidate, RejectsNonFiniteActivationParam) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha = {kNaNF}; }),
            "config.activation.alpha");
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.activation.beta.assign(8, 25.0f);
              c.activation.beta[5] = kInfF;
            }),
            "config.activation.beta");
}
TEST(ConfigValidate, RejectsNonPositiveSiTUAlphaOrBeta) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha = {0.0f}; }),
            "config.activation.alpha");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.beta = {-25.0f}; }),
            "config.activation.beta");
}
TEST(ConfigValidate, RejectsSiTUAlphaTimesBetaAbove2To120) {
  // The activation's division takes numerators up to 2^126 (activation_math.h).
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.activation.alpha.assign(8, 4.0f);
              c.activation.alpha[3] = 1e30f;
              c.activation.beta = {1e10f};
            }),
            "config.activation.beta");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.alpha = {1e18f}, c.activation.beta = {1e18f}; }), "");
}
TEST(ConfigValidate, RejectsSwiGLUWithoutLimit) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.activation = ActivationParams::swiglu_oai();
              c.activation.limit.clear();
            }),
            "config.activation.limit");
}
TEST(ConfigValidate, RejectsSwiGLUNonFiniteOrNonPositiveLimit) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.activation = ActivationParams::swiglu_oai(1.702f, 1.0f, kInfF);
            }),
            "config.activation.limit");
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.activation = ActivationParams::swiglu_oai(1.702f, 1.0f, -7.0f);
            }),
            "config.activation.limit");
}
TEST(ConfigValidate, RejectsInvalidEnumValues) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.activation.kind = static_cast<Activation>(9); }),
            "config.activation.kind");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.input_format = static_cast<InputFormat>(2); }),
            "config.input_format");
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.intermediate_format = static_cast<IntermediateFormat>(-1);
            }),
            "config.intermediate_format");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.intermediate_format = static_cast<IntermediateFormat>(3); }),
            "config.intermediate_format");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.output_format = static_cast<OutputFormat>(5); }),
            "config.output_format");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.scale_rule = static_cast<ScaleRule>(3); }),
            "config.scale_rule");
}
TEST(ConfigValidate, RejectsNonFiniteOutputScale) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.output_scale = kNaNF; }), "config.output_scale");
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.output_scale = -kInfF; }), "config.output_scale");
}
TEST(ConfigValidate, Fp8PrecisionNeedsMxfp8ActivationsAndAValidValue) {
  EXPECT_EQ(config_rejects([](MoeConfig& c) { c.precision = static_cast<Precision>(2); }), "config.precision");
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.precision = Precision::FP8;
              c.input_format = InputFormat::BF16;
            }),
            "config.precision");
  EXPECT_EQ(config_rejects([](MoeConfig& c) {
              c.precision = Precision::FP8;
              c.input_format = InputFormat::MXFP8;
              c.intermediate_format = IntermediateFormat::BF16;
            }),
            "config.precision");
  MoeConfig c = good_config();
  c.input_format = InputFormat::MXFP8;
  c.intermediate_format = IntermediateFormat::MXFP8;
  c.precision = Precision::FP8;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(parse_precision("FP8"), Precision::FP8);
  EXPECT_EQ(parse_precision("exact"), Precision::Exact);
  EXPECT_EQ(rejected_message([] { parse_precision("fp4", "--precision"); }),
            "--precision: unknown precision 'fp4' (expected exact or fp8)");
}
TEST(ConfigValidate, MessageNamesTheBadValue) {
  MoeConfig c = good_config();
  c.top_k = 17;
  EXPECT_EQ(rejected_message([&] { c.validate(); }), "config.top_k: 17 is out of range [1, 16]");
}

// ---------------------------------------------------------------- EP ownership

TEST(ConfigOwnership, RangeOwnershipForKimiEP32Rank7) {
  MoeConfig c;
  c.num_experts = 896;
  c.top_k = 16;
  c.hidden = 3584;
  c.intermediate = 3072;
  c.ep_size = 32;
  c.ep_rank = 7;
  EXPECT_EQ(c.local_experts(), 28);
  for (int32_t g = -1; g < 896; ++g) {
    const int32_t want = (g >= 196 && g < 224) ? g - 196 : -1;
    ASSERT_EQ(c.local_of(g), want) << g;
  }
}

TEST(ConfigOwnership, ExplicitExpertMapIsUsedAsGiven) {
  MoeConfig c = good_config();
  c.expert_map.assign(16, -1);
  c.expert_map[15] = 0;
  c.expert_map[1] = 2;
  c.expert_map[7] = 1;
  EXPECT_EQ(c.local_experts(), 3);
  EXPECT_EQ(c.local_of(15), 0);
  EXPECT_EQ(c.local_of(7), 1);
  EXPECT_EQ(c.local_of(1), 2);
  EXPECT_EQ(c.local_of(8), -1);
  EXPECT_EQ(c.local_of(-1), -1);
}

// local_of is public (and Python's MoeConfig.local_of): an id outside [-1, num_experts)
// is refused naming it, with a map or without; a map of the wrong size or an ep_size of 0
// (an unvalidated config) names the field instead of reading past it or dividing by 0.
TEST(ConfigOwnership, LocalOfRefusesIdsOutsideTheConfigAndUnanswerableConfigs) {
  MoeConfig c = good_config();
  for (int32_t bad : {16, 1000000000, -2, std::numeric_limits<int32_t>::min()}) {
    EXPECT_EQ(rejected_argument([&] { (void)c.local_of(bad); }), "global_id") << bad;
    MoeConfig m = c;
    m.expert_map.assign(16, -1);
    EXPECT_EQ(rejected_argument([&] { (void)m.local_of(bad); }), "global_id") << bad;
  }
  MoeConfig short_map = c;
  short_map.expert_map.assign(4, 0);
  EXPECT_EQ(rejected_argument([&] { (void)short_map.local_of(9); }), "config.expert_map");
  MoeConfig no_ranks = c;
  no_ranks.ep_size = 0;
  EXPECT_EQ(rejected_argument([&] { (void)no_ranks.local_of(3); }), "config.ep_size");
}

// SPEC §7: the intermediate is MXFP8 by default for MXFP8 activations and BF16 by default
// for BF16 ones; either can be asked for explicitly, whatever the input.
TEST(ConfigIntermediate, DefaultFollowsTheInputAndAnExplicitFormatWins) {
  MoeConfig c = good_config();
  EXPECT_EQ(c.intermediate_format, IntermediateFormat::Auto);
  EXPECT_EQ(c.resolved_intermediate(), IntermediateFormat::MXFP8);
  c.input_format = InputFormat::BF16;
  EXPECT_EQ(c.resolved_intermediate(), IntermediateFormat::BF16);
  EXPECT_NE(c.describe().find("in=bf16 mid=bf16"), std::string::npos) << c.describe();
  EXPECT_NO_THROW(c.validate());
  c.intermediate_format = IntermediateFormat::MXFP8;
  EXPECT_EQ(c.resolved_intermediate(), IntermediateFormat::MXFP8);
  c.input_format = InputFormat::MXFP8;
  c.intermediate_format = IntermediateFormat::BF16;
  EXPECT_EQ(c.resolved_intermediate(), IntermediateFormat::BF16);
  EXPECT_STREQ(to_string(IntermediateFormat::Auto), "auto");
  // The FP8 mode needs an MXFP8 intermediate: the default gives it with MXFP8 input.
  MoeConfig f = good_config();
  f.precision = Precision::FP8;
  EXPECT_NO_THROW(f.validate());
  f.input_format = InputFormat::BF16;  // and its default intermediate, BF16
  EXPECT_EQ(rejected_argument([&] { f.validate(); }), "config.precision");
  // A tolerance is for a resolved format.
  EXPECT_EQ(rejected_argument([] { (void)tolerance_for(IntermediateFormat::Auto); }), "intermediate format");
  MoeConfig b = good_config();
  b.input_format = InputFormat::BF16;  // judged as a BF16 intermediate: the tighter bound
  EXPECT_EQ(tolerance_for(b).max_rel_l2, tolerance_for(IntermediateFormat::BF16).max_rel_l2);
  EXPECT_EQ(tolerance_for(good_config()).max_rel_l2, tolerance_for(IntermediateFormat::MXFP8).max_rel_l2);
}

// SPEC §10: per GPU, what the CUDA engine runs (the rules behind cuda_devices(), `mxmoe
// info` and Python's capabilities()): nothing on an unsupported GPU; every activation and
// format on a supported one, exactly; the FP8 mode and the wgmma prefill path only on
// Hopper with this build's sm_90a kernels.
TEST(GpuCapabilities, PerArchitectureAndBuild) {
  using V = std::vector<std::string>;
  const GpuCapabilities none = gpu_capabilities(false, 9, true);
  EXPECT_TRUE(none.activations.empty() && none.input_formats.empty() && none.precisions.empty() && none.paths.empty());
  for (const auto& [sm, sm90a, precisions, paths] : std::vector<std::tuple<int, bool, V, V>>{
           {8, false, {"exact"}, {"decode"}},
           {9, true, {"exact", "fp8"}, {"decode", "prefill"}},
           {9, false, {"exact"}, {"decode"}},  // a build without sm_90a (e.g. sm_90 only)
           {12, true, {"exact"}, {"decode"}},  // RTX Blackwell: no wgmma, no FP8 mode
       }) {
    SCOPED_TRACE("sm " + std::to_string(sm) + (sm90a ? " with" : " without") + " sm_90a kernels");
    const GpuCapabilities c = gpu_capabilities(true, sm, sm90a);
    EXPECT_EQ(c.activations, (V{"situ", "swiglu", "silu"}));
    EXPECT_EQ(c.input_formats, (V{"bf16", "mxfp8"}));
    EXPECT_EQ(c.intermediate_formats, (V{"bf16", "mxfp8"}));
    EXPECT_EQ(c.output_formats, (V{"bf16", "fp32"}));
    EXPECT_EQ(c.activations, library_capabilities().activations);  // drawn from the library's
    EXPECT_EQ(c.precisions, precisions);
    EXPECT_EQ(c.paths, paths);
  }
}

// The library's lists (mxmoe info, Python's capabilities()) by the names the parsers take.
TEST(LibraryCapabilities, ListsEveryActivationFormatAndCheckpointByItsParsedName) {
  using V = std::vector<std::string>;
  const LibraryCapabilities& c = library_capabilities();
  EXPECT_EQ(c.activations, (V{"situ", "swiglu", "silu"}));
  EXPECT_EQ(c.input_formats, (V{"bf16", "mxfp8"}));
  EXPECT_EQ(c.intermediate_formats, (V{"bf16", "mxfp8"}));
  EXPECT_EQ(c.output_formats, (V{"bf16", "fp32"}));
  EXPECT_EQ(c.weight_formats, (V{"mxfp4"}));
  EXPECT_EQ(c.w13_layouts, (V{"gate_up", "interleaved", "up_gate"}));
  EXPECT_EQ(c.checkpoint_formats, (V{"kimi", "gpt-oss"}));
  EXPECT_EQ(c.routers, (V{"sigmoid", "softmax"}));
  for (const std::string& a : c.activations) EXPECT_EQ(to_string(parse_activation(a)), a);
  for (const std::string& f : c.checkpoint_formats) EXPECT_EQ(to_string(parse_checkpoint_format(f)), f);
}

// `mxmoe run` without --backend: CUDA where some GPU is supported, else the CPU, saying
// why when GPUs are seen but none is supported (README's main job).
TEST(DefaultBackend, CudaOnlyWhereSomeGpuIsSupportedAndTheCpuSaysWhy) {
  GpuInfo old_gpu;
  old_gpu.index = 0;
  old_gpu.name = "Tesla T4";
  old_gpu.note = "GPU 'Tesla T4' is sm_75; the engine needs sm_80 or newer";
  GpuInfo h200;
  h200.index = 1;
  h200.name = "NVIDIA H200";
  h200.supported = true;
  std::string note;
  EXPECT_EQ(default_backend({}, &note), Backend::Cpu);
  EXPECT_EQ(note, "");  // no GPU: nothing to explain
  EXPECT_EQ(default_backend({old_gpu}, &note), Backend::Cpu);
  EXPECT_NE(note.find("running on the CPU"), std::string::npos) << note;
  EXPECT_NE(note.find("sm_75"), std::string::npos) << note;
  note.clear();
  EXPECT_EQ(default_backend({old_gpu, h200}, &note), Backend::Cuda);
  EXPECT_EQ(note, "");
  EXPECT_EQ(default_backend({old_gpu}), Backend::Cpu);  // the note is optional
}

TEST(ConfigDescribe, MentionsShapesEpAndActivation) {
  const std::string d = good_config().describe();
  for (const char* s : {"E=16", "top_k=4", "K=64", "N=64", "ep=1/2", "E_local=8", "situ",
                        "alpha=4", "beta=25", "mxfp8", "bf16"})
    EXPECT_NE(d.find(s), std::string::npos) << s << " not in: " << d;
}

// ---------------------------------------------------------------- ExpertWeights

std::string weights_reject(void (*mod)(MoeConfig&, ExpertWeights&)) {
  MoeConfig c = good_config();
  ExpertWeights w = good_weights(c);
  mod(c, w);
  return rejected_argument([&] { w.validate(c); });
}

TEST(WeightsValidate, AcceptsMatchingWeightsWithAndWithoutBias) {
  MoeConfig c = good_config();
  EXPECT_NO_THROW(good_weights(c).validate(c));
  c.has_bias = true;
  EXPECT_NO_THROW(good_weights(c).validate(c));
}
TEST(WeightsValidate, RejectsNumLocalMismatch) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.num_local = 16; }),
            "weights.num_local");
}
TEST(WeightsValidate, RejectsHiddenMismatch) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.hidden = 32; }), "weights.hidden");
}
TEST(WeightsValidate, RejectsIntermediateMismatch) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.intermediate = 96; }),
            "weights.intermediate");
}
TEST(WeightsValidate, RejectsW13PackedSize) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w13_packed.pop_back(); }),
            "weights.w13_packed");
}
TEST(WeightsValidate, RejectsW13ScaleSize) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w13_scale.push_back(0); }),
            "weights.w13_scale");
}
TEST(WeightsValidate, RejectsW2PackedSize) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w2_packed.clear(); }),
            "weights.w2_packed");
}
TEST(WeightsValidate, RejectsW2ScaleSize) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w2_scale.pop_back(); }),
            "weights.w2_scale");
}
TEST(WeightsValidate, RejectsMissingBiasWhenConfigHasBias) {
  EXPECT_EQ(weights_reject([](MoeConfig& c, ExpertWeights&) { c.has_bias = true; }),
            "weights.w13_bias");
  EXPECT_EQ(weights_reject([](MoeConfig& c, ExpertWeights& w) {
              c.has_bias = true;
              w.w13_bias.assign(8 * 128, 0.0f);
              w.w2_bias.assign(8 * 64 - 1, 0.0f);
            }),
            "weights.w2_bias");
}
TEST(WeightsValidate, RejectsBiasTheConfigWouldIgnore) {
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w13_bias.assign(8 * 128, 0.0f); }),
            "weights.w13_bias");
  EXPECT_EQ(weights_reject([](MoeConfig&, ExpertWeights& w) { w.w2_bias.assign(8 * 64, 0.0f); }),
            "weights.w2_bias");
}

// ---------------------------------------------------------------- Activations

TEST(ActivationsValidate, AcceptsBf16AndMxfp8AndZeroTokens) {
  const Activations a = good_bf16(5, 64);
  EXPECT_NO_THROW(a.validate("x", 64));
  EXPECT_NO_THROW(a.to_mxfp8().validate("x", 64));
  EXPECT_NO_THROW(good_bf16(0, 64).validate("x", 64));
}
TEST(ActivationsValidate, RejectsHiddenMismatchNamingTheArgument) {
  EXPECT_EQ(rejected_argument([] { good_bf16(5, 64).validate("x", 128); }), "x.hidden");
  EXPECT_EQ(rejected_argument([] { good_bf16(5, 64).validate("inputs", 128); }), "inputs.hidden");
}
TEST(ActivationsValidate, RejectsNegativeTokens) {
  Activations a = good_bf16(0, 64);
  a.tokens = -1;
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.tokens");
}
TEST(ActivationsValidate, RejectsBf16BufferSize) {
  Activations a = good_bf16(5, 64);
  a.bf16.pop_back();
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.bf16");
}
TEST(ActivationsValidate, RejectsFp8BufferSize) {
  Activations a = good_bf16(5, 64).to_mxfp8();
  a.fp8.push_back(0);
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.fp8");
}
TEST(ActivationsValidate, RejectsScaleBufferSize) {
  Activations a = good_bf16(5, 64).to_mxfp8();
  a.scale.pop_back();
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.scale");
}
TEST(ActivationsValidate, RejectsFormatMismatchWithBuffers) {
  Activations a = good_bf16(5, 64);
  a.format = InputFormat::MXFP8;  // claims MXFP8 but holds BF16
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.fp8");
}
TEST(ActivationsValidate, RejectsInvalidFormat) {
  Activations a = good_bf16(5, 64);
  a.format = static_cast<InputFormat>(4);
  EXPECT_EQ(rejected_argument([&] { a.validate("x", 64); }), "x.format");
}

TEST(ActivationsConvert, ToMxfp8QuantizesEach32BlockOfEachRow) {
  const Activations a = good_bf16(3, 96, 77);
  const Activations q = a.to_mxfp8();
  ASSERT_EQ(q.format, InputFormat::MXFP8);
  ASSERT_EQ(q.tokens, 3);
  ASSERT_EQ(q.hidden, 96);
  for (int64_t b = 0; b < 3 * 96 / 32; ++b) {
    float blk[32];
    for (int i = 0; i < 32; ++i) blk[i] = fmt::bf16_to_float(a.bf16[b * 32 + i]);
    uint8_t codes[32], s;
    fmt::quantize_block_e4m3(blk, codes, &s);
    ASSERT_EQ(q.scale[b], s) << "block " << b;
    for (int i = 0; i < 32; ++i) ASSERT_EQ(q.fp8[b * 32 + i], codes[i]) << "block " << b;
  }
  // The floor rule is passed through.
  const Activations f = a.to_mxfp8(ScaleRule::Floor);
  float blk[32];
  for (int i = 0; i < 32; ++i) blk[i] = fmt::bf16_to_float(a.bf16[32 + i]);
  uint8_t codes[32], s;
  fmt::quantize_block_e4m3(blk, codes, &s, ScaleRule::Floor);
  EXPECT_EQ(f.scale[1], s);
}

TEST(ActivationsConvert, ValueIsExactBf16OrDequantizedFp8) {
  const Activations a = good_bf16(2, 64, 78);
  const Activations q = a.to_mxfp8();
  double max_rel = 0;
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t k = 0; k < 64; ++k) {
      ASSERT_EQ(a.value(t, k), static_cast<double>(fmt::bf16_to_float(a.bf16[t * 64 + k])));
      ASSERT_EQ(q.value(t, k), fmt::dequant_e4m3(q.fp8[t * 64 + k], q.scale[(t * 64 + k) / 32]));
      if (std::fabs(a.value(t, k)) > 0.5)
        max_rel = std::max(max_rel, std::fabs(q.value(t, k) / a.value(t, k) - 1));
    }
  }
  EXPECT_LE(max_rel, 1.0 / 16);  // half an E4M3 ulp, relative, for normal codes
  EXPECT_GT(max_rel, 0.0) << "MXFP8 should not be lossless on Gaussian bf16";
}

// ---------------------------------------------------------------- Routing

std::string routing_reject(void (*mod)(Routing&)) {
  const MoeConfig c = good_config();
  Routing r = good_routing(c, 6);
  mod(r);
  return rejected_argument([&] { r.validate(c); });
}

TEST(RoutingValidate, AcceptsValidIdsIncludingMinusOneAndZeroTokens) {
  const MoeConfig c = good_config();
  Routing r = good_routing(c, 6);
  r.ids[0] = -1;
  r.ids[1] = 15;
  EXPECT_NO_THROW(r.validate(c));
  EXPECT_NO_THROW(good_routing(c, 0).validate(c));
}
TEST(RoutingValidate, RejectsIdAtOrAboveNumExperts) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.ids[7] = 16; }), "topk_ids");
}
TEST(RoutingValidate, RejectsIdBelowMinusOne) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.ids[2] = -2; }), "topk_ids");
}
TEST(RoutingValidate, MessageNamesIdAndPosition) {
  MoeConfig c;
  c.num_experts = 896;
  c.top_k = 16;
  c.hidden = 64;
  c.intermediate = 64;
  Routing r = good_routing(c, 4);
  r.ids[3 * 16 + 5] = 900;
  EXPECT_EQ(rejected_message([&] { r.validate(c); }),
            "topk_ids: id 900 at [3][5] is out of range [-1, 896)");
}
TEST(RoutingValidate, RejectsIdsBufferSize) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.ids.pop_back(); }), "topk_ids");
}
TEST(RoutingValidate, RejectsWeightsBufferSize) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.weights.push_back(0.0f); }), "topk_weights");
}
TEST(RoutingValidate, RejectsNonFiniteWeight) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.weights[4] = kNaNF; }), "topk_weights");
  EXPECT_EQ(routing_reject([](Routing& r) { r.weights[9] = -kInfF; }), "topk_weights");
}
TEST(RoutingValidate, RejectsTopKMismatch) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.top_k = 3; }), "routing.top_k");
}
TEST(RoutingValidate, RejectsNegativeTokens) {
  EXPECT_EQ(routing_reject([](Routing& r) { r.tokens = -2; }), "routing.tokens");
}

// ---------------------------------------------------------------- names, activations

TEST(Names, ParseActivationRoundTripsToString) {
  for (Activation a : {Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated})
    EXPECT_EQ(parse_activation(to_string(a)), a);
  EXPECT_EQ(parse_activation("SiTU"), Activation::SiTU);
  EXPECT_EQ(rejected_argument([] { parse_activation("gelu"); }), "activation");
  EXPECT_EQ(rejected_argument([] { parse_activation("relu", "--activation"); }), "--activation");
  EXPECT_STREQ(to_string(InputFormat::MXFP8), "mxfp8");
  EXPECT_STREQ(to_string(IntermediateFormat::BF16), "bf16");
  EXPECT_STREQ(to_string(OutputFormat::FP32), "fp32");
}

TEST(ActivationParamsFactories, HoldTheModelDefaults) {
  const ActivationParams s = ActivationParams::situ();
  EXPECT_EQ(s.kind, Activation::SiTU);
  EXPECT_EQ(s.alpha, std::vector<float>{4.0f});
  EXPECT_EQ(s.beta, std::vector<float>{25.0f});
  const ActivationParams o = ActivationParams::swiglu_oai();
  EXPECT_EQ(o.kind, Activation::SwiGLU_OAI);
  EXPECT_EQ(o.alpha, std::vector<float>{1.702f});
  EXPECT_EQ(o.beta, std::vector<float>{1.0f});
  EXPECT_EQ(o.limit, std::vector<float>{7.0f});
  EXPECT_EQ(ActivationParams::silu_gated().kind, Activation::SiLU_Gated);
  ActivationParams per = ActivationParams::situ();
  per.alpha = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(per.alpha_of(2), 3.0f);
  EXPECT_EQ(per.beta_of(2), 25.0f);
}

TEST(ActivationRef, SiTUMatchesFormula) {
  const ActivationParams p = ActivationParams::situ(4.0f, 25.0f);
  // Hand value: g = 2, u = 10: 4*tanh(0.5)*sigmoid(2) * 25*tanh(0.4)
  //           = 4*0.46211716*0.88079708 * 25*0.37994896 = 15.46512
  EXPECT_NEAR(activation_ref(p, 0, 2.0, 10.0), 15.46512, 1e-4);
  // Large |u| saturates at beta, large g at alpha: the SiTU bounds.
  EXPECT_NEAR(activation_ref(p, 0, 100.0, 1000.0), 4.0 * 25.0, 1e-9);
  EXPECT_EQ(activation_ref(p, 0, 0.0, 3.0), 0.0);
}

TEST(ActivationRef, SwiGLUOAIClampsGateAboveAndUpBothSides) {
  const ActivationParams p = ActivationParams::swiglu_oai(1.702f, 1.0f, 7.0f);
  const double a = 1.702f;
  auto f = [&](double g, double u) { return g / (1 + std::exp(-a * g)) * (u + 1.0); };
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, 1.5, 2.0), f(1.5, 2.0));
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, 9.0, 2.0), f(7.0, 2.0)) << "gate clamped above";
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, -9.0, 2.0), f(-9.0, 2.0)) << "gate not clamped below";
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, 1.5, 20.0), f(1.5, 7.0)) << "up clamped above";
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, 1.5, -20.0), f(1.5, -7.0)) << "up clamped below";
}

TEST(ActivationRef, SiLUGatedMatchesFormula) {
  const ActivationParams p = ActivationParams::silu_gated();
  EXPECT_DOUBLE_EQ(activation_ref(p, 0, 1.25, -3.0), 1.25 / (1 + std::exp(-1.25)) * -3.0);
}

TEST(ActivationRef, PerExpertParametersAreUsed) {
  ActivationParams p = ActivationParams::situ();
  p.alpha = {4.0f, 1.0f};
  EXPECT_NE(activation_ref(p, 0, 3.0, 1.0), activation_ref(p, 1, 3.0, 1.0));
  EXPECT_NEAR(activation_ref(p, 1, 3.0, 1.0),
              std::tanh(3.0) / (1 + std::exp(-3.0)) * 25 * std::tanh(1.0 / 25), 1e-12);
}

TEST(ActivationRef, NaNPropagatesThroughEveryActivation) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const ActivationParams& p : {ActivationParams::situ(), ActivationParams::swiglu_oai(),
                                    ActivationParams::silu_gated()}) {
    EXPECT_TRUE(std::isnan(activation_ref(p, 0, nan, 1.0))) << to_string(p.kind);
    EXPECT_TRUE(std::isnan(activation_ref(p, 0, 1.0, nan))) << to_string(p.kind);
  }
}

TEST(OutputValue, ReadsBf16OrFp32) {
  Output o;
  o.tokens = 1;
  o.hidden = 2;
  o.bf16 = {fmt::float_to_bf16(1.5f), fmt::float_to_bf16(-2.25f)};
  EXPECT_EQ(o.value(0, 1), -2.25f);
  o.format = OutputFormat::FP32;
  o.fp32 = {0.1f, 3.0f};
  EXPECT_EQ(o.value(0, 0), 0.1f);
}

TEST(ElementAccessors, RefuseIndicesOutsideAndBuffersTooShort) {
  Output o;
  o.tokens = 1;
  o.hidden = 2;
  o.bf16 = {0, 0};
  EXPECT_EQ(rejected_argument([&] { o.value(1, 0); }), "(t, k)");
  EXPECT_EQ(rejected_argument([&] { o.value(0, 2); }), "(t, k)");
  EXPECT_EQ(rejected_argument([&] { o.value(-1, 0); }), "(t, k)");
  o.format = OutputFormat::FP32;  // fp32 left empty
  EXPECT_EQ(rejected_argument([&] { o.value(0, 1); }), "out.fp32");
  Activations a;
  a.tokens = 2;
  a.hidden = 32;
  a.bf16.assign(40, 0);  // fewer than 2 x 32
  EXPECT_EQ(rejected_argument([&] { a.value(0, 31); }), "");
  EXPECT_EQ(rejected_argument([&] { a.value(1, 31); }), "x.bf16");
  EXPECT_EQ(rejected_argument([&] { a.value(0, 32); }), "(t, k)");
  a.format = InputFormat::MXFP8;
  a.fp8.assign(64, 0);
  a.scale.assign(1, 127);  // one scale: row 1's block is missing
  EXPECT_EQ(rejected_argument([&] { a.value(0, 5); }), "");
  EXPECT_EQ(rejected_argument([&] { a.value(1, 5); }), "x.fp8");
}

}  // namespace
