// CudaHostSession: the synchronous host driver used by the CLI, the validation suite,
// the benchmark and the tests (see cuda.h). Serving engines call forward() directly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "host_session.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe {

namespace {
void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(detail::cat(what, ": ", cudaGetErrorString(e), " (", file, ":", line, ")"));
}
#define HS_CHECK(x) check((x), #x, __FILE__, __LINE__)

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void reserve(size_t n) {
    if (n <= bytes) return;
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    HS_CHECK(cudaMalloc(&ptr, n));
    bytes = n;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};
}  // namespace

struct CudaHostSession::Impl {
  const CudaMoeLayer* layer = nullptr;
  int64_t max_tokens = 0;
  cudaStream_t stream = nullptr;
  DeviceBuffer workspace, x, x_scale, ids, weights, logits, out, flush;
  size_t workspace_bytes = 0;
  ForwardArgs args;
  size_t out_bytes = 0;

  void poison_output() { cuda_detail::poison_output(out.ptr, out_bytes, stream); }
  Output fetch_output() { return cuda_detail::fetch_output(out.ptr, layer->config(), args.tokens, stream); }
  void launch() { layer->forward(args, workspace.ptr, workspace_bytes, stream); }
  /// Copy x and one routing input (ids/weights, or `count` logits of `logit_bytes` each:
  /// 4 for fp32, 2 for BF16) to the device, and set args to read them.
  void stage(const Activations& x, const Routing* routing, const void* logits, size_t count,
             size_t logit_bytes);
};

CudaHostSession::CudaHostSession(const CudaMoeLayer& layer, int64_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  MXMOE_CHECK_ARG(max_tokens >= 1, "max_tokens", "must be >= 1, got ", max_tokens);
  impl_->layer = &layer;
  impl_->max_tokens = max_tokens;
  HS_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  impl_->workspace_bytes = layer.workspace_size(max_tokens);
  impl_->workspace.reserve(std::max<size_t>(impl_->workspace_bytes, 1));
}

CudaHostSession::~CudaHostSession() {
  if (impl_ && impl_->stream) cudaStreamDestroy(impl_->stream);
}

void CudaHostSession::set_inputs(const Activations& x, const Routing* routing,
                                 const std::vector<float>* logits) {
  MXMOE_CHECK_ARG((routing != nullptr) != (logits != nullptr), "routing",
                  "give exactly one of topk ids/weights and router logits");
  impl_->stage(x, routing, logits ? logits->data() : nullptr, logits ? logits->size() : 0, 4);
}

void CudaHostSession::set_inputs(const Activations& x, const std::vector<uint16_t>& logits_bf16) {
  impl_->stage(x, nullptr, logits_bf16.data(), logits_bf16.size(), 2);
}

void CudaHostSession::Impl::stage(const Activations& x, const Routing* routing, const void* logits,
                                  size_t count, size_t logit_bytes) {
  Impl& s = *this;
  const MoeConfig& cfg = s.layer->config();
  MXMOE_CHECK_ARG(x.tokens >= 1 && x.tokens <= s.max_tokens, "x.tokens",
                  "must be in [1, ", s.max_tokens, "], got ", x.tokens);
  x.validate("x", cfg.hidden);
  const int64_t M = x.tokens, K = cfg.hidden;
  // Every check before the first copy; and until this call succeeds no run uses the old
  // inputs (the buffers below may be reallocated under the old arguments' pointers).
  if (routing) {
    routing->validate(cfg);
    MXMOE_CHECK_ARG(routing->tokens == M, "routing.tokens", "must equal x.tokens (", M, "), got ",
                    routing->tokens);
  } else {
    MXMOE_CHECK_ARG(static_cast<int64_t>(count) == M * cfg.num_experts,
                    logit_bytes == 2 ? "router_logits_bf16" : "router_logits",
                    "size must be tokens*num_experts = ", M * cfg.num_experts, ", got ", count);
  }
  s.args = ForwardArgs{};
  ForwardArgs a;
  a.tokens = M;
  a.x_format = x.format;
  if (x.format == InputFormat::BF16) {
    s.x.reserve(x.bf16.size() * 2);
    HS_CHECK(cudaMemcpy(s.x.ptr, x.bf16.data(), x.bf16.size() * 2, cudaMemcpyHostToDevice));
  } else {
    s.x.reserve(x.fp8.size());
    s.x_scale.reserve(x.scale.size());
    HS_CHECK(cudaMemcpy(s.x.ptr, x.fp8.data(), x.fp8.size(), cudaMemcpyHostToDevice));
    HS_CHECK(cudaMemcpy(s.x_scale.ptr, x.scale.data(), x.scale.size(), cudaMemcpyHostToDevice));
    a.x_scale = static_cast<const uint8_t*>(s.x_scale.ptr);
  }
  a.x = s.x.ptr;
  if (routing) {
    s.ids.reserve(routing->ids.size() * 4);
    s.weights.reserve(routing->weights.size() * 4);
    HS_CHECK(cudaMemcpy(s.ids.ptr, routing->ids.data(), routing->ids.size() * 4, cudaMemcpyHostToDevice));
    HS_CHECK(cudaMemcpy(s.weights.ptr, routing->weights.data(), routing->weights.size() * 4,
                        cudaMemcpyHostToDevice));
    a.topk_ids = static_cast<const int32_t*>(s.ids.ptr);
    a.topk_weights = static_cast<const float*>(s.weights.ptr);
  } else {
    s.logits.reserve(count * logit_bytes);
    HS_CHECK(cudaMemcpy(s.logits.ptr, logits, count * logit_bytes, cudaMemcpyHostToDevice));
    if (logit_bytes == 2)
      a.router_logits_bf16 = static_cast<const uint16_t*>(s.logits.ptr);
    else
      a.router_logits = static_cast<const float*>(s.logits.ptr);
  }
  s.out_bytes = static_cast<size_t>(M * K) * (cfg.output_format == OutputFormat::BF16 ? 2 : 4);
  s.out.reserve(s.out_bytes);
  a.out = s.out.ptr;
  s.args = a;
}

Output CudaHostSession::run_eager() {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.args.tokens > 0, "inputs", "set_inputs() must be called first");
  s.poison_output();
  s.launch();
  return s.fetch_output();
}

std::vector<Output> CudaHostSession::run_graph(int replays) {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.args.tokens > 0, "inputs", "set_inputs() must be called first");
  MXMOE_CHECK_ARG(replays >= 1, "replays", "must be >= 1, got ", replays);
  HS_CHECK(cudaStreamSynchronize(s.stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  HS_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    s.launch();
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  HS_CHECK(cudaStreamEndCapture(s.stream, &graph));
  HS_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<Output> outs;
  for (int i = 0; i < replays; ++i) {
    s.poison_output();
    HS_CHECK(cudaGraphLaunch(exec, s.stream));
    outs.push_back(s.fetch_output());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return outs;
}

CudaHostSession::Timing CudaHostSession::time(int iterations, bool use_graph) {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.args.tokens > 0, "inputs", "set_inputs() must be called first");
  MXMOE_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  // Cold L2: write a buffer of 4x the L2 size between runs, outside the timed region.
  int dev = 0, l2 = 0;
  HS_CHECK(cudaGetDevice(&dev));
  HS_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t flush_bytes = std::max<size_t>(static_cast<size_t>(l2) * 4, 1 << 20);
  s.flush.reserve(flush_bytes);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (use_graph) {
    HS_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    s.launch();
    HS_CHECK(cudaStreamEndCapture(s.stream, &graph));
    HS_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  auto once = [&] {
    if (use_graph) HS_CHECK(cudaGraphLaunch(exec, s.stream));
    else s.launch();
  };
  for (int i = 0; i < 3; ++i) once();  // warm-up
  cudaEvent_t start, stop;
  HS_CHECK(cudaEventCreate(&start));
  HS_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    HS_CHECK(cudaMemsetAsync(s.flush.ptr, i & 0xFF, flush_bytes, s.stream));
    HS_CHECK(cudaEventRecord(start, s.stream));
    once();
    HS_CHECK(cudaEventRecord(stop, s.stream));
    HS_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    HS_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  Timing t;
  t.iterations = iterations;
  t.min_us = us.front();
  t.max_us = us.back();
  t.median_us = us[us.size() / 2];
  return t;
}

}  // namespace mxmoe
