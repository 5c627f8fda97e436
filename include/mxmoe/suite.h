// mxmoe/suite.h — the validation harness behind `mxmoe validate` and `mxmoe run`: the
// SPEC §8 coverage matrix as named cases, each run on a backend and judged against the
// float64 reference on the same quantized bytes (and reported against the ideal).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/moe.h"
#include "mxmoe/reference.h"
#include "mxmoe/routing.h"

namespace mxmoe {

enum class Backend : int { Cpu = 0, Cuda = 1 };
const char* to_string(Backend b);
Backend parse_backend(const std::string& s);  // "cpu" | "cuda"
/// The backend taken when none is named (`mxmoe run`): CUDA where one of `gpus`
/// (cuda_devices()) is supported, else the CPU. Where GPUs are seen but none is
/// supported, `note` (if given) says so with the first one's reason, to be shown: the
/// choice is never silent (SPEC §9).
Backend default_backend(const std::vector<GpuInfo>& gpus, std::string* note = nullptr);

/// How a case chooses experts for its tokens.
enum class RoutingPattern : int {
  Uniform,       // top_k distinct experts uniformly over all global experts
  Skewed,        // most picks fall on two hot local experts
  EmptyExperts,  // only half of the local experts are ever chosen
  MaskedSlots,   // about a quarter of the slots are -1
  LocalOnly,     // every slot picks a distinct local expert (the busiest EP rank)
  RouterSigmoid, // router logits + correction bias, sigmoid top-k (routed on the backend)
  RouterSoftmax, // router logits, softmax top-k (routed on the backend)
};
const char* to_string(RoutingPattern p);

/// Non-finite inputs a case injects.
enum class Hazard : int { None, InfToken, NaNToken, NaNWeightBlock };

struct SuiteCase {
  std::string name;
  std::string what;  // one line: what the case covers
  MoeConfig cfg;
  int64_t tokens = 1;
  RoutingPattern routing = RoutingPattern::Uniform;
  RoutingParams router;  // for the Router* patterns
  Hazard hazard = Hazard::None;
  bool check_determinism = true;  // three runs bitwise identical
  bool check_graph = true;        // CUDA only: capture + two replays == eager
};

/// Cases of a suite: "smoke" (small shapes, the whole matrix), "real" (Kimi-K3 real
/// shapes: decode M=1 and prefill M=128, SiTU and SwiGLU), "all" (both).
std::vector<SuiteCase> suite_cases(const std::string& suite);

/// Element-wise bound used with the SPEC §8 row metrics: |out-ref| <= atol + rtol*|ref|
/// with atol = atol_rms * rms(ref).
struct Tolerance {
  double max_rel_l2, min_cosine, rtol, atol_rms;
};
/// For a resolved format (BF16 or MXFP8; Auto is refused: MoeConfig::resolved_intermediate()).
Tolerance tolerance_for(IntermediateFormat f);
/// The bounds a layer of `cfg` is judged by: tolerance_for(cfg.resolved_intermediate()), or the
/// FP8 precision mode's documented bound (docs/FP8_MODE.md) when cfg.precision is fp8.
Tolerance tolerance_for(const MoeConfig& cfg);

struct CaseResult {
  std::string name, what;
  Backend backend = Backend::Cpu;
  enum class Status { Pass, Fail, Skip } status = Status::Fail;
  Comparison vs_reference;     // against the reference with near-ties taken (reference.h)
  int64_t near_ties = 0, near_ties_taken = 0;  // the intermediate's near-ties; those taken
  int64_t output_ties_taken = 0;               // BF16 output roundings taken the other way
  bool has_ideal = false;
  double ideal_rel_l2 = 0, ideal_cosine = 0;  // informational: the format's price
  bool deterministic = true, graph_identical = true, graph_checked = false;
  double backend_seconds = 0, reference_seconds = 0;
  uint64_t seed = 0;
  std::string note;  // reason for a failure or a skip
  const char* status_string() const;
};

/// A layer and inputs prepared for a case (weights may come from a checkpoint).
struct CaseData {
  MoeConfig cfg;
  // Shared, so the real-shape cases of one run can reuse one generated layer.
  std::shared_ptr<const ExpertWeights> weights;
  std::shared_ptr<const IdealWeights> ideal;  // may be null (then no ideal comparison)
  std::vector<float> router_bias;
  Activations x_bf16;  // the original activations (BF16)
  Activations x;       // what the layer consumes (cfg.input_format)
  Routing routing;     // the routing the reference uses
  std::vector<float> logits;  // set for Router* patterns: the backend routes itself
};
/// Build weights (from `weight_seed`) and fresh inputs (from `seed`) for a case. The
/// last synthetic layer is kept, so cases of one run with the same geometry and weight
/// seed share it: the Kimi real-shape layer takes tens of seconds to generate.
CaseData make_case_data(const SuiteCase& c, uint64_t seed, uint64_t weight_seed);
/// Fresh inputs (activations, routing) for already-built weights.
void make_case_inputs(const SuiteCase& c, uint64_t seed, CaseData& d);

/// Run a prepared case on a backend and judge it. Never throws for a failing check;
/// backend errors become a Fail with the message in `note`.
CaseResult judge_case(const SuiteCase& c, const CaseData& d, Backend backend, uint64_t seed);
CaseResult run_case(const SuiteCase& c, Backend backend, uint64_t seed, uint64_t weight_seed);

}  // namespace mxmoe
