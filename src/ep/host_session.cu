// host_session.cu — CudaEpHostSession (ep.h): the synchronous per-rank driver of the
// tests and ep-bench. Serving engines call CudaEpLayer::forward directly.
#include <algorithm>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/host_session.h"
#include "ep_internal.h"
#include "mxmoe/ep.h"

namespace mxmoe {

namespace {

struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(size_t bytes) { MXMOE_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 256))); }
  ~Buffer() {
    if (ptr) cudaFree(ptr);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

struct CudaEpHostSession::Impl {
  const CudaEpLayer* layer = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[4] = {};
  std::unique_ptr<Buffer> x, x_scale, ids, weights, out, barrier;
  ForwardArgs args;
  bool have_inputs = false;
  size_t out_bytes = 0;

  void poison() { cuda_detail::poison_output(out->ptr, out_bytes, stream); }
  Output fetch() { return cuda_detail::fetch_output(out->ptr, layer->config(), args.tokens, stream); }
  // A collective on the stream: every rank's following work starts after all ranks got
  // here (on the GPUs, without a host round trip).
  void barrier_on_stream() {
    MXMOE_NCCL_CHECK(ep_detail::nccl_api().AllReduce(barrier->ptr, barrier->ptr, 1, ncclFloat32, ncclSum,
                                   static_cast<ncclComm_t>(layer->comm().handle()), stream));
  }
};

CudaEpHostSession::CudaEpHostSession(const CudaEpLayer& layer) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.layer = &layer;
  const MoeConfig& cfg = layer.config();
  MXMOE_CUDA_CHECK(cudaSetDevice(layer.comm().device()));
  const size_t R = static_cast<size_t>(layer.max_tokens_per_rank());
  const size_t K = static_cast<size_t>(cfg.hidden), k = static_cast<size_t>(cfg.top_k);
  s.x = std::make_unique<Buffer>(R * K * 2);
  s.x_scale = std::make_unique<Buffer>(R * K / kMxBlock);
  s.ids = std::make_unique<Buffer>(R * k * 4);
  s.weights = std::make_unique<Buffer>(R * k * 4);
  s.out = std::make_unique<Buffer>(R * K * 4);
  s.barrier = std::make_unique<Buffer>(4);
  MXMOE_CUDA_CHECK(cudaMemset(s.barrier->ptr, 0, 4));
  MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : s.ev) MXMOE_CUDA_CHECK(cudaEventCreate(&e));
}

CudaEpHostSession::~CudaEpHostSession() {
  if (!impl_) return;
  if (impl_->stream) cudaStreamSynchronize(impl_->stream);
  for (cudaEvent_t e : impl_->ev)
    if (e) cudaEventDestroy(e);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void CudaEpHostSession::set_inputs(const Activations& x, const Routing& routing) {
  Impl& s = *impl_;
  const MoeConfig& cfg = s.layer->config();
  const int64_t R = s.layer->max_tokens_per_rank();
  MXMOE_CHECK_ARG(x.tokens >= 0 && x.tokens <= R, "x.tokens", "must be in [0, ", R, "], got ",
                  x.tokens);
  x.validate("x", cfg.hidden);
  routing.validate(cfg);
  MXMOE_CHECK_ARG(routing.tokens == x.tokens, "routing.tokens", "must equal x.tokens (", x.tokens,
                  "), got ", routing.tokens);
  const int64_t M = x.tokens;
  ForwardArgs a;
  a.tokens = M;
  a.x_format = x.format;
  if (x.format == InputFormat::BF16) {
    if (M) MXMOE_CUDA_CHECK(cudaMemcpy(s.x->ptr, x.bf16.data(), x.bf16.size() * 2, cudaMemcpyHostToDevice));
  } else {
    if (M) {
      MXMOE_CUDA_CHECK(cudaMemcpy(s.x->ptr, x.fp8.data(), x.fp8.size(), cudaMemcpyHostToDevice));
      MXMOE_CUDA_CHECK(cudaMemcpy(s.x_scale->ptr, x.scale.data(), x.scale.size(), cudaMemcpyHostToDevice));
    }
    a.x_scale = static_cast<const uint8_t*>(s.x_scale->ptr);
  }
  a.x = s.x->ptr;
  if (M) {
    MXMOE_CUDA_CHECK(cudaMemcpy(s.ids->ptr, routing.ids.data(), routing.ids.size() * 4, cudaMemcpyHostToDevice));
    MXMOE_CUDA_CHECK(cudaMemcpy(s.weights->ptr, routing.weights.data(), routing.weights.size() * 4,
                                cudaMemcpyHostToDevice));
  }
  a.topk_ids = static_cast<const int32_t*>(s.ids->ptr);
  a.topk_weights = static_cast<const float*>(s.weights->ptr);
  a.out = s.out->ptr;
  s.out_bytes = static_cast<size_t>(M * cfg.hidden) * (cfg.output_format == OutputFormat::BF16 ? 2 : 4);
  s.args = a;
  s.have_inputs = true;
}

Output CudaEpHostSession::run_eager() {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.have_inputs, "inputs", "set_inputs() must be called first");
  s.poison();
  s.layer->forward(s.args, s.stream);
  return s.fetch();
}

std::vector<Output> CudaEpHostSession::run_graph(int replays) {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.have_inputs, "inputs", "set_inputs() must be called first");
  MXMOE_CHECK_ARG(replays >= 1, "replays", "must be >= 1, got ", replays);
  MXMOE_CHECK_ARG(s.layer->mode() == EpMode::Padded, "mode",
                  "graph capture needs EpMode::Padded (Exact mode synchronizes the host)");
  // One eager forward first: NCCL connects peers lazily on their first send/recv, which
  // must not happen inside a capture.
  s.layer->forward(s.args, s.stream);
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MXMOE_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    s.layer->forward(s.args, s.stream);
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  MXMOE_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
  MXMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<Output> outs;
  try {
    for (int i = 0; i < replays; ++i) {
      s.poison();
      MXMOE_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
      outs.push_back(s.fetch());
    }
  } catch (...) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return outs;
}

CudaEpHostSession::PhaseTiming CudaEpHostSession::time(int iterations, bool use_graph) {
  Impl& s = *impl_;
  MXMOE_CHECK_ARG(s.have_inputs, "inputs", "set_inputs() must be called first");
  MXMOE_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  if (use_graph)
    MXMOE_CHECK_ARG(s.layer->mode() == EpMode::Padded, "use_graph",
                    "graph capture needs EpMode::Padded (Exact mode synchronizes the host)");
  int dev = 0, l2 = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t flush_bytes = std::max<size_t>(static_cast<size_t>(l2) * 4, 1 << 20);
  Buffer flush(flush_bytes);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  struct GraphHold {
    cudaGraph_t& g;
    cudaGraphExec_t& e;
    ~GraphHold() {
      if (e) cudaGraphExecDestroy(e);
      if (g) cudaGraphDestroy(g);
    }
  } hold{graph, exec};
  for (int i = 0; i < 3; ++i) s.layer->forward(s.args, s.stream);  // warm-up (NCCL connects)
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  if (use_graph) {
    MXMOE_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    try {
      s.layer->forward(s.args, s.stream);
    } catch (...) {
      cudaStreamEndCapture(s.stream, &graph);
      throw;
    }
    MXMOE_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
    MXMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MXMOE_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
  }
  std::vector<double> dispatch, experts, combine, total;
  for (int i = 0; i < iterations; ++i) {
    s.barrier_on_stream();
    MXMOE_CUDA_CHECK(cudaMemsetAsync(flush.ptr, i & 0xFF, flush_bytes, s.stream));
    if (use_graph) {
      // Phases are not separated inside a replay: the total only.
      MXMOE_CUDA_CHECK(cudaEventRecord(s.ev[0], s.stream));
      MXMOE_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
      MXMOE_CUDA_CHECK(cudaEventRecord(s.ev[3], s.stream));
    } else {
      void* ev[4] = {s.ev[0], s.ev[1], s.ev[2], s.ev[3]};
      s.layer->forward(s.args, s.stream, ev);
    }
    MXMOE_CUDA_CHECK(cudaEventSynchronize(s.ev[3]));
    float ms = 0;
    MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.ev[0], s.ev[3]));
    total.push_back(ms * 1000.0);
    if (!use_graph) {
      MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.ev[0], s.ev[1]));
      dispatch.push_back(ms * 1000.0);
      MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.ev[1], s.ev[2]));
      experts.push_back(ms * 1000.0);
      MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.ev[2], s.ev[3]));
      combine.push_back(ms * 1000.0);
    }
  }
  PhaseTiming t;
  t.iterations = iterations;
  t.total_us = median(total);
  t.dispatch_us = median(dispatch);
  t.experts_us = median(experts);
  t.combine_us = median(combine);
  return t;
}

}  // namespace mxmoe
