// comm.cu — the NCCL side of EP that is not the layer: the unique id, the communicator,
// the NCCL environment, a max-over-ranks helper and the send/recv bandwidth probe.
#include <cstdlib>
#include <exception>
#include <cstring>
#include <vector>
#include <algorithm>

#include "../cuda/common.cuh"
#include "ep_internal.h"
#include "mxmoe/cuda.h"
#include "mxmoe/ep.h"

namespace mxmoe {

namespace ep_detail {

void force_nccl_environment() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

// Called by ep_launch in each child before its body: GPU `rank` becomes current when it
// exists (the body reports a missing GPU in its own words).
void select_device(int rank) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || rank >= n) {
    (void)cudaGetLastError();
    return;
  }
  if (cudaSetDevice(rank) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace ep_detail

using namespace ep_detail;

bool ep_built() { return true; }

EpUniqueId ep_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(EpUniqueId), "ncclUniqueId is 128 bytes");
  force_nccl_environment();
  ncclUniqueId id;
  MXMOE_NCCL_CHECK(nccl_api().GetUniqueId(&id));
  EpUniqueId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

struct EpComm::Impl {
  ncclComm_t comm = nullptr;
  int world = 1, rank = 0, device = 0;
};

EpComm::EpComm(const EpUniqueId& id, int world_size, int rank, int device)
    : impl_(std::make_unique<Impl>()) {
  MXMOE_CHECK_ARG(world_size >= 1, "world_size", "must be >= 1, got ", world_size);
  MXMOE_CHECK_ARG(rank >= 0 && rank < world_size, "rank", rank, " is out of range [0, ",
                  world_size, ")");
  const int count = cuda_device_count();
  if (count == 0)
    throw Unsupported("EP: no CUDA GPU is visible (no driver or no device); expert parallelism "
                      "needs one GPU per rank");
  int dev = device;
  if (dev < 0) MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  MXMOE_CHECK_ARG(dev >= 0 && dev < count, "device", dev, " is out of range [0, ", count, ")");
  impl_->world = world_size;
  impl_->rank = rank;
  impl_->device = dev;
  force_nccl_environment();
  int prev = -1;
  MXMOE_CUDA_CHECK(cudaGetDevice(&prev));
  MXMOE_CUDA_CHECK(cudaSetDevice(dev));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  const ncclResult_t r = nccl_api().CommInitRank(&impl_->comm, world_size, nid, rank);
  if (prev != dev) cudaSetDevice(prev);
  MXMOE_NCCL_CHECK(r);
}

EpComm::~EpComm() {
  if (impl_ && impl_->comm) {
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != impl_->device) cudaSetDevice(impl_->device);
    // Destroy waits for the communicator's outstanding work; while an exception unwinds
    // (a peer may have failed, leaving a send/recv that never completes) abort instead.
    if (std::uncaught_exceptions() > 0)
      nccl_api().CommAbort(impl_->comm);
    else
      nccl_api().CommDestroy(impl_->comm);
    if (prev >= 0 && prev != impl_->device) cudaSetDevice(prev);
  }
}

int EpComm::world_size() const { return impl_->world; }
int EpComm::rank() const { return impl_->rank; }
int EpComm::device() const { return impl_->device; }
void* EpComm::handle() const { return impl_->comm; }

namespace {

// A stream and device memory that live for one synchronous helper call.
struct Scratch {
  cudaStream_t stream = nullptr;
  std::vector<void*> ptrs;
  std::vector<cudaEvent_t> events;
  Scratch() { MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    MXMOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    ptrs.push_back(p);
    return p;
  }
  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    MXMOE_CUDA_CHECK(cudaEventCreate(&e));
    events.push_back(e);
    return e;
  }
  ~Scratch() {
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (void* p : ptrs) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

std::vector<double> EpComm::max_over_ranks(const std::vector<double>& v) const {
  if (v.empty()) return v;
  cuda_detail::DeviceGuard dev(impl_->device);
  Scratch s;
  void* d = s.alloc(v.size() * sizeof(double));
  std::vector<double> out(v.size());
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice, s.stream));
  MXMOE_NCCL_CHECK(nccl_api().AllReduce(d, d, v.size(), ncclFloat64, ncclMax, impl_->comm, s.stream));
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(out.data(), d, v.size() * sizeof(double), cudaMemcpyDeviceToHost, s.stream));
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return out;
}

EpBandwidth ep_sendrecv_bandwidth(const EpComm& comm, size_t bytes, int iterations) {
  MXMOE_CHECK_ARG(bytes >= 1, "bytes", "must be >= 1");
  MXMOE_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  cuda_detail::DeviceGuard dev(comm.device());
  Scratch s;
  void* src = s.alloc(bytes);
  void* dst = s.alloc(bytes);
  MXMOE_CUDA_CHECK(cudaMemsetAsync(src, 0x5A, bytes, s.stream));
  const int W = comm.world_size(), r = comm.rank();
  const int next = (r + 1) % W, prev = (r + W - 1) % W;
  ncclComm_t nc = static_cast<ncclComm_t>(comm.handle());
  auto once = [&] {
    MXMOE_NCCL_CHECK(nccl_api().GroupStart());
    const ncclResult_t a = nccl_api().Send(src, bytes, ncclUint8, next, nc, s.stream);
    const ncclResult_t b = nccl_api().Recv(dst, bytes, ncclUint8, prev, nc, s.stream);
    MXMOE_NCCL_CHECK(nccl_api().GroupEnd());
    MXMOE_NCCL_CHECK(a);
    MXMOE_NCCL_CHECK(b);
  };
  for (int i = 0; i < 3; ++i) once();  // connections are set up lazily on first use
  // Trials of `iterations` transfers back to back: the ranks' launch skew is paid once
  // per trial, not once per transfer. Median over 5 trials of the per-transfer time.
  cudaEvent_t e0 = s.event(), e1 = s.event();
  std::vector<double> us;
  for (int trial = 0; trial < 5; ++trial) {
    MXMOE_CUDA_CHECK(cudaEventRecord(e0, s.stream));
    for (int i = 0; i < iterations; ++i) once();
    MXMOE_CUDA_CHECK(cudaEventRecord(e1, s.stream));
    MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.0 / iterations);
  }
  std::sort(us.begin(), us.end());
  EpBandwidth b;
  b.bytes = bytes;
  b.median_us = us[us.size() / 2];
  b.gbps = static_cast<double>(bytes) / (b.median_us * 1e-6) / 1e9;
  return b;
}

}  // namespace mxmoe
