// mxmoe/activation_math.h — fp32 transcendental arithmetic shared bit-for-bit by the
// host and the GPU: exp, sigmoid, tanh and the gated activations (SPEC §3, §6).
//
// Why not expf(): the device's expf and the host C library's expf may differ in the
// last ulp, and routing must pick the same experts with the same weights on both
// sides (route_cpu is the judge of the GPU routing kernel, bit for bit). So exp is
// built here from operations IEEE 754 rounds correctly everywhere (fmaf, +, *, /) and
// bit operations, with every multiply-add written as an explicit fmaf: no compiler
// contraction can change the result. Accuracy: exp_f32 is within 2 ulp of exp over its
// normal range (measured 1.01 ulp; tests/cpu/test_activation_math.cpp, which also bounds
// sigmoid, tanh and SiTU), which is far below what the fp32 activation and the MXFP8
// intermediate cost anyway; host and device agree bit for bit (tests/gpu/test_engine.cu).
//
// Everything here is fp32 in, fp32 out, NaN in -> NaN out.
#pragma once

#include <cmath>
#include <cstdint>

#include "mxmoe/formats.h"

namespace mxmoe {
namespace am {

MXMOE_HD float fma32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}
// A product and a sum that the device compiler may not fuse with a neighbour.
MXMOE_HD float mul32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MXMOE_HD float add32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// m (>= 0) with the sign bit of x.
MXMOE_HD float with_sign_of(float m, float x) {
  return fmt::bits_float(fmt::float_bits(m) | (fmt::float_bits(x) & 0x80000000u));
}

/// e^x for |x / ln2| < 2^22 (no special cases): Cody-Waite reduction to |r| <= ln2/2,
/// degree-6 minimax polynomial, exact power-of-two rescale. A NaN x gives NaN.
MXMOE_HD float exp_core_f32(float x) {
  // n = round(x / ln2), ties to even as rintf, by the 1.5 * 2^23 shift: |x / ln2| < 2^22,
  // so the sum's ulp is 1 and its low bits hold n (no float-to-int conversion).
  const float shifted = add32(mul32(x, 1.44269502162933349609375f), 12582912.0f);
  const float n = add32(shifted, -12582912.0f);
  const int ni = static_cast<int>(fmt::float_bits(shifted) - 0x4B400000u);
  // r = x - n*ln2 with ln2 = C1 + C2, C1 having few bits so n*C1 is exact.
  float r = fma32(n, -0.693359375f, x);
  r = fma32(n, 2.12194440e-4f, r);
  // exp(r) = 1 + r + r^2 * P(r)   (Cephes expf coefficients)
  float p = 1.9875691500e-4f;
  p = fma32(p, r, 1.3981999507e-3f);
  p = fma32(p, r, 8.3334519073e-3f);
  p = fma32(p, r, 4.1665795894e-2f);
  p = fma32(p, r, 1.6666665459e-1f);
  p = fma32(p, r, 5.0000001201e-1f);
  const float r2 = mul32(r, r);
  p = fma32(p, r2, r);
  p = add32(p, 1.0f);
  // p * 2^n, n in [-150, 128], as (p * 2^n1) * 2^n2 with n1 = floor(n / 2), n2 = n - n1,
  // both in [-75, 64]: the first product is exact (p in [0.7, 1.42]), so only the last
  // multiply rounds (the one that may produce a subnormal or overflow).
  const int n1 = ni >> 1, n2 = ni - n1;
  return mul32(mul32(p, fmt::bits_float(static_cast<uint32_t>(n1 + 127) << 23)),
               fmt::bits_float(static_cast<uint32_t>(n2 + 127) << 23));
}

inline constexpr float kExpUnderflow = -103.97208404541015625f;  // below: e^x rounds to 0

/// e^x in fp32, deterministic across host and device (exp_core_f32 with the special
/// cases selected at the end).
MXMOE_HD float exp_f32(float x) {
  // Branch-free: the GPU epilogues evaluate many activations per thread, and straight-line
  // code lets the compiler interleave them.
  const bool nan = fmt::is_nan(x);
  const bool over = x > 88.72283935546875f;  // overflows to +Inf
  const bool under = x < kExpUnderflow;
  const float e = exp_core_f32((nan || over || under) ? 0.0f : x);
  return nan ? x : over ? fmt::bits_float(0x7f800000u) : under ? 0.0f : e;
}

/// e^x for x <= 0 or NaN, equal to exp_f32 there bit for bit up to a NaN's payload
/// (checked over every such float, tests/cpu/test_activation_math.cpp) with fewer
/// special cases: nothing overflows, a NaN passes through the arithmetic, and below the
/// underflow bound x is replaced by -104, whose e^x rounds to 0.
MXMOE_HD float exp_nonpos_f32(float x) { return exp_core_f32(x < kExpUnderflow ? -104.0f : x); }

MXMOE_HD float sigmoid_f32(float x) { return 1.0f / add32(1.0f, exp_f32(-x)); }

/// The odd Taylor series of tanh through z^17 as tanh(z) = z + z^3 * tanh_series(z^2),
/// truncation < 1e-8 relative for |z| < 0.55.
MXMOE_HD float tanh_series(float z2) {
  float p = 6404582.0f / 10854718875.0f;
  p = fma32(p, z2, -929569.0f / 638512875.0f);
  p = fma32(p, z2, 21844.0f / 6081075.0f);
  p = fma32(p, z2, -1382.0f / 155925.0f);
  p = fma32(p, z2, 62.0f / 2835.0f);
  p = fma32(p, z2, -17.0f / 315.0f);
  p = fma32(p, z2, 2.0f / 15.0f);
  return fma32(p, z2, -1.0f / 3.0f);
}

/// tanh(z): 2*sigmoid(2z) - 1 for |z| >= 0.55 (a few ulp there), and the odd Taylor
/// series below, because 2*sigmoid(2z) - 1 alone has ~6e-8 *absolute* error, i.e. a
/// large relative error for small z. (tanh.approx would cost ~1e-2 through SiTU's up
/// branch, SPEC §6.) 2*s is exact, so fma or not gives the same bits.
MXMOE_HD float tanh_f32(float z) {
  // Both forms are evaluated and one selected (branch-free, see exp_f32).
  const float z2 = mul32(z, z);
  const float small = fma32(mul32(z, z2), tanh_series(z2), z);
  const float large = fma32(2.0f, sigmoid_f32(mul32(2.0f, z)), -1.0f);
  return fabsf(z) < 0.55f ? small : large;
}

/// A quotient num / den, for activations that multiply several quotients and divide once.
struct Fraction {
  float num, den;
};

/// a * tanh(x / a) as a Fraction, with inv_a = 1/a and k = -2/a (both loop-invariant:
/// the compiler computes them once per expert). For |x / a| < 0.55 the series with
/// den = 1, written as x + x * z^2 * P(z^2) with z = x * inv_a: a * z is x itself, and
/// z's rounding only reaches the correction term, which is below 0.11 x. Above it
/// sign(x) * a * (1 - E) / (1 + E) with E = e^(-2|x|/a) in (0, 0.34]: no cancellation
/// worse than 2x and no overflow for any x (x = +-Inf gives E = 0, +-a / 1).
MXMOE_HD Fraction scaled_tanh_fraction(float x, float a, float inv_a, float k) {
  const float z = mul32(x, inv_a);
  const float z2 = mul32(z, z);
  const float series = fma32(x, mul32(z2, tanh_series(z2)), x);
  const float e = exp_nonpos_f32(mul32(fabsf(x), k));
  const float large = mul32(a, with_sign_of(add32(1.0f, -e), x));
  const bool small = fabsf(z) < 0.55f;
  return Fraction{small ? series : large, small ? 1.0f : add32(1.0f, e)};
}

/// SiTU(alpha, beta) = alpha*tanh(g/alpha) * sigmoid(g) * beta*tanh(u/beta) (SPEC §6) as
/// one quotient: the two scaled tanh fractions above and sigmoid(g) = N / (1 + E) with
/// E = e^(-|g|), N = 1 for g >= 0 and E below (no overflow either way), multiplied out
/// and divided once. Why: an IEEE division compiles to about a dozen instructions and a
/// branch to a slow path; the form with tanh and sigmoid one after the other took five
/// of them per activation and ~250 instructions, and the GEMM1 epilogues evaluate
/// millions. Accuracy against float64: tests/cpu/test_activation_math.cpp.
MXMOE_HD float situ_f32(float g, float u, float alpha, float beta) {
  const Fraction t1 = scaled_tanh_fraction(g, alpha, 1.0f / alpha, -2.0f / alpha);
  const Fraction t3 = scaled_tanh_fraction(u, beta, 1.0f / beta, -2.0f / beta);
  const float e2 = exp_nonpos_f32(-fabsf(g));  // NaN for a NaN g, so the result is NaN
  const float sig_num = g >= 0.0f ? 1.0f : e2;
  const float num = mul32(mul32(t1.num, t3.num), sig_num);  // a subnormal only at the end
  const float den = mul32(mul32(t1.den, t3.den), add32(1.0f, e2));  // in [1, 8]
  return num / den;
}

/// SwiGLU-OAI (GPT-OSS): g = min(g, limit), u = clamp(u, -limit, limit),
/// g*sigmoid(alpha*g)*(u+beta). Comparisons are written so a NaN g or u stays NaN
/// (fminf would turn it into `limit`).
MXMOE_HD float swiglu_oai_f32(float g, float u, float alpha, float beta, float limit) {
  g = (limit < g) ? limit : g;
  u = (u < -limit) ? -limit : ((limit < u) ? limit : u);
  return mul32(mul32(g, sigmoid_f32(mul32(alpha, g))), add32(u, beta));
}

/// SiLU-gated: g*sigmoid(g)*u.
MXMOE_HD float silu_gated_f32(float g, float u) { return mul32(mul32(g, sigmoid_f32(g)), u); }

/// The activation of kind kKind (the integer value of mxmoe::Activation: 0 SiTU,
/// 1 SwiGLU_OAI, 2 SiLU_Gated), for epilogues that dispatch once outside their loops.
template <int kKind>
MXMOE_HD float gated_activation_t(float g, float u, float alpha, float beta, float limit) {
  if constexpr (kKind == 0) return situ_f32(g, u, alpha, beta);
  else if constexpr (kKind == 1) return swiglu_oai_f32(g, u, alpha, beta, limit);
  else return silu_gated_f32(g, u);
}

/// Dispatch on the activation kind (as above; any other value is SiLU_Gated).
MXMOE_HD float gated_activation_f32(int kind, float g, float u, float alpha, float beta,
                                    float limit) {
  switch (kind) {
    case 0: return gated_activation_t<0>(g, u, alpha, beta, limit);
    case 1: return gated_activation_t<1>(g, u, alpha, beta, limit);
    default: return gated_activation_t<2>(g, u, alpha, beta, limit);
  }
}

}  // namespace am
}  // namespace mxmoe
