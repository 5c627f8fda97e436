// capabilities.cpp — what the CUDA engine runs on a GPU, as data (mxmoe/cuda.h
// GpuCapabilities): the rules in one place, for cuda_devices(), `mxmoe info` and Python's
// mxmoe.capabilities(). Host code in every build, so the rules are tested without a GPU.
#include "mxmoe/cuda.h"

namespace mxmoe {

GpuCapabilities gpu_capabilities(bool supported, int sm_major, bool sm90a_kernels) {
  GpuCapabilities c;
  if (!supported) return c;
  c.activations = {"situ", "swiglu", "silu"};
  c.input_formats = {"bf16", "mxfp8"};
  c.intermediate_formats = {"bf16", "mxfp8"};
  c.output_formats = {"bf16", "fp32"};
  c.precisions = {"exact"};
  c.paths = {"decode"};
  // wgmma and the FP8 mode's kernels exist only for sm_90a (Hopper); other GPUs run
  // every size on the mma.sync paths, exactly.
  if (sm_major == 9 && sm90a_kernels) {
    c.precisions.push_back("fp8");
    c.paths.push_back("prefill");
  }
  return c;
}

}  // namespace mxmoe
