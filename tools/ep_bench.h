// `mxmoe ep-bench`: expert parallelism over NCCL on Kimi-K3 shapes (tools/ep_bench.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

struct EpBenchOptions {
  int ranks = 2;
  std::vector<int64_t> tokens{1, 8, 32, 128, 1024, 4096};  // per rank
  std::string mode = "both";                               // padded | exact | both
  int iterations = 30;
  std::string json_path;
};

/// Registers the subcommand; main() runs cmd_ep_bench when it was given.
CLI::App* add_ep_bench_command(CLI::App& app, EpBenchOptions& o);
int cmd_ep_bench(const EpBenchOptions& o);
