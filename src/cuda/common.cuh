// common.cuh — error checking for every CUDA call and launch, the current-device
// guards, a per-device cache, the test knobs' parsing, the kernels' local-memory query and
// the device-pointer check, shared by src/cuda/*.cu and src/ep/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "mxmoe/error.h"

namespace mxmoe::cuda_detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw CudaError(detail::cat(call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                              ") at ", file, ":", line));
}

}  // namespace mxmoe::cuda_detail

/// Throw mxmoe::CudaError (call, error string, file:line) unless the call succeeded.
#define MXMOE_CUDA_CHECK(call)                                                        \
  do {                                                                                \
    const cudaError_t mxmoe_err_ = (call);                                            \
    if (mxmoe_err_ != cudaSuccess)                                                    \
      ::mxmoe::cuda_detail::throw_cuda(mxmoe_err_, #call, __FILE__, __LINE__);        \
  } while (0)

/// After every kernel launch: a bad configuration is reported at the launch that caused
/// it. Never a device synchronize (forward stays asynchronous and graph-capturable).
#define MXMOE_LAUNCH_CHECK(kernel_name)                                               \
  do {                                                                                \
    const cudaError_t mxmoe_err_ = cudaGetLastError();                                \
    if (mxmoe_err_ != cudaSuccess)                                                    \
      ::mxmoe::cuda_detail::throw_cuda(mxmoe_err_, "launch of " kernel_name, __FILE__, \
                                       __LINE__);                                     \
  } while (0)

namespace mxmoe::cuda_detail {

/// Launches `kernel` with `attrs` (cudaLaunchKernelEx; also inside a graph capture).
template <typename... Params, typename... Args>
void launch_kernel_with(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        cudaLaunchAttribute* attrs, unsigned num_attrs, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = num_attrs;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

/// Launches `kernel`, as a programmatic dependent of the stream's previous kernel when
/// `programmatic` (cudaLaunchAttributeProgrammaticStreamSerialization; also inside a
/// graph capture): its blocks may then start before that kernel ends, so the kernel must
/// call pdl_wait_for_predecessor (ptx.cuh) before it touches that kernel's results.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool programmatic, const Args&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  launch_kernel_with(kernel, grid, block, smem, stream, &attr, programmatic ? 1u : 0u, args...);
}

/// Launches `kernel` cooperatively (cudaLaunchAttributeCooperative; also inside a graph
/// capture): every block of the grid is resident at once, so the blocks may wait for each
/// other (cooperative_groups' grid sync). The launch fails where they would not fit.
template <typename... Params, typename... Args>
void launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        const Args&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  launch_kernel_with(kernel, grid, block, smem, stream, &attr, 1u, args...);
}

/// Calls f(std::bool_constant<b>{}): a runtime flag to a kernel's template argument.
template <class F>
decltype(auto) with_bool(bool b, F&& f) {
  return b ? f(std::true_type{}) : f(std::false_type{});
}

/// Makes `dev` the current device for a scope (a layer lives on its own device whatever
/// the caller's current one) and restores the caller's device on the way out.
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int dev) {
    MXMOE_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != dev) MXMOE_CUDA_CHECK(cudaSetDevice(dev));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
};

/// DeviceGuard for destructors: never throws and ignores CUDA errors. Switches only when
/// the current device is known and differs, and then restores it unconditionally.
struct DeviceGuardNoThrow {
  int prev = -1;  // -1: nothing to restore
  explicit DeviceGuardNoThrow(int dev) noexcept {
    if (cudaGetDevice(&prev) == cudaSuccess && prev != dev)
      cudaSetDevice(dev);
    else
      prev = -1;
  }
  ~DeviceGuardNoThrow() {
    if (prev >= 0) cudaSetDevice(prev);
  }
  DeviceGuardNoThrow(const DeviceGuardNoThrow&) = delete;
  DeviceGuardNoThrow& operator=(const DeviceGuardNoThrow&) = delete;
};

/// `compute(dev)` for the current device `dev`, computed once per device into `cache`
/// (one slot per device; a slot holds the value plus one, so 0 means not yet computed and
/// a value of 0 is cached too). Devices past the cache are computed at every call.
template <class Compute>
int per_device_cached(std::atomic<int> (&cache)[64], Compute compute) {
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool slot = dev >= 0 && dev < 64;
  if (slot) {
    const int held = cache[dev].load();
    if (held > 0) return held - 1;
  }
  const int value = compute(dev);
  if (slot) cache[dev].store(value + 1);
  return value;
}

/// A test or measurement knob: environment variable `name` as a whole decimal number in
/// [lo, hi]; unset, anything else or out of range: `fallback`. Knobs are for tests and
/// the bench and never reach a serving engine's defaults; each caller says when it reads
/// its knob (per launch or when a layer is built).
inline int env_knob(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && *end == 0 && n >= lo && n <= hi ? static_cast<int>(n) : fallback;
}

/// The most local memory per thread (bytes: spills and stack frame) among `kernels`, as
/// this binary compiled them for the current device; for tests.
inline size_t most_local_bytes(std::initializer_list<const void*> kernels) {
  size_t most = 0;
  for (const void* kernel : kernels) {
    cudaFuncAttributes a{};
    MXMOE_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
    most = std::max(most, a.localSizeBytes);
  }
  return most;
}

/// Rejects pointers the driver knows are not usable on `dev` (plain host memory, another
/// GPU). An inconclusive query is not an error: the kernels would fault visibly.
inline void check_device_pointer(const void* p, const char* argument, int dev) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  MXMOE_CHECK_ARG(a.type != cudaMemoryTypeUnregistered, argument, "pointer ", p,
                  " is not device memory (pageable host memory?)");
  if (a.type == cudaMemoryTypeHost)
    MXMOE_CHECK_ARG(a.devicePointer != nullptr, argument, "pointer ", p,
                    " is host memory not mapped into the device");
  if (a.type == cudaMemoryTypeDevice)
    MXMOE_CHECK_ARG(a.device == dev, argument, "pointer ", p, " lives on device ", a.device,
                    " but the layer is on device ", dev);
}

}  // namespace mxmoe::cuda_detail
