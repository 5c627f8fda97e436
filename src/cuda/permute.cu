// permute.cu — group the (token, slot) pairs by local expert.
//
// Deterministic order: within an expert, rows follow the pair index token*k + slot.
// Two kernels, one block per local expert, each block reading all M*k pairs (ids and the
// expert map are L2-resident):
//   count:   rows per expert (counts[e]); block 0 also marks every non-local pair
//            (pair_row = -1) and writes the error word (ids < -1 or >= E_global are
//            skipped and flagged, never used as an index);
//   scatter: offsets[e] = sum of the counts before e, then the rows of expert e in pair
//            order: each thread takes a run of kRun consecutive pairs, and a block-wide
//            exclusive scan of the runs' match counts gives every match its row:
//            row_map[row] = pair, pair_row[pair] = row.
// Why runs: a form with one pair per thread and a barrier per 256 pairs waited out two
// dependent L2 loads (id, map entry) per step: 116 + 135 us at M=4096 (65536 pairs),
// 2.5% of the layer (PERFORMANCE.md, session 12). A thread's run issues its kRun loads at
// once, and a block of kThreads takes kThreads * kRun pairs per barrier step.
// Small problems use one block instead (permute_small_block below, heuristics.h).
// Nothing is read back by the host: the GEMMs read counts/offsets from device memory.
// Either form also clears the words a later kernel of the forward counts on (p.clear).
#include "common.cuh"
#include "engine.h"
#include "heuristics.h"
#include "ptx.cuh"
#include "quantize.cuh"

namespace mxmoe::cuda_detail {

namespace {

constexpr int kThreads = 512;
constexpr int kRun = 16;  // consecutive pairs per thread and step (a 32-bit match mask)
constexpr int kWarps = kThreads / 32;

/// The local expert of global id `id` (-1: none); ids < -1 or >= E_global set *bad.
__device__ __forceinline__ int local_of_id(const PermuteParams& p, int32_t id, bool* bad) {
  if (id >= 0 && id < p.num_experts) return p.expert_map[id];
  if (id != -1) *bad = true;
  return -1;
}

/// Bit i set where pair first + i (< total) belongs to local expert e. The kRun id loads
/// are independent, so they are in flight together, then the kRun map lookups. Pairs
/// of no local expert in the run get pair_row = -1 when `mark` (block 0 of the count).
__device__ __forceinline__ uint32_t run_matches(const PermuteParams& p, int64_t first, int64_t total,
                                                int e, bool mark, bool* bad) {
  int32_t id[kRun];
#pragma unroll
  for (int i = 0; i < kRun; ++i) id[i] = first + i < total ? p.ids[first + i] : -1;
  uint32_t mask = 0;
#pragma unroll
  for (int i = 0; i < kRun; ++i) {
    const int loc = local_of_id(p, id[i], bad);
    if (mark && loc < 0 && first + i < total) p.pair_row[first + i] = -1;
    mask |= static_cast<uint32_t>(loc == e) << i;
  }
  return mask;
}

/// p.clear's words to zero, spread over the launch's threads.
__device__ __forceinline__ void clear_words(const PermuteParams& p) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.clear_words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.clear[i] = 0u;
}

__global__ void __launch_bounds__(kThreads) permute_count_kernel(const PermuteParams p) {
  __shared__ int s_warp[kWarps];
  clear_words(p);
  const int e = blockIdx.x;
  const int64_t total = p.tokens * p.top_k;
  int count = 0;
  bool bad = false;
  for (int64_t first = static_cast<int64_t>(threadIdx.x) * kRun; first < total;
       first += int64_t{kThreads} * kRun)
    count += __popc(run_matches(p, first, total, e, e == 0, &bad));
  // No barrier per step: the block's sum once at the end.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = count;
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += s_warp[w];
    p.counts[e] = sum;
    if (e == 0) *p.error = any_bad ? kErrorIdOutOfRange : 0u;
  }
}

__global__ void __launch_bounds__(kThreads) permute_scatter_kernel(const PermuteParams p) {
  __shared__ int s_warp[kWarps];
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
  bool bad = false;  // flagged by the count kernel already
  for (int64_t base = 0; base < total; base += int64_t{kThreads} * kRun) {
    const int64_t first = base + static_cast<int64_t>(threadIdx.x) * kRun;
    const uint32_t mask = run_matches(p, first, total, e, false, &bad);
    // Exclusive scan of the runs' match counts over the block, in thread (= pair) order.
    const int n = __popc(mask);
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    int before = incl - n, step = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      before += (w < warp) ? s_warp[w] : 0;
      step += s_warp[w];
    }
    int row = running + before;
    for (uint32_t m = mask; m != 0; m &= m - 1) {
      const int64_t pair = first + __ffs(m) - 1;
      p.row_map[row] = static_cast<int32_t>(pair);
      p.pair_row[pair] = row;
      ++row;
    }
    running += step;
    __syncthreads();  // s_warp is rewritten by the next step
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
  if (pair < total) loc = local_of_id(p, p.ids[pair], &bad);
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
  // GEMM1 may start its blocks now (a programmatic dependent on the decode path: it
  // waits for this grid's completion before reading anything of it).
  pdl_allow_dependents();
  clear_words(p);
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
