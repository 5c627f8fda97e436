// The CUDA engine's API in a build without CUDA: every entry point says so.
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe {

namespace detail_stub {
[[noreturn]] void not_built() {
  throw Unsupported(
      "backend cuda: this build of mxmoe has no CUDA engine (nvcc was not found at "
      "configure time); use backend cpu, or rebuild where nvcc is present");
}
}  // namespace detail_stub
using detail_stub::not_built;

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::vector<GpuInfo> cuda_devices() { return {}; }

struct CudaMoeLayer::Impl {};
CudaMoeLayer::CudaMoeLayer(const MoeConfig&, const ExpertWeights&, const RoutingParams*,
                           const std::vector<float>*, int) {
  not_built();
}
CudaMoeLayer::~CudaMoeLayer() = default;
const MoeConfig& CudaMoeLayer::config() const { not_built(); }
size_t CudaMoeLayer::workspace_size(int64_t) const { not_built(); }
void CudaMoeLayer::forward(const ForwardArgs&, void*, size_t, void*) const { not_built(); }
const uint32_t* CudaMoeLayer::error_flags_device(const void*) const { not_built(); }
uint32_t CudaMoeLayer::read_error_flags(const void*, void*) const { not_built(); }

}  // namespace mxmoe

namespace mxmoe {
struct CudaHostSession::Impl {};
CudaHostSession::CudaHostSession(const CudaMoeLayer&, int64_t) { not_built(); }
CudaHostSession::~CudaHostSession() = default;
void CudaHostSession::set_inputs(const Activations&, const Routing*, const std::vector<float>*) { not_built(); }
void CudaHostSession::set_inputs(const Activations&, const std::vector<uint16_t>&) { not_built(); }
Output CudaHostSession::run_eager() { not_built(); }
std::vector<Output> CudaHostSession::run_graph(int) { not_built(); }
CudaHostSession::Timing CudaHostSession::time(int, bool) { not_built(); }
}  // namespace mxmoe
