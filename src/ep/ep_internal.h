// ep_internal.h — what the EP sources share: the NCCL error check, the forced
// environment, and one launcher per EP kernel (kernels.cu).
// Launchers enqueue on the given stream, check the launch, and never synchronize.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "mxmoe/error.h"
#include "mxmoe/moe.h"
#include "nccl_api.h"

namespace mxmoe::ep_detail {

[[noreturn]] inline void throw_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  throw Error(detail::cat(call, " failed: ", nccl_api().GetErrorString(r), " (ncclResult ",
                          static_cast<int>(r), ") at ", file, ":", line,
                          "; NCCL_DEBUG=WARN in the environment says more"));
}

/// NVLink multicast (NVLS) stays off: this library never uses it, and where it is
/// enabled NCCL may call cuMulticastCreate at communicator setup. Overwrites any value,
/// since a user's NCCL_NVLS_ENABLE=1 must not turn it on. Called before every NCCL entry
/// point that can read the environment.
void force_nccl_environment();

/// Rank that owns global expert `id` with contiguous ownership, or -1 (id == -1 or out
/// of range). Shared by the kernels and the host-side emulation in the tests' reasoning.
__host__ __device__ inline int owner_of(int32_t id, int64_t num_experts, int64_t e_local) {
  if (id < 0 || id >= num_experts) return -1;
  return static_cast<int>(id / e_local);
}

struct PlanParams {
  const int32_t* ids = nullptr;  // [M][k] global ids of this rank's tokens
  int64_t tokens = 0, top_k = 0, num_experts = 0, e_local = 0;
  int world = 1;
  int64_t rows_cap = 0;          // max_tokens_per_rank
  int32_t* pos = nullptr;        // [M][W]: row of token t in the block sent to d, or -1
  int32_t* src_tok = nullptr;    // [W][rows_cap]: token of each sent row
  int32_t* counts = nullptr;     // [W]: rows sent to d
  uint32_t* error = nullptr;     // bit 0: an id outside [-1, E) was seen
};
/// One block per peer d, scanning tokens in order: deterministic positions.
void launch_plan(const PlanParams& p, cudaStream_t stream);

struct PackParams {
  const void* x = nullptr;           // [M][row_bytes] e4m3 codes or bf16
  const uint8_t* x_scale = nullptr;  // [M][K/32] or null (bf16)
  const int32_t* ids = nullptr;      // [M][k]
  const float* weights = nullptr;    // [M][k]
  const int32_t* src_tok = nullptr;
  const int32_t* counts = nullptr;
  int64_t row_bytes = 0, scale_bytes = 0, top_k = 0, rows_cap = 0;
  int world = 1;
  bool padded = false;               // fill rows [count, rows_cap) with ids -1, zeros
  uint8_t* send_x = nullptr;         // [W][rows_cap][row_bytes]
  uint8_t* send_scale = nullptr;     // [W][rows_cap][scale_bytes]
  int32_t* send_ids = nullptr;       // [W][rows_cap][k]
  float* send_weights = nullptr;     // [W][rows_cap][k]
};
/// One block per destination row (gather by src_tok): copies x, scales, the full id
/// row and the weight row of each sent token.
void launch_pack(const PackParams& p, cudaStream_t stream);

struct CombineParams {
  const float* back = nullptr;   // [W][rows_cap][K] fp32 partial outputs, per owner rank
  const int32_t* pos = nullptr;  // [M][W]
  int64_t tokens = 0, hidden = 0, rows_cap = 0;
  int world = 1;
  float output_scale = 1.0f;
  void* out = nullptr;           // [M][K] bf16 or fp32
  bool out_fp32 = false;
};
/// out[t] = output_scale * (sum over d = 0..W-1, in rank order, of back[d][pos[t][d]]).
void launch_combine(const CombineParams& p, cudaStream_t stream);

}  // namespace mxmoe::ep_detail

/// Throw mxmoe::Error (call, NCCL's error string, file:line) unless the call succeeded.
#define MXMOE_NCCL_CHECK(call)                                                    \
  do {                                                                            \
    const ncclResult_t mxmoe_nccl_r_ = (call);                                    \
    if (mxmoe_nccl_r_ != ncclSuccess)                                             \
      ::mxmoe::ep_detail::throw_nccl(mxmoe_nccl_r_, #call, __FILE__, __LINE__);   \
  } while (0)
