// launch.cpp — ep_launch (ep.h): one process per GPU on one host, without MPI. The parent
// forks every child before any CUDA call (CUDA does not survive a fork once
// initialised), child 0 makes the NCCL unique id, and the parent relays its 128 bytes to
// the other children through pipes. The parent never touches CUDA or NCCL, so it can
// launch again (a test binary runs one launch per test).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <thread>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/ep.h"
#include "mxmoe/error.h"

namespace mxmoe {

namespace ep_detail {
void select_device(int rank);  // comm.cu (no-op in a build without NCCL)
}

namespace {

using Clock = std::chrono::steady_clock;

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes before `deadline` (-1 ms: no deadline); false on EOF, error or time.
bool read_all(int fd, void* data, size_t n, Clock::time_point deadline, bool use_deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    int wait_ms = -1;
    if (use_deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      wait_ms = static_cast<int>(std::min<long long>(left.count(), 1 << 30));
    }
    pollfd pfd{fd, POLLIN, 0};
    const int pr = ::poll(&pfd, 1, wait_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void flush_all() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

[[noreturn]] void child_main(int rank, int ranks, int up_write, int down_read,
                             const std::function<int(int, int, const EpUniqueId&)>& body) {
  int rc = 1;
  try {
    EpUniqueId id{};
    if (rank == 0) {
      id = ep_unique_id();
      if (!write_all(up_write, id.data(), id.size()))
        throw Error("ep_launch: rank 0 could not hand the NCCL unique id to the launcher");
      ::close(up_write);
    } else if (!read_all(down_read, id.data(), id.size(), Clock::now(), false)) {
      throw Error("ep_launch: did not receive the NCCL unique id (rank 0 failed to make it?)");
    }
    if (down_read >= 0) ::close(down_read);
    ep_detail::select_device(rank);
    rc = body(rank, ranks, id);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mxmoe ep rank %d: error: %s\n", rank, e.what());
    rc = 1;
  } catch (...) {
    std::fprintf(stderr, "mxmoe ep rank %d: error: unknown exception\n", rank);
    rc = 1;
  }
  flush_all();
  // An exit status holds 8 bits: a body's 256 must not read as success.
  ::_exit(rc >= 0 && rc <= 255 ? rc : 1);
}

}  // namespace

int ep_launch(int ranks, const std::function<int(int, int, const EpUniqueId&)>& body, int timeout_s) {
  MXMOE_CHECK_ARG(ranks >= 1, "ranks", "must be >= 1, got ", ranks);
  MXMOE_CHECK_ARG(timeout_s >= 1, "timeout_s", "must be >= 1, got ", timeout_s);
  MXMOE_CHECK_ARG(static_cast<bool>(body), "body", "is empty");
  // Before the fork, so every child's NCCL sees it whatever the caller's environment says.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  flush_all();  // buffered output must not be written once per child

  int up[2];
  if (::pipe(up) != 0) throw Error(detail::cat("ep_launch: pipe failed: ", std::strerror(errno)));
  std::vector<int> down_r(ranks, -1), down_w(ranks, -1);
  auto close_fd = [](int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  };
  auto close_all = [&] {
    close_fd(up[0]);
    close_fd(up[1]);
    for (int r = 0; r < ranks; ++r) {
      close_fd(down_r[r]);
      close_fd(down_w[r]);
    }
  };
  for (int r = 1; r < ranks; ++r) {
    int p[2];
    if (::pipe(p) != 0) {
      close_all();
      throw Error(detail::cat("ep_launch: pipe failed: ", std::strerror(errno)));
    }
    down_r[r] = p[0];
    down_w[r] = p[1];
  }

  // The children must be reapable here whatever the caller did with SIGCHLD.
  struct sigaction chld_default{}, chld_old{};
  chld_default.sa_handler = SIG_DFL;
  sigemptyset(&chld_default.sa_mask);
  ::sigaction(SIGCHLD, &chld_default, &chld_old);
  struct RestoreChld {
    struct sigaction* old;
    ~RestoreChld() { ::sigaction(SIGCHLD, old, nullptr); }
  } restore_chld{&chld_old};

  const pid_t parent = ::getpid();
  std::vector<pid_t> pids(ranks, -1);
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      // A rank must not outlive the launcher (killed by a test timeout, say) and keep
      // spinning in NCCL on the GPU.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      // The child keeps only its own ends.
      close_fd(up[0]);
      if (r != 0) close_fd(up[1]);
      for (int q = 0; q < ranks; ++q) {
        close_fd(down_w[q]);
        if (q != r) close_fd(down_r[q]);
      }
      child_main(r, ranks, up[1], down_r[r], body);
    }
    if (pid < 0) {
      const int err = errno;
      for (int q = 0; q < r; ++q) {
        ::kill(pids[q], SIGKILL);
        ::waitpid(pids[q], nullptr, 0);
      }
      close_all();
      throw Error(detail::cat("ep_launch: fork failed: ", std::strerror(err)));
    }
    pids[r] = pid;
  }
  close_fd(up[1]);
  for (int r = 0; r < ranks; ++r) close_fd(down_r[r]);

  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  // Relay the id. A child that died closes its pipe: writing must not raise SIGPIPE here.
  EpUniqueId id{};
  struct sigaction ignore{}, old{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &old);
  if (read_all(up[0], id.data(), id.size(), deadline, true))
    for (int r = 1; r < ranks; ++r) (void)write_all(down_w[r], id.data(), id.size());
  ::sigaction(SIGPIPE, &old, nullptr);
  close_all();  // children still waiting for the id now read EOF and fail

  // Wait for every child. When one fails, the others may be blocked in NCCL waiting for
  // it: they get a grace period, then are killed. A child past the deadline is killed.
  std::vector<int> code(ranks, -1);
  std::vector<bool> killed(ranks, false);
  int running = ranks;
  bool failed = false;
  Clock::time_point kill_at = deadline;
  while (running > 0) {
    for (int r = 0; r < ranks; ++r) {
      if (code[r] >= 0) continue;
      int status = 0;
      const pid_t w = ::waitpid(pids[r], &status, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR)) continue;
      if (w < 0) {
        code[r] = 127;  // lost (should not happen: the child is ours, SIGCHLD default)
      } else if (WIFEXITED(status)) {
        code[r] = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        code[r] = 128 + WTERMSIG(status);
        std::fprintf(stderr, "ep_launch: rank %d was killed by signal %d (%s)\n", r,
                     WTERMSIG(status), strsignal(WTERMSIG(status)));
      } else {
        continue;
      }
      --running;
      if (code[r] != 0 && !failed) {
        failed = true;
        kill_at = std::min(deadline, Clock::now() + std::chrono::seconds(20));
      }
    }
    if (running == 0) break;
    if (Clock::now() >= kill_at) {
      for (int r = 0; r < ranks; ++r) {
        if (code[r] >= 0) continue;
        std::fprintf(stderr, "ep_launch: rank %d %s; killing it\n", r,
                     failed ? "still running 20 s after another rank failed"
                            : "did not finish within the timeout");
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        code[r] = 128 + SIGKILL;
        killed[r] = true;
        --running;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::fflush(stderr);
  // The first rank that failed by itself names the failure; ranks the launcher killed
  // only because of it come after.
  for (int r = 0; r < ranks; ++r)
    if (code[r] != 0 && !killed[r]) return code[r];
  for (int r = 0; r < ranks; ++r)
    if (code[r] != 0) return code[r];
  return 0;
}

int ep_device_count() {
  flush_all();
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    try {
      n = cuda_device_count();
    } catch (...) {
      n = 0;
    }
    ::_exit(n > 255 ? 255 : n);
  }
  if (pid < 0) return 0;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

}  // namespace mxmoe
