// nccl_api.h — NCCL, loaded on first use with dlopen. The library is needed only when
// expert parallelism runs, so the CLI (`mxmoe run`, `validate`, ...) and every other
// binary start on machines without libnccl.so.2 on the loader path; only nccl.h is
// needed at build time.
#pragma once

#include <nccl.h>

namespace mxmoe::ep_detail {

/// The NCCL entry points the EP layer calls.
struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
};

/// The loaded library's entry points. The first call loads libnccl.so.2 (then
/// libnccl.so); throws Unsupported naming the library and the loader's message when it
/// cannot, and tries again on the next call.
const NcclApi& nccl_api();

}  // namespace mxmoe::ep_detail
