// mxmoe/reference.h — the float64 reference engine (SPEC §8), the fp32 CPU backend,
// the unquantized "ideal", synthetic layers and the comparison metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe {

/// The one place that checks a forward call's arguments (config, weights, x in
/// cfg.input_format, routing ids, token counts agreeing); reference_forward and
/// cpu_forward both call it before touching `out`. Throws InvalidArgument naming the
/// argument ("x", "topk_ids", "weights.w13_packed", "config.top_k", ...).
void validate_forward_inputs(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                             const Routing& routing);

/// A near-tie of the intermediate rounding: one of its values (or, for MXFP8, a whole
/// block's scale) lies so close to a rounding boundary that a backend summing in fp32
/// may round it the other way (SPEC §7 allows the summation order to differ). `delta`
/// is what that other rounding adds to output row `row` (K values, unrounded).
struct NearTie {
  int64_t row = 0;
  std::vector<double> delta;
};

/// Float64 oracle on the same quantized bytes: dequantize exactly, accumulate in
/// double, activation in double, mirror the intermediate quantization (MXFP8 via
/// formats.h on the float-rounded activation, or BF16 rounding), GEMM2 in double,
/// finalize in slot order 0..k-1, output_scale, round to the output format.
/// `x` must be in cfg.input_format (see Activations::to_mxfp8). threads <= 0: all cores.
/// out64 (optional) receives the unrounded [M][K] result; near_ties (optional) the
/// intermediate's near-ties, for judges that accept either rounding there.
void reference_forward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                       const Routing& routing, Output& out, std::vector<double>* out64 = nullptr,
                       int threads = 0, std::vector<NearTie>* near_ties = nullptr);

/// fp32 CPU backend: the kernels' arithmetic on the CPU (permute by local expert,
/// fp32 GEMMs, fp32 activation, requantization, fixed-order finalize). This is what
/// `--backend cpu` runs and what is compared against the reference.
void cpu_forward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                 const Routing& routing, Output& out, int threads = 0);

/// The judge's reference for a backend's output `actual` [M][K]: reference_forward on the
/// same inputs, with the intermediate's near-ties taken toward `actual`
/// (take_near_ties), rounded to the output format, and for BF16 outputs the output
/// roundings within 2^-14 of a midpoint taken toward it (take_output_ties). The suite
/// and the Python tests judge against this. Counts go to `ties` (offered, taken,
/// output roundings taken) when given.
struct TieCounts {
  int64_t offered = 0, taken = 0, output_taken = 0;
};
std::vector<double> reference_toward(const MoeConfig& cfg, const ExpertWeights& w, const Activations& x,
                                     const Routing& routing, const std::vector<double>& actual,
                                     TieCounts* ties = nullptr, int threads = 0);

/// Unquantized weights for the ideal: floats in the kernel row order.
///  w13 [E_local][2N][K], w2 [E_local][K][N], biases as in ExpertWeights.
struct IdealWeights {
  int64_t num_local = 0, hidden = 0, intermediate = 0;
  std::vector<float> w13, w2, w13_bias, w2_bias;
};

/// What a user would get without any quantization: float weights and activations,
/// everything in double, no intermediate rounding. x [M][K].
void ideal_forward(const MoeConfig& cfg, const IdealWeights& w, const std::vector<float>& x,
                   const Routing& routing, std::vector<double>& out, int threads = 0);

/// A deterministic synthetic layer: Gaussian BF16 weights (std 1/sqrt(K) for W13,
/// 1/sqrt(N) for W2) quantized with the MXFP4 quantizer, from `seed`.
struct SyntheticLayer {
  ExpertWeights weights;   // kernel layout
  IdealWeights ideal;      // the BF16 originals, as floats
};
SyntheticLayer make_synthetic_layer(const MoeConfig& cfg, uint64_t seed);

/// Deterministic Gaussian BF16 activations [M][K] (std 1), from `seed`.
Activations make_activations(int64_t tokens, int64_t hidden, uint64_t seed);

/// Kernel-vs-reference metrics over [M][K] (SPEC §8).
struct Comparison {
  double max_row_rel_l2 = 0;    // max over rows of ||a-r|| / ||r|| (0/0 = 0)
  double min_cosine = 1;        // min over rows (rows with ||r|| == 0 must be all zero)
  double max_abs_err = 0;
  int64_t bound_violations = 0; // elements with |a-r| > atol + rtol*|r|
  int64_t first_bad_row = -1, first_bad_col = -1;  // first violation, row-major
  int64_t nonfinite = 0;        // non-finite elements in `a` (where `r` is finite)
  double atol = 0, rtol = 0;
  bool pass(double max_rel_l2, double min_cos) const;
  std::string summary() const;
};
Comparison compare_outputs(const std::vector<double>& actual, const std::vector<double>& ref,
                           int64_t rows, int64_t cols, double atol, double rtol);

/// `v` rounded to the output format (through float, as the kernels' fp32 sums are).
double output_rounded(OutputFormat format, double v);

/// Near-ties taken the other way where that brings a row closer to `actual`: per row,
/// the tie that brings the row's rounded reference (output_rounded) closest to
/// `actual` in L2 is added to `ref64` (the unrounded reference), then the next best,
/// while one still brings it closer; each tie whole or not at all. So a backend is not
/// failed for a rounding the precision contract allows. Rows with non-finite values are
/// left alone. Returns how many ties were taken.
int64_t take_near_ties(const std::vector<double>& actual, std::vector<double>& ref64, int64_t cols,
                       const std::vector<NearTie>& ties, OutputFormat format);

/// The same for the BF16 output rounding: where the unrounded reference `ref64` lies
/// within a relative `window` of the midpoint between its BF16 value `ref` and the
/// adjacent BF16 value `actual` holds, `ref` takes `actual`'s value. Returns how many.
int64_t take_output_ties(const std::vector<double>& actual, std::vector<double>& ref,
                         const std::vector<double>& ref64, double window);
/// Output -> doubles (BF16/fp32 decoded).
std::vector<double> output_values(const Output& out);

}  // namespace mxmoe
