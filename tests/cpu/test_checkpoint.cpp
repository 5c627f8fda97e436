// Checkpoints: synthetic Kimi-K3 / GPT-OSS files load back into exactly the bytes
// make_synthetic_layer produces; EP slices; format conversion is bit-exact; broken files
// and bad options are rejected naming the tensor or option; the embedded checkpoint
// regenerates from its metadata.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/reference.h"
#include "mxmoe/safetensors.h"
#include "../expect_invalid.h"

using namespace mxmoe;

namespace {

using mxmoe_test::expect_invalid;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "mxmoe_ckpt_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

SyntheticSpec small_spec(CheckpointFormat f, bool bias, uint64_t seed = 1234) {
  SyntheticSpec s;
  s.format = f;
  s.num_experts = 8;
  s.hidden = 128;
  s.intermediate = 96;  // three 32-column gate/up groups: the kernel layout's interleave shows
  s.top_k = 2;
  s.layer = 3;
  s.seed = seed;
  s.with_bias = bias;
  return s;
}

MoeConfig config_of(const SyntheticSpec& s, int64_t ep_size = 1, int64_t ep_rank = 0) {
  MoeConfig c;
  c.num_experts = s.num_experts;
  c.top_k = s.top_k;
  c.hidden = s.hidden;
  c.intermediate = s.intermediate;
  c.has_bias = s.with_bias;
  c.ep_size = ep_size;
  c.ep_rank = ep_rank;
  return c;
}

// First differing index of two buffers, or -1.
template <typename T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

void expect_same_weights(const ExpertWeights& a, const ExpertWeights& b) {
  EXPECT_EQ(a.num_local, b.num_local);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(first_diff(a.w13_packed, b.w13_packed), -1) << "w13_packed sizes " << a.w13_packed.size() << " vs " << b.w13_packed.size();
  EXPECT_EQ(first_diff(a.w13_scale, b.w13_scale), -1) << "w13_scale";
  EXPECT_EQ(first_diff(a.w2_packed, b.w2_packed), -1) << "w2_packed";
  EXPECT_EQ(first_diff(a.w2_scale, b.w2_scale), -1) << "w2_scale";
  EXPECT_EQ(first_diff(a.w13_bias, b.w13_bias), -1) << "w13_bias sizes " << a.w13_bias.size() << " vs " << b.w13_bias.size();
  EXPECT_EQ(first_diff(a.w2_bias, b.w2_bias), -1) << "w2_bias";
}

// Experts [first, first+count) of a full-layer ExpertWeights.
ExpertWeights slice(const ExpertWeights& w, int64_t first, int64_t count) {
  const int64_t K = w.hidden, N = w.intermediate;
  auto cut = [&](const auto& v, int64_t per) {
    using V = std::decay_t<decltype(v)>;
    if (v.empty()) return V{};
    return V(v.begin() + first * per, v.begin() + (first + count) * per);
  };
  ExpertWeights s;
  s.num_local = count;
  s.hidden = K;
  s.intermediate = N;
  s.w13_packed = cut(w.w13_packed, 2 * N * K / 2);
  s.w13_scale = cut(w.w13_scale, 2 * N * K / 32);
  s.w2_packed = cut(w.w2_packed, K * N / 2);
  s.w2_scale = cut(w.w2_scale, K * N / 32);
  s.w13_bias = cut(w.w13_bias, 2 * N);
  s.w2_bias = cut(w.w2_bias, K);
  return s;
}

// Copy a safetensors file tensor by tensor; `edit` may change dtype/shape/bytes or return
// false to drop the tensor.
using Edit = std::function<bool(const std::string&, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&)>;
void rewrite(const std::string& src, const std::string& dst, const Edit& edit) {
  const SafetensorsFile f = SafetensorsFile::open(src);
  SafetensorsWriter w;
  for (const TensorInfo& t : f.tensors()) {
    StDType dt = t.dtype;
    std::vector<int64_t> shape = t.shape;
    std::vector<uint8_t> bytes(f.data(t.name), f.data(t.name) + (t.end - t.begin));
    if (!edit(t.name, dt, shape, bytes)) continue;
    w.add(t.name, dt, shape, bytes.data(), bytes.size());
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  w.write(dst);
}

// Run `fn`, expect FormatError whose message holds every needle.
template <typename Fn>
void expect_format_error(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected FormatError mentioning '" << needles.front() << "'";
  } catch (const FormatError& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message '" << e.what() << "' lacks '" << n << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected FormatError, got: " << e.what();
  }
}

// A sharded copy of a checkpoint in folder `dir` (created): the tensors of `src` spread
// over shards by `shard_of(name)` (a file name), each shard with src's metadata, and a
// Hugging Face index naming them (`index_text` replaces the index when given).
void shard(const std::string& src, const std::string& dir,
           const std::function<std::string(const std::string&)>& shard_of, const std::string& index_text = "") {
  std::filesystem::create_directories(dir);
  const SafetensorsFile f = SafetensorsFile::open(src);
  std::map<std::string, SafetensorsWriter> shards;
  std::string map;
  for (const TensorInfo& t : f.tensors()) {
    const std::string s = shard_of(t.name);
    shards[s].add(t.name, t.dtype, t.shape, f.data(t.name), t.end - t.begin);
    map += (map.empty() ? "" : ",\n    ") + ("\"" + t.name + "\": \"" + s + "\"");
  }
  for (auto& [name, w] : shards) {
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    w.write(dir + "/" + name);
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << (index_text.empty() ? "{\"metadata\": {\"total_size\": 1},\n  \"weight_map\": {\n    " + map + "}}\n"
                             : index_text);
}

LoadOptions opts(int64_t layer, int64_t ep_size = 1, int64_t ep_rank = 0) {
  LoadOptions o;
  o.layer = layer;
  o.ep_size = ep_size;
  o.ep_rank = ep_rank;
  return o;
}

}  // namespace

// ---------------------------------------------------------------- synthetic layers

TEST(SyntheticLayer, IdealWeightsQuantizeToThePackedBytes) {
  const SyntheticSpec s = small_spec(CheckpointFormat::GptOss, true);
  const SyntheticLayer L = make_synthetic_layer(config_of(s), 99);
  const int64_t E = s.num_experts, K = s.hidden, N = s.intermediate;
  ASSERT_EQ(L.ideal.w13.size(), static_cast<size_t>(E * 2 * N * K));
  ASSERT_EQ(L.ideal.w2.size(), static_cast<size_t>(E * K * N));
  auto check = [](const std::vector<float>& ideal, const std::vector<uint8_t>& packed,
                  const std::vector<uint8_t>& scale, const char* what) {
    for (size_t b = 0; b < scale.size(); ++b) {
      uint8_t p[16], sc;
      fmt::quantize_block_e2m1(&ideal[b * 32], p, &sc);
      ASSERT_EQ(sc, scale[b]) << what << " block " << b;
      ASSERT_EQ(0, std::memcmp(p, &packed[b * 16], 16)) << what << " block " << b;
    }
  };
  check(L.ideal.w13, L.weights.w13_packed, L.weights.w13_scale, "w13");
  check(L.ideal.w2, L.weights.w2_packed, L.weights.w2_scale, "w2");
  // BF16 originals, Gaussian with std 1/sqrt(K): exact bf16 values, sane spread.
  double ss = 0;
  for (float v : L.ideal.w13) {
    ASSERT_EQ(fmt::bf16_to_float(fmt::float_to_bf16(v)), v);
    ss += double(v) * v;
  }
  EXPECT_NEAR(std::sqrt(ss / L.ideal.w13.size()) * std::sqrt(double(K)), 1.0, 0.02);
  EXPECT_EQ(L.ideal.w13_bias, L.weights.w13_bias);
  EXPECT_EQ(L.weights.w13_bias.size(), static_cast<size_t>(E * 2 * N));
  EXPECT_EQ(L.weights.w2_bias.size(), static_cast<size_t>(E * K));
}

TEST(SyntheticLayer, DeterministicAndSeedSensitiveAndBiasDoesNotChangeWeights) {
  const SyntheticSpec s = small_spec(CheckpointFormat::GptOss, true);
  const SyntheticLayer a = make_synthetic_layer(config_of(s), 5);
  const SyntheticLayer b = make_synthetic_layer(config_of(s), 5);
  expect_same_weights(a.weights, b.weights);
  const SyntheticLayer c = make_synthetic_layer(config_of(s), 6);
  EXPECT_NE(a.weights.w13_packed, c.weights.w13_packed);
  SyntheticSpec nb = s;
  nb.with_bias = false;
  const SyntheticLayer d = make_synthetic_layer(config_of(nb), 5);
  EXPECT_EQ(d.weights.w13_packed, a.weights.w13_packed);
  EXPECT_EQ(d.weights.w2_scale, a.weights.w2_scale);
  EXPECT_TRUE(d.weights.w13_bias.empty());
}

TEST(SyntheticLayer, EpRankSliceEqualsTheSameExpertsOfTheFullLayer) {
  const SyntheticSpec s = small_spec(CheckpointFormat::GptOss, true);
  const SyntheticLayer full = make_synthetic_layer(config_of(s), 77);
  const SyntheticLayer r2 = make_synthetic_layer(config_of(s, 4, 2), 77);
  EXPECT_EQ(r2.weights.num_local, 2);
  expect_same_weights(r2.weights, slice(full.weights, 4, 2));
  const int64_t per = 2 * s.intermediate * s.hidden;
  EXPECT_EQ(r2.ideal.w13, std::vector<float>(full.ideal.w13.begin() + 4 * per, full.ideal.w13.begin() + 6 * per));
}

TEST(SyntheticLayer, RejectsShapesThatAreNotMxBlocks) {
  MoeConfig c = config_of(small_spec(CheckpointFormat::KimiK3, false));
  c.hidden = 100;
  expect_invalid([&] { make_synthetic_layer(c, 1); }, "config.hidden");
  c = config_of(small_spec(CheckpointFormat::KimiK3, false), 3, 0);
  expect_invalid([&] { make_synthetic_layer(c, 1); }, "config.ep_size");
}

TEST(SyntheticActivations, GaussianBf16DeterministicFromSeed) {
  const Activations a = make_activations(16, 256, 3), b = make_activations(16, 256, 3);
  const Activations c = make_activations(16, 256, 4);
  EXPECT_EQ(a.format, InputFormat::BF16);
  EXPECT_EQ(a.tokens, 16);
  EXPECT_EQ(a.hidden, 256);
  ASSERT_EQ(a.bf16.size(), 16u * 256u);
  EXPECT_EQ(a.bf16, b.bf16);
  EXPECT_NE(a.bf16, c.bf16);
  double sum = 0, ss = 0;
  for (uint16_t v : a.bf16) {
    const double x = fmt::bf16_to_float(v);
    sum += x;
    ss += x * x;
  }
  const double n = double(a.bf16.size());
  EXPECT_NEAR(sum / n, 0.0, 0.06);
  EXPECT_NEAR(std::sqrt(ss / n), 1.0, 0.05);
  expect_invalid([] { make_activations(-1, 256, 1); }, "tokens");
}

// ---------------------------------------------------------------- load == generate

TEST(CheckpointSynthetic, KimiLoadsExactlyMakeSyntheticLayerBytes) {
  const SyntheticSpec s = small_spec(CheckpointFormat::KimiK3, false);
  const std::string path = temp_path("kimi.safetensors");
  write_synthetic_checkpoint(path, s);
  const LoadedLayer L = load_checkpoint(path, opts(3));
  EXPECT_EQ(L.format, CheckpointFormat::KimiK3);
  EXPECT_EQ(L.num_experts, 8);
  EXPECT_EQ(L.hidden, 128);
  EXPECT_EQ(L.intermediate, 96);
  expect_same_weights(L.weights, make_synthetic_layer(config_of(s), s.seed).weights);
  EXPECT_EQ(L.correction_bias, synthetic_correction_bias(8, s.seed));
  bool nonzero = false;
  for (float v : L.correction_bias) nonzero |= v != 0.0f;
  EXPECT_TRUE(nonzero);

  // The real checkpoint's names and shapes (SPEC §5), scaled down.
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.7.w1.weight_packed", StDType::U8, {96, 64}));
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.7.w1.weight_scale", StDType::U8, {96, 4}));
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.7.w2.weight_packed", StDType::U8, {128, 48}));
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.7.w2.weight_scale", StDType::U8, {128, 3}));
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.gate.e_score_correction_bias", StDType::F32, {8}));
  EXPECT_EQ(L.metadata.at("mxmoe.format_version"), "1");
  SyntheticSpec back;
  ASSERT_TRUE(synthetic_spec_from_metadata(L.metadata, back));
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.format, CheckpointFormat::KimiK3);
  EXPECT_EQ(back.num_experts, 8);
  EXPECT_EQ(back.hidden, 128);
  EXPECT_EQ(back.intermediate, 96);
  EXPECT_EQ(back.top_k, 2);
  EXPECT_EQ(back.layer, 3);
  EXPECT_FALSE(back.with_bias);
  std::remove(path.c_str());
}

TEST(CheckpointSynthetic, GptOssWithBiasLoadsExactlyMakeSyntheticLayerBytes) {
  const SyntheticSpec s = small_spec(CheckpointFormat::GptOss, true);
  const std::string path = temp_path("gptoss.safetensors");
  write_synthetic_checkpoint(path, s);
  const LoadedLayer L = load_checkpoint(path, opts(3));
  EXPECT_EQ(L.format, CheckpointFormat::GptOss);
  expect_same_weights(L.weights, make_synthetic_layer(config_of(s), s.seed).weights);
  EXPECT_TRUE(L.correction_bias.empty());
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.gate_up_proj_blocks", StDType::U8, {8, 192, 4, 16}));
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.down_proj_scales", StDType::U8, {8, 128, 3}));
  // Synthetic biases are BF16 values, stored as BF16 like the real GPT-OSS files.
  EXPECT_NO_THROW(f.expect("model.layers.3.mlp.experts.gate_up_proj_bias", StDType::BF16, {8, 192}));
  SyntheticSpec back;
  ASSERT_TRUE(synthetic_spec_from_metadata(L.metadata, back));
  EXPECT_TRUE(back.with_bias);
  EXPECT_EQ(back.format, CheckpointFormat::GptOss);
  std::remove(path.c_str());
}

TEST(CheckpointSynthetic, GptOssWithoutBiasAndCustomPrefix) {
  SyntheticSpec s = small_spec(CheckpointFormat::GptOss, false);
  s.prefix = "blk.0.moe";
  const std::string path = temp_path("gptoss_nobias.safetensors");
  write_synthetic_checkpoint(path, s);
  LoadOptions o;
  o.prefix = "blk.0.moe";
  const LoadedLayer L = load_checkpoint(path, o);
  EXPECT_TRUE(L.weights.w13_bias.empty());
  expect_same_weights(L.weights, make_synthetic_layer(config_of(s), s.seed).weights);
  SyntheticSpec back;
  ASSERT_TRUE(synthetic_spec_from_metadata(L.metadata, back));
  EXPECT_EQ(back.prefix, "blk.0.moe");
  std::remove(path.c_str());
}

TEST(CheckpointSynthetic, SameSeedSameBytesDifferentSeedDifferentBytes) {
  const std::string p1 = temp_path("s1"), p2 = temp_path("s2"), p3 = temp_path("s3");
  write_synthetic_checkpoint(p1, small_spec(CheckpointFormat::KimiK3, false, 11));
  write_synthetic_checkpoint(p2, small_spec(CheckpointFormat::KimiK3, false, 11));
  write_synthetic_checkpoint(p3, small_spec(CheckpointFormat::KimiK3, false, 12));
  const auto b1 = read_all(p1);
  EXPECT_FALSE(b1.empty());
  EXPECT_EQ(b1, read_all(p2));
  EXPECT_NE(b1, read_all(p3));
  for (auto* p : {&p1, &p2, &p3}) std::remove(p->c_str());
}

// The two formats hold the same experts: GPT-OSS row 2n is Kimi's w1 row n, row 2n+1 is
// w3 row n. Checked on the raw files, independently of the layout code.
TEST(CheckpointSynthetic, GptOssInterleavedRowsAreKimiGateAndUpRows) {
  const std::string pk = temp_path("xk"), pg = temp_path("xg");
  write_synthetic_checkpoint(pk, small_spec(CheckpointFormat::KimiK3, false, 21));
  write_synthetic_checkpoint(pg, small_spec(CheckpointFormat::GptOss, false, 21));
  const SafetensorsFile k = SafetensorsFile::open(pk), g = SafetensorsFile::open(pg);
  const int64_t E = 8, K = 128, N = 96;
  const uint8_t* gb = g.data("model.layers.3.mlp.experts.gate_up_proj_blocks");
  const uint8_t* gs = g.data("model.layers.3.mlp.experts.gate_up_proj_scales");
  const uint8_t* db = g.data("model.layers.3.mlp.experts.down_proj_blocks");
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.3.mlp.experts." + std::to_string(e);
    const uint8_t* w1 = k.data(p + ".w1.weight_packed");
    const uint8_t* w3 = k.data(p + ".w3.weight_packed");
    const uint8_t* s3 = k.data(p + ".w3.weight_scale");
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_EQ(0, std::memcmp(gb + (e * 2 * N + 2 * n) * K / 2, w1 + n * K / 2, K / 2)) << e << "," << n;
      ASSERT_EQ(0, std::memcmp(gb + (e * 2 * N + 2 * n + 1) * K / 2, w3 + n * K / 2, K / 2)) << e << "," << n;
      ASSERT_EQ(0, std::memcmp(gs + (e * 2 * N + 2 * n + 1) * K / 32, s3 + n * K / 32, K / 32)) << e << "," << n;
    }
    ASSERT_EQ(0, std::memcmp(db + e * K * N / 2, k.data(p + ".w2.weight_packed"), K * N / 2)) << e;
  }
  std::remove(pk.c_str());
  std::remove(pg.c_str());
}

// ---------------------------------------------------------------- EP slicing

// ---------------------------------------------------------------- sharded checkpoints

// A checkpoint split over shards (as real ones are: a Hugging Face index names the shard
// of every tensor) loads the same bytes as the single file, by its index or its folder,
// whole or as an EP slice, for both formats.
TEST(CheckpointSharded, LoadsTheSameBytesAsTheSingleFileByIndexOrFolder) {
  for (const CheckpointFormat fmt : {CheckpointFormat::KimiK3, CheckpointFormat::GptOss}) {
    SCOPED_TRACE(to_string(fmt));
    const SyntheticSpec s = small_spec(fmt, fmt == CheckpointFormat::GptOss);
    const std::string one = temp_path("one.safetensors"), dir = temp_path("sharded");
    write_synthetic_checkpoint(one, s);
    // Kimi: experts 0..3 in the first shard, 4..7 (and the bias) in the second; GPT-OSS:
    // the gate-up tensors in one, the down ones in the other.
    shard(one, dir, [](const std::string& n) {
      const bool second = n.find(".experts.4.") != std::string::npos || n.find(".experts.5.") != std::string::npos ||
                          n.find(".experts.6.") != std::string::npos || n.find(".experts.7.") != std::string::npos ||
                          n.find("down_proj") != std::string::npos || n.find("gate.") != std::string::npos;
      return second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    });
    const LoadedLayer want = load_checkpoint(one, opts(3));
    for (const std::string& path : {dir + "/model.safetensors.index.json", dir}) {
      const LoadedLayer got = load_checkpoint(path, opts(3));
      EXPECT_EQ(got.format, fmt);
      EXPECT_EQ(got.num_experts, 8);
      expect_same_weights(got.weights, want.weights);
      EXPECT_EQ(got.correction_bias, want.correction_bias);
      EXPECT_EQ(got.metadata, want.metadata);
      expect_same_weights(load_checkpoint(path, opts(3, 4, 3)).weights, load_checkpoint(one, opts(3, 4, 3)).weights);
    }
    if (fmt == CheckpointFormat::KimiK3) {
      // Every expert's shapes are checked (headers only), so even rank 0 of 2 opens the
      // shard of experts 4..7: a missing shard file is named.
      std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
      expect_format_error([&] { load_checkpoint(dir, opts(3, 2, 0)); }, {"model-00002-of-00002.safetensors"});
    }
    std::filesystem::remove_all(dir);
    std::remove(one.c_str());
  }
}

TEST(CheckpointSharded, BrokenIndexesAreRejectedNamingWhatIsWrong) {
  const SyntheticSpec s = small_spec(CheckpointFormat::KimiK3, false);
  const std::string one = temp_path("one_b.safetensors"), dir = temp_path("sharded_b");
  write_synthetic_checkpoint(one, s);
  const auto to_a = [](const std::string&) { return std::string("a.safetensors"); };
  const std::string index = dir + "/model.safetensors.index.json";
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "not a JSON object"},
           {"[1, 2]", "not a JSON object"},
           {"{\"metadata\": {}}", "weight_map"},
           {"{\"weight_map\": {}}", "weight_map"},
           {"{\"weight_map\": {\"x\": 3}}", "non-string"},
           {"{\"weight_map\": {\"model.layers.3.mlp.experts.0.w1.weight_packed\": \"../a.safetensors\"}}", "not a file name"},
           {"{\"weight_map\": {\"model.layers.3.mlp.experts.0.w1.weight_packed\": \"\"}}", "not a file name"},
           // The index places a tensor in a shard that does not hold it.
           {"{\"weight_map\": {\"model.layers.3.mlp.experts.0.w1.weight_packed\": \"a.safetensors\", "
            "\"model.layers.3.mlp.experts.0.w9.weight_packed\": \"a.safetensors\"}}", "not found"},
       }) {
    SCOPED_TRACE(text);
    shard(one, dir, to_a, text);
    expect_format_error([&] { load_checkpoint(index, opts(3)); }, {needle});
  }
  // An index whose expert 5 lacks a tensor: named, as in a single file.
  const std::string victim = "model.layers.3.mlp.experts.5.w2.weight_scale";
  std::filesystem::remove_all(dir);
  shard(one, dir, to_a);
  {
    std::ifstream in(index);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t at = text.find("\"" + victim + "\"");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, victim.size() + 2, "\"model.layers.3.mlp.experts.5.w2.other\"");
    std::ofstream(index) << text;
  }
  expect_format_error([&] { load_checkpoint(index, opts(3)); }, {victim, "not found", index});
  // A tensor the index places in a shard that lacks it (expert 7 lives in b).
  std::filesystem::remove_all(dir);
  shard(one, dir, [](const std::string& n) {
    return std::string(n.find(".experts.7.") != std::string::npos ? "b.safetensors" : "a.safetensors");
  });
  {
    std::ifstream in(index);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const std::string moved = "\"" + victim + "\": \"a.safetensors\"";
    const size_t at = text.find(moved);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, moved.size(), "\"" + victim + "\": \"b.safetensors\"");
    std::ofstream(index) << text;
  }
  expect_format_error([&] { load_checkpoint(index, opts(3)); }, {"shard 'b.safetensors' does not hold", victim});
  // A folder without an index.
  std::filesystem::remove(index);
  expect_format_error([&] { load_checkpoint(dir, opts(3)); }, {"model.safetensors.index.json", dir});
  std::filesystem::remove_all(dir);
  std::remove(one.c_str());
}

TEST(CheckpointEp, Rank2Of4EqualsExpertsHalfToThreeQuartersOfFullLoad) {
  for (bool gpt : {false, true}) {
    SyntheticSpec s = small_spec(gpt ? CheckpointFormat::GptOss : CheckpointFormat::KimiK3, gpt);
    s.num_experts = 16;
    const std::string path = temp_path(gpt ? "ep_g" : "ep_k");
    write_synthetic_checkpoint(path, s);
    const LoadedLayer full = load_checkpoint(path, opts(3));
    const LoadedLayer r2 = load_checkpoint(path, opts(3, 4, 2));
    EXPECT_EQ(r2.num_experts, 16) << "num_experts is global";
    EXPECT_EQ(r2.weights.num_local, 4);
    SCOPED_TRACE(gpt ? "gpt-oss" : "kimi");
    expect_same_weights(r2.weights, slice(full.weights, 8, 4));
    expect_same_weights(r2.weights, make_synthetic_layer(config_of(s, 4, 2), s.seed).weights);
    EXPECT_EQ(r2.correction_bias, full.correction_bias) << "correction bias stays global";
    std::remove(path.c_str());
  }
}

// ---------------------------------------------------------------- conversion

TEST(CheckpointConvert, KimiToGptOssToKimiIsBitExact) {
  const SyntheticSpec s = small_spec(CheckpointFormat::KimiK3, false, 31);
  const std::string pk = temp_path("c_k"), pg = temp_path("c_g"), pk2 = temp_path("c_k2");
  write_synthetic_checkpoint(pk, s);
  const LoadedLayer k = load_checkpoint(pk, opts(3));
  write_checkpoint(pg, k, CheckpointFormat::GptOss, "", 3);
  const LoadedLayer g = load_checkpoint(pg, opts(3));
  EXPECT_EQ(g.format, CheckpointFormat::GptOss);
  expect_same_weights(g.weights, k.weights);
  EXPECT_EQ(g.correction_bias, k.correction_bias);
  SyntheticSpec gs;
  ASSERT_TRUE(synthetic_spec_from_metadata(g.metadata, gs));
  EXPECT_EQ(gs.format, CheckpointFormat::GptOss) << "metadata follows the conversion";
  write_checkpoint(pk2, g, CheckpointFormat::KimiK3, "", 3);
  EXPECT_EQ(read_all(pk), read_all(pk2)) << "round trip must reproduce the file byte for byte";
  for (auto* p : {&pk, &pg, &pk2}) std::remove(p->c_str());
}

TEST(CheckpointConvert, GptOssWithBiasRoundTripsAndRefusesKimi) {
  const SyntheticSpec s = small_spec(CheckpointFormat::GptOss, true, 32);
  const std::string p1 = temp_path("b1"), p2 = temp_path("b2"), pk = temp_path("bk");
  write_synthetic_checkpoint(p1, s);
  const LoadedLayer g = load_checkpoint(p1, opts(3));
  write_checkpoint(p2, g, CheckpointFormat::GptOss, "", 3);
  EXPECT_EQ(read_all(p1), read_all(p2));
  expect_invalid([&] { write_checkpoint(pk, g, CheckpointFormat::KimiK3, "", 3); }, "format");
  EXPECT_TRUE(read_all(pk).empty()) << "nothing is written on error";
  // Biases that are not BF16 values are kept exactly, as F32.
  LoadedLayer h = g;
  h.weights.w13_bias[5] = 0.1f;
  write_checkpoint(p2, h, CheckpointFormat::GptOss, "", 3);
  const LoadedLayer h2 = load_checkpoint(p2, opts(3));
  EXPECT_EQ(h2.weights.w13_bias, h.weights.w13_bias);
  EXPECT_EQ(SafetensorsFile::open(p2).info("model.layers.3.mlp.experts.gate_up_proj_bias").dtype, StDType::F32);
  for (auto* p : {&p1, &p2, &pk}) std::remove(p->c_str());
}

TEST(CheckpointConvert, WritingAnEpSliceIsRejected) {
  const SyntheticSpec s = small_spec(CheckpointFormat::KimiK3, false);
  const std::string p = temp_path("slice"), q = temp_path("slice_out");
  write_synthetic_checkpoint(p, s);
  const LoadedLayer r = load_checkpoint(p, opts(3, 2, 1));
  expect_invalid([&] { write_checkpoint(q, r, CheckpointFormat::GptOss, "", 3); }, "layer");
  EXPECT_TRUE(read_all(q).empty());
  std::remove(p.c_str());
}

// ---------------------------------------------------------------- broken files, bad options

class CheckpointErrors : public testing::Test {
 protected:
  void SetUp() override {
    kimi_ = temp_path("err_k");
    gpt_ = temp_path("err_g");
    bad_ = temp_path("err_bad");
    write_synthetic_checkpoint(kimi_, small_spec(CheckpointFormat::KimiK3, false));
    write_synthetic_checkpoint(gpt_, small_spec(CheckpointFormat::GptOss, true));
  }
  void TearDown() override {
    for (auto* p : {&kimi_, &gpt_, &bad_}) std::remove(p->c_str());
  }
  std::string kimi_, gpt_, bad_;
};

TEST_F(CheckpointErrors, MissingKimiTensorIsNamed) {
  const std::string victim = "model.layers.3.mlp.experts.5.w2.weight_scale";
  rewrite(kimi_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
    return n != victim;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {victim, "not found", bad_});
  // Every expert's shapes are checked, not only this rank's.
  expect_format_error([&] { load_checkpoint(bad_, opts(3, 4, 0)); }, {victim});
}

TEST_F(CheckpointErrors, MissingLastExpertTensorIsNamed) {
  const std::string victim = "model.layers.3.mlp.experts.7.w3.weight_packed";
  rewrite(kimi_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
    return n != victim;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {victim, "not found"});
}

TEST_F(CheckpointErrors, WrongKimiDtypeIsNamedWithExpectedAndActual) {
  const std::string victim = "model.layers.3.mlp.experts.2.w1.weight_scale";
  rewrite(kimi_, bad_, [&](const std::string& n, StDType& dt, std::vector<int64_t>&, std::vector<uint8_t>&) {
    if (n == victim) dt = StDType::I8;
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {victim, "I8", "U8"});
}

TEST_F(CheckpointErrors, WrongKimiShapeIsNamedWithExpectedAndActual) {
  const std::string victim = "model.layers.3.mlp.experts.6.w3.weight_packed";
  rewrite(kimi_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
    if (n == victim) {
      shape = {96, 48};
      b.resize(96 * 48);
    }
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {victim, "[96, 48]", "[96, 64]"});
}

TEST_F(CheckpointErrors, KimiHiddenNotAMultipleOf32IsRejected) {
  rewrite(kimi_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
    if (n == "model.layers.3.mlp.experts.0.w1.weight_packed") {
      shape = {96, 60};
      b.resize(96 * 60);
    }
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {"experts.0.w1.weight_packed", "multiples of 32"});
}

TEST_F(CheckpointErrors, GptOssWrongShapeDtypeAndUnpairedBias) {
  const std::string p = "model.layers.3.mlp.experts.";
  rewrite(gpt_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
    if (n == p + "down_proj_scales") {
      shape = {8, 128, 2};
      b.resize(8 * 128 * 2);
    }
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {p + "down_proj_scales", "[8, 128, 2]", "[8, 128, 3]"});

  rewrite(gpt_, bad_, [&](const std::string& n, StDType& dt, std::vector<int64_t>&, std::vector<uint8_t>&) {
    if (n == p + "gate_up_proj_bias") dt = StDType::I16;
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {p + "gate_up_proj_bias", "I16", "F32 or BF16"});

  rewrite(gpt_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
    return n != p + "down_proj_bias";
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {p + "down_proj_bias", "not found"});

  rewrite(gpt_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>& shape, std::vector<uint8_t>&) {
    if (n == p + "gate_up_proj_blocks") shape = {8, 192, 8, 8};
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {p + "gate_up_proj_blocks", "[8, 192, 8, 8]"});
}

TEST_F(CheckpointErrors, WrongCorrectionBiasShapeIsNamed) {
  const std::string victim = "model.layers.3.mlp.gate.e_score_correction_bias";
  rewrite(kimi_, bad_, [&](const std::string& n, StDType&, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
    if (n == victim) {
      shape = {4};
      b.resize(16);
    }
    return true;
  });
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {victim, "[4]", "[8]"});
}

TEST_F(CheckpointErrors, WrongLayerOrPrefixListsWhatTheFileHolds) {
  expect_format_error([&] { load_checkpoint(kimi_, opts(5)); },
                      {"model.layers.5.mlp", "'model.layers.3.mlp'"});
  LoadOptions o;
  o.prefix = "nope";
  expect_format_error([&] { load_checkpoint(gpt_, o); }, {"'nope'", "model.layers.3.mlp"});
}

TEST_F(CheckpointErrors, BadEpOptionsNameTheOption) {
  expect_invalid([&] { load_checkpoint(kimi_, opts(3, 3, 0)); }, "ep_size");  // 3 does not divide 8
  expect_invalid([&] { load_checkpoint(kimi_, opts(3, 0, 0)); }, "ep_size");
  expect_invalid([&] { load_checkpoint(kimi_, opts(3, 4, 4)); }, "ep_rank");
  expect_invalid([&] { load_checkpoint(kimi_, opts(3, 4, -1)); }, "ep_rank");
  expect_invalid([&] { load_checkpoint(gpt_, opts(3, 16, 0)); }, "ep_size");
  expect_invalid([&] { load_checkpoint(kimi_, opts(-1)); }, "layer");
}

TEST_F(CheckpointErrors, NotASafetensorsFileIsAFormatError) {
  {
    std::ofstream out(bad_, std::ios::binary);
    out << "this is not a checkpoint at all, just text";
  }
  expect_format_error([&] { load_checkpoint(bad_, opts(3)); }, {bad_});
  expect_format_error([&] { load_checkpoint("/nonexistent/x.safetensors", opts(3)); }, {"/nonexistent/x.safetensors"});
}

TEST(CheckpointSpec, MetadataParsingAndSpecValidation) {
  SyntheticSpec s;
  EXPECT_FALSE(synthetic_spec_from_metadata({{"format", "pt"}}, s));
  std::map<std::string, std::string> md = {
      {"mxmoe.synthetic.seed", "18446744073709551615"}, {"mxmoe.synthetic.format", "gpt-oss"},
      {"mxmoe.synthetic.num_experts", "4"},             {"mxmoe.synthetic.hidden", "64"},
      {"mxmoe.synthetic.intermediate", "32"},           {"mxmoe.synthetic.top_k", "2"},
      {"mxmoe.synthetic.layer", "0"},                   {"mxmoe.synthetic.with_bias", "true"}};
  ASSERT_TRUE(synthetic_spec_from_metadata(md, s));
  EXPECT_EQ(s.seed, 18446744073709551615ull);
  EXPECT_EQ(s.format, CheckpointFormat::GptOss);
  EXPECT_TRUE(s.with_bias);
  auto broken = [&](const char* key, const char* value) {
    auto m = md;
    if (value) m[key] = value;
    else m.erase(key);
    SyntheticSpec t;
    expect_format_error([&] { synthetic_spec_from_metadata(m, t); }, {key});
  };
  broken("mxmoe.synthetic.seed", "12x");
  broken("mxmoe.synthetic.hidden", "-64");
  broken("mxmoe.synthetic.hidden", nullptr);
  broken("mxmoe.synthetic.format", "llama");
  broken("mxmoe.synthetic.with_bias", "yes");

  EXPECT_EQ(parse_checkpoint_format("kimi"), CheckpointFormat::KimiK3);
  EXPECT_EQ(parse_checkpoint_format("gpt-oss"), CheckpointFormat::GptOss);
  EXPECT_STREQ(to_string(CheckpointFormat::GptOss), "gpt-oss");
  expect_invalid([] { parse_checkpoint_format("mixtral"); }, "format");

  const std::string p = temp_path("never");
  SyntheticSpec bad = small_spec(CheckpointFormat::KimiK3, true);
  expect_invalid([&] { write_synthetic_checkpoint(p, bad); }, "with_bias");
  bad = small_spec(CheckpointFormat::KimiK3, false);
  bad.intermediate = 100;
  expect_invalid([&] { write_synthetic_checkpoint(p, bad); }, "intermediate");
  bad = small_spec(CheckpointFormat::KimiK3, false);
  bad.top_k = 9;
  expect_invalid([&] { write_synthetic_checkpoint(p, bad); }, "top_k");
  EXPECT_TRUE(read_all(p).empty());
}

// ---------------------------------------------------------------- the embedded checkpoint

TEST(EmbeddedCheckpoint, KimiK3MiniLoadsAndRegeneratesFromItsMetadata) {
  const std::string path = std::string(MXMOE_DATA_DIR) + "/kimi_k3_mini.safetensors";
  const LoadedLayer L = load_checkpoint(path, opts(3));
  EXPECT_EQ(L.format, CheckpointFormat::KimiK3);
  EXPECT_EQ(L.num_experts, 64);
  EXPECT_EQ(L.hidden, 224);
  EXPECT_EQ(L.intermediate, 192);
  EXPECT_EQ(L.correction_bias.size(), 64u);
  SyntheticSpec s;
  ASSERT_TRUE(synthetic_spec_from_metadata(L.metadata, s));
  EXPECT_EQ(s.seed, 20261129u);
  EXPECT_EQ(s.top_k, 8);
  EXPECT_EQ(s.layer, 3);
  EXPECT_EQ(s.num_experts, L.num_experts);
  EXPECT_EQ(s.hidden, L.hidden);
  EXPECT_EQ(s.intermediate, L.intermediate);
  expect_same_weights(L.weights, make_synthetic_layer(config_of(s), s.seed).weights);
  EXPECT_EQ(L.correction_bias, synthetic_correction_bias(s.num_experts, s.seed));
  // And the generator reproduces the committed file byte for byte.
  const std::string again = temp_path("mini_again");
  write_synthetic_checkpoint(again, s);
  EXPECT_EQ(read_all(again), read_all(path));
  std::remove(again.c_str());
}
