// nccl_api.cpp — see nccl_api.h.
#include "nccl_api.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "mxmoe/error.h"

namespace mxmoe::ep_detail {
namespace {

NcclApi load() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw Unsupported(detail::cat(
        "expert parallelism needs NCCL, and libnccl.so.2 could not be loaded (",
        why ? why : "not found",
        "); put NCCL's lib directory (e.g. site-packages/nvidia/nccl/lib of the pip package "
        "nvidia-nccl-cu13) on LD_LIBRARY_PATH"));
  }
  NcclApi a;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr)
      throw Unsupported(detail::cat("the loaded libnccl lacks ", name, " (NCCL too old?)"));
  };
  sym(a.GetUniqueId, "ncclGetUniqueId");
  sym(a.CommInitRank, "ncclCommInitRank");
  sym(a.CommDestroy, "ncclCommDestroy");
  sym(a.CommAbort, "ncclCommAbort");
  sym(a.GetErrorString, "ncclGetErrorString");
  sym(a.GroupStart, "ncclGroupStart");
  sym(a.GroupEnd, "ncclGroupEnd");
  sym(a.Send, "ncclSend");
  sym(a.Recv, "ncclRecv");
  sym(a.AllReduce, "ncclAllReduce");
  return a;  // the library stays loaded for the life of the process
}

}  // namespace

const NcclApi& nccl_api() {
  static const NcclApi api = load();  // thread-safe; a throw leaves it for the next call
  return api;
}

}  // namespace mxmoe::ep_detail
