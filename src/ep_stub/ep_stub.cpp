// The EP API in a build without NCCL (or without CUDA): every entry point says so.
// ep_launch and ep_device_count (src/ep/launch.cpp) need neither and are built always.
#include "mxmoe/ep.h"
#include "mxmoe/error.h"

namespace mxmoe {

namespace {
[[noreturn]] void not_built() {
  throw Unsupported(
      "expert parallelism: this build of mxmoe has no NCCL (nccl.h/libnccl were not found at "
      "configure time, or the CUDA engine is off); install NCCL (e.g. the CUDA toolkit's or "
      "pip nvidia-nccl-cu13) and reconfigure with -DNCCL_ROOT=<dir>, or run one GPU per layer "
      "with ep_size 1");
}
}  // namespace

namespace ep_detail {
void select_device(int) {}
}  // namespace ep_detail

bool ep_built() { return false; }
EpUniqueId ep_unique_id() { not_built(); }
const char* to_string(EpMode m) { return m == EpMode::Padded ? "padded" : "exact"; }

struct EpComm::Impl {};
EpComm::EpComm(const EpUniqueId&, int, int, int) { not_built(); }
EpComm::~EpComm() = default;
int EpComm::world_size() const { not_built(); }
int EpComm::rank() const { not_built(); }
int EpComm::device() const { not_built(); }
void* EpComm::handle() const { not_built(); }
std::vector<double> EpComm::max_over_ranks(const std::vector<double>&) const { not_built(); }

struct CudaEpLayer::Impl {};
CudaEpLayer::CudaEpLayer(const MoeConfig&, const ExpertWeights&, const EpComm&, int64_t, EpMode) {
  not_built();
}
CudaEpLayer::~CudaEpLayer() = default;
const MoeConfig& CudaEpLayer::config() const { not_built(); }
EpMode CudaEpLayer::mode() const { not_built(); }
int64_t CudaEpLayer::max_tokens_per_rank() const { not_built(); }
const EpComm& CudaEpLayer::comm() const { not_built(); }
void CudaEpLayer::forward(const ForwardArgs&, void*, void* const*) const { not_built(); }
uint32_t CudaEpLayer::read_error_flags(void*) const { not_built(); }

struct CudaEpHostSession::Impl {};
CudaEpHostSession::CudaEpHostSession(const CudaEpLayer&) { not_built(); }
CudaEpHostSession::~CudaEpHostSession() = default;
void CudaEpHostSession::set_inputs(const Activations&, const Routing&) { not_built(); }
Output CudaEpHostSession::run_eager() { not_built(); }
std::vector<Output> CudaEpHostSession::run_graph(int) { not_built(); }
CudaEpHostSession::PhaseTiming CudaEpHostSession::time(int, bool) { not_built(); }

EpBandwidth ep_sendrecv_bandwidth(const EpComm&, size_t, int) { not_built(); }

}  // namespace mxmoe
