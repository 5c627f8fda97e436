// mxmoe/cuda.h — the CUDA engine's public API. Host-only users include it without
// CUDA headers: streams are passed as void* (a cudaStream_t). In a build without CUDA
// every function here throws Unsupported saying so, and cuda_device_count() returns 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/routing.h"

namespace mxmoe {

/// True when the library was compiled with the CUDA engine.
bool cuda_built();
/// Number of usable GPUs (0 without CUDA or without a driver/GPU; never throws).
int cuda_device_count();

/// What the library runs at all, by the names its parsers take: the CPU engine and the
/// reference run every one (exactly); a GPU's lists (GpuCapabilities) are drawn from
/// these. The one place `mxmoe info` and Python's mxmoe.capabilities() read them from.
struct LibraryCapabilities {
  std::vector<std::string> activations;           // situ, swiglu, silu
  std::vector<std::string> input_formats;         // bf16, mxfp8
  std::vector<std::string> intermediate_formats;  // bf16, mxfp8 (and auto, which resolves to one)
  std::vector<std::string> output_formats;        // bf16, fp32
  std::vector<std::string> weight_formats;        // mxfp4
  std::vector<std::string> w13_layouts;           // gate_up, interleaved, up_gate
  std::vector<std::string> checkpoint_formats;    // kimi, gpt-oss
  std::vector<std::string> routers;               // sigmoid (+bias, group-limited), softmax
};
const LibraryCapabilities& library_capabilities();

/// What the CUDA engine runs on one GPU (SPEC §10: an engine decides once, at start-up).
/// Every list is empty on a GPU the engine does not support.
struct GpuCapabilities {
  std::vector<std::string> activations;           // situ, swiglu, silu
  std::vector<std::string> input_formats;         // bf16, mxfp8
  std::vector<std::string> intermediate_formats;  // bf16, mxfp8
  std::vector<std::string> output_formats;        // bf16, fp32
  std::vector<std::string> precisions;            // exact; fp8 (the FP8 mode) on Hopper with sm_90a kernels
  std::vector<std::string> paths;                 // decode (mma.sync); prefill (wgmma, sm_90a kernels on Hopper)
};
/// The capabilities of a GPU of compute capability `sm_major`.x: `supported`, this build
/// has kernels for it; `sm90a_kernels`, this build's sm_90a kernels (the wgmma prefill
/// path and the FP8 mode) run on it. A pure function of those (tested without a GPU).
GpuCapabilities gpu_capabilities(bool supported, int sm_major, bool sm90a_kernels);

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0, sm_count = 0;
  size_t memory_bytes = 0;
  bool supported = false;     // the engine has code for this architecture
  std::string note;           // why not, when not; when supported, the capabilities in words
  GpuCapabilities capabilities;
};
std::vector<GpuInfo> cuda_devices();

/// Device pointers for one forward call. Exactly one of {topk_ids+topk_weights},
/// {router_logits} and {router_logits_bf16} is given; with logits the layer routes on
/// the GPU with the RoutingParams it was built with (BF16 logits widened exactly, so
/// both give route_cpu's result on the same values).
struct ForwardArgs {
  int64_t tokens = 0;
  InputFormat x_format = InputFormat::BF16;  // what `x` holds; BF16 is quantized on the
                                             // GPU when the layer consumes MXFP8
  const void* x = nullptr;          // [M][K] bf16 bits or E4M3 codes
  const uint8_t* x_scale = nullptr; // [M][K/32] when x_format is MXFP8
  const int32_t* topk_ids = nullptr;      // [M][top_k] global ids, -1 = none
  const float* topk_weights = nullptr;    // [M][top_k]
  const float* router_logits = nullptr;   // [M][E_global] fp32
  const uint16_t* router_logits_bf16 = nullptr;  // [M][E_global] bf16 bits, instead
  void* out = nullptr;              // [M][K] bf16 or fp32 (config.output_format)
};

/// One MoE layer resident on a GPU: weights converted and uploaded once. forward()
/// never allocates, never synchronizes the host, launches only on the given stream,
/// and is CUDA-graph capturable for a fixed maximum token count.
class CudaMoeLayer {
 public:
  /// Checks that this GPU supports what `cfg` asks (throws Unsupported naming the
  /// feature and the alternative), validates the weights and uploads them.
  /// `routing` is needed only for forward() calls that pass router logits (fp32 or BF16);
  /// `router_bias` [E_global] (nullable) is uploaded with it.
  CudaMoeLayer(const MoeConfig& cfg, const ExpertWeights& weights,
               const RoutingParams* routing = nullptr, const std::vector<float>* router_bias = nullptr,
               int device = -1);
  ~CudaMoeLayer();
  CudaMoeLayer(const CudaMoeLayer&) = delete;
  CudaMoeLayer& operator=(const CudaMoeLayer&) = delete;

  const MoeConfig& config() const;
  /// Bytes of device workspace forward() needs for up to max_tokens tokens.
  size_t workspace_size(int64_t max_tokens) const;
  /// Validates every argument on the host (throws InvalidArgument, nothing launched),
  /// then enqueues the whole MoE on `stream` (a cudaStream_t). No tokens (args.tokens
  /// 0) is a valid forward that touches none of the caller's tensors (their pointers may
  /// be null) and clears the error word.
  void forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, void* stream) const;

  /// Device-side error flags of the last forward() that used `workspace`: bit
  /// kErrorExpertIdOutOfRange means a topk id outside [-1, num_experts) was skipped
  /// (never dereferenced; the slot contributed nothing). forward() writes the word on
  /// the GPU without synchronizing the host, so a caller reads it after the fact:
  /// error_flags_device() for a device-side reader (e.g. inside a captured graph),
  /// read_error_flags() to copy it to the host (synchronizes `stream`).
  static constexpr uint32_t kErrorExpertIdOutOfRange = 1u;
  const uint32_t* error_flags_device(const void* workspace) const;
  uint32_t read_error_flags(const void* workspace, void* stream) const;

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxmoe

namespace mxmoe {

/// Host-side driver for the CLI, the validation suite and the tests: owns device
/// buffers for up to max_tokens tokens, copies host inputs in, runs the layer eagerly or
/// through a captured CUDA graph, and copies the output back. Not for serving (it
/// synchronizes); engines call CudaMoeLayer::forward directly.
class CudaHostSession {
 public:
  CudaHostSession(const CudaMoeLayer& layer, int64_t max_tokens);
  ~CudaHostSession();
  CudaHostSession(const CudaHostSession&) = delete;
  CudaHostSession& operator=(const CudaHostSession&) = delete;

  /// Stage inputs (x as given; routing either ids/weights or router logits [M][E]).
  void set_inputs(const Activations& x, const Routing* routing, const std::vector<float>* logits);
  /// The same with BF16 router logits [M][E] (bits).
  void set_inputs(const Activations& x, const std::vector<uint16_t>& logits_bf16);
  /// Poison the output with NaN, run once eagerly, copy the output back.
  Output run_eager();
  /// Capture one forward into a CUDA graph, then poison + replay `replays` times,
  /// returning each replay's output.
  std::vector<Output> run_graph(int replays);

  struct Timing {
    double median_us = 0, min_us = 0, max_us = 0;
    int iterations = 0;
  };
  /// Time forward with CUDA events: `iterations` runs, each preceded by a write of a
  /// buffer larger than L2 (cold cache), eager or graph replay; median of the runs.
  Timing time(int iterations, bool use_graph);

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxmoe
