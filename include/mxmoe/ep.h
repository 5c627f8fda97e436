// mxmoe/ep.h — expert parallelism across GPUs (SPEC §4): tokens travel to the ranks
// that own their experts with NCCL (grouped ncclSend/ncclRecv), each rank runs its local
// experts with the fused layer (CudaMoeLayer), and the results travel back and are summed
// in token order. Host-only: no CUDA or NCCL types (streams and events are void*, the
// NCCL unique id is 128 bytes). In a build without NCCL (or without CUDA) every entry
// point throws Unsupported saying so, and ep_built() is false.
//
// One process per GPU. ep_launch() starts them on one host without MPI; engines with their
// own launcher call ep_unique_id() on one rank, share the bytes, and build an EpComm on
// every rank. Everything that talks to the other ranks (EpComm, CudaEpLayer's
// constructor and forward, the session helpers) is collective: every rank calls it, in
// the same order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/moe.h"

namespace mxmoe {

/// True when the library was built with NCCL (and CUDA): the EP layer is available.
bool ep_built();

/// ncclUniqueId's bytes: made on one rank, handed to all the others.
using EpUniqueId = std::array<char, 128>;
/// A fresh NCCL unique id (ncclGetUniqueId). Forces NCCL_NVLS_ENABLE=0 first.
EpUniqueId ep_unique_id();

/// One NCCL communicator: this process is `rank` of `world_size`, on GPU `device` (-1:
/// the current device). Collective: every rank constructs it with the same id. Sets
/// NCCL_NVLS_ENABLE=0 (overwriting any value) before NCCL sees the environment: this
/// library never uses NVLink multicast.
class EpComm {
 public:
  EpComm(const EpUniqueId& id, int world_size, int rank, int device = -1);
  ~EpComm();
  EpComm(const EpComm&) = delete;
  EpComm& operator=(const EpComm&) = delete;

  int world_size() const;
  int rank() const;
  int device() const;
  /// The ncclComm_t, for callers that add their own collectives.
  void* handle() const;

  /// Element-wise maximum of `v` over the ranks (same length everywhere); synchronous.
  std::vector<double> max_over_ranks(const std::vector<double>& v) const;

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

enum class EpMode : int {
  /// Every pair of ranks exchanges exactly max_tokens_per_rank rows per forward (rows
  /// not needed carry topk ids -1 and zero activations, and produce zero rows). No host
  /// synchronization: forward() is CUDA-graph capturable (NCCL send/recv capture) once
  /// one eager forward has run (NCCL connects the peers on first use, which cannot be
  /// captured; CudaEpHostSession::run_graph does that warm-up).
  Padded = 0,
  /// Row counts are exchanged first (a tiny NCCL send/recv) and copied to the host, so
  /// exactly the needed rows move and the local experts run on exactly the received
  /// rows. That copy SYNCHRONIZES the stream: forward() is not capturable in this mode
  /// (it throws InvalidArgument("stream") when called on a capturing stream).
  Exact = 1,
};
const char* to_string(EpMode m);

/// One MoE layer's routed experts spread over the ranks of `comm`: rank r owns global
/// experts [r*E_local, (r+1)*E_local), E_local = num_experts / ep_size.
class CudaEpLayer {
 public:
  /// `cfg`: the layer as this rank sees it: ep_size == comm.world_size(), ep_rank ==
  /// comm.rank(), expert_map empty (contiguous ownership). `weights`: this rank's local
  /// experts. Up to `max_tokens_per_rank` tokens per rank per forward. Uploads the weights
  /// and allocates every buffer (about W*max_tokens_per_rank rows of activations, routing,
  /// fp32 partial outputs, plus the local layer's workspace for that many rows).
  /// Collective: the ranks check with each other that max_tokens_per_rank, the mode and
  /// the shapes agree; when any rank's arguments are bad every rank throws (the bad rank
  /// its own error, the others an Error saying which rank failed).
  CudaEpLayer(const MoeConfig& cfg, const ExpertWeights& weights, const EpComm& comm,
              int64_t max_tokens_per_rank, EpMode mode = EpMode::Padded);
  ~CudaEpLayer();
  CudaEpLayer(const CudaEpLayer&) = delete;
  CudaEpLayer& operator=(const CudaEpLayer&) = delete;

  const MoeConfig& config() const;
  EpMode mode() const;
  int64_t max_tokens_per_rank() const;
  const EpComm& comm() const;

  /// This rank's M_r = args.tokens tokens (0 <= M_r <= max_tokens_per_rank; 0 is allowed
  /// and the rank still takes part): x [M_r][K] (bf16 or MXFP8, args.x_format),
  /// topk_ids [M_r][top_k] GLOBAL ids (-1 = none), topk_weights, out [M_r][K] in
  /// config.output_format. Router logits are not supported (route first). Device
  /// pointers on the layer's GPU, the current device; `stream` a cudaStream_t.
  /// Validates every argument on the host before launching anything (InvalidArgument
  /// naming it; nothing of the caller's is read or written); because forward is
  /// collective, a rank whose arguments are rejected first takes part in the exchange
  /// with no tokens, so its peers finish this forward, then throws. A wrong current
  /// device or a capturing stream in Exact mode throws at once (this rank cannot take
  /// part; the peers then wait in the exchange). Never allocates; in Padded mode never
  /// synchronizes the host. Ids outside [-1, num_experts) are skipped and flagged
  /// (read_error_flags).
  /// `phase_events` (optional, benchmarks): 4 cudaEvent_t recorded on `stream` at the
  /// start, after dispatch, after the local experts and at the end.
  /// Collective: every rank calls forward the same number of times, in the same order.
  /// The layer owns its exchange buffers: forwards on one layer must be stream-ordered
  /// (one stream, or synchronized), never concurrent.
  void forward(const ForwardArgs& args, void* stream, void* const* phase_events = nullptr) const;

  /// CudaMoeLayer::kErrorExpertIdOutOfRange when the last forward on this rank skipped an
  /// id outside [-1, num_experts) (its own tokens' or a received token's). Synchronizes
  /// `stream`.
  uint32_t read_error_flags(void* stream) const;

  struct Impl;
 private:
  void check_forward_args(const ForwardArgs& args, void* const* phase_events) const;
  void run_forward(const ForwardArgs& args, void* stream, void* const* phase_events) const;
  std::unique_ptr<Impl> impl_;
};

/// Host-side driver for the tests and ep-bench (not for serving: it synchronizes): owns
/// device copies of one rank's inputs and output, runs the EP layer eagerly or through a
/// captured CUDA graph, and times its phases. Collective like the layer.
class CudaEpHostSession {
 public:
  explicit CudaEpHostSession(const CudaEpLayer& layer);
  ~CudaEpHostSession();
  CudaEpHostSession(const CudaEpHostSession&) = delete;
  CudaEpHostSession& operator=(const CudaEpHostSession&) = delete;

  /// This rank's tokens (x.tokens may be 0; routing.tokens must equal it).
  void set_inputs(const Activations& x, const Routing& routing);
  /// Poison the output with NaN, run once, copy the output back.
  Output run_eager();
  /// Capture one forward into a CUDA graph (Padded mode only), then poison and replay
  /// `replays` times, returning each replay's output.
  std::vector<Output> run_graph(int replays);

  struct PhaseTiming {
    double dispatch_us = 0, experts_us = 0, combine_us = 0, total_us = 0;  // medians
    int iterations = 0;
  };
  /// `iterations` timed forwards (eager, or graph replays in Padded mode), each after a
  /// barrier across the ranks and a write of a buffer larger than L2 (cold cache); per
  /// phase, the median over the iterations of this rank's CUDA-event times. Graph replays
  /// report total_us only (the phases stay 0).
  PhaseTiming time(int iterations, bool use_graph);

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

/// NCCL point-to-point bandwidth beside the EP numbers: every rank r sends `bytes` to rank
/// (r+1) % W and receives as many from (r-1+W) % W in one group, `iterations` times back
/// to back, in 5 trials. Collective. Returns this rank's median over the trials of the
/// time per transfer and bytes / time in GB/s (1e9 B/s, one direction of one link; with
/// W = 2 both directions of the link are busy at once).
struct EpBandwidth {
  size_t bytes = 0;
  double median_us = 0, gbps = 0;
};
EpBandwidth ep_sendrecv_bandwidth(const EpComm& comm, size_t bytes, int iterations);

/// Starts `ranks` processes on this host, one per GPU, without MPI: forks the children
/// first (the calling process must not have initialised CUDA: CUDA does not survive a
/// fork), child 0 makes the NCCL unique id and the parent hands it to the others through
/// pipes. Child r makes GPU r current (cudaSetDevice(r)), runs body(r, ranks, id) and
/// exits with its return value (an exception is printed and exits 1); stdout/stderr are
/// flushed first. Returns 0 when every child exited 0, else the first non-zero exit code
/// in rank order (a child killed by a signal counts as 128 + signal). A child still
/// running after `timeout_s` seconds is killed (SIGKILL) and reported on stderr.
/// NCCL_NVLS_ENABLE is forced to 0 in the environment before the fork.
int ep_launch(int ranks, const std::function<int(int rank, int ranks, const EpUniqueId& id)>& body,
              int timeout_s = 600);

/// cuda_device_count() asked in a forked child, so the caller stays CUDA-free and can
/// still ep_launch() afterwards (tests and the CLI decide before launching). 0 when the
/// child fails.
int ep_device_count();

}  // namespace mxmoe
