// Kernel-vs-reference metrics (SPEC §8): per-row relative L2 and cosine, and an
// element-wise bound that fails on any single element.
//
// Non-finite values: NaN in both at the same place (or the same infinity) is agreement,
// e.g. a poisoned token's row; it is left out of the row's norms. Any other non-finite
// mismatch is a bound violation and makes its row's relative error infinite (and cosine
// -1); non-finite `actual` where `ref` is finite is also counted in `nonfinite`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/reference.h"

namespace mxmoe {

Comparison compare_outputs(const std::vector<double>& actual, const std::vector<double>& ref,
                           int64_t rows, int64_t cols, double atol, double rtol) {
  MXMOE_CHECK_ARG(rows >= 0 && cols >= 0, "rows", "shape ", rows, " x ", cols, " is negative");
  MXMOE_CHECK_ARG(static_cast<int64_t>(actual.size()) == rows * cols, "actual", "has ",
                  actual.size(), " elements, expected ", rows, " x ", cols);
  MXMOE_CHECK_ARG(static_cast<int64_t>(ref.size()) == rows * cols, "ref", "has ", ref.size(),
                  " elements, expected ", rows, " x ", cols);
  MXMOE_CHECK_ARG(atol >= 0 && rtol >= 0, "atol", "tolerances must be >= 0, got atol ", atol,
                  " rtol ", rtol);
  Comparison c;
  c.atol = atol;
  c.rtol = rtol;
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    double dd = 0, rr = 0, aa = 0, ar = 0;
    bool mismatch = false;
    for (int64_t k = 0; k < cols; ++k) {
      const double a = actual[r * cols + k], e = ref[r * cols + k];
      bool bad;
      if (std::isfinite(a) && std::isfinite(e)) {
        const double d = std::fabs(a - e);
        if (d > c.max_abs_err) c.max_abs_err = d;
        dd += d * d;
        rr += e * e;
        aa += a * a;
        ar += a * e;
        bad = d > atol + rtol * std::fabs(e);
      } else {
        const bool agree = (std::isnan(a) && std::isnan(e)) || (std::isinf(a) && a == e);
        bad = !agree;
        if (std::isfinite(e)) ++c.nonfinite;
        mismatch |= bad;
      }
      if (bad) {
        if (c.bound_violations == 0) {
          c.first_bad_row = r;
          c.first_bad_col = k;
        }
        ++c.bound_violations;
      }
    }
    double rel, cosine;
    if (mismatch) {
      rel = inf;
      cosine = -1;
    } else if (rr == 0) {
      rel = aa == 0 ? 0 : inf;
      cosine = aa == 0 ? 1 : 0;
    } else {
      rel = std::sqrt(dd) / std::sqrt(rr);
      cosine = aa == 0 ? 0 : ar / (std::sqrt(aa) * std::sqrt(rr));
    }
    if (!(rel <= c.max_row_rel_l2)) c.max_row_rel_l2 = rel;
    if (!(cosine >= c.min_cosine)) c.min_cosine = cosine;
  }
  return c;
}

bool Comparison::pass(double max_rel_l2, double min_cos) const {
  return max_row_rel_l2 <= max_rel_l2 && min_cosine >= min_cos && bound_violations == 0 &&
         nonfinite == 0;
}

std::string Comparison::summary() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "max_row_rel_l2=%.3e min_cosine=%.8f max_abs_err=%.3e violations=%lld "
                "(|a-r| > %.3g + %.3g*|r|) nonfinite=%lld",
                max_row_rel_l2, min_cosine, max_abs_err, static_cast<long long>(bound_violations),
                atol, rtol, static_cast<long long>(nonfinite));
  std::string s = buf;
  if (bound_violations > 0)
    s += detail::cat(" first_bad=[", first_bad_row, "][", first_bad_col, "]");
  return s;
}

double output_rounded(OutputFormat format, double v) {
  const float f = static_cast<float>(v);
  return format == OutputFormat::BF16 ? static_cast<double>(fmt::bf16_to_float(fmt::float_to_bf16(f)))
                                      : static_cast<double>(f);
}

int64_t take_near_ties(const std::vector<double>& actual, std::vector<double>& ref64, int64_t cols,
                       const std::vector<NearTie>& ties, OutputFormat format) {
  MXMOE_CHECK_ARG(actual.size() == ref64.size(), "actual", "has ", actual.size(),
                  " elements, the reference ", ref64.size());
  MXMOE_CHECK_ARG(cols > 0 && ref64.size() % static_cast<size_t>(cols) == 0, "cols", cols,
                  " does not divide the reference's ", ref64.size(), " elements");
  const int64_t rows = static_cast<int64_t>(ref64.size()) / cols;
  std::vector<std::vector<size_t>> of_row(static_cast<size_t>(rows));  // in `ties` order
  for (size_t i = 0; i < ties.size(); ++i) {
    MXMOE_CHECK_ARG(static_cast<int64_t>(ties[i].delta.size()) == cols && ties[i].row >= 0 &&
                        ties[i].row < rows,
                    "ties", "entry ", i, " does not fit the ", cols, "-wide output");
    of_row[static_cast<size_t>(ties[i].row)].push_back(i);
  }
  // Judged on the rounded reference: `actual` is rounded to the output format, and for
  // BF16 that rounding (~2^-9 of a value) swamps a tie's effect (~2e-5), so against the
  // unrounded reference ties were taken for rounding noise. Best first, not largest
  // first: ties of one row overlap, and a large one can explain less than a smaller one.
  int64_t taken = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const double* a = &actual[row * cols];
    double* r = &ref64[row * cols];
    bool finite = true;
    for (int64_t k = 0; k < cols; ++k) finite &= std::isfinite(a[k]) && std::isfinite(r[k]);
    std::vector<size_t>& left = of_row[static_cast<size_t>(row)];
    while (finite && !left.empty()) {
      double best = 0;  // change of the squared distance to `actual`; only decreases count
      size_t best_at = left.size();
      for (size_t j = 0; j < left.size(); ++j) {
        const std::vector<double>& d = ties[left[j]].delta;
        double change = 0;
        for (int64_t k = 0; k < cols; ++k) {
          if (d[k] == 0) continue;
          const double now = a[k] - output_rounded(format, r[k]);
          const double then = a[k] - output_rounded(format, r[k] + d[k]);
          change += then * then - now * now;
        }
        if (change < best) best = change, best_at = j;  // the first of equals: deterministic
      }
      if (best_at == left.size()) break;
      const std::vector<double>& d = ties[left[best_at]].delta;
      for (int64_t k = 0; k < cols; ++k) r[k] += d[k];
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(best_at));
      ++taken;
    }
  }
  return taken;
}

int64_t take_output_ties(const std::vector<double>& actual, std::vector<double>& ref,
                         const std::vector<double>& ref64, double window) {
  MXMOE_CHECK_ARG(actual.size() == ref.size() && ref64.size() == ref.size(), "ref64", "has ",
                  ref64.size(), " elements; actual ", actual.size(), ", ref ", ref.size());
  int64_t taken = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (actual[i] == ref[i] || !std::isfinite(actual[i]) || !std::isfinite(ref[i])) continue;
    const uint16_t a = fmt::float_to_bf16(static_cast<float>(actual[i]));
    const uint16_t r = fmt::float_to_bf16(static_cast<float>(ref[i]));
    const bool adjacent = (a >> 15) == (r >> 15) && (a == r + 1 || r == a + 1);
    const double mid = 0.5 * (actual[i] + ref[i]);  // exact: adjacent BF16 values
    if (adjacent && std::fabs(ref64[i] - mid) <= window * std::fabs(mid)) {
      ref[i] = actual[i];
      ++taken;
    }
  }
  return taken;
}

std::vector<double> output_values(const Output& out) {
  const int64_t n = out.tokens * out.hidden;
  MXMOE_CHECK_ARG(out.tokens >= 0 && out.hidden >= 0, "out", "shape ", out.tokens, " x ",
                  out.hidden, " is negative");
  std::vector<double> v(static_cast<size_t>(n));
  if (out.format == OutputFormat::BF16) {
    MXMOE_CHECK_ARG(static_cast<int64_t>(out.bf16.size()) == n, "out.bf16", "has ",
                    out.bf16.size(), " elements, expected ", out.tokens, " x ", out.hidden);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(fmt::bf16_to_float(out.bf16[i]));
  } else {
    MXMOE_CHECK_ARG(out.format == OutputFormat::FP32, "out.format", "invalid value ",
                    static_cast<int>(out.format));
    MXMOE_CHECK_ARG(static_cast<int64_t>(out.fp32.size()) == n, "out.fp32", "has ",
                    out.fp32.size(), " elements, expected ", out.tokens, " x ", out.hidden);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(out.fp32[i]);
  }
  return v;
}

}  // namespace mxmoe
