// routing.cu — top-k routing on the GPU, bit-exact with route_cpu (src/cpu/routing.cpp):
// one warp per token, the token's scores in registers (lane l holds experts l, l+32, ...),
// k rounds of warp-wide arg-max (larger key first, ties to the lower expert id), the
// optional group limit, then weights in the same fp32 operation order as the CPU:
// sigmoid via am::sigmoid_f32, renormalize by a sum taken in slot order, scaling factor.
// A NaN score ranks as -inf and is still selectable, so a token always gets k ids.
// Logits come as fp32 or BF16 (widened exactly on load, as route_cpu_bf16 does).
#include <cfloat>
#include <climits>

#include "common.cuh"
#include "engine.h"
#include "mxmoe/activation_math.h"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kRouteWarps = 4;

__device__ __forceinline__ float rank_key(float x) { return fmt::is_nan(x) ? -INFINITY : x; }

// (key, id, value) arg-max over the warp: larger key, then lower id. Lanes with no
// candidate carry id INT_MAX.
__device__ __forceinline__ void warp_argmax(float& key, int& id, float& val) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    const float v2 = __shfl_xor_sync(0xffffffffu, val, o);
    if (k2 > key || (k2 == key && i2 < id)) {
      key = k2;
      id = i2;
      val = v2;
    }
  }
}

template <int EPL>
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(const RouteParams p) {
  __shared__ float s_keys[kRouteWarps][EPL * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tok = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (tok >= p.tokens) return;  // no block barriers: each warp is independent
  const int E = static_cast<int>(p.num_experts);
  const int k = static_cast<int>(p.params.top_k);
  const bool sigmoid = p.params.kind == RouterKind::Sigmoid;
  const int64_t row = tok * E;

  float key[EPL], val[EPL];  // val: unbiased score (sigmoid) or raw logit (softmax)
  uint32_t taken = 0;        // bit i: expert lane + 32i is not selectable
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      // Uniform per launch: fp32 logits, or BF16 widened exactly (route_cpu_bf16).
      const float x = p.logits ? p.logits[row + e] : fmt::bf16_to_float(p.logits_bf16[row + e]);
      if (sigmoid) {
        const float s = am::sigmoid_f32(x);
        val[i] = s;
        key[i] = rank_key(p.bias ? s + p.bias[e] : s);
      } else {
        val[i] = x;
        key[i] = rank_key(x);
      }
    } else {
      val[i] = 0.0f;
      key[i] = -INFINITY;
      taken |= 1u << i;
    }
  }

  if (sigmoid && p.params.n_group > 1) {
    const int ng = static_cast<int>(p.params.n_group);
    const int G = E / ng;
#pragma unroll
    for (int i = 0; i < EPL; ++i) s_keys[warp][lane + 32 * i] = key[i];
    __syncwarp();
    // Lane gi scores group gi exactly as the CPU does: running top-2 in expert order.
    float gkey = -INFINITY;
    int gid = INT_MAX;
    if (lane < ng) {
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int e = lane * G; e < (lane + 1) * G; ++e) {
        const float kv = s_keys[warp][e];
        if (kv > top1) {
          top2 = top1;
          top1 = kv;
        } else if (kv > top2) {
          top2 = kv;
        }
      }
      gkey = top1 + top2;
      gid = lane;
    }
    uint32_t groups = 0;
    for (int r = 0; r < p.params.topk_group; ++r) {
      float bk = gkey, bv = 0.0f;
      int bi = gid;
      warp_argmax(bk, bi, bv);
      groups |= 1u << bi;
      if (lane == bi) {
        gkey = -INFINITY;
        gid = INT_MAX;
      }
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((groups >> (e / G)) & 1u)) taken |= 1u << i;
    }
  }

  int my_id = -1;
  float my_val = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bk = -INFINITY, bv = 0.0f;
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      // Strictly greater: within a lane ids grow with i, so ties keep the lower id.
      if (!((taken >> i) & 1u) && (bi == INT_MAX || key[i] > bk)) {
        bk = key[i];
        bv = val[i];
        bi = lane + 32 * i;
      }
    }
    warp_argmax(bk, bi, bv);
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == j) {
      my_id = bi;
      my_val = bv;
    }
  }

  float w = my_val;
  if (sigmoid) {
    if (p.params.renormalize) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum = sum + __shfl_sync(0xffffffffu, my_val, j);
      if (sum != 0.0f) w = w / sum;
    }
  } else {
    const float m = __shfl_sync(0xffffffffu, my_val, 0);
    const float ex = am::exp_f32(my_val - m);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = sum + __shfl_sync(0xffffffffu, ex, j);
    w = ex / sum;
  }
  if (p.params.scaling_in_weights) w = w * p.params.routed_scaling_factor;
  if (lane < k) {
    p.ids[tok * k + lane] = my_id;
    p.weights[tok * k + lane] = w;
  }
}

template <int EPL>
void launch_t(const RouteParams& p, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.tokens + kRouteWarps - 1) / kRouteWarps);
  route_kernel<EPL><<<blocks, kRouteWarps * 32, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("route_kernel");
}

}  // namespace

void launch_route(const RouteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int64_t epl = (p.num_experts + 31) / 32;
  if (epl <= 4) return launch_t<4>(p, stream);
  if (epl <= 8) return launch_t<8>(p, stream);
  if (epl <= 16) return launch_t<16>(p, stream);
  return launch_t<32>(p, stream);  // the layer refuses E > kMaxRouteExperts up front
}

}  // namespace mxmoe::cuda_detail
