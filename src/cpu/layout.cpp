// layout.cpp — checkpoint W13 layouts <-> the kernel layout (layout.h). The conversion is
// a pure permutation of whole rows (packed bytes, scale bytes and bias entries move
// together); no byte is decoded or requantized, so a round trip is bit-exact.
#include "mxmoe/layout.h"

#include <cstring>
#include <limits>
#include <string>

#include "mxmoe/error.h"

namespace mxmoe {

namespace {

bool layout_valid(W13Layout l) {
  return l == W13Layout::GateUp || l == W13Layout::Interleaved || l == W13Layout::UpGate;
}

void check_layout(W13Layout l) {
  MXMOE_CHECK_ARG(layout_valid(l), "layout", "invalid value ", static_cast<int>(l));
}

void check_intermediate(int64_t n, const char* argument) {
  MXMOE_CHECK_ARG(n > 0 && n % kGateUpChunk == 0, argument, "intermediate ", n,
                  " must be a positive multiple of ", kGateUpChunk);
}

// Copy `rows` rows of `width` bytes/elements from src to dst, dst row r taking src row
// source_row_of_kernel_row(r) (to kernel) or the reverse (from kernel).
template <typename T>
void permute_rows(const T* src, T* dst, W13Layout layout, int64_t n, int64_t width,
                  bool to_kernel) {
  for (int64_t r = 0; r < 2 * n; ++r) {
    const int64_t s = source_row_of_kernel_row(layout, n, r);
    const int64_t from = to_kernel ? s : r, to = to_kernel ? r : s;
    std::memcpy(dst + to * width, src + from * width, static_cast<size_t>(width) * sizeof(T));
  }
}

std::string at(const char* what, size_t e, const char* field) {
  return std::string(what) + "[" + std::to_string(e) + "]." + field;
}

}  // namespace

const char* to_string(W13Layout l) {
  switch (l) {
    case W13Layout::GateUp: return "gate_up";
    case W13Layout::Interleaved: return "interleaved";
    case W13Layout::UpGate: return "up_gate";
  }
  return "unknown";
}

int64_t kernel_row_of_gate(int64_t n) {
  return 2 * kGateUpChunk * (n / kGateUpChunk) + n % kGateUpChunk;
}
int64_t kernel_row_of_up(int64_t n) { return kernel_row_of_gate(n) + kGateUpChunk; }

int64_t source_row_of_kernel_row(W13Layout layout, int64_t intermediate, int64_t kernel_row) {
  check_layout(layout);
  check_intermediate(intermediate, "intermediate");
  MXMOE_CHECK_ARG(kernel_row >= 0 && kernel_row < 2 * intermediate, "kernel_row", kernel_row,
                  " is out of range [0, ", 2 * intermediate, ")");
  const int64_t j = kernel_row / (2 * kGateUpChunk), i = kernel_row % (2 * kGateUpChunk);
  const bool up = i >= kGateUpChunk;
  const int64_t n = j * kGateUpChunk + i % kGateUpChunk;  // intermediate column
  switch (layout) {
    case W13Layout::GateUp: return up ? intermediate + n : n;
    case W13Layout::Interleaved: return 2 * n + (up ? 1 : 0);
    case W13Layout::UpGate: return up ? n : intermediate + n;
  }
  return -1;  // unreachable: check_layout
}

void MxMatrix::validate(const char* argument) const {
  const std::string a = argument ? argument : "matrix";
  MXMOE_CHECK_ARG(rows > 0, a + ".rows", "must be > 0, got ", rows);
  MXMOE_CHECK_ARG(cols > 0 && cols % kMxBlock == 0, a + ".cols", cols,
                  " must be a positive multiple of ", kMxBlock);
  MXMOE_CHECK_ARG(rows <= std::numeric_limits<int64_t>::max() / cols, a, "shape ", rows, " x ",
                  cols, " overflows");
  MXMOE_CHECK_ARG(static_cast<int64_t>(packed.size()) == rows * (cols / 2), a + ".packed",
                  "has ", packed.size(), " bytes, expected ", rows * (cols / 2), " ([", rows,
                  "][", cols / 2, "])");
  MXMOE_CHECK_ARG(static_cast<int64_t>(scale.size()) == rows * (cols / kMxBlock), a + ".scale",
                  "has ", scale.size(), " bytes, expected ", rows * (cols / kMxBlock), " ([",
                  rows, "][", cols / kMxBlock, "])");
}

ExpertWeights to_kernel_layout(const std::vector<SourceExpert>& experts, W13Layout layout) {
  check_layout(layout);
  MXMOE_CHECK_ARG(!experts.empty(), "experts", "is empty");
  const SourceExpert& first = experts[0];
  first.w13.validate("experts[0].w13");
  MXMOE_CHECK_ARG(first.w13.rows % 2 == 0, "experts[0].w13.rows", first.w13.rows,
                  " is not 2N (gate and up rows)");
  const int64_t n = first.w13.rows / 2, k = first.w13.cols;
  check_intermediate(n, "experts[0].w13.rows");
  const bool has_bias = !first.w13_bias.empty() || !first.w2_bias.empty();

  for (size_t e = 0; e < experts.size(); ++e) {
    const SourceExpert& x = experts[e];
    x.w13.validate(at("experts", e, "w13").c_str());
    x.w2.validate(at("experts", e, "w2").c_str());
    MXMOE_CHECK_ARG(x.w13.rows == 2 * n && x.w13.cols == k, at("experts", e, "w13"), "shape [",
                    x.w13.rows, "][", x.w13.cols, "] differs from experts[0]'s [", 2 * n, "][",
                    k, "]");
    MXMOE_CHECK_ARG(x.w2.rows == k && x.w2.cols == n, at("experts", e, "w2"), "shape [",
                    x.w2.rows, "][", x.w2.cols, "] is not [K=", k, "][N=", n, "]");
    if (has_bias) {
      MXMOE_CHECK_ARG(static_cast<int64_t>(x.w13_bias.size()) == 2 * n,
                      at("experts", e, "w13_bias"), "has ", x.w13_bias.size(),
                      " entries, expected 2N = ", 2 * n, " (experts[0] has biases)");
      MXMOE_CHECK_ARG(static_cast<int64_t>(x.w2_bias.size()) == k, at("experts", e, "w2_bias"),
                      "has ", x.w2_bias.size(), " entries, expected K = ", k,
                      " (experts[0] has biases)");
    } else {
      MXMOE_CHECK_ARG(x.w13_bias.empty() && x.w2_bias.empty(), at("experts", e, "w13_bias"),
                      "has biases but experts[0] has none");
    }
  }

  ExpertWeights w;
  const int64_t el = static_cast<int64_t>(experts.size());
  w.num_local = el;
  w.hidden = k;
  w.intermediate = n;
  const int64_t p13 = 2 * n * (k / 2), s13 = 2 * n * (k / kMxBlock);
  const int64_t p2 = k * (n / 2), s2 = k * (n / kMxBlock);
  w.w13_packed.resize(static_cast<size_t>(el * p13));
  w.w13_scale.resize(static_cast<size_t>(el * s13));
  w.w2_packed.resize(static_cast<size_t>(el * p2));
  w.w2_scale.resize(static_cast<size_t>(el * s2));
  if (has_bias) {
    w.w13_bias.resize(static_cast<size_t>(el * 2 * n));
    w.w2_bias.resize(static_cast<size_t>(el * k));
  }
  for (int64_t e = 0; e < el; ++e) {
    const SourceExpert& x = experts[static_cast<size_t>(e)];
    permute_rows(x.w13.packed.data(), w.w13_packed.data() + e * p13, layout, n, k / 2, true);
    permute_rows(x.w13.scale.data(), w.w13_scale.data() + e * s13, layout, n, k / kMxBlock,
                 true);
    std::memcpy(w.w2_packed.data() + e * p2, x.w2.packed.data(), static_cast<size_t>(p2));
    std::memcpy(w.w2_scale.data() + e * s2, x.w2.scale.data(), static_cast<size_t>(s2));
    if (has_bias) {
      permute_rows(x.w13_bias.data(), w.w13_bias.data() + e * 2 * n, layout, n, 1, true);
      std::memcpy(w.w2_bias.data() + e * k, x.w2_bias.data(),
                  static_cast<size_t>(k) * sizeof(float));
    }
  }
  return w;
}

std::vector<SourceExpert> from_kernel_layout(const ExpertWeights& w, W13Layout layout) {
  check_layout(layout);
  MXMOE_CHECK_ARG(w.num_local >= 1, "weights.num_local", "must be >= 1, got ", w.num_local);
  MXMOE_CHECK_ARG(w.hidden > 0 && w.hidden % kMxBlock == 0, "weights.hidden", w.hidden,
                  " must be a positive multiple of ", kMxBlock);
  check_intermediate(w.intermediate, "weights.intermediate");
  const int64_t el = w.num_local, k = w.hidden, n = w.intermediate;
  const int64_t p13 = 2 * n * (k / 2), s13 = 2 * n * (k / kMxBlock);
  const int64_t p2 = k * (n / 2), s2 = k * (n / kMxBlock);
  auto check = [&](size_t have, int64_t want, const char* arg) {
    MXMOE_CHECK_ARG(static_cast<int64_t>(have) == want, arg, "has ", have,
                    " elements, expected ", want);
  };
  check(w.w13_packed.size(), el * p13, "weights.w13_packed");
  check(w.w13_scale.size(), el * s13, "weights.w13_scale");
  check(w.w2_packed.size(), el * p2, "weights.w2_packed");
  check(w.w2_scale.size(), el * s2, "weights.w2_scale");
  const bool has_bias = !w.w13_bias.empty() || !w.w2_bias.empty();
  if (has_bias) {
    check(w.w13_bias.size(), el * 2 * n, "weights.w13_bias");
    check(w.w2_bias.size(), el * k, "weights.w2_bias");
  }

  std::vector<SourceExpert> out(static_cast<size_t>(el));
  for (int64_t e = 0; e < el; ++e) {
    SourceExpert& x = out[static_cast<size_t>(e)];
    x.w13.rows = 2 * n;
    x.w13.cols = k;
    x.w2.rows = k;
    x.w2.cols = n;
    x.w13.packed.resize(static_cast<size_t>(p13));
    x.w13.scale.resize(static_cast<size_t>(s13));
    permute_rows(w.w13_packed.data() + e * p13, x.w13.packed.data(), layout, n, k / 2, false);
    permute_rows(w.w13_scale.data() + e * s13, x.w13.scale.data(), layout, n, k / kMxBlock,
                 false);
    x.w2.packed.assign(w.w2_packed.begin() + e * p2, w.w2_packed.begin() + (e + 1) * p2);
    x.w2.scale.assign(w.w2_scale.begin() + e * s2, w.w2_scale.begin() + (e + 1) * s2);
    if (has_bias) {
      x.w13_bias.resize(static_cast<size_t>(2 * n));
      permute_rows(w.w13_bias.data() + e * 2 * n, x.w13_bias.data(), layout, n, 1, false);
      x.w2_bias.assign(w.w2_bias.begin() + e * k, w.w2_bias.begin() + (e + 1) * k);
    }
  }
  return out;
}

std::vector<float> rows_to_kernel_layout(const std::vector<float>& src, W13Layout layout,
                                         int64_t intermediate, int64_t cols) {
  check_layout(layout);
  check_intermediate(intermediate, "intermediate");
  MXMOE_CHECK_ARG(cols > 0, "cols", "must be > 0, got ", cols);
  MXMOE_CHECK_ARG(static_cast<int64_t>(src.size()) == 2 * intermediate * cols, "src", "has ",
                  src.size(), " elements, expected 2N x cols = ", 2 * intermediate, " x ",
                  cols);
  std::vector<float> dst(src.size());
  permute_rows(src.data(), dst.data(), layout, intermediate, cols, true);
  return dst;
}

}  // namespace mxmoe
