// arrays.h — checking tensors that arrive through DLPack (NumPy, PyTorch, CuPy, JAX).
// Every check throws mxmoe::InvalidArgument naming the Python argument and the bad value,
// which the module turns into ValueError (SPEC §9): a wrong dtype, shape, stride or device
// is said before anything is read or written.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "mxmoe/error.h"

namespace mxmoe_py {

namespace nb = nanobind;
using Array = nb::ndarray<>;

enum class Dev { Cpu, Cuda };

// DLPack type codes we meet. Byte-sized tensors may arrive as uint8 or as torch's
// float8_e4m3fn (codes are bytes either way).
struct DType {
  uint8_t code, bits;
  const char* name;
};
inline constexpr DType kU8{(uint8_t)nb::dlpack::dtype_code::UInt, 8, "uint8"};
inline constexpr DType kI8{(uint8_t)nb::dlpack::dtype_code::Int, 8, "int8"};
inline constexpr DType kE4m3{(uint8_t)nb::dlpack::dtype_code::Float8_E4M3FN, 8, "float8_e4m3fn"};
inline constexpr DType kU16{(uint8_t)nb::dlpack::dtype_code::UInt, 16, "uint16 (bf16 bits)"};
inline constexpr DType kI16{(uint8_t)nb::dlpack::dtype_code::Int, 16, "int16 (bf16 bits)"};
inline constexpr DType kBf16{(uint8_t)nb::dlpack::dtype_code::Bfloat, 16, "bfloat16"};
inline constexpr DType kF32{(uint8_t)nb::dlpack::dtype_code::Float, 32, "float32"};
inline constexpr DType kF64{(uint8_t)nb::dlpack::dtype_code::Float, 64, "float64"};
inline constexpr DType kI32{(uint8_t)nb::dlpack::dtype_code::Int, 32, "int32"};
inline constexpr DType kI64{(uint8_t)nb::dlpack::dtype_code::Int, 64, "int64"};

inline bool is(const Array& a, const DType& t) {
  return a.dtype().code == t.code && a.dtype().bits == t.bits && a.dtype().lanes == 1;
}
inline bool is_any(const Array& a, std::initializer_list<DType> ts) {
  for (const auto& t : ts)
    if (is(a, t)) return true;
  return false;
}

inline std::string dtype_name(const Array& a) {
  const auto d = a.dtype();
  const char* base = "?";
  switch ((nb::dlpack::dtype_code)d.code) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    default: break;
  }
  return std::string(base) + std::to_string(d.bits);
}

inline std::string shape_str(const Array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

inline std::string device_name(const Array& a) {
  if (a.device_type() == nb::device::cpu::value) return "cpu";
  if (a.device_type() == nb::device::cuda::value) return "cuda:" + std::to_string(a.device_id());
  return "device type " + std::to_string(a.device_type());
}

/// Row-major and dense, as the kernels index with plain row strides. A dim of extent 1
/// may have any stride, and an empty array is dense whatever its strides (exporters give
/// empty arrays zero or arbitrary strides; no element is read through them).
inline void check_c_contiguous(const Array& a, const char* name) {
  if (a.size() == 0 || a.stride_ptr() == nullptr) return;
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1)
      MXMOE_CHECK_ARG(a.stride(d) == expect, name, "is not C-contiguous (stride ", a.stride(d),
                      " in dim ", d, ", expected ", expect, "); pass a contiguous copy");
    expect *= (int64_t)a.shape(d);
  }
}

/// Check device, dtype, rank, shape (-1 = any) and C-contiguity of `a`.
inline void check(const Array& a, const char* name, Dev dev, std::initializer_list<DType> dtypes,
                  std::initializer_list<int64_t> shape, int cuda_device = -1) {
  MXMOE_CHECK_ARG(a.is_valid(), name, "is not an array");
  if (dev == Dev::Cpu) {
    MXMOE_CHECK_ARG(a.device_type() == nb::device::cpu::value, name, "is on ", device_name(a),
                    ", expected a CPU array (the CPU path reads host memory)");
  } else {
    MXMOE_CHECK_ARG(a.device_type() == nb::device::cuda::value, name, "is on ", device_name(a),
                    ", expected a CUDA tensor");
    MXMOE_CHECK_ARG(cuda_device < 0 || a.device_id() == cuda_device, name, "is on ",
                    device_name(a), " but the layer lives on cuda:", cuda_device);
  }
  if (!is_any(a, dtypes)) {
    std::string want;
    for (const auto& t : dtypes) want += (want.empty() ? "" : " or ") + std::string(t.name);
    throw mxmoe::InvalidArgument(name, "has dtype " + dtype_name(a) + ", expected " + want);
  }
  MXMOE_CHECK_ARG(a.ndim() == shape.size(), name, "has shape ", shape_str(a), " (", a.ndim(),
                  " dims), expected ", shape.size(), " dims");
  size_t i = 0;
  for (int64_t want : shape) {
    MXMOE_CHECK_ARG(want < 0 || (int64_t)a.shape(i) == want, name, "has shape ", shape_str(a),
                    ": dim ", i, " is ", a.shape(i), ", expected ", want);
    ++i;
  }
  check_c_contiguous(a, name);
}

inline const void* ptr(const Array& a) {
  return static_cast<const uint8_t*>(a.data_handle()) + a.byte_offset();
}
inline void* mut_ptr(const Array& a) {
  return static_cast<uint8_t*>(a.data_handle()) + a.byte_offset();
}

template <typename T>
std::vector<T> to_vector(const Array& a) {
  const T* p = static_cast<const T*>(ptr(a));
  return std::vector<T>(p, p + a.size());
}

/// A float32 or float64 array (already checked) as doubles.
inline std::vector<double> to_doubles(const Array& a) {
  if (!is(a, kF32)) return to_vector<double>(a);
  const float* p = static_cast<const float*>(ptr(a));
  return std::vector<double>(p, p + a.size());
}

}  // namespace mxmoe_py
