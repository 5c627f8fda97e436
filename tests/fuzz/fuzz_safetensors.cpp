// libFuzzer target: SafetensorsFile::parse over arbitrary bytes (SPEC §9: a malformed
// checkpoint is rejected with a message, never a crash).
//
// Properties checked beyond "no sanitizer report":
//  * parse() either succeeds or throws FormatError (any other exception aborts);
//  * an accepted file describes only bytes that exist: for every tensor, info(), data()
//    and expect(its own dtype and shape) agree, begin <= end, (end - begin) equals
//    numel * dtype_size, and every byte of [data, data + size) is read (ASan sees any
//    byte outside the input, which libFuzzer allocates at its exact size).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace {

[[noreturn]] void fail(const char* what, const char* detail) {
  std::fprintf(stderr, "fuzz_safetensors: property violated: %s: %s\n", what, detail);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  try {
    const SafetensorsFile f = SafetensorsFile::parse(data, size);
    volatile uint8_t sink = 0;
    for (const TensorInfo& t : f.tensors()) {
      if (!f.has(t.name)) fail("has() is false for a listed tensor", t.name.c_str());
      const TensorInfo& i = f.info(t.name);
      if (&i != &t) fail("info() returns another entry", t.name.c_str());
      if (t.begin > t.end) fail("begin > end", t.name.c_str());
      const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype);
      if (t.end - t.begin != bytes) fail("byte span differs from numel * dtype_size", t.name.c_str());
      const uint8_t* p = f.data(t.name);
      if (f.expect(t.name, t.dtype, t.shape) != p) fail("expect() and data() differ", t.name.c_str());
      if (bytes != 0 && (p < data || p + bytes > data + size))
        fail("tensor bytes outside the input", t.name.c_str());
      for (uint64_t k = 0; k < bytes; ++k) sink = sink ^ p[k];
    }
    for (const auto& kv : f.metadata()) sink = sink ^ static_cast<uint8_t>(kv.first.size() + kv.second.size());
    (void)sink;
  } catch (const FormatError&) {
    // The expected outcome for malformed input.
  } catch (const std::exception& e) {
    fail("exception other than FormatError", e.what());
  }
  return 0;
}
