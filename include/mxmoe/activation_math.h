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
#include <type_traits>

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

/// |m| with the sign of x, NaNs included (IEEE copysign: a bit operation, the same bits on
/// host and device). Written as copysignf because nvcc then emits one LOP3 (a bit select
/// with the sign mask); the mask-and-or form compiled to two, three times per SiTU.
MXMOE_HD float with_sign_of(float m, float x) {
#if defined(__CUDA_ARCH__)
  return copysignf(m, x);
#else
  return std::copysign(m, x);
#endif
}

/// e^x = 2^n * (1 + em) for |x / ln2| < 2^22: Cody-Waite reduction x = n ln2 + r,
/// |r| <= ln2/2, and em = e^r - 1 = r + r^2 P(r) (Cephes expf's degree-6 polynomial),
/// kept without its leading 1 so that expm1 needs no subtraction. A NaN x gives NaN em.
struct ExpParts {
  float em;
  int n;
};
MXMOE_HD ExpParts exp_parts(float x) {
  // n = round(x / ln2), ties to even as rintf, by the 1.5 * 2^23 shift: |x / ln2| < 2^22,
  // so the sum's ulp is 1 and its low bits hold n (no float-to-int conversion). One fma:
  // the product is not rounded before the shift (one instruction fewer per exp). n can
  // differ from the rounded product's only where x / ln2 lies within half an ulp of a
  // half integer; either n leaves |r| past ln2/2 by at most that half ulp times ln2 (as
  // the rounded product could), where P is as accurate.
  const float shifted = fma32(x, 1.44269502162933349609375f, 12582912.0f);
  const float n = add32(shifted, -12582912.0f);
  // r = x - n*ln2 with ln2 = C1 + C2, C1 having few bits so n*C1 is exact.
  float r = fma32(n, -0.693359375f, x);
  r = fma32(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma32(p, r, 1.3981999507e-3f);
  p = fma32(p, r, 8.3334519073e-3f);
  p = fma32(p, r, 4.1665795894e-2f);
  p = fma32(p, r, 1.6666665459e-1f);
  p = fma32(p, r, 5.0000001201e-1f);
  return ExpParts{fma32(p, mul32(r, r), r), static_cast<int>(fmt::float_bits(shifted) - 0x4B400000u)};
}

/// 2^n as a float, for -126 <= n <= 127.
MXMOE_HD float pow2_f32(int n) { return fmt::bits_float(static_cast<uint32_t>(n + 127) << 23); }

/// e^x for |x / ln2| < 2^22 (no special cases). A NaN x gives NaN.
MXMOE_HD float exp_core_f32(float x) {
  const ExpParts e = exp_parts(x);
  const float p = add32(e.em, 1.0f);
  // p * 2^n, n in [-150, 128], as (p * 2^n1) * 2^n2 with n1 = floor(n / 2), n2 = n - n1,
  // both in [-75, 64]: the first product is exact (p in [0.7, 1.42]), so only the last
  // multiply rounds (the one that may produce a subnormal or overflow).
  const int n1 = e.n >> 1, n2 = e.n - n1;
  return mul32(mul32(p, pow2_f32(n1)), pow2_f32(n2));
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
/// (checked once over all 2^31 such floats; tests/cpu/test_activation_math.cpp samples
/// them and the underflow bound's neighbourhood), with fewer
/// special cases: nothing overflows, a NaN passes through the arithmetic, and below the
/// underflow bound x is replaced by -104, whose e^x rounds to 0.
MXMOE_HD float exp_nonpos_f32(float x) { return exp_core_f32(x < kExpUnderflow ? -104.0f : x); }

MXMOE_HD float sigmoid_f32(float x) { return 1.0f / add32(1.0f, exp_f32(-x)); }

/// tanh(z): 2*sigmoid(2z) - 1 for |z| >= 0.55 (a few ulp there), and the odd Taylor
/// series through z^17 below (truncation < 1e-8 relative), because 2*sigmoid(2z) - 1
/// alone has ~6e-8 *absolute* error, i.e. a large relative error for small z. (SiTU has
/// its own form below; tanh.approx would cost ~1e-2 through its up branch, SPEC §6.)
/// 2*s is exact, so fma or not gives the same bits.
MXMOE_HD float tanh_f32(float z) {
  // Both forms are evaluated and one selected (branch-free, see exp_f32).
  const float z2 = mul32(z, z);
  float p = 6404582.0f / 10854718875.0f;
  p = fma32(p, z2, -929569.0f / 638512875.0f);
  p = fma32(p, z2, 21844.0f / 6081075.0f);
  p = fma32(p, z2, -1382.0f / 155925.0f);
  p = fma32(p, z2, 62.0f / 2835.0f);
  p = fma32(p, z2, -17.0f / 315.0f);
  p = fma32(p, z2, 2.0f / 15.0f);
  p = fma32(p, z2, -1.0f / 3.0f);
  const float small = fma32(mul32(z, z2), p, z);
  const float large = fma32(2.0f, sigmoid_f32(mul32(2.0f, z)), -1.0f);
  return fabsf(z) < 0.55f ? small : large;
}

/// A quotient num / den, for activations that multiply several quotients and divide once.
struct Fraction {
  float num, den;
};

/// num / den for den in [1, 8] and |num| <= 2^126 (or either NaN), without a branch:
/// Newton's reciprocal from a bit trick, then two residual corrections of the quotient
/// (fma gives each residual exactly). Why not `/`: an IEEE division on the GPU is a fast
/// path, a check and a branch to a slow path, and the branch cuts the activation loops of
/// the GEMM1 epilogues into blocks that the compiler cannot interleave (PERFORMANCE.md,
/// session 19). Same operations on host and device, so the same bits. Accuracy: the
/// reciprocal x is within 6.8e-6 of 1/den, and the last correction's own error is that
/// fraction of an ulp, so the result is num / den correctly rounded except within ~1e-5
/// ulp of a tie, and for results near or under 2^-126, where the residuals lose bits:
/// within 1 ulp there (tests/cpu/test_activation_math.cpp). The sign is num's, also for a
/// zero.
MXMOE_HD float div_den_1_to_8_f32(float num, float den) {
  float x = fmt::bits_float(0x7EF311C3u - fmt::float_bits(den));  // 1/den within 5.1%
  x = fma32(x, fma32(-den, x, 1.0f), x);                          // within 2.6e-3
  x = fma32(x, fma32(-den, x, 1.0f), x);                          // within 6.8e-6
  float q = mul32(num, x);
  q = fma32(fma32(-den, q, num), x, q);
  q = fma32(fma32(-den, q, num), x, q);
  return with_sign_of(q, num);
}

/// e^x - 1 for x <= 0 or NaN, without cancellation: 2^n * em + (2^n - 1) in one fma
/// (exp_parts; 2^n - 1 is exact for n >= -24). Below -44 (n < -63) x is replaced by
/// -44, where e^x - 1 is -1 to fp32 already, so 2^n stays a normal float.
MXMOE_HD float expm1_nonpos_f32(float x) {
  const ExpParts e = exp_parts(x < -44.0f ? -44.0f : x);
  const float s = pow2_f32(e.n);
  return fma32(s, e.em, add32(s, -1.0f));
}

/// tanh(x / a) as a Fraction, from k = -2/a (loop-invariant: the compiler computes it
/// once per expert): with m = e^(-2|x|/a) - 1 in [-1, 0], sign(x) * -m / (2 + m). m is
/// computed as such, so there is no cancellation for small |x| and one form serves every
/// x (x = +-Inf: m = -1, +-1 / 1).
MXMOE_HD Fraction tanh_fraction(float x, float k) {
  const float m = expm1_nonpos_f32(mul32(fabsf(x), k));
  return Fraction{with_sign_of(m, x), add32(2.0f, m)};
}

/// SiTU(alpha, beta) = alpha*tanh(g/alpha) * sigmoid(g) * beta*tanh(u/beta) (SPEC §6) as
/// one quotient: the two tanh fractions above and sigmoid(g) = N / (1 + E) with
/// E = e^(-|g|), N = 1 for g >= 0 and E below (no overflow either way), multiplied out
/// with alpha*beta and divided once. Why: an IEEE division compiles to about a dozen
/// instructions and a branch to a slow path; the form with tanh and sigmoid one after
/// the other took five of them per activation (197 SASS instructions against 88 here),
/// and the GEMM1 epilogues evaluate millions. Accuracy against float64 (Kimi SiTU on
/// normal(0, 18) inputs: worst 7.2 ulp, mean 0.94): tests/cpu/test_activation_math.cpp.
/// This is the form for alpha != 4; situ_f32 below picks.
MXMOE_HD float situ_any_alpha_f32(float g, float u, float alpha, float beta) {
  const Fraction t1 = tanh_fraction(g, -2.0f / alpha);
  const Fraction t3 = tanh_fraction(u, -2.0f / beta);
  const float e2 = exp_nonpos_f32(-fabsf(g));  // NaN for a NaN g, so the result is NaN
  const float sig_num = g >= 0.0f ? 1.0f : e2;
  // A subnormal only in the last product; den in [1, 8].
  const float num = mul32(mul32(mul32(mul32(alpha, beta), t1.num), t3.num), sig_num);
  const float den = mul32(mul32(t1.den, t3.den), add32(1.0f, e2));
  return div_den_1_to_8_f32(num, den);
}

/// SiTU with alpha = 4 (Kimi-K3's), with one exp for g instead of two: tanh(g/4) needs
/// F = e^(-|g|/2) and the sigmoid F^2 = e^(-|g|). With F = 2^n (1 + em) from exp_parts,
/// F^2 = 2^2n (1 + w), w = em^2 + 2 em in one fma, and where F^2 is a factor of the
/// numerator (g < 0) its (1 + w) is applied as fma(x, w, x): one rounding fewer than
/// squaring 1 + em. Otherwise the same quotient as situ_any_alpha_f32. Why: the GEMM1
/// prefill epilogue is a quarter of GEMM1 at M=4096, and its exps are most of it
/// (PERFORMANCE.md, session 19). Accuracy against float64 is no worse (Kimi SiTU on
/// normal(0, 18) inputs: worst 6.95 ulp against 7.19, test_activation_math.cpp); for
/// g in (-106, -104], where e^(-|g|) alone underflows, it keeps the value the other form
/// rounds to 0.
MXMOE_HD float situ_alpha4_f32(float g, float u, float beta) {
  // |g|/2 clamped at 53: beyond, tanh(g/4) is +-1 to fp32 (m = -1 exactly: 2^n = 2^-76
  // is still normal) and the sigmoid's F^2 < e^-106 is taken as 0 (below e^-105 by s2),
  // as e^(-|g|) itself rounds to 0 (kExpUnderflow). A NaN g stays NaN (the compare is
  // false) and makes em, m and w NaN.
  const float h = mul32(fabsf(g), -0.5f);
  const ExpParts f = exp_parts(h < -53.0f ? -53.0f : h);
  const float s = pow2_f32(f.n);
  const float s2 = h < -52.5f ? 0.0f : s;                 // the second 2^n of F^2
  const float m = fma32(s, f.em, add32(s, -1.0f));        // e^(-|g|/2) - 1, as expm1_nonpos_f32
  const float w = fma32(f.em, f.em, mul32(2.0f, f.em));   // (1 + em)^2 - 1
  const Fraction t1{with_sign_of(m, g), add32(2.0f, m)};  // tanh_fraction(g, -0.5)
  const Fraction t3 = tanh_fraction(u, -2.0f / beta);
  const float front = mul32(mul32(mul32(4.0f, beta), t1.num), t3.num);
  // A subnormal only in the last product (s2); den in [1, 8].
  const float num = g >= 0.0f ? front : mul32(mul32(fma32(front, w, front), s), s2);
  const float den = mul32(mul32(t1.den, t3.den), add32(1.0f, mul32(mul32(add32(w, 1.0f), s), s2)));
  return div_den_1_to_8_f32(num, den);
}

/// SiTU(alpha, beta) for any alpha: the bits of situ_alpha4_f32 where alpha is 4, of
/// situ_any_alpha_f32 otherwise. Kernels that evaluate many activations of one expert
/// test alpha once outside their loops (gated_activation_t's kinds kActSituAlpha4 and
/// kActSituOtherAlpha) and get the same bits.
MXMOE_HD float situ_f32(float g, float u, float alpha, float beta) {
  return alpha == 4.0f ? situ_alpha4_f32(g, u, beta) : situ_any_alpha_f32(g, u, alpha, beta);
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

/// Two more kinds for gated_activation_t, past mxmoe::Activation's values: SiTU where the
/// caller has tested alpha == 4 (or != 4) once for all of an expert's activations.
inline constexpr int kActSituAlpha4 = 3;
inline constexpr int kActSituOtherAlpha = 4;

/// The activation of kind kKind (the integer value of mxmoe::Activation: 0 SiTU,
/// 1 SwiGLU_OAI, 2 SiLU_Gated; or one of the two SiTU kinds above), for epilogues that
/// dispatch once outside their loops.
template <int kKind>
MXMOE_HD float gated_activation_t(float g, float u, float alpha, float beta, float limit) {
  if constexpr (kKind == 0) return situ_f32(g, u, alpha, beta);
  else if constexpr (kKind == kActSituAlpha4) return situ_alpha4_f32(g, u, beta);
  else if constexpr (kKind == kActSituOtherAlpha) return situ_any_alpha_f32(g, u, alpha, beta);
  else if constexpr (kKind == 1) return swiglu_oai_f32(g, u, alpha, beta, limit);
  else return silu_gated_f32(g, u);
}

/// Calls f(std::integral_constant<int, K>{}) with K the form of activation `kind` (a
/// mxmoe::Activation value, or kActSituAlpha4 / kActSituOtherAlpha; any other value is
/// SiLU_Gated). SiTU's kind 0 takes its form from the expert's alpha, alpha_of(), which
/// is called only then. Used per value by gated_activation_f32 (the CPU engine and the
/// generic GEMM1 kernel); the kernels compiled per kind use with_form_of_kind. Not
/// written as with_activation_kind then with_form_of_kind: resolving kind 0 first inlines
/// each SiTU form once, where the composition inlines them twice (the generic kernels'
/// SASS was 35-50% larger that way, session 20).
template <class AlphaOf, class F>
MXMOE_HD void with_activation_form(int kind, AlphaOf&& alpha_of, F&& f) {
  if (kind == 0) kind = alpha_of() == 4.0f ? kActSituAlpha4 : kActSituOtherAlpha;
  switch (kind) {
    case kActSituAlpha4: f(std::integral_constant<int, kActSituAlpha4>{}); break;
    case kActSituOtherAlpha: f(std::integral_constant<int, kActSituOtherAlpha>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
}

/// Calls f(std::integral_constant<int, K>{}) with K = `kind` (a mxmoe::Activation value,
/// or kActSituAlpha4 / kActSituOtherAlpha; any other value is SiLU_Gated), unresolved:
/// SiTU's kind 0 stays 0. For launchers that pick a kernel per kind, so that each kernel
/// holds only the epilogue code it can run: the cold code of the other kinds pushed the
/// hot code of the 32-token prefill kernel apart in the instruction cache (M=16..32:
/// GEMM1 +2..5%, PERFORMANCE.md session 20).
template <class F>
MXMOE_HD void with_activation_kind(int kind, F&& f) {
  switch (kind) {
    case 0: f(std::integral_constant<int, 0>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    case kActSituAlpha4: f(std::integral_constant<int, kActSituAlpha4>{}); break;
    case kActSituOtherAlpha: f(std::integral_constant<int, kActSituOtherAlpha>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
}

/// In a kernel of kind kKind (with_activation_kind): calls f with the form, resolving
/// SiTU's kind 0 by the expert's alpha (alpha_of(), called only then).
template <int kKind, class AlphaOf, class F>
MXMOE_HD void with_form_of_kind(AlphaOf&& alpha_of, F&& f) {
  if constexpr (kKind == 0) {
    if (alpha_of() == 4.0f) f(std::integral_constant<int, kActSituAlpha4>{});
    else f(std::integral_constant<int, kActSituOtherAlpha>{});
  } else {
    f(std::integral_constant<int, kKind>{});
  }
}

/// The activation of kind `kind` (as with_activation_form) at one point.
MXMOE_HD float gated_activation_f32(int kind, float g, float u, float alpha, float beta,
                                    float limit) {
  float v = 0.0f;
  with_activation_form(kind, [&] { return alpha; }, [&](auto form) {
    v = gated_activation_t<decltype(form)::value>(g, u, alpha, beta, limit);
  });
  return v;
}

}  // namespace am
}  // namespace mxmoe
