// The CUDA engine's API in a build without CUDA: every entry point says so.
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe {

namespace {
[[noreturn]] void not_built() {
  throw Unsupported(
      "backend cuda: this build of mxmoe has no CUDA engine (nvcc was not found at "
      "configure time); use backend cpu, or rebuild where nvcc is present");
}
}  // namespace

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

}  // namespace mxmoe
