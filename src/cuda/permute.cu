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
// Small problems use one block instead (permute_small_block below, heuristics.h).
// Nothing is read back by the host: the GEMMs read counts/offsets from device memory.
#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "quantize.cuh"

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


// Small problems (heuristics.h: up to 512 pairs, 64 local experts): one block of 512
// threads, one pair per thread. Same deterministic order: a pair's row is its expert's
// offset + the pairs of that expert in earlier warps + its rank among the lanes of its
// warp with the same expert (match.any). Fused with the activation quantization in the
// decode prologue: block 0 permutes, blocks 1.. quantize (one thread per MX block).
constexpr int kSmallThreads = 512;
constexpr int kSmallWarps = kSmallThreads / 32;
static_assert(kSmallThreads >= kSmallPermutePairs);

__device__ __forceinline__ void permute_small_block(const PermuteParams& p) {
  __shared__ int s_wc[kSmallWarps][kSmallPermuteExperts];
  __shared__ int s_off[kSmallPermuteExperts];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < kSmallWarps * kSmallPermuteExperts; i += kSmallThreads)
    (&s_wc[0][0])[i] = 0;
  __syncthreads();
  const int64_t total = p.tokens * p.top_k;
  const int64_t pair = tid;
  bool bad = false;
  int loc = -1;
  if (pair < total) loc = local_of(p, pair, &bad);
  const uint32_t same = __match_any_sync(0xffffffffu, loc);
  const int rank = __popc(same & ((1u << lane) - 1u));
  if (loc >= 0 && rank == 0) s_wc[warp][loc] = __popc(same);
  const int any_bad = __syncthreads_or(bad);
  if (tid < p.num_local) {
    int run = 0;
    for (int w = 0; w < kSmallWarps; ++w) {
      const int c = s_wc[w][tid];
      s_wc[w][tid] = run;
      run += c;
    }
    p.counts[tid] = run;
    s_off[tid] = run;
  }
  __syncthreads();
  if (tid == 0) {
    int off = 0;
    for (int e = 0; e < p.num_local; ++e) {
      const int c = s_off[e];
      s_off[e] = off;
      p.offsets[e] = off;
      off += c;
    }
    p.offsets[p.num_local] = off;
    *p.error = any_bad ? kErrorIdOutOfRange : 0u;
  }
  __syncthreads();
  if (pair < total) {
    if (loc >= 0) {
      const int row = s_off[loc] + s_wc[warp][loc] + rank;
      p.row_map[row] = static_cast<int32_t>(pair);
      p.pair_row[pair] = row;
    } else {
      p.pair_row[pair] = -1;
    }
  }
}

struct QuantizeArgs {
  const uint16_t* x = nullptr;
  int64_t blocks = 0;
  ScaleRule rule = ScaleRule::RoundUp;
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
};

__global__ void __launch_bounds__(kSmallThreads) prologue_kernel(const PermuteParams p,
                                                                 const QuantizeArgs q) {
  if (blockIdx.x == 0) {
    permute_small_block(p);
    return;
  }
  const int64_t b = static_cast<int64_t>(blockIdx.x - 1) * kSmallThreads + threadIdx.x;
  if (b < q.blocks) quantize_x_block(q.x, b, q.rule, q.codes, q.scales);
}

void launch_prologue_small(const PermuteParams& p, const QuantizeArgs& q, cudaStream_t stream) {
  const int64_t qblocks = (q.blocks + kSmallThreads - 1) / kSmallThreads;
  prologue_kernel<<<static_cast<unsigned>(1 + qblocks), kSmallThreads, 0, stream>>>(p, q);
  MXMOE_LAUNCH_CHECK("prologue_kernel");
}
}  // namespace

void launch_permute(const PermuteParams& p, cudaStream_t stream) {
  if (small_permute(p.tokens * p.top_k, p.num_local)) return launch_prologue_small(p, {}, stream);
  permute_count_kernel<<<p.num_local, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("permute_count_kernel");
  permute_scatter_kernel<<<p.num_local, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("permute_scatter_kernel");
}

void launch_quantize_permute(const PermuteParams& p, const uint16_t* x, int64_t hidden,
                             ScaleRule rule, uint8_t* codes, uint8_t* scales,
                             cudaStream_t stream) {
  if (!small_permute(p.tokens * p.top_k, p.num_local)) {
    launch_quantize_x(x, p.tokens, hidden, rule, codes, scales, stream);
    return launch_permute(p, stream);
  }
  QuantizeArgs q;
  q.x = x;
  q.blocks = p.tokens * hidden / kMxBlock;
  q.rule = rule;
  q.codes = codes;
  q.scales = scales;
  launch_prologue_small(p, q, stream);
}

}  // namespace mxmoe::cuda_detail
