// Hardening (issue 7, SPEC §2 and §9): the checked conditions that no other test file
// covers, and the numeric hazards through both CPU engines. docs/HARDENING.md lists
// every checked condition with the test that proves it; the rows marked
// test_hardening.cpp are here.
//
// Numeric hazards (formats.h, docs/DESIGN.md) are tested end to end, through
// reference_forward (float64) and cpu_forward (fp32, the kernels' arithmetic):
//  * scale byte 0x00 (2^-127, a float subnormal) is decoded exactly, never flushed;
//    scale byte 0xFE (2^127) too, and where its products stay in fp32's range the two
//    extremes cancel exactly;
//  * subnormal E4M3 codes decode exactly;
//  * user-supplied 0xFE scales that overflow fp32, Inf in BF16 inputs and NaN reach
//    only the rows they belong to (bit-identical elsewhere);
//  * ±Inf in activations quantized to MXFP8 saturates at the block scale: all finite.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "mxmoe/routing.h"
#include "mxmoe/safetensors.h"

namespace mxmoe {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "mxmoe_hard_" + std::to_string(::getpid()) + "_" + name;
}

template <typename F>
std::string rejected_argument(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.argument();
  } catch (const std::exception& e) {
    return std::string("<other exception: ") + e.what() + ">";
  }
  return "<accepted>";
}

// The FormatError message of f() ("<accepted>" or "<other ...>" otherwise).
template <typename F>
std::string format_error(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other exception: ") + e.what() + ">";
  }
  return "<accepted>";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "'" << (haystack) << "' lacks '" << (needle) << "'"

// ================================================================ argument validation

MoeConfig small_config() {
  MoeConfig c;
  c.num_experts = 8;
  c.top_k = 2;
  c.hidden = 64;
  c.intermediate = 64;
  c.activation = ActivationParams::situ();
  return c;
}

TEST(HardeningArgs, ConfigRejectsNumExpertsBeyondInt32Ids) {
  MoeConfig c = small_config();
  c.num_experts = int64_t{1} << 31;
  EXPECT_EQ(rejected_argument([&] { c.validate(); }), "config.num_experts");
}

TEST(HardeningArgs, WeightSizesThatOverflowInt64AreRejectedNotWrapped) {
  MoeConfig c = small_config();
  c.num_experts = 1;
  c.top_k = 1;
  c.hidden = int64_t{1} << 40;
  c.intermediate = int64_t{1} << 40;
  ASSERT_NO_THROW(c.validate());
  ExpertWeights w;
  w.num_local = 1;
  w.hidden = c.hidden;
  w.intermediate = c.intermediate;
  // 2N * K/2 = 2^80 bytes: the checked product throws instead of wrapping to a small size.
  EXPECT_EQ(rejected_argument([&] { w.validate(c); }), "weights.w13_packed");
}

TEST(HardeningArgs, ActivationSizeOverflowIsRejected) {
  Activations x;
  x.format = InputFormat::BF16;
  x.tokens = int64_t{1} << 40;
  x.hidden = int64_t{1} << 30;
  EXPECT_EQ(rejected_argument([&] { x.validate("x", x.hidden); }), "x");
}

TEST(HardeningArgs, RoutingSizeOverflowIsRejected) {
  MoeConfig c = small_config();
  Routing r;
  r.tokens = int64_t{1} << 62;
  r.top_k = 2;
  EXPECT_EQ(rejected_argument([&] { r.validate(c); }), "routing");
}

TEST(HardeningArgs, RouterRejectsNumExpertsBeyondInt32Ids) {
  RoutingParams p;
  p.top_k = 2;
  EXPECT_EQ(rejected_argument([&] { route_cpu(nullptr, 0, int64_t{1} << 31, nullptr, p); }), "num_experts");
}

TEST(HardeningArgs, CudaApiInACpuOnlyBuildIsUnsupportedNamingTheAlternative) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA engine (tests/gpu cover it)";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_TRUE(cuda_devices().empty());
  const MoeConfig c = small_config();
  const SyntheticLayer syn = make_synthetic_layer(c, 3);
  try {
    CudaMoeLayer layer(c, syn.weights);
    ADD_FAILURE() << "a CPU-only build constructed a CUDA layer";
  } catch (const Unsupported& e) {
    EXPECT_CONTAINS(e.what(), "backend cpu");
  }
}

// ================================================================ safetensors

std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes, bool override_length = false,
                              uint64_t length = 0) {
  const uint64_t n = override_length ? length : header.size();
  std::vector<uint8_t> f(8);
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  f.insert(f.end(), header.begin(), header.end());
  f.resize(f.size() + data_bytes, 0x5A);
  return f;
}

void write_file(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(HardeningSafetensors, OpenRejectsADirectoryAndAFileShorterThanTheLengthField) {
  const std::string dir = temp_path("dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  EXPECT_CONTAINS(format_error([&] { SafetensorsFile::open(dir); }), "not a regular file");
  ::rmdir(dir.c_str());
  const std::string shortf = temp_path("short");
  write_file(shortf, {1, 0, 0, 0});
  const std::string m = format_error([&] { SafetensorsFile::open(shortf); });
  EXPECT_CONTAINS(m, shortf);
  EXPECT_CONTAINS(m, "shorter than the 8-byte");
  std::remove(shortf.c_str());
}

TEST(HardeningSafetensors, OpenOfAFifoIsRejectedWithoutBlocking) {
  // Regression (issue 7): open() blocked forever on a FIFO with no writer, before the
  // regular-file check could reject it.
  const std::string fifo = temp_path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_CONTAINS(format_error([&] { SafetensorsFile::open(fifo); }), "not a regular file");
  EXPECT_CONTAINS(format_error([&] { load_checkpoint(fifo, {}); }), "not a regular file");
  std::remove(fifo.c_str());
}

TEST(HardeningSafetensors, ParseOfNullWithNonZeroSizeIsInvalidArgument) {
  EXPECT_EQ(rejected_argument([] { SafetensorsFile::parse(nullptr, 16); }), "data");
}

TEST(HardeningSafetensors, HeaderTooSmallForJsonAndEmptyTensorName) {
  const auto tiny = raw_file("{", 0);
  EXPECT_CONTAINS(format_error([&] { SafetensorsFile::parse(tiny.data(), tiny.size()); }), "too small");
  const auto unnamed = raw_file(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_CONTAINS(format_error([&] { SafetensorsFile::parse(unnamed.data(), unnamed.size()); }), "empty name");
}

TEST(HardeningSafetensors, ControlCharactersInNamesAreNotEchoedRaw) {
  // A crafted name must not put terminal escapes into error messages.
  const auto f = raw_file("{\"a\\u001b[31m\":{\"dtype\":\"X\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  const std::string m = format_error([&] { SafetensorsFile::parse(f.data(), f.size()); });
  EXPECT_CONTAINS(m, "unknown dtype");
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
}

// ================================================================ checkpoints

// A file made of the given tensors (all U8 [rows, cols] of filler unless a dtype is given).
struct T {
  std::string name;
  std::vector<int64_t> shape;
  StDType dtype = StDType::U8;
};
std::string write_tensors(const std::string& file, std::initializer_list<T> tensors) {
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> keep;
  for (const T& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    keep.emplace_back(static_cast<size_t>(n) * dtype_size(t.dtype), 0x3C);
    w.add(t.name, t.dtype, t.shape, keep.back().data(), keep.back().size());
  }
  const std::string path = temp_path(file);
  w.write(path);
  return path;
}

const std::string kP = "model.layers.0.mlp.experts.";

TEST(HardeningCheckpoint, ImplausibleKimiExpertIndexIsRejected) {
  for (const char* idx : {"01", "12345678"}) {
    const std::string path = write_tensors("idx", {{kP + "0.w1.weight_packed", {32, 32}},
                                                   {kP + idx + ".w1.weight_packed", {32, 32}}});
    const std::string m = format_error([&] { load_checkpoint(path, {}); });
    EXPECT_CONTAINS(m, "not a plausible index");
    EXPECT_CONTAINS(m, idx);
    std::remove(path.c_str());
  }
}

TEST(HardeningCheckpoint, KimiAndGptOssUnderOnePrefixIsAmbiguous) {
  const std::string path = write_tensors("both", {{kP + "0.w1.weight_packed", {32, 32}},
                                                  {kP + "gate_up_proj_blocks", {1, 64, 2, 16}}});
  EXPECT_CONTAINS(format_error([&] { load_checkpoint(path, {}); }), "ambiguous");
  std::remove(path.c_str());
}

TEST(HardeningCheckpoint, GptOssBlocksOfWrongRankOrZeroExpertsAreRejected) {
  {
    const std::string path = write_tensors("rank", {{kP + "gate_up_proj_blocks", {64, 2, 16}}});
    const std::string m = format_error([&] { load_checkpoint(path, {}); });
    EXPECT_CONTAINS(m, "gate_up_proj_blocks");
    EXPECT_CONTAINS(m, "expected U8 [experts, 2*intermediate, hidden/32, 16]");
    std::remove(path.c_str());
  }
  {
    const std::string path = write_tensors("zero", {{kP + "gate_up_proj_blocks", {0, 64, 2, 16}}});
    EXPECT_CONTAINS(format_error([&] { load_checkpoint(path, {}); }), "no experts");
    std::remove(path.c_str());
  }
}

TEST(HardeningCheckpoint, KimiFirstTensorOfWrongRankIsRejected) {
  const std::string path = write_tensors("k1d", {{kP + "0.w1.weight_packed", {1024}}});
  EXPECT_CONTAINS(format_error([&] { load_checkpoint(path, {}); }), "expected U8 [intermediate, hidden/2]");
  std::remove(path.c_str());
}

TEST(HardeningCheckpoint, GapInKimiExpertNumberingNamesTheMissingTensor) {
  // Experts 0 and 2 present: E = 3, expert 1 missing.
  const std::string path = write_tensors(
      "gap", {{kP + "0.w1.weight_packed", {32, 32}}, {kP + "0.w1.weight_scale", {32, 2}},
              {kP + "0.w3.weight_packed", {32, 32}}, {kP + "0.w3.weight_scale", {32, 2}},
              {kP + "0.w2.weight_packed", {64, 16}}, {kP + "0.w2.weight_scale", {64, 1}},
              {kP + "2.w1.weight_packed", {32, 32}}});
  const std::string m = format_error([&] { load_checkpoint(path, {}); });
  EXPECT_CONTAINS(m, kP + "1.w1.weight_packed");
  EXPECT_CONTAINS(m, "not found");
  std::remove(path.c_str());
}

TEST(HardeningCheckpoint, CorrectionBiasOfWrongDtypeIsRejected) {
  SyntheticSpec s;
  s.num_experts = 2;
  s.hidden = 64;
  s.intermediate = 32;
  s.top_k = 1;
  const std::string good = temp_path("cb_good");
  write_synthetic_checkpoint(good, s);
  const SafetensorsFile f = SafetensorsFile::open(good);
  SafetensorsWriter w;
  const std::string cb = "model.layers.0.mlp.gate.e_score_correction_bias";
  for (const TensorInfo& t : f.tensors())
    w.add(t.name, t.name == cb ? StDType::I32 : t.dtype, t.shape, f.data(t.name), t.end - t.begin);
  const std::string bad = temp_path("cb_bad");
  w.write(bad);
  const std::string m = format_error([&] { load_checkpoint(bad, {}); });
  EXPECT_CONTAINS(m, cb);
  EXPECT_CONTAINS(m, "expected F32 or BF16");
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

TEST(HardeningCheckpoint, FuzzSeedCorpusFilesOnlyEverThrowMxmoeErrors) {
  // The fuzzers' malformed seeds (tests/fuzz/corpus) as a regression check in every
  // build, sanitizer builds included.
  const std::string dir = std::string(MXMOE_DATA_DIR) + "/../tests/fuzz/corpus/fuzz_checkpoint/";
  int loaded = 0, rejected = 0;
  for (const char* name : {"kimi_e2_k64_n32_layer0.safetensors", "gptoss_bias_e2_k64_n32.safetensors",
                           "bad_kimi_missing_w2_scale.safetensors", "bad_kimi_scale_dtype.safetensors",
                           "bad_kimi_expert_gap.safetensors", "bad_gptoss_bias_f32_wrong_shape.safetensors",
                           "bad_gptoss_unpaired_bias.safetensors", "bad_truncated.safetensors"}) {
    try {
      load_checkpoint(dir + name, {});
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded, 2);
  EXPECT_EQ(rejected, 6);
}

// ================================================================ CLI

struct CliResult {
  int code = -1;
  std::string output;
};
CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(MXMOE_CLI_PATH) + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;  // a crash is -1, never 2
  return r;
}

TEST(HardeningCli, MalformedCheckpointExitsTwoWithAMessageForRunAndConvert) {
  const std::string bad = temp_path("cli_bad.safetensors");
  write_file(bad, raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,400]}})", 4));
  const CliResult r = run_cli("run --backend cpu --checkpoint " + bad);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "mxmoe: error:");
  EXPECT_CONTAINS(r.output, "past the data section");
  const CliResult c = run_cli("convert --input " + bad + " --output " + bad + ".out");
  EXPECT_EQ(c.code, 2) << c.output;
  EXPECT_CONTAINS(c.output, bad);
  std::ifstream out(bad + ".out");
  EXPECT_FALSE(out.good()) << "a failed convert wrote its output";
  std::remove(bad.c_str());
}

TEST(HardeningCli, BadNumbersAreRejectedNamingTheOption) {
  const CliResult g = run_cli("generate --output " + temp_path("g.safetensors") + " --hidden 33");
  EXPECT_EQ(g.code, 2) << g.output;
  EXPECT_CONTAINS(g.output, "hidden");
  EXPECT_CONTAINS(g.output, "33");
  const CliResult ep = run_cli("run --backend cpu --tokens 2 --ep-size 3");  // 64 experts
  EXPECT_EQ(ep.code, 2) << ep.output;
  EXPECT_CONTAINS(ep.output, "ep_size");
  const CliResult m = run_cli("run --backend cpu --tokens 0");
  EXPECT_NE(m.code, 0) << m.output;
  EXPECT_NE(m.code, -1) << "crashed: " << m.output;
  EXPECT_CONTAINS(m.output, "--tokens");
  const CliResult f = run_cli("convert --input " + std::string(MXMOE_DATA_DIR) + "/kimi_k3_mini.safetensors --layer 3 --output " +
                              temp_path("x.safetensors") + " --to onnx");
  EXPECT_EQ(f.code, 2) << f.output;
  EXPECT_CONTAINS(f.output, "onnx");
}

// ================================================================ numeric hazards

// A small layer on EP2 rank 1 (local experts 4..7 of 8), K 64, N 64, top-3, fp32 output so
// non-finite values and exact bits are visible.
struct Problem {
  MoeConfig cfg;
  ExpertWeights w;
  Activations x;
  Routing r;
};

Problem make_problem(Activation act, InputFormat in, uint64_t seed, int64_t M = 12) {
  Problem p;
  p.cfg.num_experts = 8;
  p.cfg.ep_size = 2;
  p.cfg.ep_rank = 1;
  p.cfg.top_k = 3;
  p.cfg.hidden = 64;
  p.cfg.intermediate = 64;
  p.cfg.activation = act == Activation::SiTU         ? ActivationParams::situ()
                     : act == Activation::SwiGLU_OAI ? ActivationParams::swiglu_oai()
                                                     : ActivationParams::silu_gated();
  p.cfg.input_format = in;
  p.cfg.intermediate_format = IntermediateFormat::MXFP8;
  p.cfg.output_format = OutputFormat::FP32;
  p.w = make_synthetic_layer(p.cfg, seed).weights;
  const Activations bf = make_activations(M, p.cfg.hidden, seed + 1);
  p.x = in == InputFormat::MXFP8 ? bf.to_mxfp8() : bf;
  Rng rng(seed + 2);
  p.r.tokens = M;
  p.r.top_k = 3;
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> ids(8);
    std::iota(ids.begin(), ids.end(), 0);
    for (int i = 7; i > 0; --i) std::swap(ids[i], ids[rng.below(i + 1)]);
    // Token t always has local expert 4 + t % 4, so every local expert is used.
    const int32_t mine = static_cast<int32_t>(4 + t % 4);
    p.r.ids.push_back(mine);
    for (int j = 0, n = 0; n < 2; ++j)
      if (ids[j] != mine) p.r.ids.push_back(ids[j]), ++n;
    for (int j = 0; j < 3; ++j) p.r.weights.push_back(static_cast<float>(0.2 + rng.uniform()));
  }
  return p;
}

struct Outputs {
  Output ref, cpu;
};
Outputs run_both(const Problem& p) {
  Outputs o;
  reference_forward(p.cfg, p.w, p.x, p.r, o.ref, nullptr, 2);
  cpu_forward(p.cfg, p.w, p.x, p.r, o.cpu, 2);
  return o;
}

bool row_bits_equal(const Output& a, const Output& b, int64_t t) {
  const int64_t K = a.hidden;
  return std::memcmp(&a.fp32[t * K], &b.fp32[t * K], K * sizeof(float)) == 0;
}
int64_t row_nonfinite(const Output& a, int64_t t) {
  int64_t n = 0;
  for (int64_t k = 0; k < a.hidden; ++k) n += !std::isfinite(a.fp32[t * a.hidden + k]);
  return n;
}
bool routed_to(const Problem& p, int64_t t, int32_t local) {
  for (int64_t j = 0; j < p.r.top_k; ++j)
    if (p.cfg.local_of(p.r.ids[t * p.r.top_k + j]) == local) return true;
  return false;
}

const char* kEngines[] = {"reference_forward", "cpu_forward"};
const Output& engine(const Outputs& o, int i) { return i == 0 ? o.ref : o.cpu; }

TEST(HardeningNumerics, Scale00OnActivationsTimesScaleFEOnW13EqualsUnitScalesBitForBit) {
  // 2^-127 * 2^127 = 1: if either engine flushed the subnormal scale 0x00 to zero or lost
  // the 0xFE scale, GEMM1 would differ. W13 codes are limited to |c| <= 1.5, where
  // c * 2^127 is finite in fp32 (2 * 2^127 is not: see the next tests); then every product
  // v * 2^-127 * c * 2^127 is exact in fp32 (v * 2^-127 is an exact float, normal or
  // subnormal) and equals v * c.
  for (Activation act : {Activation::SiTU, Activation::SwiGLU_OAI}) {
    Problem unit = make_problem(act, InputFormat::MXFP8, 101);
    for (uint8_t& b : unit.w.w13_packed) b &= 0xBB;  // clear each nibble's top exponent bit
    std::fill(unit.x.scale.begin(), unit.x.scale.end(), 127);
    std::fill(unit.w.w13_scale.begin(), unit.w.w13_scale.end(), 127);
    Problem extreme = unit;
    std::fill(extreme.x.scale.begin(), extreme.x.scale.end(), 0x00);
    std::fill(extreme.w.w13_scale.begin(), extreme.w.w13_scale.end(), 0xFE);
    const Outputs a = run_both(unit), b = run_both(extreme);
    for (int i = 0; i < 2; ++i) {
      const Output &u = engine(a, i), &e = engine(b, i);
      EXPECT_EQ(std::memcmp(u.fp32.data(), e.fp32.data(), u.fp32.size() * 4), 0) << kEngines[i];
      int64_t nonzero = 0, nonfinite = 0;
      for (float v : e.fp32) nonzero += v != 0.0f, nonfinite += !std::isfinite(v);
      EXPECT_GT(nonzero, static_cast<int64_t>(e.fp32.size()) / 2) << kEngines[i];
      EXPECT_EQ(nonfinite, 0) << kEngines[i];
    }
  }
}

TEST(HardeningNumerics, SubnormalE4M3CodesDecodeExactlyThroughBothEngines) {
  // Codes 0x01..0x07 are m * 2^-9 (E4M3 subnormals); with scale 2^9 they are the integers
  // m, the same values as the normal codes for m at scale 2^0: outputs must be identical.
  Problem normal = make_problem(Activation::SiLU_Gated, InputFormat::MXFP8, 202);
  Problem sub = normal;
  Rng rng(203);
  for (size_t i = 0; i < normal.x.fp8.size(); ++i) {
    const uint8_t m = static_cast<uint8_t>(rng.below(8));  // 0..7
    const uint8_t sign = rng.below(2) ? 0x80 : 0x00;
    sub.x.fp8[i] = sign | m;
    normal.x.fp8[i] = sign | fmt::float_to_e4m3(static_cast<float>(m));
    ASSERT_EQ(fmt::e4m3_to_float(sub.x.fp8[i]) * 512.0f, fmt::e4m3_to_float(normal.x.fp8[i]));
  }
  std::fill(sub.x.scale.begin(), sub.x.scale.end(), 127 + 9);
  std::fill(normal.x.scale.begin(), normal.x.scale.end(), 127);
  const Outputs a = run_both(normal), b = run_both(sub);
  for (int i = 0; i < 2; ++i) {
    const Output &n = engine(a, i), &s = engine(b, i);
    EXPECT_EQ(std::memcmp(n.fp32.data(), s.fp32.data(), n.fp32.size() * 4), 0) << kEngines[i];
    int64_t nonzero = 0;
    for (float v : s.fp32) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, static_cast<int64_t>(s.fp32.size()) / 2) << kEngines[i];
  }
}

TEST(HardeningNumerics, Bf16SubnormalActivationsAreNotFlushedByMxfp8Conversion) {
  Activations x;
  x.format = InputFormat::BF16;
  x.tokens = 1;
  x.hidden = 32;
  for (int i = 0; i < 32; ++i) x.bf16.push_back(static_cast<uint16_t>((i & 1 ? 0x8000 : 0) | (1 + i % 8)));  // m * 2^-133
  for (int i = 0; i < 32; ++i) ASSERT_NE(x.value(0, i), 0.0) << "BF16 subnormal decoded as zero";
  const Activations q = x.to_mxfp8();
  EXPECT_EQ(q.scale[0], 0) << "amax ~2^-130 needs the smallest scale, 2^-127";
  // m * 2^-133 / 2^-127 = m * 2^-6: E4M3 subnormals and normals, exact for m <= 8.
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q.value(0, i), x.value(0, i)) << i;
}

TEST(HardeningNumerics, OverflowingScaleFEOnAnActivationBlockStaysInItsRow) {
  // 448 * 2^127 is beyond fp32: a caller-supplied 0xFE scale (the library's quantizer
  // never makes one) gives that token non-finite values in fp32 engines. Every other row
  // must be bit-identical to the clean run.
  const Problem clean = make_problem(Activation::SiTU, InputFormat::MXFP8, 303);
  Problem bad = clean;
  const int64_t t_bad = 5, K = clean.cfg.hidden;
  bad.x.scale[t_bad * (K / kMxBlock) + 1] = 0xFE;
  for (int k = 32; k < 64; ++k) bad.x.fp8[t_bad * K + k] = 0x7E;  // 448
  const Outputs a = run_both(clean), b = run_both(bad);
  for (int i = 0; i < 2; ++i)
    for (int64_t t = 0; t < clean.r.tokens; ++t) {
      if (t == t_bad) EXPECT_FALSE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i];
      else EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
    }
  EXPECT_GT(row_nonfinite(b.cpu, t_bad), 0) << "fp32 overflow expected in the hazard row";
}

TEST(HardeningNumerics, ScaleFEOnAWeightBlockStaysInRowsRoutedToThatExpert) {
  const Problem clean = make_problem(Activation::SwiGLU_OAI, InputFormat::MXFP8, 404);
  Problem bad = clean;
  const int64_t K = clean.cfg.hidden, N = clean.cfg.intermediate;
  const int32_t e = 2;
  for (int64_t row = 0; row < K; ++row) bad.w.w2_scale[(e * K + row) * (N / kMxBlock)] = 0xFE;
  const Outputs a = run_both(clean), b = run_both(bad);
  int64_t hit = 0, missed = 0;
  for (int64_t t = 0; t < clean.r.tokens; ++t) {
    const bool routed = routed_to(clean, t, e);
    (routed ? hit : missed) += 1;
    for (int i = 0; i < 2; ++i) {
      if (routed) EXPECT_FALSE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
      else EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
    }
  }
  EXPECT_GT(hit, 0);
  EXPECT_GT(missed, 0);
}

TEST(HardeningNumerics, ScaleFEOnW13WithCodesFromTwoUpOverflowsFp32ButStaysInRoutedRows) {
  // E2M1 codes >= 2 at scale 2^127 are >= 2^128: finite in the float64 reference, +-Inf
  // once dequantized to fp32 (as the kernels do). Only rows routed to the expert change.
  const Problem clean = make_problem(Activation::SiTU, InputFormat::MXFP8, 111);
  Problem bad = clean;
  const int64_t K = clean.cfg.hidden, N = clean.cfg.intermediate;
  const int32_t e = 3;
  for (int64_t i = e * 2 * N * K / kMxBlock; i < (e + 1) * 2 * N * K / kMxBlock; ++i) bad.w.w13_scale[i] = 0xFE;
  EXPECT_TRUE(std::isinf(fmt::e2m1_to_float(0x4) * fmt::e8m0_to_float(0xFE))) << "2 * 2^127 overflows fp32";
  EXPECT_TRUE(std::isfinite(fmt::dequant_e2m1(0x7, 0, 0xFE))) << "6 * 2^127 is finite in double";
  const Outputs a = run_both(clean), b = run_both(bad);
  int64_t hit = 0, cpu_nonfinite = 0;
  for (int64_t t = 0; t < clean.r.tokens; ++t) {
    const bool routed = routed_to(clean, t, e);
    hit += routed;
    if (routed) cpu_nonfinite += row_nonfinite(b.cpu, t);
    for (int i = 0; i < 2; ++i)
      if (!routed) EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
  }
  EXPECT_GT(hit, 0);
  EXPECT_GT(cpu_nonfinite, 0) << "the fp32 engine is expected to overflow in the routed rows";
}

TEST(HardeningNumerics, AmaxWithinThreePercentOfFltMaxQuantizesTo2Pow128) {
  // Round-up scale for amax = bf16 max (0x7F7F, 3.39e38) is 2^120 and the element
  // 3.39e38 / 2^120 = 255 rounds to the E4M3 value 256: the MXFP8 value is 2^128, finite
  // in float64, +Inf in fp32. Any |x| > 248 * 2^120 (~3.30e38) does this. The fp32 engine's
  // row turns non-finite where the reference's stays finite; no other row changes.
  float blk[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) blk[i] = 1.0f + static_cast<float>(i);
  blk[7] = fmt::bf16_to_float(0x7F7F);
  uint8_t codes[kMxBlock], sb = 0;
  fmt::quantize_block_e4m3(blk, codes, &sb);
  EXPECT_EQ(sb, 127 + 120);
  EXPECT_EQ(codes[7], 0x78) << "E4M3 256";
  EXPECT_EQ(fmt::dequant_e4m3(codes[7], sb), std::ldexp(1.0, 128));
  EXPECT_TRUE(std::isinf(fmt::e4m3_to_float(codes[7]) * fmt::e8m0_to_float(sb)));

  const Problem clean0 = make_problem(Activation::SiTU, InputFormat::BF16, 112);
  Problem clean = clean0, bad = clean0;
  const int64_t t_bad = 2;
  Activations bf = clean0.x;
  clean.cfg.input_format = bad.cfg.input_format = InputFormat::MXFP8;
  clean.x = bf.to_mxfp8();
  bf.bf16[t_bad * 64 + 7] = 0x7F7F;
  bad.x = bf.to_mxfp8();
  const Outputs a = run_both(clean), b = run_both(bad);
  EXPECT_EQ(row_nonfinite(b.ref, t_bad), 0) << "float64 holds 2^128";
  EXPECT_GT(row_nonfinite(b.cpu, t_bad), 0) << "fp32 does not";
  for (int i = 0; i < 2; ++i)
    for (int64_t t = 0; t < clean.r.tokens; ++t)
      if (t != t_bad) EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
}

TEST(HardeningNumerics, InfInActivationsSaturatesAtTheBlockScaleAndEveryRowStaysFinite) {
  Problem p = make_problem(Activation::SiTU, InputFormat::BF16, 505);
  Activations bf = p.x;
  bf.bf16[0 * 64 + 3] = fmt::float_to_bf16(kInfF);
  bf.bf16[4 * 64 + 40] = fmt::float_to_bf16(-kInfF);
  for (int k = 32; k < 64; ++k) bf.bf16[7 * 64 + k] = fmt::float_to_bf16(k & 1 ? kInfF : -kInfF);  // all-Inf block
  p.cfg.input_format = InputFormat::MXFP8;
  p.x = bf.to_mxfp8();
  for (uint8_t s : p.x.scale) ASSERT_NE(s, 0xFF) << "Inf must never give the NaN scale";
  EXPECT_EQ(p.x.fp8[0 * 64 + 3], 0x7E) << "+Inf -> +448";
  EXPECT_EQ(p.x.fp8[4 * 64 + 40], 0xFE) << "-Inf -> -448";
  const Outputs o = run_both(p);
  for (int i = 0; i < 2; ++i)
    for (int64_t t = 0; t < p.r.tokens; ++t) EXPECT_EQ(row_nonfinite(engine(o, i), t), 0) << kEngines[i] << " row " << t;
}

TEST(HardeningNumerics, InfInBf16InputIsNotQuantizedAndReachesOnlyItsRow) {
  // With BF16 input nothing saturates an Inf: it enters GEMM1 as Inf and that token's row
  // turns non-finite; no other row changes.
  const Problem clean = make_problem(Activation::SiLU_Gated, InputFormat::BF16, 606);
  Problem bad = clean;
  const int64_t t_bad = 9;
  bad.x.bf16[t_bad * 64 + 17] = fmt::float_to_bf16(kInfF);
  const Outputs a = run_both(clean), b = run_both(bad);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(row_nonfinite(engine(b, i), t_bad), 0) << kEngines[i];
    for (int64_t t = 0; t < clean.r.tokens; ++t)
      if (t != t_bad) EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
  }
}

TEST(HardeningNumerics, NaNInFloatWeightsQuantizesToScaleFFAndReachesOnlyRowsOfThatExpert) {
  // From float weights, as a checkpoint generator would: one W13 block of local expert 1
  // holds a NaN. quantize_block_e2m1 marks the block with scale 0xFF; through either engine
  // the rows routed to expert 1 are all NaN and every other row is finite and unchanged.
  const Problem clean = make_problem(Activation::SiTU, InputFormat::MXFP8, 707);
  Problem bad = clean;
  const int64_t K = clean.cfg.hidden;
  const int32_t e = 1;
  const int64_t row = e * 2 * clean.cfg.intermediate + 33, blk = 1;  // an up row, K-block 1
  float vals[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i)
    vals[i] = static_cast<float>(fmt::dequant_e2m1(clean.w.w13_packed[row * K / 2 + blk * 16 + i / 2], i & 1,
                                                   clean.w.w13_scale[row * (K / kMxBlock) + blk]));
  vals[11] = kNaNF;
  fmt::quantize_block_e2m1(vals, &bad.w.w13_packed[row * K / 2 + blk * 16], &bad.w.w13_scale[row * (K / kMxBlock) + blk]);
  ASSERT_EQ(bad.w.w13_scale[row * (K / kMxBlock) + blk], fmt::kE8m0Nan);
  const Outputs a = run_both(clean), b = run_both(bad);
  int64_t hit = 0;
  for (int64_t t = 0; t < clean.r.tokens; ++t) {
    const bool routed = routed_to(clean, t, e);
    hit += routed;
    for (int i = 0; i < 2; ++i) {
      if (routed) EXPECT_EQ(row_nonfinite(engine(b, i), t), K) << kEngines[i] << " row " << t;
      else EXPECT_TRUE(row_bits_equal(engine(a, i), engine(b, i), t)) << kEngines[i] << " row " << t;
      if (!routed) EXPECT_EQ(row_nonfinite(engine(b, i), t), 0) << kEngines[i] << " row " << t;
    }
  }
  EXPECT_GT(hit, 0);
}

}  // namespace
}  // namespace mxmoe
