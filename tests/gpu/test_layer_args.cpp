// Argument checks of the CUDA layer and the host session (docs/HARDENING.md §4). The
// constructor's routing and bias checks run before it looks for a GPU, so those tests
// run everywhere the CUDA engine is built; the rest need a GPU and skip without one.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../../src/cuda/common.cuh"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/reference.h"
#include "../expect_invalid.h"

namespace {

using mxmoe_test::expect_invalid;

using namespace mxmoe;

MoeConfig small_cfg(int64_t experts = 8, int64_t top_k = 2, int64_t ep_size = 1) {
  MoeConfig c;
  c.num_experts = experts;
  c.top_k = top_k;
  c.hidden = 64;
  c.intermediate = 32;
  c.ep_size = ep_size;
  return c;
}

template <typename F>
void expect_unsupported_naming(F f, const std::string& alternative) {
  try {
    f();
    ADD_FAILURE() << "no Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find(alternative), std::string::npos) << e.what();
  }
}

// The test knobs (docs/HARDENING.md §4): a whole decimal number in range, else the
// fallback; no GPU needed.
TEST(LayerArgs, TestKnobIsAWholeNumberInRangeElseTheFallback) {
  const char* name = "MXMOE_TEST_KNOB_PARSING";
  unsetenv(name);
  EXPECT_EQ(cuda_detail::env_knob(name, 1, 64, -1), -1);
  const std::pair<const char*, int> cases[] = {
      {"1", 1},   {"64", 64}, {"07", 7},  {"0", -1}, {"65", -1},  {"-3", -1}, {"", -1},
      {"12x", -1}, {"x12", -1}, {"1.5", -1}, {"99999999999999999999", -1}};
  for (const auto& [value, expected] : cases) {
    setenv(name, value, 1);
    EXPECT_EQ(cuda_detail::env_knob(name, 1, 64, -1), expected) << "value '" << value << "'";
  }
  setenv(name, "0", 1);
  EXPECT_EQ(cuda_detail::env_knob(name, 0, 2, -1), 0);  // knob_digit's form: 0 is a value
  unsetenv(name);
}

TEST(LayerArgs, GpuRoutingBeyondTheKernelLimitsIsRefusedNamingTheAlternative) {
  MoeConfig many = small_cfg(2048, 2, 2048);  // one local expert: small weights
  SyntheticLayer w = make_synthetic_layer(many, 1);
  RoutingParams r;
  r.top_k = 2;
  expect_unsupported_naming([&] { CudaMoeLayer l(many, w.weights, &r); }, "topk_ids");

  MoeConfig wide = small_cfg(64, 33);
  SyntheticLayer w2 = make_synthetic_layer(wide, 1);
  RoutingParams r2;
  r2.top_k = 33;
  expect_unsupported_naming([&] { CudaMoeLayer l(wide, w2.weights, &r2); }, "topk_ids");
}

TEST(LayerArgs, GpuRoutingWithMoreThan32GroupsIsRefusedNamingTheAlternative) {
  MoeConfig c = small_cfg(66, 2);
  SyntheticLayer w = make_synthetic_layer(c, 3);
  RoutingParams r;
  r.top_k = 2;
  r.n_group = 33;  // groups of 2 experts
  r.topk_group = 1;
  ASSERT_NO_THROW(r.validate(c.num_experts));  // valid routing, beyond the GPU kernel
  expect_unsupported_naming([&] { CudaMoeLayer l(c, w.weights, &r); }, "topk_ids");
}

// The engine's int32 row indices: K and N up to 2^24, each named; refused before the
// weights are looked at (a layer that size would not be built to find out).
TEST(LayerArgs, HiddenOrIntermediateBeyondTheEngineLimitIsNamed) {
  MoeConfig k = small_cfg();
  k.hidden = (int64_t{1} << 24) + 32;
  expect_invalid([&] { CudaMoeLayer l(k, ExpertWeights{}); }, "config.hidden");
  MoeConfig n = small_cfg();
  n.intermediate = (int64_t{1} << 24) + 32;
  expect_invalid([&] { CudaMoeLayer l(n, ExpertWeights{}); }, "config.intermediate");
}

TEST(LayerArgs, RoutingTopKMustMatchTheConfig) {
  MoeConfig c = small_cfg();
  SyntheticLayer w = make_synthetic_layer(c, 2);
  RoutingParams r;
  r.top_k = 3;
  expect_invalid([&] { CudaMoeLayer l(c, w.weights, &r); }, "routing.top_k");
}

TEST(LayerArgs, RouterBiasIsChecked) {
  MoeConfig c = small_cfg();
  SyntheticLayer w = make_synthetic_layer(c, 3);
  std::vector<float> bias(8, 0.1f);
  expect_invalid([&] { CudaMoeLayer l(c, w.weights, nullptr, &bias); }, "router_bias");  // no routing
  RoutingParams soft;
  soft.kind = RouterKind::Softmax;
  soft.top_k = 2;
  expect_invalid([&] { CudaMoeLayer l(c, w.weights, &soft, &bias); }, "router_bias");  // softmax
  RoutingParams sig;
  sig.top_k = 2;
  std::vector<float> short_bias(7, 0.1f);
  expect_invalid([&] { CudaMoeLayer l(c, w.weights, &sig, &short_bias); }, "router_bias");
  std::vector<float> nan_bias(8, 0.1f);
  nan_bias[3] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid([&] { CudaMoeLayer l(c, w.weights, &sig, &nan_bias); }, "router_bias");
}

TEST(LayerArgs, MisalignedPointersAreRejectedBeforeAnyLaunch) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible (run on a GPU machine; see README)";
  MoeConfig c = small_cfg();
  c.input_format = InputFormat::BF16;
  SyntheticLayer w = make_synthetic_layer(c, 4);
  CudaMoeLayer layer(c, w.weights);
  const int64_t M = 2;
  char* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, layer.workspace_size(M)), cudaSuccess);
  ForwardArgs a;
  a.tokens = M;
  a.x = buf;
  a.topk_ids = reinterpret_cast<const int32_t*>(buf + 4096 + 2);  // misaligned
  a.topk_weights = reinterpret_cast<const float*>(buf + 8192);
  a.out = buf + 16384;
  expect_invalid([&] { layer.forward(a, ws, layer.workspace_size(M), nullptr); }, "args.topk_ids");
  a.topk_ids = reinterpret_cast<const int32_t*>(buf + 4096);
  a.topk_weights = reinterpret_cast<const float*>(buf + 8192 + 1);
  expect_invalid([&] { layer.forward(a, ws, layer.workspace_size(M), nullptr); }, "args.topk_weights");
  a.topk_weights = reinterpret_cast<const float*>(buf + 8192);
  a.x = buf + 8;  // BF16 rows are read 16 bytes at a time
  expect_invalid([&] { layer.forward(a, ws, layer.workspace_size(M), nullptr); }, "args.x");
  cudaFree(ws);
  cudaFree(buf);
}

// The capability query and the layer decide by one rule (gpu_capabilities): a layer takes
// precision fp8 exactly where cuda_devices() lists it for the layer's GPU.
TEST(LayerArgs, LayerTakesPrecisionFp8ExactlyWhereTheQueryListsIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible (run on a GPU machine; see README)";
  const std::vector<GpuInfo> gpus = cuda_devices();
  ASSERT_FALSE(gpus.empty());
  const GpuInfo& g = gpus[0];
  ASSERT_TRUE(g.supported) << g.note;
  const auto& p = g.capabilities.precisions;
  const bool fp8 = std::find(p.begin(), p.end(), "fp8") != p.end();
  MoeConfig c = small_cfg();
  c.hidden = 256;
  c.intermediate = 128;
  c.precision = Precision::FP8;  // MXFP8 input and intermediate, the defaults
  SyntheticLayer w = make_synthetic_layer(c, 5);
  if (fp8) {
    EXPECT_NO_THROW({ CudaMoeLayer l(c, w.weights, nullptr, nullptr, g.index); }) << g.name;
  } else {
    expect_unsupported_naming([&] { CudaMoeLayer l(c, w.weights, nullptr, nullptr, g.index); },
                              "use precision exact");
  }
}

TEST(LayerArgs, HostSessionChecksItsArguments) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible (run on a GPU machine; see README)";
  MoeConfig c = small_cfg();
  SyntheticLayer w = make_synthetic_layer(c, 5);
  CudaMoeLayer layer(c, w.weights);
  expect_invalid([&] { CudaHostSession s(layer, 0); }, "max_tokens");
  CudaHostSession s(layer, 4);
  expect_invalid([&] { s.run_eager(); }, "inputs");  // before set_inputs
  Activations x = make_activations(5, c.hidden, 6).to_mxfp8();
  Routing r;
  r.tokens = 5;
  r.top_k = 2;
  r.ids.assign(10, 0);
  r.weights.assign(10, 0.5f);
  expect_invalid([&] { s.set_inputs(x, &r, nullptr); }, "x.tokens");  // 5 > max_tokens 4
  Activations x4 = make_activations(4, c.hidden, 7).to_mxfp8();
  std::vector<float> logits(4 * 8, 0.0f);
  expect_invalid([&] { s.set_inputs(x4, nullptr, nullptr); }, "routing");
  Routing r4 = r;
  r4.tokens = 3;
  r4.ids.assign(6, 0);
  r4.weights.assign(6, 0.5f);
  expect_invalid([&] { s.set_inputs(x4, &r4, nullptr); }, "routing.tokens");
  Routing ok = r4;
  ok.tokens = 4;
  ok.ids = {0, 1, 2, 3, 4, 5, 6, 7};
  ok.weights.assign(8, 0.5f);
  s.set_inputs(x4, &ok, nullptr);
  expect_invalid([&] { s.run_graph(0); }, "replays");
  expect_invalid([&] { s.time(0, false); }, "iterations");
}

}  // namespace
