// The whole SPEC §8 coverage matrix (`mxmoe validate --suite all`) on the CUDA engine,
// one GoogleTest per case. Skipped, with the reason, where no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <ostream>

#include "mxmoe/cuda.h"
#include "mxmoe/suite.h"

namespace mxmoe {
// Print a case by its name (GoogleTest would otherwise dump the struct's bytes).
void PrintTo(const SuiteCase& c, std::ostream* os) { *os << c.name; }
}  // namespace mxmoe

namespace {

class CudaSuite : public ::testing::TestWithParam<mxmoe::SuiteCase> {};

TEST_P(CudaSuite, MatchesFloat64Reference) {
  if (mxmoe::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible (run on a GPU machine; see README)";
  // Fresh inputs every run; the seed is printed so a failure can be reproduced.
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  // Weights from one seed per process, so the Kimi real-shape cases share one layer.
  static const uint64_t weight_seed = seed;
  const mxmoe::CaseResult r = mxmoe::run_case(GetParam(), mxmoe::Backend::Cuda, seed, weight_seed);
  RecordProperty("seed", std::to_string(seed));
  EXPECT_EQ(r.status, mxmoe::CaseResult::Status::Pass)
      << r.name << " (seed " << seed << "): " << r.note << " | " << r.vs_reference.summary();
  EXPECT_TRUE(r.deterministic);
  EXPECT_TRUE(r.graph_checked && r.graph_identical);
}

std::string case_name(const ::testing::TestParamInfo<mxmoe::SuiteCase>& info) {
  std::string s = info.param.name;
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(All, CudaSuite, ::testing::ValuesIn(mxmoe::suite_cases("all")), case_name);

}  // namespace
