// Tests of the checkpoint <-> kernel layout conversion (layout.h, SPEC §5): bit-exact
// round trips, the row map written out per layout, wrong layouts visibly wrong, and bad
// shapes rejected naming the argument.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/layout.h"

namespace {

using namespace mxmoe;

const W13Layout kLayouts[] = {W13Layout::GateUp, W13Layout::Interleaved, W13Layout::UpGate};

MxMatrix random_matrix(std::mt19937& rng, int64_t rows, int64_t cols) {
  MxMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(rows * cols / 2);
  m.scale.resize(rows * cols / 32);
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  for (auto& b : m.scale) b = static_cast<uint8_t>(rng());
  return m;
}

// Random bytes everywhere, so any misplaced row shows up.
std::vector<SourceExpert> random_experts(int64_t n_exp, int64_t N, int64_t K, bool bias,
                                         uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<SourceExpert> ex(n_exp);
  for (auto& e : ex) {
    e.w13 = random_matrix(rng, 2 * N, K);
    e.w2 = random_matrix(rng, K, N);
    if (bias) {
      e.w13_bias.resize(2 * N);
      e.w2_bias.resize(K);
      for (float& v : e.w13_bias) v = nd(rng);
      for (float& v : e.w2_bias) v = nd(rng);
    }
  }
  return ex;
}

bool bytes_equal(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;  // empty vectors may hold null pointers
}

void expect_same_expert(const SourceExpert& a, const SourceExpert& b, size_t e) {
  EXPECT_EQ(a.w13.rows, b.w13.rows) << e;
  EXPECT_EQ(a.w13.cols, b.w13.cols) << e;
  EXPECT_EQ(a.w2.rows, b.w2.rows) << e;
  EXPECT_EQ(a.w2.cols, b.w2.cols) << e;
  EXPECT_EQ(a.w13.packed, b.w13.packed) << "expert " << e;
  EXPECT_EQ(a.w13.scale, b.w13.scale) << "expert " << e;
  EXPECT_EQ(a.w2.packed, b.w2.packed) << "expert " << e;
  EXPECT_EQ(a.w2.scale, b.w2.scale) << "expert " << e;
  ASSERT_EQ(a.w13_bias.size(), b.w13_bias.size());
  ASSERT_EQ(a.w2_bias.size(), b.w2_bias.size());
  EXPECT_TRUE(bytes_equal(a.w13_bias.data(), b.w13_bias.data(), a.w13_bias.size() * 4));
  EXPECT_TRUE(bytes_equal(a.w2_bias.data(), b.w2_bias.data(), a.w2_bias.size() * 4));
}

// The checkpoint row that holds gate (or up) column n, written out per layout.
int64_t gate_src(W13Layout l, int64_t N, int64_t n) {
  return l == W13Layout::GateUp ? n : l == W13Layout::Interleaved ? 2 * n : N + n;
}
int64_t up_src(W13Layout l, int64_t N, int64_t n) {
  return l == W13Layout::GateUp ? N + n : l == W13Layout::Interleaved ? 2 * n + 1 : n;
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

// ---------------------------------------------------------------- row map

TEST(LayoutRowMap, KernelRowsOfGateAndUpFollowTheHeaderFormula) {
  for (int64_t n = 0; n < 256; ++n) {
    EXPECT_EQ(kernel_row_of_gate(n), 64 * (n / 32) + n % 32) << n;
    EXPECT_EQ(kernel_row_of_up(n), 64 * (n / 32) + 32 + n % 32) << n;
  }
  EXPECT_EQ(kernel_row_of_gate(33), 65);
  EXPECT_EQ(kernel_row_of_up(33), 97);
}

TEST(LayoutRowMap, SourceRowOfKernelRowIsABijectionMatchingEachLayout) {
  const int64_t N = 96;
  for (W13Layout l : kLayouts) {
    std::set<int64_t> seen;
    for (int64_t r = 0; r < 2 * N; ++r) seen.insert(source_row_of_kernel_row(l, N, r));
    EXPECT_EQ(seen.size(), static_cast<size_t>(2 * N)) << to_string(l);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 2 * N - 1);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(source_row_of_kernel_row(l, N, kernel_row_of_gate(n)), gate_src(l, N, n));
      EXPECT_EQ(source_row_of_kernel_row(l, N, kernel_row_of_up(n)), up_src(l, N, n));
    }
  }
  // A few written out for Kimi's GateUp with N = 3072.
  EXPECT_EQ(source_row_of_kernel_row(W13Layout::GateUp, 3072, 0), 0);
  EXPECT_EQ(source_row_of_kernel_row(W13Layout::GateUp, 3072, 32), 3072);
  EXPECT_EQ(source_row_of_kernel_row(W13Layout::GateUp, 3072, 64), 32);
  EXPECT_EQ(source_row_of_kernel_row(W13Layout::Interleaved, 3072, 33), 3);
  EXPECT_EQ(source_row_of_kernel_row(W13Layout::UpGate, 3072, 1), 3073);
}

TEST(LayoutRowMap, RejectsBadArguments) {
  EXPECT_EQ(rejected_argument([] { source_row_of_kernel_row(W13Layout::GateUp, 64, 128); }),
            "kernel_row");
  EXPECT_EQ(rejected_argument([] { source_row_of_kernel_row(W13Layout::GateUp, 64, -1); }),
            "kernel_row");
  EXPECT_EQ(rejected_argument([] { source_row_of_kernel_row(W13Layout::GateUp, 48, 0); }),
            "intermediate");
  EXPECT_EQ(rejected_argument([] { source_row_of_kernel_row(static_cast<W13Layout>(5), 64, 0); }),
            "layout");
}

TEST(LayoutNames, EachLayoutHasADistinctName) {
  EXPECT_STREQ(to_string(W13Layout::GateUp), "gate_up");
  EXPECT_STREQ(to_string(W13Layout::Interleaved), "interleaved");
  EXPECT_STREQ(to_string(W13Layout::UpGate), "up_gate");
}

// ---------------------------------------------------------------- conversion

TEST(LayoutConvert, RoundTripIsBitExactForAllLayouts) {
  for (bool bias : {false, true}) {
    const auto src = random_experts(3, 96, 128, bias, bias ? 7 : 8);
    for (W13Layout l : kLayouts) {
      const ExpertWeights w = to_kernel_layout(src, l);
      EXPECT_EQ(w.num_local, 3);
      EXPECT_EQ(w.hidden, 128);
      EXPECT_EQ(w.intermediate, 96);
      const auto back = from_kernel_layout(w, l);
      ASSERT_EQ(back.size(), src.size());
      for (size_t e = 0; e < src.size(); ++e) expect_same_expert(back[e], src[e], e);
    }
  }
}

TEST(LayoutConvert, KernelRow64jPlusIIsGateRow32jPlusIAndUpFollows) {
  const int64_t N = 96, K = 64;
  const auto src = random_experts(2, N, K, true, 9);
  for (W13Layout l : kLayouts) {
    const ExpertWeights w = to_kernel_layout(src, l);
    for (int64_t e = 0; e < 2; ++e) {
      const SourceExpert& s = src[e];
      const uint8_t* kp = w.w13_packed.data() + e * 2 * N * (K / 2);
      const uint8_t* ks = w.w13_scale.data() + e * 2 * N * (K / 32);
      const float* kb = w.w13_bias.data() + e * 2 * N;
      for (int64_t j = 0; j < N / 32; ++j) {
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t n = 32 * j + i;
          const int64_t kg = 64 * j + i, ku = 64 * j + 32 + i;
          const int64_t sg = gate_src(l, N, n), su = up_src(l, N, n);
          ASSERT_TRUE(bytes_equal(kp + kg * K / 2, s.w13.packed.data() + sg * K / 2, K / 2))
              << to_string(l) << " gate n=" << n;
          ASSERT_TRUE(bytes_equal(kp + ku * K / 2, s.w13.packed.data() + su * K / 2, K / 2))
              << to_string(l) << " up n=" << n;
          ASSERT_TRUE(bytes_equal(ks + kg * K / 32, s.w13.scale.data() + sg * K / 32, K / 32));
          ASSERT_TRUE(bytes_equal(ks + ku * K / 32, s.w13.scale.data() + su * K / 32, K / 32));
          ASSERT_EQ(kb[kg], s.w13_bias[sg]);
          ASSERT_EQ(kb[ku], s.w13_bias[su]);
        }
      }
    }
  }
}

TEST(LayoutConvert, W2AndItsBiasAreCopiedUnchanged) {
  const int64_t N = 64, K = 96;
  const auto src = random_experts(2, N, K, true, 10);
  const ExpertWeights w = to_kernel_layout(src, W13Layout::Interleaved);
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_TRUE(bytes_equal(w.w2_packed.data() + e * K * N / 2, src[e].w2.packed.data(), K * N / 2));
    EXPECT_TRUE(bytes_equal(w.w2_scale.data() + e * K * N / 32, src[e].w2.scale.data(), K * N / 32));
    EXPECT_TRUE(bytes_equal(w.w2_bias.data() + e * K, src[e].w2_bias.data(), K * 4));
  }
}

TEST(LayoutConvert, WrongLayoutChangesAlmostEveryRow) {
  const int64_t N = 128, K = 64;
  const auto src = random_experts(1, N, K, false, 11);
  for (W13Layout right : kLayouts) {
    const ExpertWeights w = to_kernel_layout(src, right);
    for (W13Layout wrong : kLayouts) {
      if (wrong == right) continue;
      const ExpertWeights v = to_kernel_layout(src, wrong);
      int64_t differing = 0;
      for (int64_t r = 0; r < 2 * N; ++r)
        differing += !bytes_equal(w.w13_packed.data() + r * K / 2, v.w13_packed.data() + r * K / 2, K / 2);
      // Only rows that both layouts happen to take from the same source row agree.
      int64_t same_src = 0;
      for (int64_t r = 0; r < 2 * N; ++r)
        same_src += source_row_of_kernel_row(right, N, r) == source_row_of_kernel_row(wrong, N, r);
      EXPECT_EQ(differing, 2 * N - same_src) << to_string(right) << " vs " << to_string(wrong);
      EXPECT_GT(differing, N) << to_string(right) << " vs " << to_string(wrong);
      // Reading kernel weights back with the wrong layout does not reproduce the source.
      EXPECT_NE(from_kernel_layout(w, wrong)[0].w13.packed, src[0].w13.packed);
    }
  }
}

TEST(LayoutConvert, FloatRowsFollowTheSamePermutation) {
  const int64_t N = 64, cols = 5;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> src(2 * N * cols);
  for (float& v : src) v = nd(rng);
  for (W13Layout l : kLayouts) {
    const std::vector<float> dst = rows_to_kernel_layout(src, l, N, cols);
    ASSERT_EQ(dst.size(), src.size());
    for (int64_t r = 0; r < 2 * N; ++r) {
      const int64_t s = source_row_of_kernel_row(l, N, r);
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dst[r * cols + c], src[s * cols + c]);
    }
  }
  EXPECT_EQ(rejected_argument([&] { rows_to_kernel_layout(src, W13Layout::GateUp, N, cols + 1); }),
            "src");
  EXPECT_EQ(rejected_argument([&] { rows_to_kernel_layout(src, W13Layout::GateUp, 40, cols); }),
            "intermediate");
}

// ---------------------------------------------------------------- bad shapes

TEST(LayoutErrors, EmptyExpertListRejected) {
  EXPECT_EQ(rejected_argument([] { to_kernel_layout({}, W13Layout::GateUp); }), "experts");
}

TEST(LayoutErrors, InvalidLayoutRejected) {
  const auto src = random_experts(1, 32, 32, false, 13);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, static_cast<W13Layout>(3)); }), "layout");
}

TEST(LayoutErrors, IntermediateNotMultipleOf32Rejected) {
  auto src = random_experts(1, 32, 32, false, 14);
  std::mt19937 rng(1);
  src[0].w13 = random_matrix(rng, 2 * 48, 32);
  src[0].w2 = random_matrix(rng, 32, 48 + 16);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[0].w13.rows");
}

TEST(LayoutErrors, OddRowCountRejected) {
  auto src = random_experts(1, 32, 32, false, 15);
  std::mt19937 rng(2);
  src[0].w13 = random_matrix(rng, 63, 32);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[0].w13.rows");
}

TEST(LayoutErrors, ColsNotMultipleOf32Rejected) {
  auto src = random_experts(1, 32, 32, false, 16);
  src[0].w13.cols = 48;
  src[0].w13.packed.resize(64 * 24);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[0].w13.cols");
}

TEST(LayoutErrors, PackedAndScaleSizesChecked) {
  auto src = random_experts(2, 32, 64, false, 17);
  src[1].w13.packed.pop_back();
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[1].w13.packed");
  src = random_experts(2, 32, 64, false, 17);
  src[1].w13.scale.push_back(0);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[1].w13.scale");
  src = random_experts(2, 32, 64, false, 17);
  src[0].w2.scale.pop_back();
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[0].w2.scale");
}

TEST(LayoutErrors, ExpertsOfDifferentShapesRejected) {
  auto src = random_experts(3, 32, 64, false, 18);
  const auto other = random_experts(1, 64, 64, false, 19);
  src[2] = other[0];
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }), "experts[2].w13");
  src = random_experts(3, 32, 64, false, 18);
  std::mt19937 rng(3);
  src[1].w2 = random_matrix(rng, 64, 64);  // [K][2N] instead of [K][N]
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }), "experts[1].w2");
}

TEST(LayoutErrors, BiasSizesAndPresenceChecked) {
  auto src = random_experts(2, 32, 64, true, 20);
  src[1].w13_bias.pop_back();
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[1].w13_bias");
  src = random_experts(2, 32, 64, true, 20);
  src[0].w2_bias.push_back(1.0f);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[0].w2_bias");
  src = random_experts(2, 32, 64, false, 21);
  src[1].w13_bias.assign(64, 1.0f);
  src[1].w2_bias.assign(64, 1.0f);
  EXPECT_EQ(rejected_argument([&] { to_kernel_layout(src, W13Layout::GateUp); }),
            "experts[1].w13_bias");
}

TEST(LayoutErrors, FromKernelLayoutChecksSizes) {
  const auto src = random_experts(2, 32, 64, true, 22);
  const ExpertWeights good = to_kernel_layout(src, W13Layout::GateUp);
  ExpertWeights w = good;
  w.w13_packed.pop_back();
  EXPECT_EQ(rejected_argument([&] { from_kernel_layout(w, W13Layout::GateUp); }),
            "weights.w13_packed");
  w = good;
  w.w2_scale.push_back(1);
  EXPECT_EQ(rejected_argument([&] { from_kernel_layout(w, W13Layout::GateUp); }),
            "weights.w2_scale");
  w = good;
  w.intermediate = 48;
  EXPECT_EQ(rejected_argument([&] { from_kernel_layout(w, W13Layout::GateUp); }),
            "weights.intermediate");
  w = good;
  w.num_local = 0;
  EXPECT_EQ(rejected_argument([&] { from_kernel_layout(w, W13Layout::GateUp); }),
            "weights.num_local");
  w = good;
  w.w13_bias.pop_back();
  EXPECT_EQ(rejected_argument([&] { from_kernel_layout(w, W13Layout::GateUp); }),
            "weights.w13_bias");
}

}  // namespace
