// capabilities.cpp — what the library runs (mxmoe/cuda.h LibraryCapabilities) and what
// the CUDA engine runs on a GPU (GpuCapabilities), as data: the lists and the rules in one
// place, for cuda_devices(), `mxmoe info` and Python's mxmoe.capabilities(). Host code in
// every build, so they are tested without a GPU.
#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/layout.h"

namespace mxmoe {

const LibraryCapabilities& library_capabilities() {
  // By the enums' own names, so a list cannot drift from what the parsers take.
  static const LibraryCapabilities caps = [] {
    LibraryCapabilities c;
    for (Activation a : {Activation::SiTU, Activation::SwiGLU_OAI, Activation::SiLU_Gated})
      c.activations.push_back(to_string(a));
    for (InputFormat f : {InputFormat::BF16, InputFormat::MXFP8}) c.input_formats.push_back(to_string(f));
    for (IntermediateFormat f : {IntermediateFormat::BF16, IntermediateFormat::MXFP8})
      c.intermediate_formats.push_back(to_string(f));
    for (OutputFormat f : {OutputFormat::BF16, OutputFormat::FP32}) c.output_formats.push_back(to_string(f));
    c.weight_formats = {"mxfp4"};
    for (W13Layout l : {W13Layout::GateUp, W13Layout::Interleaved, W13Layout::UpGate})
      c.w13_layouts.push_back(to_string(l));
    for (CheckpointFormat f : {CheckpointFormat::KimiK3, CheckpointFormat::GptOss})
      c.checkpoint_formats.push_back(to_string(f));
    c.routers = {"sigmoid", "softmax"};  // RoutingParams' kinds (RouterKind has no names of its own)
    return c;
  }();
  return caps;
}

GpuCapabilities gpu_capabilities(bool supported, int sm_major, bool sm90a_kernels) {
  GpuCapabilities c;
  if (!supported) return c;
  // Every activation and format runs on every supported GPU; what differs is below.
  const LibraryCapabilities& all = library_capabilities();
  c.activations = all.activations;
  c.input_formats = all.input_formats;
  c.intermediate_formats = all.intermediate_formats;
  c.output_formats = all.output_formats;
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
