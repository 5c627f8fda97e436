// The device-side error word of a forward (cuda.h: CudaMoeLayer::error_flags_device,
// read_error_flags). The permute stage writes it on every forward; it lives in the
// caller's workspace at the offset WorkspaceLayout gives it.
#include <cuda_runtime.h>

#include "engine.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe {

static_assert(CudaMoeLayer::kErrorExpertIdOutOfRange == cuda_detail::kErrorIdOutOfRange,
              "the public flag and the kernels' flag must agree");

const uint32_t* CudaMoeLayer::error_flags_device(const void* workspace) const {
  MXMOE_CHECK_ARG(workspace != nullptr, "workspace", "is null");
  // The error word's offset does not depend on the token count (it comes first).
  const size_t offset = cuda_detail::WorkspaceLayout::make(config(), 1).error;
  return reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(workspace) + offset);
}

uint32_t CudaMoeLayer::read_error_flags(const void* workspace, void* stream) const {
  const uint32_t* word = error_flags_device(workspace);
  uint32_t flags = 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(&flags, word, sizeof flags, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    throw CudaError(detail::cat("read_error_flags: ", cudaGetErrorString(e), " (", __FILE__, ":", __LINE__, ")"));
  return flags;
}

}  // namespace mxmoe
