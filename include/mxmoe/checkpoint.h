// mxmoe/checkpoint.h — loading routed experts from Kimi-K3 and GPT-OSS MXFP4 checkpoints,
// and generating synthetic ones.
//
// Kimi-K3 (compressed-tensors): "<prefix>.experts.<e>.w{1,2,3}.weight_packed" U8
//   [rows][cols/2] and ".weight_scale" U8 [rows][cols/32]; w1 gate [N][K], w3 up [N][K],
//   w2 down [K][N]. Optional "<prefix>.gate.e_score_correction_bias" F32 [E].
// GPT-OSS: "<prefix>.experts.gate_up_proj_blocks" U8 [E][2N][K/32][16],
//   "..._scales" U8 [E][2N][K/32], "..._bias" F32|BF16 [E][2N] (interleaved rows), and
//   "down_proj_{blocks,scales,bias}" [E][K][N/32][16], [E][K][N/32], [E][K].
// "<prefix>" defaults to "model.layers.<layer>.mlp". Single files and sharded checkpoints
// (load_checkpoint) both load.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/reference.h"

namespace mxmoe {

enum class CheckpointFormat : int { KimiK3 = 0, GptOss = 1 };
const char* to_string(CheckpointFormat f);
CheckpointFormat parse_checkpoint_format(const std::string& s);  // "kimi" | "gpt-oss"

struct LoadOptions {
  int64_t layer = 0;
  std::string prefix;   // empty: "model.layers.<layer>.mlp"
  int64_t ep_size = 1, ep_rank = 0;  // load only this rank's experts
};

struct LoadedLayer {
  CheckpointFormat format = CheckpointFormat::KimiK3;
  int64_t num_experts = 0, hidden = 0, intermediate = 0;  // read from the shapes
  ExpertWeights weights;                // this rank's experts, kernel layout
  std::vector<float> correction_bias;   // [E_global] or empty
  std::map<std::string, std::string> metadata;  // the file's __metadata__
};

/// Detect the format (by tensor names) unless given, and load this rank's experts.
/// `path`: a .safetensors file, or a sharded checkpoint as Hugging Face stores it: its
/// index (`model.safetensors.index.json`, whose "weight_map" names each tensor's shard
/// file beside it) or the folder holding that index; shards are opened as their tensors
/// are needed.
/// Throws FormatError (missing tensor, wrong dtype/shape, a broken index or shard) or
/// InvalidArgument (options).
LoadedLayer load_checkpoint(const std::string& path, const LoadOptions& options);
/// The tensor names of the checkpoint at `path` (a file, or a sharded checkpoint's index or
/// folder, as load_checkpoint takes it), read from its header or index alone. Throws
/// FormatError as load_checkpoint does for a broken file or index.
std::vector<std::string> checkpoint_tensor_names(const std::string& path);

/// Synthetic checkpoint spec; metadata records every field so the BF16 originals (and
/// so the ideal output) can be regenerated from the file alone.
struct SyntheticSpec {
  CheckpointFormat format = CheckpointFormat::KimiK3;
  int64_t num_experts = 32, hidden = 256, intermediate = 192, top_k = 8;
  int64_t layer = 0;
  uint64_t seed = 1;
  bool with_bias = false;  // GPT-OSS
  std::string prefix;      // empty: default
};
/// Generate all experts deterministically (same as make_synthetic_layer with ep_size 1,
/// plus a correction bias) and write them in `spec.format`.
void write_synthetic_checkpoint(const std::string& path, const SyntheticSpec& spec);
/// The correction bias [E] a synthetic Kimi-K3 checkpoint carries
/// ("<prefix>.gate.e_score_correction_bias"): small Gaussian values from `seed`.
std::vector<float> synthetic_correction_bias(int64_t num_experts, uint64_t seed);
/// Read a SyntheticSpec back from a checkpoint's metadata; false if not synthetic
/// (no "mxmoe.synthetic.seed"); throws FormatError when the synthetic keys are malformed.
bool synthetic_spec_from_metadata(const std::map<std::string, std::string>& md, SyntheticSpec& spec);

/// Write a loaded layer (all experts, ep_size 1) in another format (`mxmoe convert`).
void write_checkpoint(const std::string& path, const LoadedLayer& layer, CheckpointFormat format,
                      const std::string& prefix, int64_t layer_index);

}  // namespace mxmoe
