// kernels.cu — the EP layer's own kernels: plan (who goes where, in token order), pack
// (gather each peer's rows into its send block) and combine (sum the owners' partial
// outputs in rank order). Everything else is NCCL and the fused layer.
#include <cub/block/block_scan.cuh>

#include "../cuda/common.cuh"
#include "ep_internal.h"
#include "mxmoe/formats.h"

namespace mxmoe::ep_detail {

namespace {

constexpr int kPlanThreads = 512;

// Block d decides, for every token in order, whether any of its slots lives on rank d;
// an exclusive scan over the tokens gives its row in d's send block. The scan runs in
// token order chunk by chunk, so positions (and everything downstream) are
// deterministic and independent of scheduling.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const PlanParams p) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int base;
  const int d = blockIdx.x;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  bool bad = false;
  for (int64_t t0 = 0; t0 < p.tokens; t0 += kPlanThreads) {
    const int64_t t = t0 + threadIdx.x;
    int has = 0;
    if (t < p.tokens) {
      const int32_t* row = p.ids + t * p.top_k;
      for (int64_t j = 0; j < p.top_k; ++j) {
        const int32_t id = row[j];
        if (id < -1 || id >= p.num_experts) bad = true;
        has |= owner_of(id, p.num_experts, p.e_local) == d;
      }
    }
    int excl = 0, total = 0;
    Scan(tmp).ExclusiveSum(has, excl, total);
    if (t < p.tokens) {
      const int at = base + excl;
      p.pos[t * p.world + d] = has ? at : -1;
      if (has) p.src_tok[d * p.rows_cap + at] = static_cast<int32_t>(t);
    }
    __syncthreads();  // every thread has read `base` and the scan storage
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.counts[d] = base;
  // Only block 0 reports, so the flag is written by one block (the word is cleared
  // before the launch).
  if (d == 0 && bad) atomicOr(p.error, 1u);
}

constexpr int kPackThreads = 128;

__global__ void __launch_bounds__(kPackThreads) pack_kernel(const PackParams p) {
  const int64_t row = blockIdx.x;
  const int d = blockIdx.y;
  const int32_t n = p.counts[d];
  if (row >= n && !p.padded) return;  // Exact mode: only the counted rows move
  const int64_t dst = static_cast<int64_t>(d) * p.rows_cap + row;
  uint4* xo = reinterpret_cast<uint4*>(p.send_x + dst * p.row_bytes);
  const int64_t vecs = p.row_bytes / 16;  // row_bytes is a multiple of 32
  uint8_t* so = p.send_scale ? p.send_scale + dst * p.scale_bytes : nullptr;
  int32_t* io = p.send_ids + dst * p.top_k;
  float* wo = p.send_weights + dst * p.top_k;
  if (row < n) {
    const int64_t t = p.src_tok[dst];
    const uint4* xi = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.x) + t * p.row_bytes);
    for (int64_t i = threadIdx.x; i < vecs; i += kPackThreads) xo[i] = xi[i];
    if (so)
      for (int64_t i = threadIdx.x; i < p.scale_bytes; i += kPackThreads)
        so[i] = p.x_scale[t * p.scale_bytes + i];
    for (int64_t j = threadIdx.x; j < p.top_k; j += kPackThreads) {
      io[j] = p.ids[t * p.top_k + j];
      wo[j] = p.weights[t * p.top_k + j];
    }
  } else {
    // Padding row: no expert anywhere, so the receiving layer routes nothing from it and
    // writes a zero row; zero activations keep the exchanged bytes deterministic.
    for (int64_t i = threadIdx.x; i < vecs; i += kPackThreads) xo[i] = make_uint4(0, 0, 0, 0);
    if (so)
      for (int64_t i = threadIdx.x; i < p.scale_bytes; i += kPackThreads) so[i] = 0;
    for (int64_t j = threadIdx.x; j < p.top_k; j += kPackThreads) {
      io[j] = -1;
      wo[j] = 0.0f;
    }
  }
}

constexpr int kCombineThreads = 256;

template <bool kFp32Out>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kCombineThreads + threadIdx.x;
  if (c >= p.hidden) return;
  // A fixed chain of round-to-nearest adds in rank order (never contracted into an fma),
  // then the output scale once, as the single-GPU finalize applies it after its sum.
  float acc = 0.0f;
  for (int d = 0; d < p.world; ++d) {
    const int32_t r = p.pos[t * p.world + d];
    if (r >= 0) acc = __fadd_rn(acc, p.back[(d * p.rows_cap + r) * p.hidden + c]);
  }
  acc = __fmul_rn(acc, p.output_scale);
  if constexpr (kFp32Out) static_cast<float*>(p.out)[t * p.hidden + c] = acc;
  else static_cast<uint16_t*>(p.out)[t * p.hidden + c] = fmt::float_to_bf16(acc);
}

}  // namespace

void launch_plan(const PlanParams& p, cudaStream_t stream) {
  plan_kernel<<<static_cast<unsigned>(p.world), kPlanThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("ep plan_kernel");
}

void launch_pack(const PackParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows_cap), static_cast<unsigned>(p.world));
  pack_kernel<<<grid, kPackThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("ep pack_kernel");
}

void launch_combine(const CombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.hidden + kCombineThreads - 1) / kCombineThreads));
  if (p.out_fp32) combine_kernel<true><<<grid, kCombineThreads, 0, stream>>>(p);
  else combine_kernel<false><<<grid, kCombineThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("ep combine_kernel");
}

}  // namespace mxmoe::ep_detail
