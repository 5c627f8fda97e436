// permute.cu — group the (token, slot) pairs by local expert.
//
// Deterministic order: within an expert, rows follow the pair index token*k + slot.
// Two kernels, one block per (local expert, segment of the pairs) (heuristics.h
// permute_segments; ids and the expert map are L2-resident):
//   count:   rows per expert and segment (seg[s][e]); expert 0's blocks also mark every
//            non-local pair of their segment (pair_row = -1) and flag their segment's bad
//            ids (ids < -1 or >= E_global are skipped and flagged, never used as an index);
//   scatter: a block's first row is the rows of the experts before e plus those of expert
//            e in the segments before s; segment 0's blocks write counts[e] and offsets[e],
//            expert 0's the error word. Then the rows of expert e in the segment in pair
//            order: each thread takes a run of kRun consecutive pairs, and a block-wide
//            exclusive scan of the runs' match counts gives every match its row:
//            row_map[row] = pair, pair_row[pair] = row.
// Why runs: a form with one pair per thread and a barrier per 256 pairs waited out two
// dependent L2 loads (id, map entry) per step: 116 + 135 us at M=4096 (65536 pairs),
// 2.5% of the layer (PERFORMANCE.md, session 12). A thread's run issues its kRun loads at
// once, and a block of kThreads takes kThreads * kRun pairs per barrier step.
// Why segments: with one block per expert, each walked all pairs, 8 steps at M=4096
// (23 + 30 us, session 40); segments of 4096 pairs take one step each.
// Small problems use one block instead (permute_small_block), the others up to 64 local
// experts blocks of 1024 threads in one launch (permute_block_kernel; heuristics.h
// block_permute_plan); the two kernels take what is left: more than 64 local experts or
// 4096 global ones, or more pairs than the block form's grid fits at once.
// Nothing is read back by the host: the GEMMs read counts/offsets from device memory.
// Every form also clears the words a later kernel of the forward counts on (p.clear).
#include <cooperative_groups.h>

#include <atomic>

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

/// The local expert of global id `id` in `map` (the expert map in global memory or a
/// shared copy of it; -1: none); ids < -1 or >= num_experts set *bad.
template <class Map>
__device__ __forceinline__ int local_of(const Map* map, int64_t num_experts, int32_t id, bool* bad) {
  if (id >= 0 && id < num_experts) return map[id];
  if (id != -1) *bad = true;
  return -1;
}

/// Exclusive prefix over the lanes of the warp; *total gets the warp's sum.
__device__ __forceinline__ int warp_exclusive_sum(int v, int* total) {
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if ((threadIdx.x & 31) >= o) incl += u;
  }
  *total = __shfl_sync(0xffffffffu, incl, 31);
  return incl - v;
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
    const int loc = local_of(p.expert_map, p.num_experts, id[i], bad);
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

/// Block b of a launch over (local expert, segment): expert b % E_local, segment
/// b / E_local, pairs [lo, hi) of the segment.
struct Segment {
  int e, s;
  int64_t lo, hi;
};
__device__ __forceinline__ Segment segment_of_block(const PermuteParams& p) {
  const int64_t total = p.tokens * p.top_k, len = permute_segment_length(total);
  Segment g;
  g.e = static_cast<int>(blockIdx.x % p.num_local);
  g.s = static_cast<int>(blockIdx.x / p.num_local);
  g.lo = g.s * len;
  g.hi = min(total, g.lo + len);
  return g;
}

__global__ void __launch_bounds__(kThreads) permute_count_kernel(const PermuteParams p) {
  __shared__ int s_warp[kWarps];
  clear_words(p);
  const Segment g = segment_of_block(p);
  int count = 0;
  bool bad = false;
  for (int64_t first = g.lo + static_cast<int64_t>(threadIdx.x) * kRun; first < g.hi;
       first += int64_t{kThreads} * kRun)
    count += __popc(run_matches(p, first, g.hi, g.e, g.e == 0, &bad));
  // No barrier per step: the block's sum once at the end.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = count;
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += s_warp[w];
    p.seg[g.s * p.num_local + g.e] = sum;
    // Expert 0's blocks see every pair of their segment: its bad-id flag.
    if (g.e == 0) p.seg[permute_segments(p.tokens * p.top_k) * p.num_local + g.s] = any_bad;
  }
}

/// Sum over the block of f(i) for i in [0, n) (every thread gets it).
template <class F>
__device__ __forceinline__ int block_sum(int n, F&& f, int* s_warp) {
  int v = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) v += f(i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = v;
  __syncthreads();
  int sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += s_warp[w];
  __syncthreads();  // s_warp is reused
  return sum;
}

__global__ void __launch_bounds__(kThreads) permute_scatter_kernel(const PermuteParams p) {
  __shared__ int s_warp[kWarps];
  const Segment g = segment_of_block(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t total = p.tokens * p.top_k;
  const int segments = permute_segments(total), el = p.num_local;
  // This block's first row: the rows of the experts before e (every segment), then those
  // of expert e in the segments before s. seg[s][e] at s * el + e.
  int running = block_sum(segments * el, [&](int i) {
    const int s = i / el, e = i - s * el;
    return e < g.e || (e == g.e && s < g.s) ? p.seg[i] : 0;
  }, s_warp);
  if (g.s == 0) {
    const int count = block_sum(segments, [&](int s) { return p.seg[s * el + g.e]; }, s_warp);
    if (threadIdx.x == 0) {
      p.counts[g.e] = count;
      p.offsets[g.e] = running;
      if (g.e == el - 1) p.offsets[el] = running + count;
      if (g.e == 0) {
        bool any_bad = false;
        for (int s = 0; s < segments; ++s) any_bad |= p.seg[segments * el + s] != 0;
        *p.error = any_bad ? kErrorIdOutOfRange : 0u;
      }
    }
  }
  bool bad = false;  // flagged by the count kernel already
  for (int64_t base = g.lo; base < g.hi; base += int64_t{kThreads} * kRun) {
    const int64_t first = base + static_cast<int64_t>(threadIdx.x) * kRun;
    const uint32_t mask = run_matches(p, first, g.hi, g.e, false, &bad);
    // Exclusive scan of the runs' match counts over the block, in thread (= pair) order.
    int warp_total;
    int before = warp_exclusive_sum(__popc(mask), &warp_total), step = 0;
    if (lane == 0) s_warp[warp] = warp_total;
    __syncthreads();
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

// Problems past the small form's (heuristics.h block_permute_plan: up to 64 local
// experts and 4096 global ones): blocks of 1024 threads, block b the pairs
// [b * S, (b + 1) * S) of S = 1024 * steps, pair b * S + 1024 i + tid in its step i, with
// the expert map in shared memory (a byte per global id):
//   1. every pair's local expert, and per (step, warp) the count of each expert's pairs
//      (the lowest lane of a group of equal experts writes its size) into s_cnt;
//   2. warp w, for its experts e = w, w + 32: the exclusive scan of s_cnt[.][.][e] in
//      (step, warp) order, which is pair order, written back in place, and the block's
//      rows of e. Several blocks then publish theirs (seg[e][b]), wait for each other (a
//      cooperative launch: all resident) and read them back: an expert's rows over all
//      blocks and in the blocks before this one. Warp 0 scans the experts: counts and
//      offsets (block 0 writes them), every expert's first row of this block, and its
//      place in the block's staged rows;
//   3. every pair's row: that first row + its (step, warp) prefix + its rank among the
//      lanes of its warp with the same expert; pair_row stored, row_map's entry staged in
//      shared memory (s_rows) and stored in order, expert by expert, once all are there.
// The same rows as the other forms, in one launch where the two kernels take two. Why
// shared memory for the map and row_map: a warp's 32 scattered global accesses take the
// SM's L1 a wavefront each (a form that looked the map up and stored row_map in global
// memory took 8.8 us at 2048 pairs and 34 at 16384 on an H100, this one in one block 7.5
// and 23.4, the two kernels ~11 and ~12; PERFORMANCE.md session 54).
constexpr int kBlockThreads = kBlockPermuteThreads;
constexpr int kBlockWarps = kBlockThreads / 32;
constexpr int kBlockMaxSteps = kBlockPermuteMaxSteps;
static_assert(kBlockWarps == 32, "phase 2 scans one step's 32 warps per warp-wide scan");
static_assert(kSmallPermuteExperts <= 2 * 32, "phase 2's offsets: two experts per lane of a warp");
static_assert(kSmallPermuteExperts <= 127, "a local expert + 1 is a 7-bit key (lanes_with_same)");

/// The lanes of the warp whose key (below 2^bits, bits <= 7; the same bits in every lane)
/// equals this lane's: match.any by ballots, which issue at the full rate where match.any
/// may not.
__device__ __forceinline__ uint32_t lanes_with_same(int key, int bits) {
  uint32_t same = 0xffffffffu;
#pragma unroll
  for (int b = 0; b < 7; ++b) {
    if (b == bits) break;
    const bool bit = (key >> b) & 1;
    const uint32_t ones = __ballot_sync(0xffffffffu, bit);
    same &= bit ? ones : ~ones;
  }
  return same;
}

__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// kGrid: several blocks, co-resident (a cooperative launch), two per SM (32 registers) so
// that the grid fits twice the SMs. One block does none of the grid's work (its rows are
// all rows) and has no register bound past the launch's (with them it took 0.2-0.5 us
// more than the one-block kernel before it at 1-3 steps; PERFORMANCE.md session 55).
template <bool kGrid>
__global__ void __launch_bounds__(kBlockThreads, kGrid ? 2 : 1)
    permute_block_kernel(const PermuteParams p, const int steps) {
  extern __shared__ __align__(16) uint8_t block_smem[];
  __shared__ int s_blk[kSmallPermuteExperts];     // this block's rows per expert
  __shared__ int2 s_grid[kSmallPermuteExperts];   // several blocks: rows per expert in all, in those before this one
  __shared__ int2 s_place[kSmallPermuteExperts];  // the expert's first row of this block: in the layer, in s_rows
  __shared__ int s_block_rows;
  // The prefill path's x staging may start its blocks now (a programmatic dependent: it
  // waits for this grid's completion before it ends; layer.cu).
  pdl_allow_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, el = p.num_local;
  // 32-bit pair indices (the block form is issue-bound): its grid is co-resident, so at
  // most a few hundred blocks of 4096 pairs (heuristics.h block_permute_plan).
  const int total = static_cast<int>(p.tokens * p.top_k);
  const int lo = kGrid ? static_cast<int>(blockIdx.x) * steps * kBlockThreads : 0;
  const int E = static_cast<int>(p.num_experts);
  const int key_bits = 32 - __clz(el);  // keys loc + 1 in [0, el]: 5 bits for Kimi's 28
  uint16_t* const s_cnt = reinterpret_cast<uint16_t*>(block_smem);  // [steps][32][el]
  int32_t* const s_rows = reinterpret_cast<int32_t*>(s_cnt + steps * kBlockWarps * el);  // [steps * 1024]
  int8_t* const s_map = reinterpret_cast<int8_t*>(s_rows + steps * kBlockThreads);       // [E]
  auto cnt = [&](int i, int w, int e) -> uint16_t& { return s_cnt[(i * kBlockWarps + w) * el + e]; };
  clear_words(p);
  for (int i = tid; i < steps * kBlockWarps * el / 2; i += kBlockThreads)  // 32 el is even
    reinterpret_cast<uint32_t*>(s_cnt)[i] = 0u;
  for (int i = tid; i < E; i += kBlockThreads) s_map[i] = static_cast<int8_t>(p.expert_map[i]);
  __syncthreads();

  // f(i, pair, loc, same) for this thread's pair of each step i (< steps): its local
  // expert and the lanes of its warp with the same one; returns whether any of its ids was
  // bad. The ids of all steps are loaded first, together. (Steps are uniform over the
  // block: the ballots need every lane. `if`, not `break`: with the break ptxas kept 4
  // bytes on the stack.)
  auto for_each_pair = [&](auto&& f) {
    bool bad = false;
    int32_t id[kBlockMaxSteps];
    const int first = lo + tid;
#pragma unroll
    for (int i = 0; i < kBlockMaxSteps; ++i)
      id[i] = i < steps && first + i * kBlockThreads < total ? p.ids[first + i * kBlockThreads] : -1;
#pragma unroll
    for (int i = 0; i < kBlockMaxSteps; ++i) {
      if (i < steps) {
        const int loc = local_of(s_map, E, id[i], &bad);
        f(i, first + i * kBlockThreads, loc, lanes_with_same(loc + 1, key_bits));
      }
    }
    return bad;
  };

  // Phase 1.
  const bool bad = for_each_pair([&](int i, int pair, int loc, uint32_t same) {
    if (loc < 0 && pair < total) p.pair_row[pair] = -1;
    if (loc >= 0 && lane == __ffs(same) - 1) cnt(i, warp, loc) = static_cast<uint16_t>(__popc(same));
  });
  int any_bad = __syncthreads_or(bad);

  // Phase 2. Lane l holds entry (i, warp l) of step i (a 2-way bank conflict at most). The
  // steps' scans at once: only the running sum chains them.
  for (int e = warp; e < el; e += kBlockWarps) {
    int v[kBlockMaxSteps], before[kBlockMaxSteps], step_total[kBlockMaxSteps], run = 0;
#pragma unroll
    for (int i = 0; i < kBlockMaxSteps; ++i) v[i] = i < steps ? cnt(i, lane, e) : 0;
#pragma unroll
    for (int i = 0; i < kBlockMaxSteps; ++i) before[i] = warp_exclusive_sum(v[i], &step_total[i]);
#pragma unroll
    for (int i = 0; i < kBlockMaxSteps; ++i) {
      if (i < steps) cnt(i, lane, e) = static_cast<uint16_t>(run + before[i]);  // < 4096
      run += step_total[i];
    }
    if (lane == 0) s_blk[e] = run;
  }
  __syncthreads();
  if constexpr (kGrid) {
    const int blocks = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
    if (tid < el) p.seg[tid * blocks + b] = s_blk[tid];  // [expert][block]: read by expert below
    if (tid == 0) p.seg[blocks * el + b] = any_bad;
    cooperative_groups::this_grid().sync();  // orders the blocks' seg writes before the reads
    for (int e = warp; e < el; e += kBlockWarps) {
      int tot = 0, before = 0;
      for (int c = lane; c < blocks; c += 32) {
        const int v = __ldcg(p.seg + e * blocks + c);  // L2: other SMs wrote them; coalesced
        tot += v;
        before += c < b ? v : 0;
      }
      tot = warp_sum(tot);
      before = warp_sum(before);
      if (lane == 0) s_grid[e] = make_int2(tot, before);
    }
    if (b == 0) {  // the error word: any block's bad id
      int flag = 0;
      for (int c = tid; c < blocks; c += kBlockThreads) flag |= __ldcg(p.seg + blocks * el + c);
      any_bad = __syncthreads_or(flag);
    }
    __syncthreads();
  }
  if (warp == 0) {  // experts 2 lane and 2 lane + 1
    constexpr bool one = !kGrid;  // (one block: its rows are all rows)
    const int e0 = 2 * lane, e1 = 2 * lane + 1;
    const int k0 = e0 < el ? s_blk[e0] : 0, k1 = e1 < el ? s_blk[e1] : 0;
    const int2 g0 = one || e0 >= el ? make_int2(k0, 0) : s_grid[e0];
    const int2 g1 = one || e1 >= el ? make_int2(k1, 0) : s_grid[e1];
    int rows, block_rows = 0;
    const int off = warp_exclusive_sum(g0.x + g1.x, &rows);
    const int loc = one ? off : warp_exclusive_sum(k0 + k1, &block_rows);
    const bool writes = !kGrid || blockIdx.x == 0;
    if (e0 < el) {
      if (writes) p.counts[e0] = g0.x, p.offsets[e0] = off;
      s_place[e0] = make_int2(off + g0.y, loc);
    }
    if (e1 < el) {
      if (writes) p.counts[e1] = g1.x, p.offsets[e1] = off + g0.x;
      s_place[e1] = make_int2(off + g0.x + g1.y, loc + k0);
    }
    if (lane == 0) s_block_rows = one ? rows : block_rows;
    if (writes && lane == 0) {
      p.offsets[el] = rows;
      *p.error = any_bad ? kErrorIdOutOfRange : 0u;
    }
  }
  __syncthreads();

  // Phase 3 (the ids again: L2 hits now, coalesced).
  const uint32_t lanes_below = (1u << lane) - 1u;
  for_each_pair([&](int i, int pair, int loc, uint32_t same) {  // (bad ids: flagged above)
    if (loc < 0) return;
    const int rank = cnt(i, warp, loc) + __popc(same & lanes_below);  // among the block's rows of loc
    const int2 at = s_place[loc];
    s_rows[at.y + rank] = pair;
    p.pair_row[pair] = at.x + rank;
  });
  __syncthreads();
  if constexpr (!kGrid) {  // one block's rows are all rows: row_map in one sweep
    for (int r = tid; r < s_block_rows; r += kBlockThreads) p.row_map[r] = s_rows[r];
  } else {  // this block's rows of each expert: a run of row_map each
    for (int e = warp; e < el; e += kBlockWarps) {
      const int2 at = s_place[e];
      for (int j = lane; j < s_blk[e]; j += 32) p.row_map[at.x + j] = s_rows[at.y + j];
    }
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
  if (pair < total) loc = local_of(p.expert_map, p.num_experts, p.ids[pair], &bad);
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
  // waits for this grid's completion before reading anything of it), or the prefill
  // path's x staging (which waits for it before it ends).
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

int64_t block_permute_coresident() {
  static std::atomic<int> cache[64] = {};
  return per_device_cached(cache, [](int dev) {
    int per_sm = 0, cooperative = 0;
    const int64_t smem = block_permute_smem_bytes(kBlockMaxSteps, kSmallPermuteExperts, kBlockPermuteMaxExperts);
    MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, permute_block_kernel<true>, kBlockThreads,
                                                                   static_cast<size_t>(smem)));
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev));
    return cooperative != 0 ? per_sm * current_sm_count() : 0;  // 0: no grid, the two kernels
  });
}

void launch_permute(const PermuteParams& p, cudaStream_t stream) {
  const int64_t pairs = p.tokens * p.top_k;
  if (small_permute(pairs, p.num_local)) return launch_prologue_small(p, {}, stream);
  // Test and measurement knobs, read at each launch (tests and the bench set them per
  // run): the most steps of one block (0: several blocks from two steps on), the fewest
  // steps per block of several, the most blocks of a grid.
  const BlockPermutePlan plan = block_permute_plan(
      pairs, p.num_local, p.num_experts, block_permute_coresident(),
      env_knob("MXMOE_PERMUTE_ONE_BLOCK_STEPS", 0, kBlockMaxSteps, kBlockPermuteOneBlockSteps),
      env_knob("MXMOE_PERMUTE_GRID_STEPS", 1, kBlockMaxSteps, 1),
      env_knob("MXMOE_PERMUTE_MAX_BLOCKS", 2, 4096, static_cast<int>(kBlockPermuteMaxBlocks)));
  if (plan.blocks > 1) {
    MXMOE_CHECK_ARG(p.seg != nullptr, "PermuteParams.seg", "null: the block permutation's grid needs ",
                    permute_seg_words(pairs, p.num_local), " words of scratch");
  }
  if (plan.blocks > 0) {
    // Under the 48 KB default (heuristics.h's static_assert).
    const size_t smem = static_cast<size_t>(block_permute_smem_bytes(plan.steps, p.num_local, p.num_experts));
    if (plan.blocks == 1) {
      permute_block_kernel<false><<<1, kBlockThreads, smem, stream>>>(p, plan.steps);
      MXMOE_LAUNCH_CHECK("permute_block_kernel");
    } else {
      launch_cooperative(permute_block_kernel<true>, dim3(static_cast<unsigned>(plan.blocks)), dim3(kBlockThreads),
                         smem, stream, p, plan.steps);
    }
    return;
  }
  MXMOE_CHECK_ARG(p.seg != nullptr, "PermuteParams.seg", "null: the segmented permutation needs ",
                  permute_seg_words(pairs, p.num_local), " words of scratch");
  const unsigned blocks = static_cast<unsigned>(p.num_local * permute_segments(pairs));
  permute_count_kernel<<<blocks, kThreads, 0, stream>>>(p);
  MXMOE_LAUNCH_CHECK("permute_count_kernel");
  permute_scatter_kernel<<<blocks, kThreads, 0, stream>>>(p);
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
