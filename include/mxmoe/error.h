// mxmoe/error.h — the library's errors. Every public entry point throws one of these
// (never crashes, never writes outputs) when its input is bad; the message names the
// offending argument and its value (SPEC §9).
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace mxmoe {

/// Base of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller-supplied argument is malformed: message is "<argument>: <what is wrong>".
class InvalidArgument : public Error {
 public:
  InvalidArgument(const std::string& argument, const std::string& what)
      : Error(argument + ": " + what), argument_(argument) {}
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

/// The request is well formed but not supported here (this GPU, this build); the
/// message names the feature and the supported alternative.
class Unsupported : public Error {
 public:
  using Error::Error;
};

/// A file could not be read or is malformed (checkpoints).
class FormatError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime call failed: message has the call, the error string and file:line.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Messages are built without iostreams: the error path must work in any host process,
// and inside the Python extension on the H200 machine the first ostream use crashed
// (before torch had been imported). Integers print in full, floating point as %g.
inline void append(std::string& out, const std::string& v) { out += v; }
inline void append(std::string& out, const char* v) { out += v ? v : "(null)"; }
inline void append(std::string& out, char v) { out += v; }
inline void append(std::string& out, bool v) { out += v ? "true" : "false"; }
template <typename T>
  requires std::is_integral_v<T>
inline void append(std::string& out, T v) {
  out += std::to_string(v);
}
template <typename T>
  requires std::is_floating_point_v<T>
inline void append(std::string& out, T v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  out += buf;
}
template <typename... Args>
std::string cat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}
}  // namespace detail

}  // namespace mxmoe

/// Throw InvalidArgument naming `arg` unless `cond` holds; the rest streams the reason.
#define MXMOE_CHECK_ARG(cond, arg, ...)                                                \
  do {                                                                                 \
    if (!(cond)) throw ::mxmoe::InvalidArgument((arg), ::mxmoe::detail::cat(__VA_ARGS__)); \
  } while (0)
