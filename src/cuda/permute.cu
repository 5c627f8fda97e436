// permute.cu — group the (token, slot) pairs by local expert.
//
// Deterministic order: within an expert, rows follow the pair index token*k + slot.
// Two kernels, one block per local expert, each block scanning all M*k pairs (a few
// thousand ids, L2-resident; cheap next to the GEMMs):
//   count:   rows per expert (counts[e]); block 0 also marks every non-local pair
//            (pair_row = -1) and writes the error word (ids < -1 or >= E_global are
//            skipped and flagged, never used as an index);
//   scatter: offsets[e] = sum of the counts before e, then the rows of expert e in pair
//            order by a block-wide ballot prefix: row_map[row] = pair, pair_row[pair] = row.
// Nothing is read back by the host: the GEMMs read counts/offsets from device memory.
#include "common.cuh"
#include "engine.h"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int local_of(const PermuteParams& p, int64_t pair, bool* bad) {
  const int32_t id = p.ids[pair];
  if (id >= 0 && id < p.num_experts) return p.expert_map[id];
  if (id != -1) *bad = true;
  return -1;
}

__global__ void __launch_bounds__(kThreads) permute_count_kernel(const PermuteParams p) {
  const int e = blockIdx.x;
  const int64_t total = p.tokens * p.top_k;
  int count = 0;
  bool bad = false;
  for (int64_t base = 0; base < total; base += kThreads) {
    const int64_t pair = base + threadIdx.x;
    int loc = -1;
    if (pair < total) {
      loc = local_of(p, pair, &bad);
      if (e == 0 && loc < 0) p.pair_row[pair] = -1;
    }
    count += __syncthreads_count(loc == e);
  }
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    p.counts[e] = count;
    if (e == 0) *p.error = any_bad ? kErrorIdOutOfRange : 0u;
  }
}

__global__ void __launch_bounds__(kThreads) permute_scatter_kernel(const PermuteParams p) {
  __shared__ int s_warp[kThreads / 32];
  __shared__ int s_off;
  const int e = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    int off = 0;
    for (int i = 0; i < e; ++i) off += p.counts[i];
    s_off = off;
    p.offsets[e] = off;
    if (e == p.num_local - 1) p.offsets[p.num_local] = off + p.counts[e];
  }
  __syncthreads();
  int running = s_off;
  const int64_t total = p.tokens * p.top_k;
  bool bad = false;
  for (int64_t base = 0; base < total; base += kThreads) {
    const int64_t pair = base + threadIdx.x;
    const bool mine = pair < total && local_of(p, pair, &bad) == e;
    const uint32_t ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) s_warp[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, chunk = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      before += (w < warp) ? s_warp[w] : 0;
      chunk += s_warp[w];
    }
    if (mine) {
      const int row = running + before + __popc(ballot & ((1u << lane) - 1u));
      p.row_map[row] = static_cast<int32_t>(pair);
      p.pair_row[pair] = row;
    }
    running += chunk;
    __syncthreads();  // s_warp is rewritten by the next chunk
  }
}

}  // namespace

void launch_permute(const PermuteParams& p, cudaStream_t stream) {
  permute_count_kernel<<<p.num_local, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("permute_count_kernel");
  permute_scatter_kernel<<<p.num_local, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("permute_scatter_kernel");
}

}  // namespace mxmoe::cuda_detail
