// probe_check.h — error check for the standalone bench probes (stream_probe.cu,
// wgmma_probe.cu). The library's MXMOE_CUDA_CHECK throws through throw_cuda in
// libmxmoe; the probes build alone with nvcc (no library), so they report and exit.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
