// libFuzzer target: load_checkpoint over arbitrary file contents, with several
// LoadOptions (whole layer, an EP slice, another layer's default prefix, an explicit
// prefix). SPEC §9: malformed checkpoints are rejected with a message, never a crash.
//
// The loader takes a path, so the input is written to an anonymous in-memory file
// (memfd_create) opened through /proc/self/fd/<n>: nothing touches the disk and parallel
// fuzzing jobs cannot collide. Where memfd is unavailable a per-process file in $TMPDIR
// (default /tmp) is used instead.
//
// Properties checked beyond "no sanitizer report":
//  * load_checkpoint only ever throws mxmoe::Error subclasses (FormatError for the file,
//    InvalidArgument for options that do not fit it); anything else aborts;
//  * a layer that loads is consistent: its weights pass ExpertWeights::validate for the
//    config its shapes imply, and the correction bias is empty or [num_experts];
//  * synthetic_spec_from_metadata (what `mxmoe run` calls on the metadata) throws only
//    FormatError.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_checkpoint: property violated: %s: %s\n", what, detail.c_str());
  std::abort();
}

struct InputFile {
  int fd = -1;
  std::string path;
  InputFile() {
#ifdef MFD_CLOEXEC
    fd = memfd_create("mxmoe_fuzz_checkpoint", MFD_CLOEXEC);
#endif
    if (fd >= 0) {
      path = "/proc/self/fd/" + std::to_string(fd);
    } else {
      const char* tmp = std::getenv("TMPDIR");
      path = std::string(tmp && *tmp ? tmp : "/tmp") + "/mxmoe_fuzz_checkpoint." + std::to_string(::getpid());
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) fail("cannot create the input file", path + ": " + std::strerror(errno));
    }
  }
  ~InputFile() {
    if (path.rfind("/proc/", 0) != 0) ::unlink(path.c_str());
    ::close(fd);
  }
  void set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd, 0) != 0) fail("ftruncate", std::strerror(errno));
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("pwrite", std::strerror(errno));
      done += static_cast<size_t>(w);
    }
  }
};

void check_loaded(const mxmoe::LoadedLayer& L, const mxmoe::LoadOptions& o) {
  using namespace mxmoe;
  MoeConfig cfg;
  cfg.num_experts = L.num_experts;
  cfg.top_k = 1;
  cfg.hidden = L.hidden;
  cfg.intermediate = L.intermediate;
  cfg.ep_size = o.ep_size;
  cfg.ep_rank = o.ep_rank;
  cfg.has_bias = !L.weights.w13_bias.empty();
  try {
    cfg.validate();
    L.weights.validate(cfg);
  } catch (const Error& e) {
    fail("a loaded layer is inconsistent", e.what());
  }
  if (!L.correction_bias.empty() && static_cast<int64_t>(L.correction_bias.size()) != L.num_experts)
    fail("correction bias size", std::to_string(L.correction_bias.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  static InputFile file;
  file.set(data, size);

  LoadOptions variants[4];
  variants[1].ep_size = 2;
  variants[1].ep_rank = 1;
  variants[2].layer = 3;
  variants[3].prefix = "p";
  for (const LoadOptions& o : variants) {
    try {
      const LoadedLayer L = load_checkpoint(file.path, o);
      check_loaded(L, o);
      SyntheticSpec spec;
      try {
        synthetic_spec_from_metadata(L.metadata, spec);
      } catch (const FormatError&) {
      } catch (const std::exception& e) {
        fail("synthetic_spec_from_metadata threw something other than FormatError", e.what());
      }
    } catch (const Error&) {
      // FormatError / InvalidArgument: the expected outcome for malformed input.
    } catch (const std::exception& e) {
      fail("exception other than mxmoe::Error", e.what());
    }
  }
  return 0;
}
