// Kimi-K3 and GPT-OSS MXFP4 checkpoints: loading (with EP slicing) into the kernel
// layout, writing (conversion), and synthetic checkpoints whose metadata regenerates
// their weights.
//
// Everything read from a file is checked before use: each tensor's dtype and shape
// against what the first expert implies, so a wrong file fails with the tensor's name,
// the expected and the actual value instead of loading plausible garbage (SPEC §5, §9).
#include "mxmoe/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "../cpu/synthetic_streams.h"
#include "mxmoe/error.h"
#include "mxmoe/random.h"
#include "mxmoe/safetensors.h"

namespace mxmoe {

using detail::cat;

namespace {

constexpr const char* kFormatVersion = "1";
constexpr const char* kMd = "mxmoe.synthetic.";

std::string default_prefix(int64_t layer) { return cat("model.layers.", layer, ".mlp"); }

// The tensors of a checkpoint: one safetensors file, or the shards that a Hugging Face
// index (`model.safetensors.index.json`: {"weight_map": {tensor: shard file}}) names. A
// shard is opened (mapped) the first time one of its tensors is asked for, so a rank
// reads only the shards that hold its layer.
class TensorSet {
 public:
  static TensorSet open(const std::string& path) {
    namespace fs = std::filesystem;
    TensorSet s;
    std::error_code ec;
    const bool dir = fs::is_directory(path, ec);
    std::string index = dir ? (fs::path(path) / kIndexName).string() : path;
    if (dir && !fs::exists(index, ec))
      throw FormatError(cat(path, ": a folder without ", kIndexName, ": pass a .safetensors file, an "
                            "index, or the folder of a sharded checkpoint"));
    if (!dir && !ends_with(path, ".json")) {
      s.files_.emplace("", SafetensorsFile::open(path));
      for (const auto& t : s.files_.at("").tensors()) {
        s.names_.push_back(t.name);
        s.where_.emplace(t.name, "");
      }
      return s;
    }
    s.dir_ = fs::path(index).parent_path().string();
    s.read_index(index);
    return s;
  }

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  const uint8_t* data(const std::string& name) const { return file_of(name).data(name); }
  const uint8_t* expect(const std::string& name, StDType dtype, const std::vector<int64_t>& shape) const {
    return file_of(name).expect(name, dtype, shape);
  }
  /// Every tensor name (a single file's in its order; a sharded checkpoint's from its index, sorted).
  const std::vector<std::string>& names() const { return names_; }
  /// The __metadata__ of the file that holds `name`.
  const std::map<std::string, std::string>& metadata_of(const std::string& name) const {
    return file_of(name).metadata();
  }

 private:
  static constexpr const char* kIndexName = "model.safetensors.index.json";
  static constexpr size_t kMaxIndexBytes = size_t{64} << 20;

  static bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  }

  void read_index(const std::string& index) {
    std::ifstream in(index, std::ios::binary);
    if (!in) throw FormatError(cat("cannot read the index '", index, "'"));
    std::string text;
    text.reserve(4096);
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxIndexBytes)
        throw FormatError(cat("the index '", index, "' is over ", kMaxIndexBytes >> 20, " MB"));
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      throw FormatError(cat("the index '", index, "' is not a JSON object"));
    const auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty())
      throw FormatError(cat("the index '", index, "' has no \"weight_map\" object of tensor -> shard file"));
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string())
        throw FormatError(cat("the index '", index, "' maps tensor '", it.key(), "' to a non-string"));
      const std::string shard = it->get<std::string>();
      // A shard is a file beside the index: no folders, no way out of it.
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
          shard.find('\\') != std::string::npos)
        throw FormatError(cat("the index '", index, "' places tensor '", it.key(), "' in '", shard,
                              "', which is not a file name beside the index"));
      names_.push_back(it.key());
      where_.emplace(it.key(), shard);
    }
  }

  const SafetensorsFile& file_of(const std::string& name) const {
    const auto w = where_.find(name);
    if (w == where_.end()) throw FormatError(cat("tensor '", name, "' not found"));
    auto f = files_.find(w->second);
    if (f == files_.end())
      f = files_.emplace(w->second, SafetensorsFile::open((std::filesystem::path(dir_) / w->second).string())).first;
    if (!f->second.has(name))
      throw FormatError(cat("shard '", w->second, "' does not hold tensor '", name, "', which the index places there"));
    return f->second;
  }

  std::string dir_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> where_;                // tensor -> shard ("" for a single file)
  mutable std::map<std::string, SafetensorsFile> files_;  // shard -> its file, once opened
};

std::string kimi_name(const std::string& prefix, int64_t e, int w, const char* part) {
  return cat(prefix, ".experts.", e, ".w", w, ".weight_", part);
}
std::string gptoss_name(const std::string& prefix, const char* what) {
  return cat(prefix, ".experts.", what);
}
std::string correction_bias_name(const std::string& prefix) {
  return prefix + ".gate.e_score_correction_bias";
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Where experts live in this file, for the "nothing found under this prefix" message.
std::string expert_prefixes_hint(const TensorSet& f) {
  std::set<std::string> prefixes;
  for (const std::string& name : f.names()) {
    const size_t p = name.find(".experts.");
    if (p != std::string::npos) prefixes.insert(name.substr(0, p));
  }
  if (prefixes.empty()) return "the file holds no '.experts.' tensors";
  std::string s = "expert prefixes in the file: ";
  int n = 0;
  for (const auto& p : prefixes) {
    if (n == 8) {
      s += ", ...";
      break;
    }
    s += (n++ ? ", '" : "'") + p + "'";
  }
  return s;
}

// F32 or BF16 tensor of `shape` -> floats (rows [row0, row0+rows) of a 2-D tensor when
// `rows` >= 0, the whole tensor otherwise).
std::vector<float> read_floats(const TensorSet& f, const std::string& name,
                               const std::vector<int64_t>& shape, int64_t row0 = 0, int64_t rows = -1) {
  const TensorInfo& t = f.info(name);
  if (t.dtype != StDType::F32 && t.dtype != StDType::BF16)
    throw FormatError(cat("tensor '", name, "': dtype ", to_string(t.dtype), ", expected F32 or BF16"));
  const uint8_t* p = f.expect(name, t.dtype, shape);
  int64_t row_len = 1;
  for (size_t i = 1; i < shape.size(); ++i) row_len *= shape[i];
  if (rows < 0) {
    rows = shape.empty() ? 1 : shape[0];
    row0 = 0;
  }
  std::vector<float> out(static_cast<size_t>(rows * row_len));
  const size_t es = dtype_size(t.dtype);
  p += static_cast<size_t>(row0 * row_len) * es;
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == StDType::F32) {
      std::memcpy(&out[i], p + 4 * i, 4);  // the data section need not be 4-byte aligned
    } else {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      out[i] = fmt::bf16_to_float(b);
    }
  }
  return out;
}

void check_ep(int64_t E, const LoadOptions& o) {
  MXMOE_CHECK_ARG(o.ep_size >= 1, "ep_size", o.ep_size, " must be >= 1");
  MXMOE_CHECK_ARG(o.ep_rank >= 0 && o.ep_rank < o.ep_size, "ep_rank", o.ep_rank,
                  " must be in [0, ep_size ", o.ep_size, ")");
  MXMOE_CHECK_ARG(E % o.ep_size == 0, "ep_size", o.ep_size, " does not divide the checkpoint's ",
                  E, " experts");
}

void check_mx_dims(const std::string& tensor, int64_t K, int64_t N) {
  if (K <= 0 || K % kMxBlock != 0 || N <= 0 || N % kMxBlock != 0)
    throw FormatError(cat("tensor '", tensor, "': implies hidden ", K, " and intermediate ", N,
                          "; both must be positive multiples of ", kMxBlock));
}

std::vector<uint8_t> bytes_of(const uint8_t* p, size_t n) { return std::vector<uint8_t>(p, p + n); }

LoadedLayer load_kimi(const TensorSet& f, const std::string& prefix, const LoadOptions& o) {
  // Experts are numbered 0..E-1; E is one past the largest index present, and every
  // index below it must then be complete (checked tensor by tensor below).
  const std::string ep = prefix + ".experts.";
  int64_t E = 0;
  for (const std::string& name : f.names()) {
    if (name.compare(0, ep.size(), ep) != 0) continue;
    const size_t dot = name.find('.', ep.size());
    const std::string idx = name.substr(ep.size(), dot == std::string::npos ? std::string::npos : dot - ep.size());
    if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) continue;
    if (idx.size() > 7 || (idx.size() > 1 && idx[0] == '0'))
      throw FormatError(cat("tensor '", name, "': expert index '", idx, "' is not a plausible index"));
    E = std::max<int64_t>(E, std::stoll(idx) + 1);
  }
  const std::string w1p = kimi_name(prefix, 0, 1, "packed");
  const TensorInfo& t0 = f.info(w1p);
  if (t0.dtype != StDType::U8 || t0.shape.size() != 2)
    throw FormatError(cat("tensor '", w1p, "': dtype ", to_string(t0.dtype), " shape ", shape_str(t0.shape),
                          ", expected U8 [intermediate, hidden/2]"));
  const int64_t N = t0.shape[0], K = 2 * t0.shape[1];
  check_mx_dims(w1p, K, N);
  check_ep(E, o);
  const int64_t EL = E / o.ep_size, first = o.ep_rank * EL;

  // Every expert's shapes first (header only, cheap; a missing expert fails before any
  // allocation sized by the claimed expert count), then the bytes of this rank's experts.
  for (int64_t e = 0; e < E; ++e) {
    for (int w : {1, 3}) {
      f.expect(kimi_name(prefix, e, w, "packed"), StDType::U8, {N, K / 2});
      f.expect(kimi_name(prefix, e, w, "scale"), StDType::U8, {N, K / kMxBlock});
    }
    f.expect(kimi_name(prefix, e, 2, "packed"), StDType::U8, {K, N / 2});
    f.expect(kimi_name(prefix, e, 2, "scale"), StDType::U8, {K, N / kMxBlock});
  }
  std::vector<SourceExpert> experts(static_cast<size_t>(EL));
  for (int64_t l = 0; l < EL; ++l) {
    const int64_t e = first + l;
    SourceExpert& x = experts[static_cast<size_t>(l)];
    x.w13.rows = 2 * N;
    x.w13.cols = K;
    // Gate half, then the up half (W13Layout::GateUp).
    x.w13.packed = bytes_of(f.data(kimi_name(prefix, e, 1, "packed")), N * K / 2);
    const uint8_t* w3 = f.data(kimi_name(prefix, e, 3, "packed"));
    x.w13.packed.insert(x.w13.packed.end(), w3, w3 + N * K / 2);
    x.w13.scale = bytes_of(f.data(kimi_name(prefix, e, 1, "scale")), N * K / kMxBlock);
    const uint8_t* s3 = f.data(kimi_name(prefix, e, 3, "scale"));
    x.w13.scale.insert(x.w13.scale.end(), s3, s3 + N * K / kMxBlock);
    x.w2.rows = K;
    x.w2.cols = N;
    x.w2.packed = bytes_of(f.data(kimi_name(prefix, e, 2, "packed")), K * N / 2);
    x.w2.scale = bytes_of(f.data(kimi_name(prefix, e, 2, "scale")), K * N / kMxBlock);
  }
  LoadedLayer L;
  L.format = CheckpointFormat::KimiK3;
  L.num_experts = E;
  L.hidden = K;
  L.intermediate = N;
  L.weights = to_kernel_layout(experts, W13Layout::GateUp);
  return L;
}

LoadedLayer load_gptoss(const TensorSet& f, const std::string& prefix, const LoadOptions& o) {
  const std::string gub = gptoss_name(prefix, "gate_up_proj_blocks");
  const TensorInfo& t0 = f.info(gub);
  if (t0.dtype != StDType::U8 || t0.shape.size() != 4 || t0.shape[3] != 16 || t0.shape[1] % 2 != 0)
    throw FormatError(cat("tensor '", gub, "': dtype ", to_string(t0.dtype), " shape ", shape_str(t0.shape),
                          ", expected U8 [experts, 2*intermediate, hidden/32, 16]"));
  const int64_t E = t0.shape[0], N = t0.shape[1] / 2, K = t0.shape[2] * kMxBlock;
  if (E <= 0) throw FormatError(cat("tensor '", gub, "': no experts (shape ", shape_str(t0.shape), ")"));
  check_mx_dims(gub, K, N);
  check_ep(E, o);
  const int64_t EL = E / o.ep_size, first = o.ep_rank * EL;

  const uint8_t* gu_b = f.expect(gub, StDType::U8, {E, 2 * N, K / kMxBlock, 16});
  const uint8_t* gu_s = f.expect(gptoss_name(prefix, "gate_up_proj_scales"), StDType::U8, {E, 2 * N, K / kMxBlock});
  const uint8_t* dn_b = f.expect(gptoss_name(prefix, "down_proj_blocks"), StDType::U8, {E, K, N / kMxBlock, 16});
  const uint8_t* dn_s = f.expect(gptoss_name(prefix, "down_proj_scales"), StDType::U8, {E, K, N / kMxBlock});
  const std::string gu_bias = gptoss_name(prefix, "gate_up_proj_bias");
  const std::string dn_bias = gptoss_name(prefix, "down_proj_bias");
  if (f.has(gu_bias) != f.has(dn_bias))
    throw FormatError(cat("tensor '", f.has(gu_bias) ? dn_bias : gu_bias, "' not found, but '",
                          f.has(gu_bias) ? gu_bias : dn_bias, "' is present (biases come in pairs)"));
  const bool has_bias = f.has(gu_bias);
  std::vector<float> b13, b2;
  if (has_bias) {
    b13 = read_floats(f, gu_bias, {E, 2 * N}, first, EL);
    b2 = read_floats(f, dn_bias, {E, K}, first, EL);
  }

  std::vector<SourceExpert> experts(static_cast<size_t>(EL));
  for (int64_t l = 0; l < EL; ++l) {
    const int64_t e = first + l;
    SourceExpert& x = experts[static_cast<size_t>(l)];
    x.w13.rows = 2 * N;
    x.w13.cols = K;
    x.w13.packed = bytes_of(gu_b + e * 2 * N * K / 2, 2 * N * K / 2);
    x.w13.scale = bytes_of(gu_s + e * 2 * N * K / kMxBlock, 2 * N * K / kMxBlock);
    x.w2.rows = K;
    x.w2.cols = N;
    x.w2.packed = bytes_of(dn_b + e * K * N / 2, K * N / 2);
    x.w2.scale = bytes_of(dn_s + e * K * N / kMxBlock, K * N / kMxBlock);
    if (has_bias) {
      x.w13_bias.assign(b13.begin() + l * 2 * N, b13.begin() + (l + 1) * 2 * N);
      x.w2_bias.assign(b2.begin() + l * K, b2.begin() + (l + 1) * K);
    }
  }
  LoadedLayer L;
  L.format = CheckpointFormat::GptOss;
  L.num_experts = E;
  L.hidden = K;
  L.intermediate = N;
  L.weights = to_kernel_layout(experts, W13Layout::Interleaved);
  return L;
}

bool parse_i64(const std::string& s, int64_t& v) {
  const char* b = s.data();
  const char* e = b + s.size();
  auto r = std::from_chars(b, e, v);
  return r.ec == std::errc() && r.ptr == e && !s.empty();
}
bool parse_u64(const std::string& s, uint64_t& v) {
  const char* b = s.data();
  const char* e = b + s.size();
  auto r = std::from_chars(b, e, v);
  return r.ec == std::errc() && r.ptr == e && !s.empty();
}

// Biases as BF16 where that is lossless (synthetic and real GPT-OSS biases are BF16
// values), else F32: conversion never loses bits and round trips reproduce the file.
bool bf16_exact(const std::vector<float>& v) {
  for (float x : v)
    if (fmt::float_bits(fmt::bf16_to_float(fmt::float_to_bf16(x))) != fmt::float_bits(x)) return false;
  return true;
}

// Names, dtypes and shapes of a layer's tensors in `format`: the one place both writers
// (conversion and synthetic generation) take them from, so they produce the same bytes.
struct LayerShape {
  CheckpointFormat format;
  std::string prefix;
  int64_t E, K, N;
  bool has_bias;
  StDType bias_dtype;  // F32 or BF16
  bool has_correction_bias;
};

std::vector<SafetensorsStreamWriter::Decl> declare_tensors(const LayerShape& s) {
  const int64_t E = s.E, K = s.K, N = s.N;
  std::vector<SafetensorsStreamWriter::Decl> d;
  if (s.format == CheckpointFormat::KimiK3) {
    for (int64_t e = 0; e < E; ++e) {
      d.push_back({kimi_name(s.prefix, e, 1, "packed"), StDType::U8, {N, K / 2}});
      d.push_back({kimi_name(s.prefix, e, 1, "scale"), StDType::U8, {N, K / kMxBlock}});
      d.push_back({kimi_name(s.prefix, e, 3, "packed"), StDType::U8, {N, K / 2}});
      d.push_back({kimi_name(s.prefix, e, 3, "scale"), StDType::U8, {N, K / kMxBlock}});
      d.push_back({kimi_name(s.prefix, e, 2, "packed"), StDType::U8, {K, N / 2}});
      d.push_back({kimi_name(s.prefix, e, 2, "scale"), StDType::U8, {K, N / kMxBlock}});
    }
  } else {
    d.push_back({gptoss_name(s.prefix, "gate_up_proj_blocks"), StDType::U8, {E, 2 * N, K / kMxBlock, 16}});
    d.push_back({gptoss_name(s.prefix, "gate_up_proj_scales"), StDType::U8, {E, 2 * N, K / kMxBlock}});
    d.push_back({gptoss_name(s.prefix, "down_proj_blocks"), StDType::U8, {E, K, N / kMxBlock, 16}});
    d.push_back({gptoss_name(s.prefix, "down_proj_scales"), StDType::U8, {E, K, N / kMxBlock}});
    if (s.has_bias) {
      d.push_back({gptoss_name(s.prefix, "gate_up_proj_bias"), s.bias_dtype, {E, 2 * N}});
      d.push_back({gptoss_name(s.prefix, "down_proj_bias"), s.bias_dtype, {E, K}});
    }
  }
  if (s.has_correction_bias) d.push_back({correction_bias_name(s.prefix), StDType::F32, {E}});
  return d;
}

void write_floats(SafetensorsStreamWriter& w, const std::string& name, StDType dtype, uint64_t first_elem,
                  const std::vector<float>& v) {
  if (dtype == StDType::F32) {
    w.write(name, first_elem * 4, v.data(), v.size() * 4);
  } else {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = fmt::float_to_bf16(v[i]);
    w.write(name, first_elem * 2, b.data(), b.size() * 2);
  }
}

// Write experts [first, first + kernel.num_local) given in the kernel layout.
void write_experts(SafetensorsStreamWriter& w, const LayerShape& s, int64_t first, const ExpertWeights& kernel) {
  const int64_t K = s.K, N = s.N;
  const bool kimi = s.format == CheckpointFormat::KimiK3;
  const std::vector<SourceExpert> src =
      from_kernel_layout(kernel, kimi ? W13Layout::GateUp : W13Layout::Interleaved);
  for (size_t i = 0; i < src.size(); ++i) {
    const SourceExpert& x = src[i];
    const int64_t e = first + static_cast<int64_t>(i);
    if (kimi) {
      const size_t hp = static_cast<size_t>(N * K / 2), hs = static_cast<size_t>(N * K / kMxBlock);
      w.write(kimi_name(s.prefix, e, 1, "packed"), 0, x.w13.packed.data(), hp);
      w.write(kimi_name(s.prefix, e, 1, "scale"), 0, x.w13.scale.data(), hs);
      w.write(kimi_name(s.prefix, e, 3, "packed"), 0, x.w13.packed.data() + hp, hp);
      w.write(kimi_name(s.prefix, e, 3, "scale"), 0, x.w13.scale.data() + hs, hs);
      w.write(kimi_name(s.prefix, e, 2, "packed"), 0, x.w2.packed.data(), x.w2.packed.size());
      w.write(kimi_name(s.prefix, e, 2, "scale"), 0, x.w2.scale.data(), x.w2.scale.size());
    } else {
      const uint64_t ue = static_cast<uint64_t>(e);
      w.write(gptoss_name(s.prefix, "gate_up_proj_blocks"), ue * x.w13.packed.size(), x.w13.packed.data(), x.w13.packed.size());
      w.write(gptoss_name(s.prefix, "gate_up_proj_scales"), ue * x.w13.scale.size(), x.w13.scale.data(), x.w13.scale.size());
      w.write(gptoss_name(s.prefix, "down_proj_blocks"), ue * x.w2.packed.size(), x.w2.packed.data(), x.w2.packed.size());
      w.write(gptoss_name(s.prefix, "down_proj_scales"), ue * x.w2.scale.size(), x.w2.scale.data(), x.w2.scale.size());
      if (s.has_bias) {
        write_floats(w, gptoss_name(s.prefix, "gate_up_proj_bias"), s.bias_dtype, ue * 2 * N, x.w13_bias);
        write_floats(w, gptoss_name(s.prefix, "down_proj_bias"), s.bias_dtype, ue * K, x.w2_bias);
      }
    }
  }
}

std::map<std::string, std::string> synthetic_metadata(const SyntheticSpec& spec) {
  std::map<std::string, std::string> md = {
      {"mxmoe.format_version", kFormatVersion},
      {cat(kMd, "seed"), std::to_string(spec.seed)},
      {cat(kMd, "format"), to_string(spec.format)},
      {cat(kMd, "num_experts"), std::to_string(spec.num_experts)},
      {cat(kMd, "hidden"), std::to_string(spec.hidden)},
      {cat(kMd, "intermediate"), std::to_string(spec.intermediate)},
      {cat(kMd, "top_k"), std::to_string(spec.top_k)},
      {cat(kMd, "layer"), std::to_string(spec.layer)},
      {cat(kMd, "with_bias"), spec.with_bias ? "true" : "false"},
  };
  if (!spec.prefix.empty()) md[cat(kMd, "prefix")] = spec.prefix;
  return md;
}

}  // namespace

// ---------------------------------------------------------------- public

const char* to_string(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::KimiK3: return "kimi";
    case CheckpointFormat::GptOss: return "gpt-oss";
  }
  return "?";
}

CheckpointFormat parse_checkpoint_format(const std::string& s) {
  if (s == "kimi" || s == "kimi-k3") return CheckpointFormat::KimiK3;
  if (s == "gpt-oss" || s == "gptoss") return CheckpointFormat::GptOss;
  throw InvalidArgument("format", cat("'", s, "' is not a checkpoint format (kimi | gpt-oss)"));
}

std::vector<std::string> checkpoint_tensor_names(const std::string& path) { return TensorSet::open(path).names(); }

LoadedLayer load_checkpoint(const std::string& path, const LoadOptions& options) {
  MXMOE_CHECK_ARG(options.layer >= 0, "layer", options.layer, " must be >= 0");
  MXMOE_CHECK_ARG(options.ep_size >= 1, "ep_size", options.ep_size, " must be >= 1");
  MXMOE_CHECK_ARG(options.ep_rank >= 0 && options.ep_rank < options.ep_size, "ep_rank",
                  options.ep_rank, " must be in [0, ep_size ", options.ep_size, ")");
  const std::string prefix = options.prefix.empty() ? default_prefix(options.layer) : options.prefix;
  const TensorSet f = TensorSet::open(path);  // its messages name the file or the index
  try {
    const bool gpt = f.has(gptoss_name(prefix, "gate_up_proj_blocks"));
    const bool kimi = f.has(kimi_name(prefix, 0, 1, "packed"));
    if (gpt && kimi)
      throw FormatError(cat("both Kimi-K3 ('", kimi_name(prefix, 0, 1, "packed"), "') and GPT-OSS ('",
                            gptoss_name(prefix, "gate_up_proj_blocks"),
                            "') experts under prefix '", prefix, "': ambiguous"));
    if (!gpt && !kimi)
      throw FormatError(cat("no experts under prefix '", prefix, "' (looked for Kimi-K3 '",
                            kimi_name(prefix, 0, 1, "packed"), "' and GPT-OSS '",
                            gptoss_name(prefix, "gate_up_proj_blocks"), "'); ",
                            expert_prefixes_hint(f)));
    LoadedLayer L = gpt ? load_gptoss(f, prefix, options) : load_kimi(f, prefix, options);
    const std::string cb = correction_bias_name(prefix);
    if (f.has(cb)) L.correction_bias = read_floats(f, cb, {L.num_experts});
    // The metadata of the file holding the first expert (a synthetic checkpoint's spec).
    L.metadata = f.metadata_of(gpt ? gptoss_name(prefix, "gate_up_proj_blocks") : kimi_name(prefix, 0, 1, "packed"));
    return L;
  } catch (const FormatError& e) {
    throw FormatError(cat(path, ": ", e.what()));
  }
}

void write_checkpoint(const std::string& path, const LoadedLayer& layer, CheckpointFormat format,
                      const std::string& prefix_in, int64_t layer_index) {
  const ExpertWeights& w = layer.weights;
  const int64_t E = layer.num_experts, K = layer.hidden, N = layer.intermediate;
  MXMOE_CHECK_ARG(layer_index >= 0, "layer_index", layer_index, " must be >= 0");
  MXMOE_CHECK_ARG(E > 0 && w.num_local == E, "layer", "holds ", w.num_local, " of ", E,
                  " experts; writing a checkpoint needs all of them (load with ep_size 1)");
  MXMOE_CHECK_ARG(w.hidden == K && w.intermediate == N, "layer", "weights are ", w.hidden, "x",
                  w.intermediate, " but the layer says hidden ", K, ", intermediate ", N);
  MXMOE_CHECK_ARG(K > 0 && K % kMxBlock == 0 && N > 0 && N % kMxBlock == 0, "layer",
                  "hidden ", K, " and intermediate ", N, " must be positive multiples of 32");
  MXMOE_CHECK_ARG(static_cast<int64_t>(w.w13_packed.size()) == E * 2 * N * K / 2 &&
                      static_cast<int64_t>(w.w13_scale.size()) == E * 2 * N * K / kMxBlock &&
                      static_cast<int64_t>(w.w2_packed.size()) == E * K * N / 2 &&
                      static_cast<int64_t>(w.w2_scale.size()) == E * K * N / kMxBlock,
                  "layer", "weight buffers do not match ", E, " experts of hidden ", K,
                  ", intermediate ", N);
  const bool has_bias = !w.w13_bias.empty() || !w.w2_bias.empty();
  MXMOE_CHECK_ARG(!has_bias || (static_cast<int64_t>(w.w13_bias.size()) == E * 2 * N &&
                                static_cast<int64_t>(w.w2_bias.size()) == E * K),
                  "layer", "bias sizes ", w.w13_bias.size(), " and ", w.w2_bias.size(),
                  " do not match [E][2N] = ", E * 2 * N, " and [E][K] = ", E * K);
  MXMOE_CHECK_ARG(format != CheckpointFormat::KimiK3 || !has_bias, "format",
                  "Kimi-K3 checkpoints hold no expert biases, but this layer has them (write gpt-oss)");
  MXMOE_CHECK_ARG(layer.correction_bias.empty() || static_cast<int64_t>(layer.correction_bias.size()) == E,
                  "layer", "correction_bias has ", layer.correction_bias.size(), " entries, expected ", E);
  const std::string prefix = prefix_in.empty() ? default_prefix(layer_index) : prefix_in;

  // Keep the source's metadata; the synthetic keys describing the file's own format and
  // naming follow the conversion, so the file still regenerates its weights and a
  // round trip (kimi -> gpt-oss -> kimi) reproduces the original bytes.
  std::map<std::string, std::string> md = layer.metadata;
  md["mxmoe.format_version"] = kFormatVersion;
  if (md.count(cat(kMd, "seed"))) {
    md[cat(kMd, "format")] = to_string(format);
    md[cat(kMd, "layer")] = std::to_string(layer_index);
    if (prefix_in.empty()) md.erase(cat(kMd, "prefix"));
    else md[cat(kMd, "prefix")] = prefix_in;
  }
  const LayerShape shape{format, prefix, E, K, N, has_bias,
                         bf16_exact(w.w13_bias) && bf16_exact(w.w2_bias) ? StDType::BF16 : StDType::F32,
                         !layer.correction_bias.empty()};
  SafetensorsStreamWriter out(path, declare_tensors(shape), md);
  write_experts(out, shape, 0, w);
  if (shape.has_correction_bias)
    out.write(correction_bias_name(prefix), 0, layer.correction_bias.data(), layer.correction_bias.size() * 4);
  out.commit();
}

std::vector<float> synthetic_correction_bias(int64_t num_experts, uint64_t seed) {
  MXMOE_CHECK_ARG(num_experts > 0, "num_experts", num_experts, " must be positive");
  Rng rng(detail::synthetic_stream(seed, detail::kStreamCorrectionBias, 0));
  std::vector<float> b(static_cast<size_t>(num_experts));
  // Small next to sigmoid scores in (0, 1): it reorders near-ties, as trained biases do.
  for (auto& v : b) v = static_cast<float>(0.01 * rng.normal());
  return b;
}

void write_synthetic_checkpoint(const std::string& path, const SyntheticSpec& spec) {
  MXMOE_CHECK_ARG(spec.num_experts > 0, "num_experts", spec.num_experts, " must be positive");
  MXMOE_CHECK_ARG(spec.hidden > 0 && spec.hidden % kMxBlock == 0, "hidden", spec.hidden,
                  " must be a positive multiple of 32");
  MXMOE_CHECK_ARG(spec.intermediate > 0 && spec.intermediate % kMxBlock == 0, "intermediate",
                  spec.intermediate, " must be a positive multiple of 32");
  MXMOE_CHECK_ARG(spec.top_k >= 1 && spec.top_k <= spec.num_experts, "top_k", spec.top_k,
                  " must be in [1, num_experts ", spec.num_experts, "]");
  MXMOE_CHECK_ARG(spec.layer >= 0, "layer", spec.layer, " must be >= 0");
  MXMOE_CHECK_ARG(!spec.with_bias || spec.format == CheckpointFormat::GptOss, "with_bias",
                  "Kimi-K3 checkpoints have no expert biases (use format gpt-oss)");

  const int64_t E = spec.num_experts, K = spec.hidden, N = spec.intermediate;
  const std::string prefix = spec.prefix.empty() ? default_prefix(spec.layer) : spec.prefix;
  const LayerShape shape{spec.format, prefix, E, K, N, spec.with_bias, StDType::BF16,
                         spec.format == CheckpointFormat::KimiK3};
  SafetensorsStreamWriter out(path, declare_tensors(shape), synthetic_metadata(spec));

  // Generate a few experts at a time (an EP slice of the layer, which is bit-identical
  // to the same experts of the full layer), so a full-size layer (~16 GB of MXFP4, ten
  // times that as floats) streams to disk in bounded memory.
  const double bytes_per_expert = 3.0 * static_cast<double>(N) * static_cast<double>(K) * 4.6;
  // At most 16 experts at a time: enough to keep the generator's threads busy, and the
  // embedded checkpoint's test then runs the multi-chunk path.
  const int64_t budget = std::clamp<int64_t>(static_cast<int64_t>(1.5e9 / bytes_per_expert), 1, 16);
  int64_t chunk = 1;
  for (int64_t c = std::min(E, budget); c >= 1; --c)
    if (E % c == 0) {
      chunk = c;
      break;
    }
  MoeConfig cfg;
  cfg.num_experts = E;
  cfg.top_k = spec.top_k;
  cfg.hidden = K;
  cfg.intermediate = N;
  cfg.has_bias = spec.with_bias;
  cfg.ep_size = E / chunk;
  for (int64_t r = 0; r < cfg.ep_size; ++r) {
    cfg.ep_rank = r;
    const SyntheticLayer syn = make_synthetic_layer(cfg, spec.seed);
    write_experts(out, shape, r * chunk, syn.weights);
  }
  if (shape.has_correction_bias) {
    const std::vector<float> cb = synthetic_correction_bias(E, spec.seed);
    out.write(correction_bias_name(prefix), 0, cb.data(), cb.size() * 4);
  }
  out.commit();
}

bool synthetic_spec_from_metadata(const std::map<std::string, std::string>& md, SyntheticSpec& spec) {
  if (!md.count(cat(kMd, "seed"))) return false;
  auto get = [&](const char* key) -> const std::string& {
    auto it = md.find(cat(kMd, key));
    if (it == md.end())
      throw FormatError(cat("synthetic checkpoint metadata lacks '", kMd, key, "'"));
    return it->second;
  };
  auto get_i64 = [&](const char* key, int64_t lo) {
    int64_t v = 0;
    if (!parse_i64(get(key), v) || v < lo)
      throw FormatError(cat("synthetic checkpoint metadata '", kMd, key, "' = '", get(key),
                            "' is not an integer >= ", lo));
    return v;
  };
  SyntheticSpec s;
  if (!parse_u64(get("seed"), s.seed))
    throw FormatError(cat("synthetic checkpoint metadata '", kMd, "seed' = '", get("seed"),
                          "' is not an unsigned integer"));
  try {
    s.format = parse_checkpoint_format(get("format"));
  } catch (const InvalidArgument& e) {
    throw FormatError(cat("synthetic checkpoint metadata '", kMd, "format': ", e.what()));
  }
  s.num_experts = get_i64("num_experts", 1);
  s.hidden = get_i64("hidden", 1);
  s.intermediate = get_i64("intermediate", 1);
  s.top_k = get_i64("top_k", 1);
  s.layer = get_i64("layer", 0);
  const std::string& wb = get("with_bias");
  if (wb != "true" && wb != "false")
    throw FormatError(cat("synthetic checkpoint metadata '", kMd, "with_bias' = '", wb,
                          "' is not true or false"));
  s.with_bias = wb == "true";
  auto p = md.find(cat(kMd, "prefix"));
  if (p != md.end()) s.prefix = p->second;
  spec = s;
  return true;
}

}  // namespace mxmoe
