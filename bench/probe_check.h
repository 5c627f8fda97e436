// probe_check.h — error check, timing and main for the standalone bench probes
// (stream_probe.cu, wgmma_probe.cu, f8_consumer_probe.cu). The library's MXMOE_CUDA_CHECK
// throws through throw_cuda in libmxmoe; the probes build alone with nvcc (no library), so
// they report and exit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

/// Median microseconds of `runs` - 1 calls of `launch` (one kernel launch each, timed with
/// CUDA events), after one warm-up call.
template <class Launch>
double median_us(Launch&& launch, int runs = 10) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < runs; ++r) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (r > 0) ms.push_back(t);  // the first run warms up
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

/// A probe's main: two rounds of run_all(out, sms), with `out` a device buffer of 256 floats
/// per multiprocessor (the probes' one store per thread, so no variant is dead code).
template <class RunAll>
int probe_main(RunAll&& run_all) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out = nullptr;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 256));
  for (int round = 0; round < 2; ++round) run_all(out, sms);
  CHECK(cudaFree(out));
  return 0;
}
