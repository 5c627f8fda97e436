// Internal: the RNG streams behind synthetic data (synthetic.cpp, checkpoint.cpp).
// Changing anything here changes every synthetic checkpoint's bytes, including the
// embedded data/kimi_k3_mini.safetensors (its test then fails, as it should).
#pragma once

#include <cstdint>

namespace mxmoe::detail {

inline constexpr uint64_t kStreamExpertWeights = 0x57454947485453ull;  // "WEIGHTS"
inline constexpr uint64_t kStreamActivations = 0x4143544956ull;        // "ACTIV"
inline constexpr uint64_t kStreamCorrectionBias = 0x434f52524249ull;   // "CORRBI"

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Seed of stream `index` of kind `tag` under the user's `seed`: a hash, so different
/// (seed, tag, index) never share a stream by arithmetic accident.
inline uint64_t synthetic_stream(uint64_t seed, uint64_t tag, uint64_t index) {
  return mix64(mix64(seed ^ mix64(tag)) + index * 0x9E3779B97F4A7C15ull);
}

}  // namespace mxmoe::detail
