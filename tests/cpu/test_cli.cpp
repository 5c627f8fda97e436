// The mxmoe command: exit codes and messages (0 on success, non-zero on any failure,
// errors name the argument).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>

#include "../../tools/bench_options.h"

namespace {

struct Result {
  int code = -1;
  std::string output;
};

Result run_cli(const std::string& args, bool with_stderr = true) {
  const std::string cmd = std::string(MXMOE_CLI_PATH) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Cli, InfoSucceedsAndListsCapabilities) {
  Result r = run_cli("info");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("situ"), std::string::npos) << r.output;
  Result j = run_cli("info --json");
  EXPECT_EQ(j.code, 0);
  EXPECT_NE(j.output.find("\"capabilities\""), std::string::npos) << j.output;
}

// SPEC §11: bench names, per case, the command that reproduces it (in its table's notes
// and its JSON): the case's M alone, with the options that change what it measures.
TEST(Cli, BenchCaseCommandCarriesTheOptionsThatChangeTheCase) {
  mxmoe::cli::BenchOptions o;
  EXPECT_EQ(mxmoe::cli::bench_case_command(o, 8), "mxmoe bench --tokens 8 --iterations 50 --precision exact");
  o.tokens = {1, 4096};
  o.iterations = 10;
  o.precision = "fp8";
  o.ep_ranks = 32;
  o.hbm_tbps = 4.1;
  o.baseline_json = "T.json";
  o.json_path = "out.json";  // where results go does not change the case
  EXPECT_EQ(mxmoe::cli::bench_case_command(o, 4096),
            "mxmoe bench --tokens 4096 --iterations 10 --precision fp8 --ep-ranks 32 --hbm-tbps 4.1 --baseline T.json");
}

// The default ceilings are the H200's: on another GPU bench says so, naming the GPU and
// the options still at their H200 values; nothing on an H200 or with both set.
TEST(Cli, BenchNotesWhenTheCeilingsAreNotTheGpusOwn) {
  mxmoe::cli::BenchOptions o;
  EXPECT_EQ(mxmoe::cli::ceiling_note(o, "NVIDIA H200"), "");
  EXPECT_NE(mxmoe::cli::ceiling_note(o, "NVIDIA GH200 480GB"), "");
  EXPECT_EQ(mxmoe::cli::ceiling_note(o, "NVIDIA H100 80GB HBM3"),
            "note: this GPU is 'NVIDIA H100 80GB HBM3', but the floors use the H200's measured "
            "ceilings (4.25 TB/s, 792 TFLOP/s): pass --hbm-tbps and --bf16-tflops measured on it, "
            "or read 'x floor' and the peak fractions as against an H200");
  o.hbm_tbps = 3.0;
  o.precision = "fp8";
  const std::string fp8 = mxmoe::cli::ceiling_note(o, "NVIDIA H100 80GB HBM3");
  EXPECT_NE(fp8.find("(1448 TFLOP/s): pass --fp8-tflops measured"), std::string::npos) << fp8;
  o.fp8_tflops = 1300;
  EXPECT_EQ(mxmoe::cli::ceiling_note(o, "NVIDIA H100 80GB HBM3"), "");
  o.precision = "exact";  // the BF16 ceiling is still the H200's
  EXPECT_NE(mxmoe::cli::ceiling_note(o, "NVIDIA H100 80GB HBM3").find("--bf16-tflops"), std::string::npos);
}

TEST(Cli, NoSubcommandFails) { EXPECT_NE(run_cli("").code, 0); }

TEST(Cli, UnknownSuiteIsRejectedNamingIt) {
  Result r = run_cli("validate --suite bogus --backend cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("suite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bogus"), std::string::npos) << r.output;
}

TEST(Cli, UnknownBackendIsRejectedNamingIt) {
  Result r = run_cli("validate --suite smoke --backend tpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("backend"), std::string::npos) << r.output;
}

TEST(Cli, Fp8PrecisionOnTheCpuBackendIsRefusedNamingTheOption) {
  Result r = run_cli("validate --suite smoke --backend cpu --precision fp8");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--precision"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--backend cuda"), std::string::npos) << r.output;
  r = run_cli("validate --suite smoke --backend cpu --precision fp4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("fp4"), std::string::npos) << r.output;
}

TEST(Cli, CudaBackendWithoutGpuSaysSoClearly) {
  Result info = run_cli("info --json");
  if (info.output.find("\"cuda\"") != std::string::npos) GTEST_SKIP() << "a GPU is visible: the no-GPU message cannot be tested here";
  Result r = run_cli("validate --suite smoke --backend cuda");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--backend cuda"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--backend cpu"), std::string::npos) << "must name the alternative: " << r.output;
}

TEST(Cli, ValidateOneCasePassesOnCpuAndWritesJson) {
  const std::string json = ::testing::TempDir() + "/mxmoe_validate.json";
  Result r = run_cli("validate --suite smoke --backend cpu --filter situ-uniform-m8 --seed 5 --json " + json);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 passed, 0 failed"), std::string::npos) << r.output;
  const std::string j = slurp(json);
  EXPECT_NE(j.find("\"status\": \"PASS\""), std::string::npos) << j;
}

TEST(Cli, ValidateWithNoMatchingCaseFails) {
  Result r = run_cli("validate --suite smoke --backend cpu --filter no-such-case");
  EXPECT_NE(r.code, 0) << "a run that checked nothing must not pass: " << r.output;
}

TEST(Cli, RunOnEmbeddedCheckpointPassesOnCpu) {
  Result r = run_cli("run --backend cpu --tokens 4 --seed 11");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
}

// SPEC §7: with BF16 activations the intermediate is BF16 unless asked for otherwise.
TEST(Cli, RunWithBf16InputTakesABf16IntermediateUnlessAsked) {
  const auto formats = [](const Result& r) {
    const size_t row = r.output.find("kimi_k3_mini.safetensors ", r.output.find("intermediate"));
    return row == std::string::npos ? std::string() : r.output.substr(row, r.output.find('\n', row) - row);
  };
  Result a = run_cli("run --backend cpu --tokens 2 --seed 3 --bf16-input");
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_NE(formats(a).find("bf16   bf16"), std::string::npos) << a.output;
  Result b = run_cli("run --backend cpu --tokens 2 --seed 3 --bf16-input --intermediate mxfp8");
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_NE(formats(b).find("bf16   mxfp8"), std::string::npos) << b.output;
  Result c = run_cli("run --backend cpu --tokens 2 --seed 3");
  EXPECT_EQ(c.code, 0) << c.output;
  EXPECT_NE(formats(c).find("mxfp8  mxfp8"), std::string::npos) << c.output;
  Result bad = run_cli("run --backend cpu --tokens 2 --intermediate fp4");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--intermediate"), std::string::npos) << bad.output;
}

// `--json -`: stdout is the JSON document alone (the tables go to stderr), so a pipe
// can parse it.
TEST(Cli, JsonToStdoutIsTheDocumentAlone) {
  for (const char* args : {"run --backend cpu --tokens 2 --seed 3 --json -",
                           "validate --suite smoke --backend cpu --filter m1 --seed 5 --json -"}) {
    SCOPED_TRACE(args);
    const Result r = run_cli(args, false);
    EXPECT_EQ(r.code, 0) << r.output;
    ASSERT_GE(r.output.size(), 2u);
    EXPECT_EQ(r.output.front(), '{') << r.output.substr(0, 200);
    EXPECT_EQ(r.output.substr(r.output.size() - 2), "}\n") << r.output.substr(r.output.size() - 200);
    EXPECT_EQ(r.output.find("-----"), std::string::npos) << "a table on stdout";
  }
}

// `run` on a GPT-OSS checkpoint runs GPT-OSS's model (SwiGLU-OAI, softmax router) unless
// an activation is asked for; a Kimi-K3 one SiTU with the sigmoid router.
TEST(Cli, RunTakesTheModelOfTheCheckpointFormat) {
  const std::string oss = ::testing::TempDir() + "/cli_run_oss.safetensors";
  ASSERT_EQ(run_cli("generate --output " + oss + " --format gpt-oss --experts 8 --hidden 64 --intermediate 64 --top-k 2 --seed 5").code, 0);
  Result r = run_cli("run --backend cpu --checkpoint " + oss + " --tokens 3 --seed 4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gpt-oss-format expert layer, softmax router"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" swiglu "), std::string::npos) << r.output;
  Result s = run_cli("run --backend cpu --checkpoint " + oss + " --tokens 3 --seed 4 --activation silu");
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find(" silu "), std::string::npos) << s.output;
  Result k = run_cli("run --backend cpu --tokens 3 --seed 4");
  EXPECT_EQ(k.code, 0) << k.output;
  EXPECT_NE(k.output.find("kimi-format expert layer, sigmoid router"), std::string::npos) << k.output;
  EXPECT_NE(k.output.find(" situ "), std::string::npos) << k.output;
}

TEST(Cli, RunWithMissingCheckpointFailsWithMessage) {
  Result r = run_cli("run --backend cpu --checkpoint /nonexistent/x.safetensors");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("/nonexistent/x.safetensors"), std::string::npos) << r.output;
}

TEST(Cli, RunRejectsBadActivation) {
  Result r = run_cli("run --backend cpu --activation gelu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("activation"), std::string::npos) << r.output;
}

TEST(Cli, ConvertKimiToGptOssAndBackIsBitExact) {
  const std::string dir = ::testing::TempDir();
  const std::string a = dir + "/cli_gen.safetensors", b = dir + "/cli_oss.safetensors",
                    c = dir + "/cli_back.safetensors";
  ASSERT_EQ(run_cli("generate --output " + a + " --experts 8 --hidden 64 --intermediate 64 --top-k 2 --seed 3").code, 0);
  Result r1 = run_cli("convert --input " + a + " --output " + b + " --to gpt-oss");
  ASSERT_EQ(r1.code, 0) << r1.output;
  Result r2 = run_cli("convert --input " + b + " --output " + c + " --to kimi");
  ASSERT_EQ(r2.code, 0) << r2.output;
  // Same experts after the round trip: run both with the same seed, same result line.
  Result x = run_cli("run --backend cpu --checkpoint " + a + " --layer 0 --top-k 2 --tokens 3 --seed 9 --json -");
  Result y = run_cli("run --backend cpu --checkpoint " + c + " --layer 0 --top-k 2 --tokens 3 --seed 9 --json -");
  EXPECT_EQ(x.code, 0) << x.output;
  EXPECT_EQ(y.code, 0) << y.output;
  auto metric = [](const std::string& s) {
    const size_t p = s.find("\"max_abs_err\"");
    return p == std::string::npos ? std::string() : s.substr(p, 40);
  };
  EXPECT_FALSE(metric(x.output).empty());
  EXPECT_EQ(metric(x.output), metric(y.output));
}

TEST(Cli, BenchWithoutGpuFailsClearly) {
  Result info = run_cli("info --json");
  if (info.output.find("\"cuda\"") != std::string::npos) GTEST_SKIP() << "a GPU is visible: bench would run";
  Result r = run_cli("bench --tokens 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("GPU"), std::string::npos) << r.output;
}

}  // namespace
