// Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/): small valid files made
// with the library's own writers and a few malformed ones, each well under 64 KB.
// Built by the fuzz configuration (target fuzz_make_corpus); run it to regenerate:
//   build-fuzz/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus
// The output is deterministic (fixed seeds), so regenerating leaves the files unchanged.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/safetensors.h"

using namespace mxmoe;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
  if (b.size() >= 64 * 1024) throw std::runtime_error(path.string() + " is not small");
  std::printf("%8zu  %s\n", b.size(), path.string().c_str());
}

// A raw file: length field (given or the header's size), header text, data bytes.
std::vector<uint8_t> raw(const std::string& header, const std::vector<uint8_t>& data, bool override_length = false,
                         uint64_t length = 0) {
  const uint64_t n = override_length ? length : header.size();
  std::vector<uint8_t> f(8);
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  f.insert(f.end(), header.begin(), header.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

std::vector<uint8_t> synthetic(const fs::path& tmp, CheckpointFormat format, bool bias, int64_t layer,
                               const std::string& prefix = "") {
  SyntheticSpec s;
  s.format = format;
  s.num_experts = 2;
  s.hidden = 64;
  s.intermediate = 32;
  s.top_k = 1;
  s.layer = layer;
  s.seed = 7;
  s.with_bias = bias;
  s.prefix = prefix;
  write_synthetic_checkpoint(tmp.string(), s);
  auto b = read_all(tmp.string());
  fs::remove(tmp);
  return b;
}

// Rewrite a file tensor by tensor (keep / rename / change dtype or shape); used to make
// near-valid checkpoints that exercise the loader's checks.
std::vector<uint8_t> rewrite(const fs::path& tmp, const std::vector<uint8_t>& src,
                             bool (*edit)(std::string& name, StDType& dtype, std::vector<int64_t>& shape,
                                          std::vector<uint8_t>& bytes)) {
  const SafetensorsFile f = SafetensorsFile::parse(src.data(), src.size());
  SafetensorsWriter w;
  for (const TensorInfo& t : f.tensors()) {
    std::string name = t.name;
    StDType dtype = t.dtype;
    std::vector<int64_t> shape = t.shape;
    std::vector<uint8_t> bytes(f.data(t.name), f.data(t.name) + (t.end - t.begin));
    if (!edit(name, dtype, shape, bytes)) continue;
    w.add(name, dtype, shape, bytes.data(), bytes.size());
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  w.write(tmp.string());
  auto b = read_all(tmp.string());
  fs::remove(tmp);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const fs::path root(argv[1]);
  const fs::path st = root / "fuzz_safetensors", ck = root / "fuzz_checkpoint";
  fs::create_directories(st);
  fs::create_directories(ck);
  const fs::path tmp = fs::temp_directory_path() / "mxmoe_make_corpus.safetensors";

  // ---- checkpoints: valid (Kimi-K3 layer 0 and 3, GPT-OSS with and without biases,
  // custom prefix) and near-valid ones that each fail one check of the loader.
  const auto kimi0 = synthetic(tmp, CheckpointFormat::KimiK3, false, 0);
  const auto kimi3 = synthetic(tmp, CheckpointFormat::KimiK3, false, 3);
  const auto gpt_bias = synthetic(tmp, CheckpointFormat::GptOss, true, 0);
  const auto gpt_nobias = synthetic(tmp, CheckpointFormat::GptOss, false, 0);
  const auto kimi_p = synthetic(tmp, CheckpointFormat::KimiK3, false, 0, "p");
  write_bytes(ck / "kimi_e2_k64_n32_layer0.safetensors", kimi0);
  write_bytes(ck / "kimi_e2_k64_n32_layer3.safetensors", kimi3);
  write_bytes(ck / "gptoss_bias_e2_k64_n32.safetensors", gpt_bias);
  write_bytes(ck / "gptoss_nobias_e2_k64_n32.safetensors", gpt_nobias);
  write_bytes(ck / "kimi_prefix_p.safetensors", kimi_p);
  write_bytes(ck / "bad_kimi_missing_w2_scale.safetensors",
              rewrite(tmp, kimi0, [](std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
                return n != "model.layers.0.mlp.experts.1.w2.weight_scale";
              }));
  write_bytes(ck / "bad_kimi_scale_dtype.safetensors",
              rewrite(tmp, kimi0, [](std::string& n, StDType& d, std::vector<int64_t>&, std::vector<uint8_t>&) {
                if (n == "model.layers.0.mlp.experts.0.w3.weight_scale") d = StDType::I8;
                return true;
              }));
  write_bytes(ck / "bad_kimi_expert_gap.safetensors",
              rewrite(tmp, kimi0, [](std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
                const std::string from = "model.layers.0.mlp.experts.1.";
                if (n.rfind(from, 0) == 0) n = "model.layers.0.mlp.experts.3." + n.substr(from.size());
                return true;
              }));
  write_bytes(ck / "bad_gptoss_bias_f32_wrong_shape.safetensors",
              rewrite(tmp, gpt_bias, [](std::string& n, StDType&, std::vector<int64_t>& s, std::vector<uint8_t>&) {
                if (n == "model.layers.0.mlp.experts.down_proj_bias") s = {s[1], s[0]};
                return true;
              }));
  write_bytes(ck / "bad_gptoss_unpaired_bias.safetensors",
              rewrite(tmp, gpt_bias, [](std::string& n, StDType&, std::vector<int64_t>&, std::vector<uint8_t>&) {
                return n != "model.layers.0.mlp.experts.down_proj_bias";
              }));
  {
    auto t = kimi0;
    t.resize(t.size() - 100);  // truncated data section
    write_bytes(ck / "bad_truncated.safetensors", t);
  }

  // ---- safetensors: every dtype and metadata, an empty file, unaligned offsets, and
  // malformed headers (each rejected by a different check).
  {
    SafetensorsWriter w;
    const StDType types[] = {StDType::BOOL, StDType::U8,  StDType::I8,   StDType::U16,  StDType::I16,
                             StDType::F16,  StDType::BF16, StDType::U32, StDType::I32,  StDType::F32,
                             StDType::U64,  StDType::I64, StDType::F64,  StDType::F8_E4M3, StDType::F8_E5M2};
    int i = 0;
    for (StDType t : types) {
      std::vector<uint8_t> b(6 * dtype_size(t));
      for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<uint8_t>(31 * k + 7 * i);
      w.add("t" + std::to_string(i++) + "." + to_string(t), t, {2, 3}, b.data(), b.size());
    }
    const uint8_t one = 1;
    w.add("scalar", StDType::U8, {}, &one, 1);
    w.add("empty", StDType::F32, {0, 4}, nullptr, 0);
    w.set_metadata("format", "pt");
    w.set_metadata("mxmoe.synthetic.seed", "1");
    w.write(tmp.string());
    write_bytes(st / "all_dtypes.safetensors", read_all(tmp.string()));
    fs::remove(tmp);
  }
  write_bytes(st / "kimi_e2_k64_n32.safetensors", kimi0);
  write_bytes(st / "gptoss_bias_e2_k64_n32.safetensors", gpt_bias);
  write_bytes(st / "empty_header.safetensors", raw("{}", {}));
  write_bytes(st / "unaligned.safetensors",
              raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[1,5]},"b":{"dtype":"U16","shape":[2],"data_offsets":[5,9]}})",
                  std::vector<uint8_t>(11, 0x3C)));
  write_bytes(st / "bad_json.safetensors", raw(R"({"a":{"dtype":"U8","shape":[2],)", {1, 2}));
  write_bytes(st / "bad_header_length.safetensors", raw("{}", {}, true, 0xFFFFFFFFFFull));
  write_bytes(st / "bad_overlap.safetensors",
              raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                  std::vector<uint8_t>(6, 1)));
  write_bytes(st / "bad_duplicate.safetensors",
              raw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                  {1, 2}));
  write_bytes(st / "bad_numel_overflow.safetensors",
              raw(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", std::vector<uint8_t>(8, 0)));
  write_bytes(st / "bad_metadata.safetensors", raw(R"({"__metadata__":{"k":1}})", {}));
  write_bytes(st / "bad_short.safetensors", {0x02, 0, 0});
  // A shape entry nested 2000 arrays deep (the regression of a stack overflow at ~10^5).
  write_bytes(st / "bad_deep_shape.safetensors",
              raw(R"({"a":{"dtype":"U8","shape":[1,)" + std::string(2000, '[') + std::string(2000, ']') +
                      R"(],"data_offsets":[0,1]}})",
                  {7}));
  return 0;
}
