// layer.cu — CudaEpLayer (ep.h): buffers preallocated for max_tokens_per_rank, host-side
// validation, and the forward sequence on the caller's stream:
//   [quantize x] -> plan -> pack -> NCCL dispatch (grouped send/recv, self included)
//   -> local fused layer (fp32 partial rows) -> NCCL combine -> rank-order sum.
// Padded mode exchanges fixed row counts (no host sync, capturable); Exact mode exchanges
// the counts first and waits for them on the host.
#include <algorithm>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../cuda/common.cuh"
#include "../cuda/engine.h"
#include "ep_internal.h"
#include "mxmoe/ep.h"

namespace mxmoe {

using namespace ep_detail;
using cuda_detail::check_device_pointer;

namespace {

struct DevFree {
  void operator()(void* p) const {
    if (p) cudaFree(p);
  }
};
using DevPtr = std::unique_ptr<void, DevFree>;

// Zeroed at allocation, so even bytes no forward has written are defined. Sizes are
// rounded up to 256 bytes: every buffer (and every per-peer block inside one, whose
// strides are multiples of 32 bytes for activations) stays 16-byte aligned.
DevPtr device_zeros(size_t bytes) {
  bytes = std::max<size_t>((bytes + 255) & ~static_cast<size_t>(255), 256);
  void* p = nullptr;
  MXMOE_CUDA_CHECK(cudaMalloc(&p, bytes));
  DevPtr d(p);
  MXMOE_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return d;
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// NCCL calls inside ncclGroupStart/End: the group is always ended, even when a call in
// it fails, so the communicator is never left inside an open group.
template <typename F>
void nccl_group(F&& body) {
  MXMOE_NCCL_CHECK(nccl_api().GroupStart());
  try {
    body();
  } catch (...) {
    (void)nccl_api().GroupEnd();
    throw;
  }
  MXMOE_NCCL_CHECK(nccl_api().GroupEnd());
}

}  // namespace

const char* to_string(EpMode m) {
  switch (m) {
    case EpMode::Padded: return "padded";
    case EpMode::Exact: return "exact";
  }
  return "?";
}

struct CudaEpLayer::Impl {
  MoeConfig cfg;  // as the user gave it
  const EpComm* comm = nullptr;
  ncclComm_t nccl = nullptr;
  int device = 0, world = 1, rank = 0;
  int64_t rows_cap = 0;  // R = max_tokens_per_rank
  EpMode mode = EpMode::Padded;
  bool fp8 = false;      // activations travel as MXFP8
  int64_t row_bytes = 0, scale_bytes = 0, top_k = 0, hidden = 0;
  std::unique_ptr<CudaMoeLayer> local;  // this rank's experts, fp32 partial output
  size_t workspace_bytes = 0;
  DevPtr error, pos, counts, src_tok, xq, xq_scale;
  DevPtr send_x, send_scale, send_ids, send_weights;
  DevPtr recv_x, recv_scale, recv_ids, recv_weights;
  DevPtr y_local, back, workspace;
  int32_t* host_counts = nullptr;  // pinned [2W]: rows sent to d, rows received from d
  // Per-forward row bookkeeping, sized once so forward() does not allocate.
  std::vector<int64_t> send_rows, recv_rows, recv_off;

  ~Impl() {
    if (host_counts) cudaFreeHost(host_counts);
  }
  template <typename T>
  T* at(const DevPtr& p, int64_t elements = 0) const {
    return static_cast<T*>(p.get()) + elements;
  }
};

CudaEpLayer::CudaEpLayer(const MoeConfig& cfg, const ExpertWeights& weights, const EpComm& comm,
                         int64_t max_tokens_per_rank, EpMode mode)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.comm = &comm;
  s.nccl = static_cast<ncclComm_t>(comm.handle());
  s.device = comm.device();
  s.world = comm.world_size();
  s.rank = comm.rank();
  s.rows_cap = max_tokens_per_rank;
  s.mode = mode;
  const int W = s.world;
  cuda_detail::DeviceGuard guard(s.device);

  // ---- local checks and allocation; a failure is held until the ranks have agreed
  std::exception_ptr failure;
  try {
    cfg.validate();
    MXMOE_CHECK_ARG(cfg.ep_size == W, "config.ep_size", cfg.ep_size,
                    " does not match the communicator's world size ", W);
    MXMOE_CHECK_ARG(cfg.ep_rank == s.rank, "config.ep_rank", cfg.ep_rank,
                    " does not match the communicator's rank ", s.rank);
    if (!cfg.expert_map.empty())
      throw Unsupported("config.expert_map: the EP layer needs contiguous ownership (rank r owns "
                        "[r*E_local, (r+1)*E_local)) so that every rank knows every expert's "
                        "owner; leave expert_map empty and order the experts accordingly");
    MXMOE_CHECK_ARG(mode == EpMode::Padded || mode == EpMode::Exact, "mode", "invalid value ",
                    static_cast<int>(mode));
    MXMOE_CHECK_ARG(max_tokens_per_rank >= 1, "max_tokens_per_rank", "must be >= 1, got ",
                    max_tokens_per_rank);
    // The local layer's row indices are int32: W*R received rows of top_k slots each.
    MXMOE_CHECK_ARG(max_tokens_per_rank <= std::numeric_limits<int32_t>::max() / (W * cfg.top_k),
                    "max_tokens_per_rank", max_tokens_per_rank, " x ranks ", W, " x top_k ",
                    cfg.top_k, " routed rows exceed the int32 row index");
    s.cfg = cfg;
    s.fp8 = cfg.input_format == InputFormat::MXFP8;
    s.hidden = cfg.hidden;
    s.top_k = cfg.top_k;
    s.row_bytes = cfg.hidden * (s.fp8 ? 1 : 2);
    s.scale_bytes = s.fp8 ? cfg.hidden / kMxBlock : 0;

    // The local layer writes fp32 partial sums and leaves output_scale to the combine, so
    // the scale is applied once, after the whole sum, as the single-GPU finalize does.
    MoeConfig lc = cfg;
    lc.output_format = OutputFormat::FP32;
    lc.output_scale = 1.0f;
    s.local = std::make_unique<CudaMoeLayer>(lc, weights, nullptr, nullptr, s.device);

    const size_t R = static_cast<size_t>(s.rows_cap), WR = static_cast<size_t>(W) * R;
    const size_t K = static_cast<size_t>(s.hidden), k = static_cast<size_t>(s.top_k);
    s.workspace_bytes = s.local->workspace_size(static_cast<int64_t>(WR));
    s.workspace = device_zeros(s.workspace_bytes);
    s.error = device_zeros(4);
    s.pos = device_zeros(R * W * 4);
    s.counts = device_zeros(2 * static_cast<size_t>(W) * 4);
    s.src_tok = device_zeros(WR * 4);
    if (s.fp8) {
      s.xq = device_zeros(R * K);
      s.xq_scale = device_zeros(R * K / kMxBlock);
    }
    s.send_x = device_zeros(WR * static_cast<size_t>(s.row_bytes));
    s.recv_x = device_zeros(WR * static_cast<size_t>(s.row_bytes));
    if (s.fp8) {
      s.send_scale = device_zeros(WR * static_cast<size_t>(s.scale_bytes));
      s.recv_scale = device_zeros(WR * static_cast<size_t>(s.scale_bytes));
    }
    s.send_ids = device_zeros(WR * k * 4);
    s.recv_ids = device_zeros(WR * k * 4);
    s.send_weights = device_zeros(WR * k * 4);
    s.recv_weights = device_zeros(WR * k * 4);
    s.y_local = device_zeros(WR * K * 4);
    s.back = device_zeros(WR * K * 4);
    MXMOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host_counts), 2 * W * sizeof(int32_t)));
    s.send_rows.assign(W, 0);
    s.recv_rows.assign(W, 0);
    s.recv_off.assign(W, 0);
  } catch (...) {
    failure = std::current_exception();
  }

  // ---- the ranks agree: the exchange sizes must match pairwise, and a rank that failed
  // above must not leave the others waiting inside a later collective.
  const char* names[] = {"failed rank + 1", "max_tokens_per_rank", "mode", "config.num_experts",
                         "config.top_k", "config.hidden", "config.input_format"};
  constexpr int kFields = 7;
  int64_t v[2 * kFields] = {failure ? s.rank + 1 : 0, max_tokens_per_rank, static_cast<int>(mode),
                            cfg.num_experts, cfg.top_k, cfg.hidden,
                            static_cast<int>(cfg.input_format)};
  for (int i = 0; i < kFields; ++i) v[kFields + i] = -v[i];
  {
    void* dv = nullptr;
    cudaStream_t st = nullptr;
    MXMOE_CUDA_CHECK(cudaMalloc(&dv, sizeof v));
    DevPtr hold(dv);
    MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    try {
      MXMOE_CUDA_CHECK(cudaMemcpyAsync(dv, v, sizeof v, cudaMemcpyHostToDevice, st));
      MXMOE_NCCL_CHECK(nccl_api().AllReduce(dv, dv, 2 * kFields, ncclInt64, ncclMax, s.nccl, st));
      MXMOE_CUDA_CHECK(cudaMemcpyAsync(v, dv, sizeof v, cudaMemcpyDeviceToHost, st));
      MXMOE_CUDA_CHECK(cudaStreamSynchronize(st));
    } catch (...) {
      cudaStreamDestroy(st);
      throw;
    }
    cudaStreamDestroy(st);
  }
  if (failure) std::rethrow_exception(failure);
  if (v[0] != 0)
    throw Error(detail::cat("CudaEpLayer: rank ", v[0] - 1,
                            " failed to build its EP layer (its own error says why); no rank "
                            "builds one"));
  for (int i = 1; i < kFields; ++i)
    MXMOE_CHECK_ARG(v[i] == -v[kFields + i], names[i], "differs across the ranks (min ",
                    -v[kFields + i], ", max ", v[i], "); every rank must build the layer alike");
}

CudaEpLayer::~CudaEpLayer() {
  if (!impl_) return;
  cuda_detail::DeviceGuardNoThrow guard(impl_->device);
  impl_.reset();
}

const MoeConfig& CudaEpLayer::config() const { return impl_->cfg; }
EpMode CudaEpLayer::mode() const { return impl_->mode; }
int64_t CudaEpLayer::max_tokens_per_rank() const { return impl_->rows_cap; }
const EpComm& CudaEpLayer::comm() const { return *impl_->comm; }

void CudaEpLayer::forward(const ForwardArgs& args, void* stream, void* const* phase_events) const {
  const Impl& s = *impl_;
  // ---- the stream and device first: without them this rank cannot take part at all
  // (its peers then wait in the exchange until their own error handling stops them).
  int cur = -1;
  MXMOE_CUDA_CHECK(cudaGetDevice(&cur));
  MXMOE_CHECK_ARG(cur == s.device, "stream", "the current device is ", cur,
                  " but the EP layer lives on device ", s.device, "; cudaSetDevice(", s.device,
                  ") before forward");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (s.mode == EpMode::Exact) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    MXMOE_CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
    MXMOE_CHECK_ARG(cs == cudaStreamCaptureStatusNone, "stream",
                    "is capturing a CUDA graph, but EpMode::Exact copies the row counts to the "
                    "host (a synchronization); build the layer with EpMode::Padded to capture");
  }
  // ---- then every argument, before the first launch (SPEC §9). forward is collective:
  // a rank that rejects its arguments still takes part with no tokens (touching none of
  // the caller's pointers, writing nothing of theirs), so its peers finish this forward,
  // and then reports the error.
  try {
    check_forward_args(args, phase_events);
  } catch (const InvalidArgument&) {
    ForwardArgs none;
    run_forward(none, st, nullptr);
    throw;
  }
  run_forward(args, st, phase_events);
}

void CudaEpLayer::check_forward_args(const ForwardArgs& args, void* const* phase_events) const {
  const Impl& s = *impl_;
  const MoeConfig& cfg = s.cfg;
  const int64_t M = args.tokens, R = s.rows_cap;
  MXMOE_CHECK_ARG(M >= 0 && M <= R, "args.tokens", M, " is out of range [0, ", R,
                  "] (max_tokens_per_rank)");
  MXMOE_CHECK_ARG(args.router_logits == nullptr, "args.router_logits",
                  "is not supported by the EP layer: route first (e.g. route_cpu or the serving "
                  "engine's router) and pass topk_ids/topk_weights");
  MXMOE_CHECK_ARG(args.router_logits_bf16 == nullptr, "args.router_logits_bf16",
                  "is not supported by the EP layer: route first (e.g. route_cpu_bf16 or the "
                  "serving engine's router) and pass topk_ids/topk_weights");
  MXMOE_CHECK_ARG(args.x_format == InputFormat::BF16 || args.x_format == InputFormat::MXFP8,
                  "args.x_format", "invalid value ", static_cast<int>(args.x_format));
  MXMOE_CHECK_ARG(!(cfg.input_format == InputFormat::BF16 && args.x_format == InputFormat::MXFP8),
                  "args.x_format",
                  "is mxfp8 but the layer consumes bf16 activations (config.input_format); "
                  "pass bf16 x or build the layer with input_format mxfp8");
  if (args.x_format == InputFormat::BF16)
    MXMOE_CHECK_ARG(args.x_scale == nullptr, "args.x_scale",
                    "is given but x_format is bf16 (no scales)");
  if (M > 0) {
    MXMOE_CHECK_ARG(args.x != nullptr, "args.x", "is null");
    MXMOE_CHECK_ARG(aligned(args.x, 16), "args.x", "pointer ", args.x, " is not 16-byte aligned");
    if (args.x_format == InputFormat::MXFP8)
      MXMOE_CHECK_ARG(args.x_scale != nullptr, "args.x_scale", "is null but x_format is mxfp8");
    MXMOE_CHECK_ARG(args.topk_ids != nullptr, "args.topk_ids", "is null");
    MXMOE_CHECK_ARG(args.topk_weights != nullptr, "args.topk_weights", "is null");
    MXMOE_CHECK_ARG(aligned(args.topk_ids, 4), "args.topk_ids", "is not 4-byte aligned");
    MXMOE_CHECK_ARG(aligned(args.topk_weights, 4), "args.topk_weights", "is not 4-byte aligned");
    MXMOE_CHECK_ARG(args.out != nullptr, "args.out", "is null");
    MXMOE_CHECK_ARG(aligned(args.out, cfg.output_format == OutputFormat::FP32 ? 4 : 2), "args.out",
                    "pointer ", args.out, " is misaligned for ", to_string(cfg.output_format));
  }
  if (phase_events)
    for (int i = 0; i < 4; ++i) {
      MXMOE_CHECK_ARG(phase_events[i] != nullptr, "phase_events", "entry ", i, " is null");
      // An event of another device would fail at its first record, after the exchange
      // has begun; a query is harmless and fails the same way.
      const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(phase_events[i]));
      if (q != cudaSuccess && q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        MXMOE_CHECK_ARG(false, "phase_events", "entry ", i, " is not a usable event (",
                        cudaGetErrorName(q), ")");
      }
    }
  if (M > 0) {
    check_device_pointer(args.x, "args.x", s.device);
    if (args.x_scale) check_device_pointer(args.x_scale, "args.x_scale", s.device);
    check_device_pointer(args.topk_ids, "args.topk_ids", s.device);
    check_device_pointer(args.topk_weights, "args.topk_weights", s.device);
    check_device_pointer(args.out, "args.out", s.device);
  }
}

void CudaEpLayer::run_forward(const ForwardArgs& args, void* stream, void* const* phase_events) const {
  Impl& s = *impl_;
  const MoeConfig& cfg = s.cfg;
  const int W = s.world;
  const int64_t M = args.tokens, R = s.rows_cap, K = s.hidden, k = s.top_k;
  cudaStream_t st = static_cast<cudaStream_t>(stream);

  auto mark = [&](int i) {
    if (phase_events) MXMOE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(phase_events[i]), st));
  };
  mark(0);
  MXMOE_CUDA_CHECK(cudaMemsetAsync(s.error.get(), 0, sizeof(uint32_t), st));

  // ---- dispatch: quantize here when the layer consumes MXFP8 (half the bytes travel;
  // the quantizer is per token and bit-identical wherever it runs), plan, pack, send
  const void* x = args.x;
  const uint8_t* xs = args.x_format == InputFormat::MXFP8 ? args.x_scale : nullptr;
  if (s.fp8 && args.x_format == InputFormat::BF16 && M > 0) {
    cuda_detail::launch_quantize_x(static_cast<const uint16_t*>(args.x), M, K, cfg.scale_rule,
                                   s.at<uint8_t>(s.xq), s.at<uint8_t>(s.xq_scale), st);
    x = s.xq.get();
    xs = s.at<uint8_t>(s.xq_scale);
  }
  PlanParams pl;
  pl.ids = args.topk_ids;
  pl.tokens = M;
  pl.top_k = k;
  pl.num_experts = cfg.num_experts;
  pl.e_local = cfg.local_experts();
  pl.world = W;
  pl.rows_cap = R;
  pl.pos = s.at<int32_t>(s.pos);
  pl.src_tok = s.at<int32_t>(s.src_tok);
  pl.counts = s.at<int32_t>(s.counts);
  pl.error = s.at<uint32_t>(s.error);
  launch_plan(pl, st);

  PackParams pk;
  pk.x = x;
  pk.x_scale = xs;
  pk.ids = args.topk_ids;
  pk.weights = args.topk_weights;
  pk.src_tok = pl.src_tok;
  pk.counts = pl.counts;
  pk.row_bytes = s.row_bytes;
  pk.scale_bytes = s.scale_bytes;
  pk.top_k = k;
  pk.rows_cap = R;
  pk.world = W;
  pk.padded = s.mode == EpMode::Padded;
  pk.send_x = s.at<uint8_t>(s.send_x);
  pk.send_scale = s.fp8 ? s.at<uint8_t>(s.send_scale) : nullptr;
  pk.send_ids = s.at<int32_t>(s.send_ids);
  pk.send_weights = s.at<float>(s.send_weights);
  launch_pack(pk, st);

  if (s.mode == EpMode::Padded) {
    for (int d = 0; d < W; ++d) {
      s.send_rows[d] = s.recv_rows[d] = R;
      s.recv_off[d] = d * R;
    }
  } else {
    // Counts all-to-all (one int per pair), then the one host synchronization of Exact mode.
    int32_t* c = s.at<int32_t>(s.counts);
    nccl_group([&] {
      for (int d = 0; d < W; ++d) {
        MXMOE_NCCL_CHECK(nccl_api().Send(c + d, 1, ncclInt32, d, s.nccl, st));
        MXMOE_NCCL_CHECK(nccl_api().Recv(c + W + d, 1, ncclInt32, d, s.nccl, st));
      }
    });
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(s.host_counts, c, 2 * W * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, st));
    MXMOE_CUDA_CHECK(cudaStreamSynchronize(st));
    // The receive sizes come from the peers: a peer running another layer (another
    // max_tokens_per_rank) or skipping a forward must not make this rank write past its
    // W*R-row buffers.
    for (int d = 0; d < 2 * W; ++d)
      if (s.host_counts[d] < 0 || s.host_counts[d] > R)
        throw Error(detail::cat("CudaEpLayer::forward: rank ", d < W ? s.rank : d - W,
                                " sends ", s.host_counts[d], " rows to rank ", d < W ? d : s.rank,
                                ", outside [0, ", R, "] (max_tokens_per_rank): the ranks are not "
                                "running the same layer's forward"));
    int64_t off = 0;
    for (int d = 0; d < W; ++d) {
      s.send_rows[d] = s.host_counts[d];
      s.recv_rows[d] = s.host_counts[W + d];
      s.recv_off[d] = off;
      off += s.recv_rows[d];
    }
  }
  // Rows from source d land contiguously at recv_off[d], in source-rank order: the local
  // layer sees one batch. Several sends to one peer in a group match its receives in order.
  // What travels of each row: the activation, its scales (MXFP8 only: for bf16 both
  // buffers are null), the id row and the weight row.
  struct Part { const DevPtr &send, &recv; int64_t row_elems, elem_bytes; ncclDataType_t type; };
  const Part parts[] = {{s.send_x, s.recv_x, s.row_bytes, 1, ncclUint8},
                        {s.send_scale, s.recv_scale, s.scale_bytes, 1, ncclUint8},
                        {s.send_ids, s.recv_ids, k, 4, ncclInt32},
                        {s.send_weights, s.recv_weights, k, 4, ncclFloat32}};
  nccl_group([&] {
    for (int d = 0; d < W; ++d) {
      const int64_t n = s.send_rows[d], m = s.recv_rows[d], so = d * R, ro = s.recv_off[d];
      for (const Part& p : parts)
        if (n > 0 && p.send)
          MXMOE_NCCL_CHECK(nccl_api().Send(s.at<uint8_t>(p.send, so * p.row_elems * p.elem_bytes),
                                           n * p.row_elems, p.type, d, s.nccl, st));
      for (const Part& p : parts)
        if (m > 0 && p.recv)
          MXMOE_NCCL_CHECK(nccl_api().Recv(s.at<uint8_t>(p.recv, ro * p.row_elems * p.elem_bytes),
                                           m * p.row_elems, p.type, d, s.nccl, st));
    }
  });
  mark(1);

  // ---- the local experts on every received row (ids of other ranks are skipped by the
  // layer's own EP config, so received id rows are used as they came)
  int64_t total = 0;
  for (int d = 0; d < W; ++d) total += s.recv_rows[d];
  if (total > 0) {
    ForwardArgs la;
    la.tokens = total;
    la.x_format = s.fp8 ? InputFormat::MXFP8 : InputFormat::BF16;
    la.x = s.recv_x.get();
    la.x_scale = s.fp8 ? s.at<uint8_t>(s.recv_scale) : nullptr;
    la.topk_ids = s.at<int32_t>(s.recv_ids);
    la.topk_weights = s.at<float>(s.recv_weights);
    la.out = s.y_local.get();
    s.local->forward(la, s.workspace.get(), s.workspace_bytes, st);
  } else {
    // Nothing arrived (Exact mode): the layer's error word must not report an old run.
    MXMOE_CUDA_CHECK(cudaMemsetAsync(const_cast<uint32_t*>(s.local->error_flags_device(s.workspace.get())),
                                     0, sizeof(uint32_t), st));
  }
  mark(2);

  // ---- combine: each source's rows of partial outputs go back to it, then the sum
  nccl_group([&] {
    for (int d = 0; d < W; ++d) {
      const size_t m = static_cast<size_t>(s.recv_rows[d]), n = static_cast<size_t>(s.send_rows[d]);
      if (m > 0)
        MXMOE_NCCL_CHECK(nccl_api().Send(s.at<float>(s.y_local, s.recv_off[d] * K), m * K, ncclFloat32, d,
                                  s.nccl, st));
      if (n > 0)
        MXMOE_NCCL_CHECK(nccl_api().Recv(s.at<float>(s.back, d * R * K), n * K, ncclFloat32, d, s.nccl, st));
    }
  });
  CombineParams cb;
  cb.back = s.at<float>(s.back);
  cb.pos = pl.pos;
  cb.tokens = M;
  cb.hidden = K;
  cb.rows_cap = R;
  cb.world = W;
  cb.output_scale = cfg.output_scale;
  cb.out = args.out;
  cb.out_fp32 = cfg.output_format == OutputFormat::FP32;
  launch_combine(cb, st);
  mark(3);
}

uint32_t CudaEpLayer::read_error_flags(void* stream) const {
  const Impl& s = *impl_;
  cuda_detail::DeviceGuard guard(s.device);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  uint32_t mine = 0;
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(&mine, s.error.get(), sizeof mine, cudaMemcpyDeviceToHost, st));
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(st));
  return mine | s.local->read_error_flags(s.workspace.get(), stream);
}

}  // namespace mxmoe
