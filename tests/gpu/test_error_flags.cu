// The public device-side error word (cuda.h): out-of-range expert ids are skipped,
// flagged, and readable after the fact; a clean forward clears the flag.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/reference.h"

namespace {

using namespace mxmoe;

template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

TEST(ErrorFlags, OutOfRangeIdsAreFlaggedAndACleanRunClearsTheFlag) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible (run on a GPU machine; see README)";
  MoeConfig cfg;
  cfg.num_experts = 8;
  cfg.top_k = 2;
  cfg.hidden = 128;
  cfg.intermediate = 64;
  cfg.input_format = InputFormat::BF16;
  const int64_t M = 4;
  SyntheticLayer syn = make_synthetic_layer(cfg, 7);
  Activations x = make_activations(M, cfg.hidden, 8);
  CudaMoeLayer layer(cfg, syn.weights);

  std::vector<int32_t> bad_ids = {0, 1, 2, 900, -7, 3, 4, 5};  // 900 and -7: garbage
  std::vector<int32_t> good_ids = {0, 1, 2, -1, -1, 3, 4, 5};
  std::vector<float> weights(M * 2, 0.5f);
  uint8_t* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, layer.workspace_size(M)), cudaSuccess);
  uint16_t* dx = upload(x.bf16);
  int32_t* dbad = upload(bad_ids);
  int32_t* dgood = upload(good_ids);
  float* dw = upload(weights);
  uint16_t* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, M * cfg.hidden * 2), cudaSuccess);

  ForwardArgs a;
  a.tokens = M;
  a.x = dx;
  a.topk_weights = dw;
  a.out = out;
  a.topk_ids = dbad;
  layer.forward(a, ws, layer.workspace_size(M), nullptr);
  EXPECT_EQ(layer.read_error_flags(ws, nullptr), CudaMoeLayer::kErrorExpertIdOutOfRange);
  // The device pointer names the same word.
  uint32_t direct = 0;
  ASSERT_EQ(cudaMemcpy(&direct, layer.error_flags_device(ws), 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(direct, CudaMoeLayer::kErrorExpertIdOutOfRange);

  // The bad slots contributed nothing: same output as the same routing with -1 there.
  std::vector<uint16_t> out_bad(M * cfg.hidden), out_good(M * cfg.hidden);
  ASSERT_EQ(cudaMemcpy(out_bad.data(), out, out_bad.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  a.topk_ids = dgood;
  layer.forward(a, ws, layer.workspace_size(M), nullptr);
  EXPECT_EQ(layer.read_error_flags(ws, nullptr), 0u) << "a clean forward clears the flag";
  ASSERT_EQ(cudaMemcpy(out_good.data(), out, out_good.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out_bad, out_good);

  EXPECT_THROW(layer.error_flags_device(nullptr), InvalidArgument);
  for (void* p : {static_cast<void*>(ws), static_cast<void*>(dx), static_cast<void*>(dbad),
                  static_cast<void*>(dgood), static_cast<void*>(dw), static_cast<void*>(out)})
    cudaFree(p);
}

}  // namespace
