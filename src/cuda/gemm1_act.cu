// gemm1_act.cu — GEMM1 (gathered x rows x W13^T, MXFP4 weights) with the gated
// activation and the intermediate quantization fused into the epilogue.
//
// Work split: block = 4 warps, warp = one 64-row group of the kernel-layout W13 (32 gate
// rows + the 32 up rows of the same intermediate columns, layout.h), so after the
// mainloop a lane holds gate and up of the same (column, token) in the same register
// slot of m16 tiles {0,1} and {2,3}. Grid = (row groups / 4, local experts, token-tile
// splits); the per-expert row counts are read from device memory (no host sync): a
// block whose expert has no rows exits at once, and token tiles are strided over z.
//
//   kernel rows of one warp:   mt0: gate 0..15  mt1: gate 16..31
//                              mt2: up   0..15  mt3: up   16..31
//   lane (g, t) holds rows g, g+8 of each mt and tokens 2t, 2t+1 of each 8-token tile:
//   intermediate columns 16i + 8h + g (i in mt{0,1}, h in {0,1}) for 2 tokens.
// The MXFP8 block of 32 columns of one token is spread over the 8 lanes with the same t:
// amax by 3 xor-shuffles, then the formats.h scale rule and E4M3 rounding.
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "engine.h"
#include "fp8_regroup.cuh"
#include "heuristics.h"
#include "mx_mma.cuh"
#include "mxmoe/activation_math.h"
#include "wgmma_fp8.cuh"
#include "wgmma_mx.cuh"

namespace mxmoe::cuda_detail {

namespace {

/// Activation kind of a kernel that reads p.activation at run time (the generic
/// fallback); the others are compiled per kind (am::with_activation_kind).
constexpr int kActRuntime = -1;

/// GEMM1's epilogue for accumulator column c of token tile nt (routed row `grow`, stored
/// when `valid`): the range factor `back`, the bias, the gated activation of kind kAct
/// (rows i = gate, i + 2 = up of this warp's group of 32 intermediate columns), then the
/// intermediate in BF16 or MXFP8 (one scale per 32 columns: the amax over the 8 lanes
/// holding the row, ignoring NaN and Inf as fmt::block_amax does). Every lane of the warp calls
/// it (shuffles).
template <int NT, bool kFp8Inter, int kAct>
__device__ __forceinline__ void store_activated(const Gemm1Params& p, const float (&acc)[4][NT][4],
                                                int nt, int c, float back, int64_t grow,
                                                bool valid, int rg, const float* bias,
                                                float alpha, float beta, float limit) {
  const int g = (threadIdx.x & 31) >> 2;
  const int64_t N = p.intermediate;
  const int kbN = static_cast<int>(N / kMxBlock);
  float v[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = 16 * i + 8 * h + g;  // column within the group of 32
      float gate = acc[i][nt][2 * h + c] * back;
      float up = acc[i + 2][nt][2 * h + c] * back;
      if (bias) {
        gate = gate + bias[lr];
        up = up + bias[32 + lr];
      }
      // Per value. Kind 0 (SiTU, alphas of both forms among the local experts) tests
      // alpha per value too: dispatching once around the epilogue instead (branch commit
      // ab406c2) made gemm1_fast<1, 4> spill 34 bytes instead of 12.
      if constexpr (kAct == kActRuntime)
        v[i][h] = am::gated_activation_f32(p.activation, gate, up, alpha, beta, limit);
      else
        v[i][h] = am::gated_activation_t<kAct>(gate, up, alpha, beta, limit);
    }
  if constexpr (kFp8Inter) {
    // fmt::amax_term: the finite values' amax, as fmt::block_amax (an Inf saturates).
    float amax = fmaxf(fmaxf(fmt::amax_term(v[0][0]), fmt::amax_term(v[0][1])),
                       fmaxf(fmt::amax_term(v[1][0]), fmt::amax_term(v[1][1])));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
    const uint8_t sb = fmt::mx_scale_byte(amax, fmt::kE4m3Max, fmt::kE4m3Emax, p.rule);
    const float inv = fmt::mx_inv_scale(sb);
    if (valid) {
      uint8_t* codes = static_cast<uint8_t*>(p.inter) + grow * N + 32 * rg;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) codes[16 * i + 8 * h + g] = fmt::float_to_e4m3(v[i][h] * inv);
      if (g == 0) p.inter_scale[grow * kbN + rg] = sb;
    }
  } else if (valid) {
    uint16_t* o = static_cast<uint16_t*>(p.inter) + grow * N + 32 * rg;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) o[16 * i + 8 * h + g] = fmt::float_to_bf16(v[i][h]);
  }
}

template <int NT, bool kFp8X, bool kFp8Inter>
__global__ void __launch_bounds__(kWarps * 32) gemm1_act_kernel(const Gemm1Params p) {
  constexpr int BT = 8 * NT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int e = blockIdx.y;
  const int rg = blockIdx.x * kWarps + warp;
  if (rg >= p.w13.rg) return;  // no block-level barriers below
  // Fallback of the prefill path: runs only when staging flagged an inexact x value, or
  // the prefill kernel an intermediate value that GEMM2's staged rows cannot hold. It
  // writes the intermediate (which the prefill kernel does not), so GEMM2 takes its
  // generic path as well.
  if (p.inexact != nullptr) {
    // Launched as the prefill kernel's programmatic dependent (fallback_programmatic), its
    // blocks may be here before that kernel ends: wait for it before reading the word.
    pdl_wait_for_predecessor();
    if ((*p.inexact & (kInexactX | kInexactInter)) == 0) return;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) atomicOr(p.inexact, kInexactInter);
  }
  const int count = p.counts[e];
  if (count == 0) return;
  const int off = p.offsets[e];
  const int64_t K = p.hidden, N = p.intermediate;
  const uint4* wp = p.w13.packed + (static_cast<size_t>(e) * p.w13.rg + rg) * p.w13.kc * 4 * 32;
  const uint32_t* ws = p.w13.scale + (static_cast<size_t>(e) * p.w13.rg + rg) * p.w13.kc * 4 * 8;
  const float alpha = p.alpha[e], beta = p.beta[e], limit = p.limit[e];
  const float* bias = p.bias ? p.bias + static_cast<size_t>(e) * 2 * N + 64 * rg : nullptr;

  for (int tile = blockIdx.z; tile * BT < count; tile += gridDim.z) {
    const void* brow[NT];
    const uint8_t* bsc[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = tile * BT + nt * 8 + g;
      brow[nt] = nullptr;
      bsc[nt] = nullptr;
      if (r < count) {
        const int64_t tok = p.row_map[off + r] / p.top_k;
        if constexpr (kFp8X) {
          brow[nt] = static_cast<const uint8_t*>(p.x) + tok * K;
          bsc[nt] = p.x_scale + tok * (K / kMxBlock);
        } else {
          brow[nt] = static_cast<const uint16_t*>(p.x) + tok * K;
        }
      }
    }
    float acc[4][NT][4], back[NT][2];
    warp_tile_mx<NT, kFp8X>(acc, back, wp, ws, p.w13.kc, static_cast<int>(K / kMxBlock), brow, bsc);

#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = tile * BT + nt * 8 + 2 * t + c;
        store_activated<NT, kFp8Inter, kActRuntime>(p, acc, nt, c, back[nt][c], off + r, r < count,
                                                    rg, bias, alpha, beta, limit);
      }
  }
}


// Decode path (heuristics.h): same work split and epilogue, E4M3 x through the FP16
// mainloop with the weights streamed D chunks deep. Each block stages its token tile's
// row pointers and x scales in shared memory once; all 4 warps share them.
//
/// Thread i < BT of a decode block stages token row i of the tile whose first routed row
/// is `first_row` (rows past `valid` null): its x row and MX scales for the mainloop and
/// stage_b_scales. The index stays unsigned: as a signed int one IMAD changed in every
/// kernel (session 21, cuobjdump).
__device__ __forceinline__ void stage_token_row(const Gemm1Params& p, int first_row, int valid, int kbK,
                                                int* s_mx, const uint8_t** s_row, const uint8_t** s_rsc) {
  const unsigned i = threadIdx.x;
  s_mx[i] = 0;
  const uint8_t* row = nullptr;
  const uint8_t* rsc = nullptr;
  if (static_cast<int>(i) < valid) {
    const int64_t tok = p.row_map[first_row + i] / p.top_k;
    row = static_cast<const uint8_t*>(p.x) + tok * p.hidden;
    rsc = p.x_scale + tok * kbK;
  }
  s_row[i] = row;
  s_rsc[i] = rsc;
}

// One block's work with token tile 8 * NT. The shared staging is the kernel's, sized for
// its own (larger or equal) tile; s_sx is used as [K/32][8 * NT].
template <int NT, int D, bool kFp8Inter, int kAct>
__device__ __forceinline__ void gemm1_fast_block(const Gemm1Params& p, int count, float* s_sx,
                                                 float* s_back, int* s_mx, const uint8_t** s_row,
                                                 const uint8_t** s_rsc, const FastRing<D>& ring) {
  constexpr int BT = 8 * NT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int e = blockIdx.y;
  const int rg = blockIdx.x * kWarps + warp;
  const bool active = rg < p.w13.rg;  // inactive warps still take part in the barriers
  const int off = p.offsets[e];
  const int64_t K = p.hidden, N = p.intermediate;
  const int kbK = static_cast<int>(K / kMxBlock);
  const int rgc = active ? rg : 0;
  const uint4* wp = p.w13.packed + (static_cast<size_t>(e) * p.w13.rg + rgc) * p.w13.kc * 4 * 32;
  const uint4* ws4 = reinterpret_cast<const uint4*>(p.w13.scale) +
                     (static_cast<size_t>(e) * p.w13.rg + rgc) * p.w13.kc * 8;
  // Weight scales without bytes 0 / 0xFF (flagged at load) take the two-op conversion.
  const bool special =
      p.w13.special == nullptr || p.w13.special[static_cast<size_t>(e) * p.w13.rg + rgc] != 0;

  for (int tile = blockIdx.z; tile * BT < count; tile += gridDim.z) {
    const int valid = min(BT, count - tile * BT);
    // The first weight loads go out before the token-scale staging (they do not depend
    // on it), so the HBM round trip overlaps the staging's L2 round trips.
    if (active) fast_prefetch<D>(ring, wp, ws4, 0, p.w13.kc);
    if (threadIdx.x < BT) stage_token_row(p, off + tile * BT, valid, kbK, s_mx, s_row, s_rsc);
    __syncthreads();
    stage_b_scales<BT>(s_rsc, valid, kbK, s_sx, s_back, s_mx);
    __syncthreads();
    if (active) {
      float acc[4][NT][4];
      zero_acc(acc);
      warp_mma_decode<NT, D, false>(special, false, valid, acc, ring, wp, ws4, 0, p.w13.kc, kbK,
                             [&](int i) { return s_row[i]; }, s_sx);
      // Epilogue operands, loaded only now so they hold no registers over the mainloop.
      const float alpha = p.alpha[e], beta = p.beta[e], limit = p.limit[e];
      const float* bias = p.bias ? p.bias + static_cast<size_t>(e) * 2 * N + 64 * rgc : nullptr;

#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = tile * BT + nt * 8 + 2 * t + c;
          store_activated<NT, kFp8Inter, kAct>(p, acc, nt, c, s_back[nt * 8 + 2 * t + c], off + r,
                                               r < count, rg, bias, alpha, beta, limit);
        }
      if (p.expert_ready != nullptr) expert_ready_signal(p.expert_ready + e, (valid + 7) / 8);
    }
    __syncthreads();  // the next tile rewrites the shared staging
  }
}

// The decode kernel of one count class (heuristics.h plan_fast). The 16-row kernel also
// serves the experts of at most 8 rows, with 8-row tiles, so that both classes stream
// their weights in one grid. One kernel per activation kind (am::with_activation_kind).
template <int NT, int D, bool kFp8Inter, int kAct>
__global__ void __launch_bounds__(kWarps * 32, fast_min_blocks(NT, D)) gemm1_fast_kernel(const Gemm1Params p) {
  constexpr int BT = 8 * NT;
  extern __shared__ __align__(128) float s_sx[];  // [K/32][BT], then the warps' rings; the region starts on 128 bytes (fast_ring_of_warp)
  __shared__ float s_back[BT];
  __shared__ int s_mx[BT];
  __shared__ const uint8_t* s_row[BT];
  __shared__ const uint8_t* s_rsc[BT];
  if (p.programmatic) {
    // Beside the prologue (Gemm1Params::programmatic): the first chunks of this block's
    // weights toward L2 if a routing id names its expert, then the wait. The ids are
    // complete: the routing kernel, if any, finished before the prologue began.
    if (NT == 1 && p.tokens * p.top_k <= kG1HintMaxPairs) {
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      const int64_t pairs = p.tokens * p.top_k;
      const int32_t id = lane < pairs ? p.ids[lane] : -1;
      const int local = id >= 0 && id < p.num_experts ? p.expert_map[id] : -1;
      const int rg = blockIdx.x * kWarps + warp;
      if (__any_sync(0xffffffffu, local == static_cast<int>(blockIdx.y)) && rg < p.w13.rg) {
        const size_t g = static_cast<size_t>(blockIdx.y) * p.w13.rg + rg;
        const char* wp = reinterpret_cast<const char*>(p.w13.packed + g * p.w13.kc * 4 * 32);
        const char* ws = reinterpret_cast<const char*>(p.w13.scale) + g * p.w13.kc * 128;
        const int chunks = min(D - 1, p.w13.kc);
        for (int l = lane; l < chunks * 16; l += 32) prefetch_l2(wp + 128 * l);
        if (lane < chunks) prefetch_l2(ws + 128 * lane);
      }
    }
    pdl_wait_for_predecessor();
  }
  // GEMM2's decode blocks (programmatic dependents at one token: heuristics.h
  // use_programmatic_launch) may start as soon as every block of this grid is past the
  // wait above: the counts they read before their own wait are then complete. They take
  // the slots of this grid's first blocks to finish and stream their weights while its
  // last ones run (M=1: GEMM1's blocks end between 58 and 69 us, session 28's timeline).
  pdl_allow_dependents();
  const int count = p.counts[blockIdx.y];
  // Not this launch's count class (or no rows): block-uniform.
  if (count <= p.fast.count_lo || count > p.fast.count_hi) return;
  const FastRing<D> ring = fast_ring_of_warp<D>(s_sx + (p.hidden / kMxBlock) * BT);
  if constexpr (NT == 2) {
    if (count <= 8) {
      gemm1_fast_block<1, D, kFp8Inter, kAct>(p, count, s_sx, s_back, s_mx, s_row, s_rsc, ring);
      return;
    }
  }
  gemm1_fast_block<NT, D, kFp8Inter, kAct>(p, count, s_sx, s_back, s_mx, s_row, s_rsc, ring);
}

// Balanced decode (heuristics.h balanced_block, 2..32 tokens): one wave of blocks over
// the units (8-row token tiles of the experts holding rows), each warp streaming a
// contiguous range of its unit's row-group chunks.

/// Units before expert `e0 + lane`'s (exclusive), its own and its rows, for the experts
/// e0 .. e0 + 31 (warp-wide; experts past num_local hold none).
__device__ __forceinline__ int3 unit_scan(const int32_t* counts, int num_local, int e0) {
  const int lane = threadIdx.x & 31;
  const int e = e0 + lane;
  const int rows = e < num_local ? max(counts[e], 0) : 0;
  const int own = (rows + 7) / 8;
  int incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  return make_int3(incl - own, own, rows);
}
/// Units of this forward (warp-wide).
__device__ __forceinline__ int count_units(const int32_t* counts, int num_local) {
  int units = 0;
  for (int e0 = 0; e0 < num_local; e0 += 32) {
    const int3 s = unit_scan(counts, num_local, e0);
    units += __shfl_sync(0xffffffffu, s.x + s.y, 31);
  }
  return units;
}
/// Expert, token tile and the expert's rows of unit u < count_units (warp-wide).
__device__ __forceinline__ int3 unit_at(const int32_t* counts, int num_local, int u) {
  int base = 0;
  for (int e0 = 0; e0 < num_local; e0 += 32) {
    const int3 s = unit_scan(counts, num_local, e0);
    const unsigned hit = __ballot_sync(0xffffffffu, base + s.x <= u && u < base + s.x + s.y);
    if (hit != 0u) {
      const int l = __ffs(hit) - 1;
      return make_int3(e0 + l, u - base - __shfl_sync(0xffffffffu, s.x, l), __shfl_sync(0xffffffffu, s.z, l));
    }
    base += __shfl_sync(0xffffffffu, s.x + s.y, 31);
  }
  return make_int3(0, 0, 0);  // not reached for u < count_units
}

/// End of the piece of a row group that starts at chunk k0 with `left` chunks of the
/// warp's range to go.
__device__ __forceinline__ int piece_end(int k0, int kc, int left) {
  return left < kc - k0 ? k0 + left : kc;
}

/// A row group cut between two warps (part 0: its first K chunks, part 1: the rest),
/// after the mainloop of this warp's part: stores its sums in the slot (lane-contiguous),
/// counts itself, and the part that arrives second adds both in part order (so the sum
/// does not depend on which part finishes last), resets the counter for the next launch
/// and returns true: it runs the epilogue. The first returns false.
__device__ __forceinline__ bool balanced_fixup(float (&acc)[4][1][4], float* slot, uint32_t* count,
                                               int part) {
  const int lane = threadIdx.x & 31;
  float* mine = slot + part * 512 + lane;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j) __stcg(mine + (4 * mt + j) * 32, acc[mt][0][j]);
  __syncwarp();  // the lanes' sums are ordered before lane 0's release
  uint32_t arrived = 0;
  if (lane == 0) arrived = atomic_add_acq_rel_gpu(count, 1u);
  __syncwarp();  // lane 0's acquire (the other part's sums) ordered before every lane's loads
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived == 0) return false;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      acc[mt][0][j] = __ldcg(slot + (4 * mt + j) * 32 + lane) + __ldcg(slot + 512 + (4 * mt + j) * 32 + lane);
  if (lane == 0) *count = 0;
  return true;
}

/// stage_b_scales out of line, for the balanced kernel (96 registers at 5 blocks per SM).
/// Inlined, its loads and the mainloop's lane constants (hoisted above it) outgrew the
/// registers: ptxas spilled 56-68 bytes. Out of line, 4 bytes remain only in the kind-4
/// kernels (stored once per unit, read outside the chunk loops). Called once per unit.
/// (GEMM2's 8-row kernel spilled more with it out of line: 12 bytes against 4.)
template <int BT>
__device__ __noinline__ void stage_b_scales_out_of_line(const uint8_t* const* rows_scale, int valid,
                                                        int kb_count, float* s_sx, float* s_back,
                                                        int* s_mx) {
  stage_b_scales<BT>(rows_scale, valid, kb_count, s_sx, s_back, s_mx);
}

// The kernel keeps its loop state in shared memory and rereads it (volatile) after each
// mainloop: the mainloop takes the 96 registers of 5 blocks per SM, and every value held
// across it spilled (session 21: 136 bytes, a load per chunk in the mainloop).
struct BalancedState {
  int units, unit;                 // the forward's units; the block's current one
  int expert, tile, count, first;  // the unit: its expert, token tile, rows, first routed row
  int pos[kWarps], hi[kWarps];     // each warp's next chunk and range end in the unit
};

template <int D, bool kFp8Inter, int kAct>
__global__ void __launch_bounds__(kWarps * 32, fast_min_blocks(1, D)) gemm1_balanced_kernel(const Gemm1Params p) {
  constexpr int BT = 8;
  extern __shared__ __align__(128) float s_sx[];  // [K/32][BT], then the warps' rings; the region starts on 128 bytes (fast_ring_of_warp)
  __shared__ float s_back[BT];
  __shared__ int s_mx[BT];
  __shared__ const uint8_t* s_row[BT];
  __shared__ const uint8_t* s_rsc[BT];
  __shared__ BalancedState s_state;
  volatile BalancedState& vs = s_state;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kbK = static_cast<int>(p.hidden / kMxBlock);
  const int kc = p.w13.kc, rgs = p.w13.rg;
  // Under the expert-ready counters GEMM2's blocks wait per expert, so they may take the
  // slots of this grid's first blocks to finish at once (the calls below then repeat it).
  if (p.expert_ready != nullptr) pdl_allow_dependents();
  if (warp == 0) {
    const int units = count_units(p.counts, p.num_local);
    if (lane == 0) {
      s_state.units = units;
      s_state.unit = balanced_block(units, gridDim.x, rgs, blockIdx.x).unit;
    }
  }
  __syncthreads();
  if (s_state.unit < 0) return;  // block-uniform

  while (vs.unit < vs.units) {
    const BalancedBlock bb = balanced_block(vs.units, gridDim.x, rgs, blockIdx.x);
    if (warp == 0) {
      // The expert's first routed row is loaded after the first weight copies are out.
      const int3 et = unit_at(p.counts, p.num_local, vs.unit);
      if (lane == 0) {
        s_state.expert = et.x;
        s_state.tile = et.y;
        s_state.count = et.z;
      }
    }
    if (lane == 0) {
      balanced_range(rgs, kc, bb.blocks, kWarps * bb.index + warp, &s_state.pos[warp], &s_state.hi[warp]);
    }
    __syncthreads();
    {
      const int e = s_state.expert, tile = s_state.tile;
      const int valid = min(BT, s_state.count - tile * BT);
      const int pos = s_state.pos[warp], hi = s_state.hi[warp];
      // The first weight loads go out before the token-scale staging (gemm1_fast_block).
      if (pos < hi) {
        const int r = pos / kc, k0 = pos - r * kc;
        const size_t g = static_cast<size_t>(e) * rgs + r;
        fast_prefetch<D>(fast_ring_of_warp<D>(s_sx + kbK * BT), p.w13.packed + g * kc * 4 * 32,
                         reinterpret_cast<const uint4*>(p.w13.scale) + g * kc * 8, k0,
                         piece_end(k0, kc, hi - pos));
      }
      if (threadIdx.x < BT) {
        const int first = p.offsets[e];
        if (threadIdx.x == 0) s_state.first = first;  // for the epilogue, after the barriers
        stage_token_row(p, first + tile * BT, valid, kbK, s_mx, s_row, s_rsc);
      }
      __syncthreads();
      stage_b_scales_out_of_line<BT>(s_rsc, valid, kbK, s_sx, s_back, s_mx);
      __syncthreads();
      if (pos >= hi) pdl_allow_dependents();
    }
    while (vs.pos[warp] < vs.hi[warp]) {
      float acc[4][1][4];
      zero_acc(acc);
      {
        // Every operand offset to chunk k0, so that the mainloop runs from chunk 0 as in
        // gemm1_fast_block (a variable first chunk took registers).
        const int pos = vs.pos[warp], hi = vs.hi[warp];
        const int r = pos / kc, k0 = pos - r * kc;
        const size_t g = static_cast<size_t>(vs.expert) * rgs + r;
        const bool special = p.w13.special == nullptr || p.w13.special[g] != 0;
        warp_mma_decode<1, D, false>(special, false, min(BT, vs.count - vs.tile * BT), acc,
                              fast_ring_of_warp<D>(s_sx + kbK * BT), p.w13.packed + (g * kc + k0) * 4 * 32,
                              reinterpret_cast<const uint4*>(p.w13.scale) + (g * kc + k0) * 8, 0,
                              piece_end(k0, kc, hi - pos) - k0, kbK - 2 * k0,
                              [&](int i) { return s_row[i] != nullptr ? s_row[i] + 64 * k0 : nullptr; },
                              s_sx + 2 * k0 * BT);
      }
      const int e = vs.expert;
      const int pos = vs.pos[warp], hi = vs.hi[warp];
      const int r = pos / kc, k0 = pos - r * kc, k1 = piece_end(k0, kc, hi - pos);
      __syncwarp();  // every lane has read pos before lane 0 moves it
      if (lane == 0) vs.pos[warp] = pos + k1 - k0;
      __syncwarp();  // and the loop's next test reads the new one
      // The next row group's first chunks go out before this one's fixup and epilogue.
      if (pos + k1 - k0 < hi) {
        const size_t g = static_cast<size_t>(e) * rgs + r + 1;
        fast_prefetch<D>(fast_ring_of_warp<D>(s_sx + kbK * BT), p.w13.packed + g * kc * 4 * 32,
                         reinterpret_cast<const uint4*>(p.w13.scale) + g * kc * 8, 0,
                         piece_end(0, kc, hi - pos - (k1 - k0)));
      } else {
        pdl_allow_dependents();  // as in gemm1_fast_block
      }
      if (k0 > 0 || k1 < kc) {
        // Cut: part 1 (k0 > 0) shares the previous warp's slot, part 0 uses its own.
        const BalancedBlock bb = balanced_block(vs.units, gridDim.x, rgs, blockIdx.x);
        const int slot = bb.first_slot + kWarps * bb.index + warp - (k0 > 0 ? 1 : 0);
        if (!balanced_fixup(acc, p.split_acc + static_cast<size_t>(slot) * kBalancedSlotFloats,
                            p.split_count + slot, k0 > 0 ? 1 : 0))
          continue;
      }
      const int tile = vs.tile, count = vs.count, off = vs.first;
      const float alpha = p.alpha[e], beta = p.beta[e], limit = p.limit[e];
      const float* bias = p.bias ? p.bias + static_cast<size_t>(e) * 2 * p.intermediate + 64 * r : nullptr;
      const int t = lane & 3;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int row = tile * BT + 2 * t + c;
        store_activated<1, kFp8Inter, kAct>(p, acc, 0, c, s_back[2 * t + c], off + row, row < count, r,
                                            bias, alpha, beta, limit);
      }
      if (p.expert_ready != nullptr) expert_ready_signal(p.expert_ready + e, 1);  // one 8-row tile
    }
    __syncthreads();  // every warp is done with the unit's staging and state
    if (threadIdx.x == 0) s_state.unit += balanced_block(s_state.units, gridDim.x, rgs, blockIdx.x).unit_stride;
    __syncthreads();
  }
}

/// Blocks of a balanced launch: one wave of `kernel` (decode_balanced_blocks).
template <class Kernel>
int balanced_blocks(Kernel kernel, int threads, size_t smem) {
  int per_sm = 0;
  MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return decode_balanced_blocks(per_sm);
}

template <int D, bool kFp8Inter>
void launch_balanced(const Gemm1Params& p, cudaStream_t stream) {
  MXMOE_CHECK_ARG(p.split_acc != nullptr && p.split_count != nullptr, "Gemm1Params.split_acc",
                  "the balanced decode kernel needs the split slots (WorkspaceLayout)");
  am::with_activation_kind(p.activation, [&](auto kind) {
    constexpr int kAct = decltype(kind)::value;
    const auto kernel = gemm1_balanced_kernel<D, kFp8Inter, kAct>;
    const size_t smem = static_cast<size_t>(p.hidden / kMxBlock) * 8 * sizeof(float) + fast_ring_bytes<D>();
    allow_fast_smem(kernel, smem);
    const int blocks = balanced_blocks(kernel, kWarps * 32, smem);
    kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(p);
    MXMOE_LAUNCH_CHECK("gemm1_balanced_kernel");
  });
}

template <int NT, int D, bool kFp8Inter, int kAct>
void launch_fast_t(const Gemm1Params& p, cudaStream_t stream) {
  constexpr int BT = 8 * NT;
  const dim3 grid(static_cast<unsigned>((p.w13.rg + kWarps - 1) / kWarps),
                  static_cast<unsigned>(p.num_local), static_cast<unsigned>(p.fast.z));
  const size_t smem = static_cast<size_t>(p.hidden / kMxBlock) * BT * sizeof(float) + fast_ring_bytes<D>();
  allow_fast_smem(gemm1_fast_kernel<NT, D, kFp8Inter, kAct>, smem);
  launch_kernel(gemm1_fast_kernel<NT, D, kFp8Inter, kAct>, grid, dim3(kWarps * 32), smem, stream, p.programmatic,
                p);
  MXMOE_LAUNCH_CHECK("gemm1_fast_kernel");
}
template <int NT, int D, bool kFp8Inter>
void launch_fast(const Gemm1Params& p, cudaStream_t stream) {
  am::with_activation_kind(p.activation, [&](auto kind) {
    launch_fast_t<NT, D, kFp8Inter, decltype(kind)::value>(p, stream);
  });
}

// Prefill path (heuristics.h use_prefill, wgmma_mx.cuh). Consumer warp w of warpgroup wg
// holds, for the tile's kTok tokens, gate (acc_g) and up (acc_u) of intermediate columns
// 32 rg + 16 (w % 2) + 8 h + g, rg = 4 rb + 2 wg + w / 2: the activation is computed in
// registers; for MXFP8 the amax of a token's 32 columns (its row group) spans warps w
// and w ^ 1: each reduces its 16 over g by shuffles, and the pair meets in shared memory.
//
// Pass 1 (the activations) is a rolled loop over the kTok / 8 blocks of 8 tokens. Fully
// unrolled (128 tokens) it was 64 activations of straight-line code (about 21k
// instructions, 330 KB) run once per tile, so the warps stalled on instruction fetch.
// Registers cannot be indexed at run time, so the accumulators rotate instead: the two
// blocks an iteration works on always sit in the same slots, and after the last iteration
// acc_g is back in place, holding the activations (acc_u is spent). The exact path's
// 96- and 128-token tiles run two such loops, one per half of the tile, each rotating only its
// half: a rotation costs a move per slot it turns, 16 per activation over the whole tile
// and 8 over a half.
#if defined(MXMOE_SM90A)
// Rotates a[kFirst, kFirst + kLen) down by kBlocks token blocks (4 slots each).
template <int kBlocks, int kFirst, int kLen, int kN>
__device__ __forceinline__ void rotate_down_range(float (&a)[kN]) {
  static_assert(kFirst + kLen <= kN && 4 * kBlocks <= kLen, "rotation past the array");
  float first[4 * kBlocks];
#pragma unroll
  for (int i = 0; i < 4 * kBlocks; ++i) first[i] = a[kFirst + i];
#pragma unroll
  for (int i = kFirst; i + 4 * kBlocks < kFirst + kLen; ++i) a[i] = a[i + 4 * kBlocks];
#pragma unroll
  for (int i = 0; i < 4 * kBlocks; ++i) a[kFirst + kLen - 4 * kBlocks + i] = first[i];
}
template <int kBlocks, int kN>
__device__ __forceinline__ void rotate_down(float (&a)[kN]) {
  rotate_down_range<kBlocks, 0, kN>(a);
}

// The amax of token 8 j + 2 t + c over the warp's 8 lanes g (their columns), published by
// lane g = 0 to the warp's row of amaxes (s_amax_w, by token) for pass 2: the exact
// prefill epilogue's block amax (both of its pass-1 forms), before the warps of a block
// meet in shared memory. g, t: the lane's lane >> 2 and lane & 3, as the callers hold them.
__device__ __forceinline__ void publish_block_amax(float* s_amax_w, int g, int t, int j, int c, float amax) {
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
  if (g == 0) s_amax_w[8 * j + 2 * t + c] = amax;
}

// The E8M0 scale (and its inverse) of each of a tile's token columns, computed once per
// warp: lane L takes columns 32 i + L. The lanes that hold values of column n (one per
// g) fetch it from lane n % 32 by a shuffle, instead of each running the same ~40
// instructions with branches (mx_scale_byte). Lane n % 32 holds it in slot n / 32, which
// is j / 4 for the token block j of 8 that n lies in: a compile-time index.
template <int kTok>
struct ColumnScales {
  static constexpr int kOwn = kTok / 32;
  float scale[kOwn];  // 2^(byte - 127) exactly: fmt::e8m0_to_float (byte 0 is 2^-127, a float subnormal)
  float inv[kOwn];
  // Some column of this lane's has a block that GEMM2's staged BF16 rows cannot hold as
  // code * 2^(byte - 127) exactly (pf_store_activated): a nonzero amax under the byte
  // kE4m3NormalMinScale (values may fall under 2^-126), or a byte above kUnitRangeMaxScale
  // (the row would need a range factor). Blocks of amax 0 (zeros, NaN, ±Inf saturated to
  // ±448 at byte 0) stage exactly.
  bool unstageable = false;
  // amax_of(n): the block amax of column n. Columns from rows_left on (warp-uniform) are
  // padding and skipped.
  template <class AmaxOf>
  __device__ __forceinline__ void compute(int rows_left, ScaleRule rule, AmaxOf&& amax_of) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
      scale[i] = 0.0f;
      inv[i] = 0.0f;
      if (32 * i >= rows_left) continue;
      const float amax = amax_of(32 * i + lane);
      const uint8_t sb = fmt::mx_scale_byte(amax, fmt::kE4m3Max, fmt::kE4m3Emax, rule);
      unstageable = unstageable || (32 * i + lane < rows_left &&
                                    (sb > kUnitRangeMaxScale || (sb < kE4m3NormalMinScale && amax > 0.0f)));
      scale[i] = fmt::e8m0_to_float(sb);
      inv[i] = fmt::mx_inv_scale(sb);
    }
  }
  // Called by the whole warp (shuffles), for a column n of token block j, inside fully
  // unrolled loops over j (the register index j / 4 must be known at compile time).
  __device__ __forceinline__ float scale_of(int j, int n) const {
    return __shfl_sync(0xffffffffu, scale[j / 4], n % 32);
  }
  __device__ __forceinline__ float inv_of(int j, int n) const {
    return __shfl_sync(0xffffffffu, inv[j / 4], n % 32);
  }
};

template <bool kFp8Inter, int kAct, int kTok>
__device__ __forceinline__ void pf_store_activated(const Gemm1Params& p, float (&acc_g)[kTok / 2],
                                                   float (&acc_u)[kTok / 2], const PfTile& tile,
                                                   int wg, float* s_amax) {
  constexpr int kStep = 2;  // token blocks per iteration of pass 1
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3, half = warp & 1;
  const int rg = tile.rb * kPfRowGroups + 2 * wg + (warp >> 1);
  const bool rg_ok = rg < p.w13.rg;
  const int e = tile.e;
  const int64_t N = p.intermediate;
  const float alpha = p.alpha[e], beta = p.beta[e], limit = p.limit[e];
  const float* bias = p.bias && rg_ok ? p.bias + static_cast<size_t>(e) * 2 * N + 64 * rg : nullptr;
  float bias_g[2] = {0.0f, 0.0f}, bias_u[2] = {0.0f, 0.0f};
  if (bias) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bias_g[h] = bias[16 * half + 8 * h + g];
      bias_u[h] = bias[32 + 16 * half + 8 * h + g];
    }
  }
  const int barrier = 1 + wg;  // named barrier of this consumer warpgroup
  const float* s_back = s_amax + kPfAmaxFloats + wg * kPfTokens;  // ring.back[wg]
  float* s_amax_w = s_amax + (wg * 4 + warp) * kPfTokens;
  named_barrier_sync(barrier, 128);  // s_back (copied by the whole warpgroup) is complete
  // Token blocks of 8 past the tile's rows are skipped (warp-uniform; both warps of a row
  // group skip the same ones): at small M most of a tile is padding.
  const int rows_left = rg_ok ? p.counts[e] - tile.tt * kTok : 0;
  // 96- and 128-token tiles: one rolled loop per half of the tile (kHalf: its first block is
  // kHalf * kHalfBlocks). Smaller tiles keep one loop: their loops run 1 or 2 times, so
  // the second loop's code is fetched cold for every tile (M=32: GEMM1 +7%,
  // PERFORMANCE.md session 19), which costs more than the moves it saves.
  constexpr int kHalves = kTok >= 96 ? 2 : 1;
  constexpr int kHalfBlocks = kTok / 8 / kHalves;
  // The activations of token block j's column c (slot0: the block's first accumulator
  // slot in the loop's window), written back over the gate accumulators; returns their
  // amax.
  auto activate = [&](int j, int slot0, int c) {
    const float back = s_back[8 * j + 2 * t + c];
    float amax = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int slot = slot0 + 2 * h + c;
      float gate = acc_g[slot] * back;
      float up = acc_u[slot] * back;
      if (bias) {
        gate = gate + bias_g[h];
        up = up + bias_u[h];
      }
      const float v = am::gated_activation_t<kAct>(gate, up, alpha, beta, limit);
      acc_g[slot] = v;
      amax = fmaxf(amax, fmt::amax_term(v));  // NaN and Inf dropped, as fmt::block_amax does
    }
    return amax;
  };
  // 96- and 128-token tiles skip per iteration, not per block: the iteration's activations then
  // form one branch-free stretch the compiler can interleave, and its shuffles follow
  // them (a skip, and each shuffle group's convergence check, ended a stretch). The cost:
  // one block of padding in a tile whose rows end in an iteration's first block. These
  // tiles run where experts average over 64 rows (heuristics.h prefill_token_tile), so
  // such blocks are few. Smaller tiles keep the per-block skip: there most tiles hold
  // under 8 rows, and the second block is padding.
  constexpr bool kSkipPerIteration = kTok >= 96;
  auto pass1_half = [&](auto half_c) {
    constexpr int kHalf = decltype(half_c)::value;
    constexpr int kFirstSlot = 4 * kHalfBlocks * kHalf;
#pragma unroll 1
    for (int j0 = kHalfBlocks * kHalf; j0 < kHalfBlocks * (kHalf + 1); j0 += kStep) {
      if constexpr (kSkipPerIteration) {
        if (8 * j0 < rows_left) {
          float amax[kStep][2];
#pragma unroll
          for (int jj = 0; jj < kStep; ++jj)
#pragma unroll
            for (int c = 0; c < 2; ++c) amax[jj][c] = activate(j0 + jj, kFirstSlot + 4 * jj, c);
          if constexpr (kFp8Inter) {
#pragma unroll
            for (int jj = 0; jj < kStep; ++jj)
#pragma unroll
              for (int c = 0; c < 2; ++c) publish_block_amax(s_amax_w, g, t, j0 + jj, c, amax[jj][c]);
          }
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < kStep; ++jj) {
          const int j = j0 + jj;
          if (8 * j >= rows_left) continue;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float amax = activate(j, kFirstSlot + 4 * jj, c);
            if constexpr (kFp8Inter) publish_block_amax(s_amax_w, g, t, j, c, amax);
          }
        }
      }
      rotate_down_range<kStep, kFirstSlot, 4 * kHalfBlocks>(acc_g);
      rotate_down_range<kStep, kFirstSlot, 4 * kHalfBlocks>(acc_u);  // a shift would do, same cost
    }
  };
  pass1_half(std::integral_constant<int, 0>{});
  if constexpr (kHalves == 2) pass1_half(std::integral_constant<int, 1>{});
  [[maybe_unused]] ColumnScales<kTok> scales;
  if constexpr (kFp8Inter) named_barrier_sync(barrier, 128);
  // The expert's first row is loaded only after pass 1 (with an MXFP8 intermediate, right
  // after its barrier, so the load's latency hides under the column scales' computation),
  // and its count is read where it is used. Both loaded at the top and held over pass 1,
  // one was spilled at the 32-token tile's 104 registers; the first row loaded after the
  // scales, its latency showed (PERFORMANCE.md sessions 58 and 59).
  const int off = p.offsets[e];
  if constexpr (kFp8Inter) {
    const float* s_amax_pair = s_amax + (wg * 4 + (warp ^ 1)) * kPfTokens;
    scales.compute(rows_left, p.rule, [&](int n) { return fmaxf(s_amax_w[n], s_amax_pair[n]); });
  }
  // Pass 2: quantize and store (a few instructions per value: unrolled). The values go
  // straight to GEMM2's staged BF16 rows (stage_bf16.cu's layout, range factor 1): for an
  // MXFP8 intermediate the exact BF16 of each E4M3 code times its block scale, i.e. the
  // intermediate's values. The MXFP8 (or BF16) intermediate itself is not written: only
  // the generic path reads it, and that path's GEMM1 writes it (the flag below).
  //
  // In a staged block of 32, element 16 half + 8 h + g sits at position
  //   8 (g / 2) + (g % 2) + 4 half + 2 h,
  // so lanes g and g ^ 1 (lane ^ 4) together hold positions 8 (g / 2) + 4 half + 0..3 of
  // each token: one shuffle per two tokens, and the even lane stores those 8 bytes for
  // token 2t (c = 0), the odd lane for token 2t + 1.
  const int odd = g & 1;
  const int row0 = tile.tt * kTok + 2 * t;  // the lane's first row (c = 0 of token block 0)
  const int ib32 = static_cast<int>(p.ib_stride);
  uint16_t* const staged = p.ib + (off + row0) * p.ib_stride + 32 * rg + 8 * (g >> 1) + 4 * half;
  // Two token blocks per step, each phase for all four columns before the next, so that
  // the shuffles' latencies overlap instead of adding up.
  constexpr int kStoreStep = 2;
#pragma unroll
  for (int j0 = 0; j0 < kTok / 8; j0 += kStoreStep) {
    if (8 * j0 >= rows_left) break;
    uint32_t bf[kStoreStep][2];  // [block][c]: bf16x2 of this lane's values h = 0, 1
#pragma unroll
    for (int jj = 0; jj < kStoreStep; ++jj)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int j = j0 + jj;
        if constexpr (kFp8Inter) {
          const int n = 8 * j + 2 * t + c;
          const float scale = scales.scale_of(j, n);
          const float inv = scales.inv_of(j, n);
          // A NaN's code loses its sign here (e4m3x2_satfinite), and the multiply below
          // gives the canonical NaN either way. Exact where scales.unstageable is not set.
          // A block of amax 0 (byte 0) holds zeros, NaN and ±Inf (saturated to ±448 at its
          // finite scale, formats.h): its scale is 2^-127 itself (byte << 23 would be 0 and
          // stage ±Inf as ±0), and ±448 * 2^-127 is a normal BF16.
          const uint32_t q = e4m3x2_satfinite(acc_g[4 * j + c] * inv, acc_g[4 * j + 2 + c] * inv);
          bf[jj][c] = e4m3x2_scaled_to_bf16x2(q, scale);
        } else {
          bf[jj][c] = fmt::float_to_bf16(acc_g[4 * j + c]) | (fmt::float_to_bf16(acc_g[4 * j + 2 + c]) << 16);
        }
      }
    uint32_t other[kStoreStep];
#pragma unroll
    for (int jj = 0; jj < kStoreStep; ++jj) other[jj] = __shfl_xor_sync(0xffffffffu, odd ? bf[jj][0] : bf[jj][1], 4);
#pragma unroll
    for (int jj = 0; jj < kStoreStep; ++jj) {
      const int dr = 8 * (j0 + jj) + odd;  // this lane's row - row0
      const uint32_t mine = odd ? bf[jj][1] : bf[jj][0];
      const uint32_t lo = odd ? other[jj] : mine, hi = odd ? mine : other[jj];  // elements g & ~1, g | 1
      if (dr < rows_left - 2 * t)  // row0 + dr < count, and rg_ok (rows_left 0 otherwise)
        *reinterpret_cast<uint2*>(staged + dr * ib32) =
            make_uint2((lo & 0xFFFFu) | (hi << 16), (lo >> 16) | (hi & 0xFFFF0000u));
    }
  }
  // Otherwise GEMM2 takes its generic path, and GEMM1's generic kernel writes the
  // intermediate for it (the staging kernel would have used a range factor or checked
  // each value: blocks of huge or tiny values only).
  if constexpr (kFp8Inter)
    if (__any_sync(0xffffffffu, scales.unstageable) && lane == 0) atomicOr(p.inexact, kInexactInter);
  // N % 64 == 32: the staged rows' last block (past N, up to ib_stride) is zeros, and it
  // belongs to the row group after the last (rg_ok false).
  if (!rg_ok && 32 * rg < p.ib_stride) {
    for (int dr = odd; dr < kTok - 2 * t; dr += 8)
      if (row0 + dr < p.counts[e]) *reinterpret_cast<uint2*>(staged + dr * ib32) = make_uint2(0u, 0u);
  }
  named_barrier_sync(barrier, 128);  // s_amax and s_back are rewritten for the next tile
}
#endif

// One kernel per activation kind kAct (am::with_activation_kind).
template <bool kFp8Inter, int kTok, int kAct>
__global__ void __launch_bounds__(kPfThreads, PfGeometry<kTok>::kCtasPerSm) gemm1_prefill_kernel(const Gemm1Params p) {
#if defined(MXMOE_SM90A)
  // The generic fallback after this kernel may have its blocks dispatched as this
  // kernel's CTAs leave (Gemm1Params::fallback_programmatic): they wait for its end.
  pdl_allow_dependents();
  if (*p.inexact & kInexactX) return;  // an x value is not exact in BF16: generic path
  extern __shared__ uint8_t pf_smem[];
  PfOperands o = pf_operands(p.w13, p.xb, p.xb_stride, p.xb_back, p.row_map,
                             static_cast<int>(p.top_k), p.counts, p.offsets, p.num_local);
  o.split_acc = p.split_acc;
  o.split_count = p.split_count;
  pf_run<true, kTok, false>(o, pf_smem, [&](float (&acc_g)[kTok / 2], float (&acc_u)[kTok / 2],
                                     const PfTile& tile, int wg, const PfRing& ring) {
    // One epilogue per activation form: the loop bodies stay free of the other forms'
    // code. SiTU: Kimi-K3's alpha 4 has a cheaper form with the same bits
    // (activation_math.h); the layer resolves the form when all local experts agree, and
    // otherwise (kind 0) the tile's expert's alpha decides.
    am::with_form_of_kind<kAct>([&] { return p.alpha[tile.e]; }, [&](auto form) {
      pf_store_activated<kFp8Inter, decltype(form)::value, kTok>(p, acc_g, acc_u, tile, wg, ring.amax);
    });
  });
#endif
}

template <bool kFp8Inter, int kTok, int kAct>
void launch_prefill_t(const Gemm1Params& p, cudaStream_t stream) {
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(gemm1_prefill_kernel<kFp8Inter, kTok, kAct>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, PfGeometry<kTok>::kSmemBytes));
  gemm1_prefill_kernel<kFp8Inter, kTok, kAct><<<prefill_ctas(PfGeometry<kTok>::kCtasPerSm), kPfThreads, PfGeometry<kTok>::kSmemBytes, stream>>>(p);
  MXMOE_LAUNCH_CHECK("gemm1_prefill_kernel");
}
template <bool kFp8Inter>
void launch_prefill(const Gemm1Params& p, cudaStream_t stream) {
  with_prefill_tile(prefill_tile_tokens(p.tokens, p.top_k, p.num_local), [&](auto tile) {
    am::with_activation_kind(p.activation, [&](auto kind) {
      launch_prefill_t<kFp8Inter, decltype(tile)::value, decltype(kind)::value>(p, stream);
    });
  });
}

// FP8 mode (wgmma_fp8.cuh; engine.h fp8_weights): consumer warp w of warpgroup wg holds,
// for tokens n = 64 wg + 16 w + 8 h + g (h = 0, 1), the block's weight rows 8j + 2t + c
// (f8_mainloop). W13's FP8 rows come in groups of 16 (8 gates, then the 8 ups of the same
// columns), so row 8j + 2t + c is the gate (j even) or the up (j odd) of the tile's
// intermediate column 8 (j >> 1) + 2t + c (column 64 rb + that of the intermediate,
// MX row group rg = 2 rb + (j >> 3)). The consumers only stage them (f8_stage_tile); the
// drain warpgroup computes the activation and the MXFP8 blocks (f8_drain_tile) while the
// consumers run the next tile's mainloop (f8_run).
#if defined(MXMOE_SM90A)
/// The consumers' epilogue: gate and up with the row scale and the bias applied (one FFMA
/// each: F8RowScales; no bias adds -0, which leaves every value as it is), into the
/// staged tile at rows c and 64 + c (f8_staged_index). Bias as pairs: the biases of
/// 32-column row group rg are [32 gates][32 ups] at 64 rg.
template <bool kRowScale>
__device__ __forceinline__ void f8_stage_tile(const Gemm1Params& p, const float (&acc)[64],
                                              const F8RowScales<kRowScale>& row_scales, const PfTile& tile,
                                              int wg, float* staged) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t N = p.intermediate;
  const int rg_count = p.w13f8.rows / 64;  // past it: the padding rows of the last block
  const float* bias = p.bias ? p.bias + static_cast<size_t>(tile.e) * 2 * N + 128 * tile.rb : nullptr;
  const int n = 64 * wg + 16 * warp + g;
  // Every row this thread stores, r = 64 up + 8 (j >> 1) + 2t + c (c < 2), has
  // (r >> 1) & 3 = t, so f8_staged_index's swizzle is the same for all of them: two base
  // addresses (tokens n and n + 8) and compile-time offsets. Left to f8_staged_index per
  // store, ptxas kept up to ~60 of the addresses live across the mainloop, beside its 128
  // accumulator registers, and spilled.
  float* const row_t = staged + 2 * t * kPfTokens;
  float* const s0 = row_t + (n ^ (t << 3));
  float* const s1 = row_t + ((n + 8) ^ (t << 3));
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int up = j & 1, col = 8 * (j >> 1) + 2 * t;  // and col + 1
    const bool rg_ok = 2 * tile.rb + (j >> 3) < rg_count;
    const float2 b = bias != nullptr && rg_ok
                         ? *reinterpret_cast<const float2*>(bias + 64 * (j >> 3) + 32 * up + (col & 31))
                         : make_float2(-0.0f, -0.0f);
    const float2 s = row_scales.pair(j);
    const int r0 = 64 * up + 8 * (j >> 1);  // r - 2t: a constant
    s0[r0 * kPfTokens] = fmaf(acc[4 * j + 0], s.x, b.x);
    s0[(r0 + 1) * kPfTokens] = fmaf(acc[4 * j + 1], s.y, b.y);
    s1[r0 * kPfTokens] = fmaf(acc[4 * j + 2], s.x, b.x);
    s1[(r0 + 1) * kPfTokens] = fmaf(acc[4 * j + 3], s.y, b.y);
  }
}

/// f8_drain_tile's token n (routed row off + 128 tt + n): per MXFP8 block (the tile's
/// columns 32b .. 32b + 31, b < 2), its 32 activations (written back over the gates),
/// their amax (a NaN is dropped as fmt::block_amax does, and so is an Inf, which
/// saturates: fmt::amax_term), the formats.h scale byte and the 32 E4M3 codes, stored as
/// two 16-byte pieces of the token's row of `inter` (kFused: into the group buffer, as
/// blocks 2 half and 2 half + 1 of its group). A whole block per thread: no shuffles, no
/// barriers.
///
/// The token's word of staged row r is at word[(r >> 1) & 3] + 128 r (f8_staged_index), so
/// loops whose r % 8 is known at compile time load and store at immediate offsets: the
/// index arithmetic took ~12 of the ~89 instructions per activation when the loop ran in
/// steps of 4. The codes go two per conversion (e4m3x2_satfinite); a block that holds a
/// NaN takes them again one by one for the NaN's sign (float_to_e4m3).
template <int kAct, bool kFused>
__device__ __forceinline__ void f8_drain_blocks(const Gemm1Params& p, const PfTile& tile, float* staged,
                                                int n, int half, F8GroupBuffer* group) {
  const int e = tile.e;
  const int64_t row = p.offsets[e] + static_cast<int64_t>(tile.tt) * kPfTokens + n;
  const int64_t N = p.intermediate;
  const int kbN = static_cast<int>(N / kMxBlock);
  const float alpha = p.alpha[e], beta = p.beta[e], limit = p.limit[e];
  // word[k]: the token's word of row 0 under swizzle k; rows r with (r >> 1) & 3 = k are
  // at word[k] + 128 r. Row offsets from a multiple of 8 keep k a compile-time index.
  float* word[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) word[k] = staged + (n ^ (k << 3));
  auto rows_from = [&](int r0, float* (&base)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) base[k] = word[k] + r0 * kPfTokens;
  };
  uint32_t bytes = 0, used = 0;  // kFused: this half's blocks' bytes and use
#pragma unroll 1
  for (int b = 0; b < 2; ++b) {
    const int rg = tile.rb * 2 + b;
    if (rg >= p.w13f8.rows / 64) break;  // the padding rows of the last block
    float amax = 0.0f;
#pragma unroll 1
    for (int r0 = 32 * b; r0 < 32 * b + 32; r0 += 8) {
      float* base[4];
      rows_from(r0, base);
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        float& gate = base[(r >> 1) & 3][r * kPfTokens];
        const float v = am::gated_activation_t<kAct>(gate, base[(r >> 1) & 3][(64 + r) * kPfTokens], alpha, beta, limit);
        gate = v;
        amax = fmaxf(amax, fmt::amax_term(v));  // NaN and Inf dropped, as fmt::block_amax
      }
    }
    const uint8_t sb = fmt::mx_scale_byte(amax, fmt::kE4m3Max, fmt::kE4m3Emax, p.rule);
    const float inv = fmt::mx_inv_scale(sb);
    float* base[4];
    rows_from(32 * b, base);
    auto scaled = [&](int r) { return base[(r >> 1) & 3][r * kPfTokens] * inv; };  // r < 32
    uint32_t q[8];
    uint32_t nan_mark = 0;  // bit 7 of a byte set where a code's magnitude is 0x7F: a NaN
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      q[w] = e4m3x2_satfinite(scaled(4 * w), scaled(4 * w + 1)) |
             (e4m3x2_satfinite(scaled(4 * w + 2), scaled(4 * w + 3)) << 16);
      nan_mark |= (q[w] & 0x7F7F7F7Fu) + 0x01010101u;  // no carry leaves a byte
    }
    if (nan_mark & 0x80808080u) {
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        q[w] = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[w] |= static_cast<uint32_t>(fmt::float_to_e4m3(scaled(4 * w + i))) << (8 * i);
      }
    }
    if constexpr (kFused) {
      const int blk = 2 * half + b, sw = n & 7;
      group->codes[n][(2 * blk) ^ sw] = make_uint4(q[0], q[1], q[2], q[3]);
      group->codes[n][(2 * blk + 1) ^ sw] = make_uint4(q[4], q[5], q[6], q[7]);
      const bool any_code = ((q[0] | q[1] | q[2] | q[3] | q[4] | q[5] | q[6] | q[7]) & 0x7F7F7F7Fu) != 0;
      bytes |= static_cast<uint32_t>(sb) << (8 * blk);
      used |= static_cast<uint32_t>(regroup_block_used(any_code, sb)) << blk;
    } else {
      uint4* dst = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.inter) + row * N + 32 * rg);
      dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
      dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
      p.inter_scale[row * kbN + rg] = sb;
    }
  }
  if constexpr (kFused) {  // the second half keeps the first's blocks
    group->bytes[n] = half ? group->bytes[n] | bytes : bytes;
    group->used[n] = half ? group->used[n] | used : used;
  }
}

/// The group of the pair the drain just finished (f8_drain_tile, fused), staged for GEMM2
/// as stage_fp8 stages it (fp8_regroup.cuh): token n's thread finds the group's byte T
/// and writes the scale (32 consecutive rows per warp), then each warp writes its 32
/// tokens' 128-byte rows, 4 tokens per store (lane l: chunk l % 8 of token 4i + l / 8),
/// re-expressed under T; an unused block as zeros.
__device__ __forceinline__ void f8_drain_group(const Gemm1Params& p, const PfTile& tile, int n, int live,
                                               F8GroupBuffer* group) {
  const int64_t row0 = p.offsets[tile.e] + static_cast<int64_t>(tile.tt) * kPfTokens;
  const int grp = tile.rb >> 1;
  if (n < live) {
    const uint32_t bytes = group->bytes[n], used = group->used[n];
    int key = 0;
#pragma unroll
    for (int blk = 0; blk < fp8mode::kBlocksPerGroup; ++blk)
      key = max(key, regroup_block_key((used >> blk) & 1u, static_cast<uint8_t>(bytes >> (8 * blk))));
    const uint8_t T = regroup_group_byte(key);
    p.if8_scale[grp * p.if8_scale_rows + row0 + n] = regroup_scale(T, p.if8_shift);
    group->used[n] = used | (static_cast<uint32_t>(T) << 8);
  }
  __syncwarp();  // the warp's 32 tokens' codes, bytes and T
  const int lane = n & 31, c = lane & 7, blk = c >> 1;
#pragma unroll 1
  for (int i = 0; i < 8; ++i) {
    const int tok = (n & ~31) + 4 * i + (lane >> 3);
    if (tok >= live) break;  // (tok grows with i)
    const uint32_t meta = group->used[tok];
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if ((meta >> blk) & 1u) {
      const uint8_t T = static_cast<uint8_t>(meta >> 8);
      const uint8_t bb = static_cast<uint8_t>(group->bytes[tok] >> (8 * blk));
      const int d = static_cast<int>(T) - static_cast<int>(bb);
      v = group->codes[tok][c ^ (tok & 7)];
      v = make_uint4(regroup_e4m3x4(v.x, d, bb, T), regroup_e4m3x4(v.y, d, bb, T), regroup_e4m3x4(v.z, d, bb, T),
                     regroup_e4m3x4(v.w, d, bb, T));
    }
    *reinterpret_cast<uint4*>(p.if8 + (row0 + tok) * p.if8_stride + fp8mode::kGroup * grp + 16 * c) = v;
  }
  __syncwarp();  // read before the next pair's blocks overwrite them
}

/// The drain warpgroup's epilogue of one staged tile (f8_drain_blocks per token). With
/// the regrouping fused (p.if8; the CTA's tiles come in pairs, F8Tiles<true>), the codes
/// and bytes go to the group buffer (row block 2p: blocks 0, 1 of group p; 2p + 1: blocks
/// 2, 3), and after a group's last row block f8_drain_group writes it staged for GEMM2.
/// Each warp touches only its own 32 tokens' entries, so __syncwarp orders them.
template <int kAct>
__device__ __forceinline__ void f8_drain_tile(const Gemm1Params& p, const PfTile& tile, const F8Ring& ring) {
  float* staged = ring.staged;
  const int n = threadIdx.x & 127;
  const int e = tile.e;
  const int live = p.counts[e] - tile.tt * kPfTokens;  // the tile's tokens: n < live (up to 128)
  const bool fused = p.if8 != nullptr;
  const int half = tile.rb & 1;  // fused: the group's blocks 2 half, 2 half + 1
  const bool group_done = half == 1 || tile.rb + 1 == p.w13f8.rows_p / kF8Rows;
  if (fused) {
    if (n < live) f8_drain_blocks<kAct, true>(p, tile, staged, n, half, ring.group);
    if (group_done) f8_drain_group(p, tile, n, live, ring.group);
  } else if (n < live) {  // (past live: a padding token)
    f8_drain_blocks<kAct, false>(p, tile, staged, n, 0, nullptr);
  }
}

#endif

// One kernel per activation kind (am::with_activation_kind) and weight form (kRowScale:
// the row form, engine.h fp8_weights).
template <int kAct, bool kRowScale>
__global__ void __launch_bounds__(F8Cta<true>::kThreads, 1)
    gemm1_fp8_kernel(const Gemm1Params p, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap b_map, const __grid_constant__ CUtensorMap bs_map) {
#if defined(MXMOE_SM90A)
  extern __shared__ uint8_t f8_smem[];
  const F8Operands o{.wmap = &w_map, .bmap = &b_map, .bsmap = &bs_map, .ws = p.w13f8.scale,
                     .rows_p = p.w13f8.rows_p, .groups = p.w13f8.groups, .counts = p.counts,
                     .offsets = p.offsets, .num_local = p.num_local};
  f8_run<kRowScale>(
      o, f8_smem,
      [&](const float (&acc)[64], const F8RowScales<kRowScale>& row_scales, const PfTile& tile, int wg,
          const F8Ring& ring) { f8_stage_tile(p, acc, row_scales, tile, wg, ring.staged); },
      [&](const PfTile& tile, const F8Ring& ring) {
        // As gemm1_prefill_kernel.
        am::with_form_of_kind<kAct>([&] { return p.alpha[tile.e]; }, [&](auto form) {
          f8_drain_tile<decltype(form)::value>(p, tile, ring);
        });
      });
#endif
}

template <int NT, bool kFp8X, bool kFp8Inter>
void launch_t(const Gemm1Params& p, cudaStream_t stream) {
  constexpr int BT = 8 * NT;
  const int64_t tiles = (p.tokens + BT - 1) / BT;  // rows per expert are <= M unless a
                                                   // token repeats an expert; then the z
                                                   // loop takes the extra tiles
  const dim3 grid(static_cast<unsigned>((p.w13.rg + kWarps - 1) / kWarps),
                  static_cast<unsigned>(p.num_local),
                  static_cast<unsigned>(generic_grid_z(tiles, p.prefill)));
  launch_kernel(gemm1_act_kernel<NT, kFp8X, kFp8Inter>, grid, dim3(kWarps * 32), 0, stream,
                p.prefill && p.fallback_programmatic, p);
  MXMOE_LAUNCH_CHECK("gemm1_act_kernel");
}

/// Calls f(std::integral_constant<int, kAct>{}) for every activation kind a GEMM1 kernel
/// is compiled for (am::with_activation_kind): the register checks below.
template <class F>
void for_each_activation_kind(F&& f) {
  for (int kind : {0, 1, 2, am::kActSituAlpha4, am::kActSituOtherAlpha}) am::with_activation_kind(kind, f);
}

}  // namespace

void check_gemm1_fp8_kernel() {
  for_each_activation_kind([&](auto k) {
    f8_check_registers<true>(reinterpret_cast<const void*>(gemm1_fp8_kernel<decltype(k)::value, false>), "gemm1_fp8_kernel");
    f8_check_registers<true>(reinterpret_cast<const void*>(gemm1_fp8_kernel<decltype(k)::value, true>), "gemm1_fp8_kernel");
  });
}

size_t gemm1_decode_local_bytes() {
  size_t most = 0;
  for_each_activation_kind([&](auto k) {  // the kernels of launch_gemm1's decode classes
    constexpr int kAct = decltype(k)::value;
    most = std::max(most, most_local_bytes({reinterpret_cast<const void*>(gemm1_balanced_kernel<4, false, kAct>),
                                            reinterpret_cast<const void*>(gemm1_balanced_kernel<4, true, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<1, 8, false, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<1, 8, true, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<2, 4, false, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<2, 4, true, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<4, 3, false, kAct>),
                                            reinterpret_cast<const void*>(gemm1_fast_kernel<4, 3, true, kAct>)}));
  });
  return most;
}

void check_gemm1_prefill_kernels() {
  for_each_prefill_tile([&](auto t) {
    constexpr int kTok = decltype(t)::value;
    for_each_activation_kind([&](auto k) {
      constexpr int kAct = decltype(k)::value;
      pf_check_registers<kTok>(reinterpret_cast<const void*>(gemm1_prefill_kernel<false, kTok, kAct>),
                               "gemm1_prefill_kernel");
      pf_check_registers<kTok>(reinterpret_cast<const void*>(gemm1_prefill_kernel<true, kTok, kAct>),
                               "gemm1_prefill_kernel");
    });
  });
}

size_t gemm1_prefill_local_bytes(int kind) {
  size_t most = 0;
  am::with_activation_kind(kind, [&](auto k) {
    constexpr int kAct = decltype(k)::value;
    for_each_prefill_tile([&](auto t) {
      constexpr int kTok = decltype(t)::value;
      most = std::max(most, most_local_bytes({reinterpret_cast<const void*>(gemm1_prefill_kernel<false, kTok, kAct>),
                                              reinterpret_cast<const void*>(gemm1_prefill_kernel<true, kTok, kAct>)}));
    });
  });
  return most;
}

bool prefill_kernels_available() {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, gemm1_prefill_kernel<true, kPfTokens, 0>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.binaryVersion == 90;
}

void launch_gemm1(const Gemm1Params& p, cudaStream_t stream) {
  if (p.fp8) {
    MXMOE_CHECK_ARG(p.xf != nullptr && p.xf_scale != nullptr && p.w13f8.codes != nullptr &&
                        p.inter_fp8 && p.w13f8.rows_p % kF8Rows == 0 && p.w13f8.rows % 64 == 0,
                    "Gemm1Params.xf", "the FP8 mode needs the staged x and its scales, the FP8 "
                    "weights and an MXFP8 intermediate");
    MXMOE_CHECK_ARG(p.if8 == nullptr || (p.if8_scale != nullptr && p.if8_stride % fp8mode::kGroup == 0 &&
                                         p.if8_stride >= p.intermediate &&
                                         p.if8_stride < p.intermediate + fp8mode::kGroup &&
                                         p.if8_scale_rows == fp8_scale_rows(p.tokens * p.top_k)),
                    "Gemm1Params.if8_stride", p.if8_stride, ": GEMM2's staged intermediate needs its scales, ",
                    "the intermediate ", p.intermediate, " rounded up to ", fp8mode::kGroup,
                    " and fp8_scale_rows(M * top_k) scale rows");
    am::with_activation_kind(p.activation, [&](auto kind) {
      with_bool(p.w13f8.row_scale, [&](auto row_c) {
        const auto kernel = gemm1_fp8_kernel<decltype(kind)::value, decltype(row_c)::value>;
        using Cta = F8Cta<true>;
        MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cta::kSmemBytes));
        kernel<<<prefill_ctas(), Cta::kThreads, Cta::kSmemBytes, stream>>>(
            p, fp8_codes_map(p.w13f8.codes, int64_t{p.num_local} * p.w13f8.rows_p, p.w13f8.cols_p),
            fp8_staged_rows_map(p.xf, p.tokens * p.top_k, p.w13f8.cols_p),
            fp8_token_scales_map(p.xf_scale, p.tokens * p.top_k, p.w13f8.groups));
        MXMOE_LAUNCH_CHECK("gemm1_fp8_kernel");
      });
    });
    return;
  }
  if (p.prefill) {
    MXMOE_CHECK_ARG(p.xb != nullptr && p.xb_back != nullptr && p.inexact != nullptr,
                    "Gemm1Params.xb", "the prefill path needs the staged x, its range factors "
                    "and the inexact word");
    MXMOE_CHECK_ARG(p.ib != nullptr && p.ib_stride % 64 == 0 && p.ib_stride >= p.intermediate,
                    "Gemm1Params.ib_stride", p.ib_stride, ": the prefill path stages the "
                    "intermediate in rows of a multiple of 64 >= N ", p.intermediate);
    MXMOE_CHECK_ARG(p.split_count != nullptr, "Gemm1Params.split_count",
                    "the prefill path's item counter follows the split counters");
    if (p.inter_fp8) launch_prefill<true>(p, stream);
    else launch_prefill<false>(p, stream);
    // The generic kernels below leave at once unless the inexact bit is set.
  }
  const FastPlan fast =
      p.prefill ? FastPlan{} : plan_fast(p.tokens, p.x_fp8, p.hidden / kMxBlock, FastGemm::kGemm1);
  MXMOE_CHECK_ARG(p.expert_ready == nullptr || fast.ok, "Gemm1Params.expert_ready",
                  "only the decode kernels count the expert-ready counters (heuristics.h "
                  "use_expert_ready)");
  if (fast.ok) {
    for (int i = 0; i < fast.n; ++i) {
      const FastClass& c = fast.c[i];
      Gemm1Params q = p;
      q.fast = FastLaunch{c.lo, c.hi, c.z};
      q.programmatic = p.programmatic && i == 0;  // the next class follows this launch
      if (c.nt == 1 && c.depth == 4 && use_balanced(p.tokens)) {
        // 2..32 tokens: one class (plan_fast), every expert's 8-row tiles in one wave.
        if (p.inter_fp8) launch_balanced<4, true>(q, stream);
        else launch_balanced<4, false>(q, stream);
        continue;
      }
      const int sel = (c.nt == 1 ? 6 : c.nt == 2 ? 2 : 4) | (p.inter_fp8 ? 1 : 0);
      switch (sel) {
        case 6: launch_fast<1, 8, false>(q, stream); break;
        case 7: launch_fast<1, 8, true>(q, stream); break;
        case 2: launch_fast<2, 4, false>(q, stream); break;
        case 3: launch_fast<2, 4, true>(q, stream); break;
        case 4: launch_fast<4, 3, false>(q, stream); break;
        default: launch_fast<4, 3, true>(q, stream); break;
      }
    }
    return;
  }
  const GemmPlan plan = plan_gemm(p.tokens);
  const int sel = (plan.nt == 1 ? 4 : 0) | (p.x_fp8 ? 2 : 0) | (p.inter_fp8 ? 1 : 0);
  switch (sel) {
    case 0: return launch_t<4, false, false>(p, stream);
    case 1: return launch_t<4, false, true>(p, stream);
    case 2: return launch_t<4, true, false>(p, stream);
    case 3: return launch_t<4, true, true>(p, stream);
    case 4: return launch_t<1, false, false>(p, stream);
    case 5: return launch_t<1, false, true>(p, stream);
    case 6: return launch_t<1, true, false>(p, stream);
    default: return launch_t<1, true, true>(p, stream);
  }
}

}  // namespace mxmoe::cuda_detail
