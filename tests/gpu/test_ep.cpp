// Expert parallelism over NCCL (ep.h) on two GPUs, one process per GPU.
//
// The test process itself never initialises CUDA: CUDA does not survive a fork, and every
// test forks its ranks through ep_launch (GPUs are counted in a forked child too). Each
// rank regenerates every rank's inputs from the seed, so it can check its own output:
//  (a) bit for bit against an emulation of the whole EP system on its own GPU: for each
//      owner rank d, an ordinary CudaMoeLayer with d's slice of the experts (ep_size W,
//      ep_rank d, fp32 output) runs on exactly the batch d receives (same rows, same
//      order, same row count including padding: the engine's kernel choice depends on
//      the row count), then the same rank-order fp32 sum, output scale and conversion;
//  (b) within SPEC §8 bounds against the float64 reference with all experts (and the
//      single-GPU all-experts layer is held to the same bounds);
//  (c) routing with tokens whose experts all live on the other rank, all-(-1) tokens,
//      mixed -1 slots, and a rank with no tokens, in both modes; Padded mode captured in a
//      CUDA graph and replayed twice equals eager.
// Without two GPUs (or without NCCL in the build) the tests skip, saying so.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/ep.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/random.h"
#include "mxmoe/reference.h"
#include "mxmoe/suite.h"
#include "../expect_invalid.h"

namespace {

using mxmoe_test::expect_invalid;

using namespace mxmoe;

constexpr int kSkipCode = 77;  // a rank found fewer GPUs than ranks

// Runs body on `ranks` processes (rank r on GPU r). A failed EXPECT in a rank fails it.
// Skips (visibly) where NCCL is not built or there are fewer GPUs than ranks.
#define RUN_RANKS(ranks, ...)                                                                  \
  do {                                                                                         \
    if (!ep_built()) GTEST_SKIP() << "this build has no NCCL: EP over NCCL is not built";      \
    const int gpus_ = ep_device_count();                                                       \
    if (gpus_ < (ranks))                                                                       \
      GTEST_SKIP() << "needs " << (ranks) << " GPU(s) (found " << gpus_ << "): EP over NCCL";    \
    const std::function<void(int, int, const EpUniqueId&)> fn_ = (__VA_ARGS__);               \
    const int rc_ = ep_launch(                                                                 \
        (ranks),                                                                               \
        [&](int r, int n, const EpUniqueId& id) -> int {                                       \
          if (cuda_device_count() < n) return kSkipCode;                                       \
          fn_(r, n, id);                                                                       \
          return ::testing::Test::HasFailure() ? 1 : 0;                                        \
        },                                                                                     \
        300);                                                                                  \
    if (rc_ == kSkipCode) GTEST_SKIP() << "needs " << (ranks) << " GPUs (found fewer): EP over NCCL"; \
    EXPECT_EQ(rc_, 0) << "a rank failed; its messages are above";                              \
  } while (0)

// ------------------------------------------------------------------ the problem
struct Problem {
  MoeConfig cfg;          // global view; ep fields set per rank
  int world = 2;
  int64_t max_tokens = 40;
  std::vector<int64_t> tokens;  // M_r per rank
  uint64_t seed = 1234;
  bool x_bf16 = true;     // give the layer BF16 x (quantized on the rank when cfg is MXFP8)
};

MoeConfig base_cfg(InputFormat in, IntermediateFormat mid, OutputFormat out, float output_scale) {
  MoeConfig c;
  c.num_experts = 16;
  c.top_k = 6;
  c.hidden = 256;
  c.intermediate = 128;
  c.activation = ActivationParams::situ();
  c.input_format = in;
  c.intermediate_format = mid;
  c.output_format = out;
  c.output_scale = output_scale;
  return c;
}

MoeConfig rank_cfg(const Problem& p, int r) {
  MoeConfig c = p.cfg;
  c.ep_size = p.world;
  c.ep_rank = r;
  return c;
}

Activations inputs_x(const Problem& p, int r) {
  Activations x = make_activations(p.tokens[r], p.cfg.hidden, p.seed * 31 + static_cast<uint64_t>(r));
  if (!p.x_bf16) x = x.to_mxfp8(p.cfg.scale_rule);
  return x;
}

// Token t of rank r, by t % 6: 0 all experts on the next rank, 1 all slots -1, 2 mixed
// with -1 slots, 3 all experts on its own rank, else distinct experts anywhere.
Routing inputs_routing(const Problem& p, int r) {
  const int64_t E = p.cfg.num_experts, k = p.cfg.top_k, M = p.tokens[r];
  const int64_t el = E / p.world;
  Rng rng(p.seed * 7919 + static_cast<uint64_t>(r) * 104729 + 17);
  Routing ro;
  ro.tokens = M;
  ro.top_k = k;
  for (int64_t t = 0; t < M; ++t) {
    const int kind = static_cast<int>(t % 6);
    std::vector<int32_t> pool;
    if (kind == 0 || kind == 3) {
      const int owner = kind == 0 ? (r + 1) % p.world : r;
      for (int64_t e = 0; e < el; ++e) pool.push_back(static_cast<int32_t>(owner * el + e));
    } else {
      for (int64_t e = 0; e < E; ++e) pool.push_back(static_cast<int32_t>(e));
    }
    for (size_t i = pool.size() - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
    for (int64_t j = 0; j < k; ++j) {
      int32_t id = pool[static_cast<size_t>(j) % pool.size()];
      if (kind == 1 || (kind == 2 && j % 2 == 1)) id = -1;
      ro.ids.push_back(id);
      ro.weights.push_back(static_cast<float>(0.05 + 0.95 * rng.uniform()));
    }
  }
  return ro;
}

// What the whole EP system computes for rank `me`'s tokens, emulated on this GPU with
// ordinary layers (see the file comment).
Output emulate(const Problem& p, int me, EpMode mode) {
  const int W = p.world;
  const int64_t K = p.cfg.hidden, k = p.cfg.top_k, R = p.max_tokens;
  const int64_t el = p.cfg.num_experts / W;
  const bool fp8 = p.cfg.input_format == InputFormat::MXFP8;
  std::vector<Activations> xs(W);
  std::vector<Routing> rs(W);
  for (int s = 0; s < W; ++s) {
    xs[s] = inputs_x(p, s);
    if (fp8) xs[s] = xs[s].to_mxfp8(p.cfg.scale_rule);  // bit-identical to the rank's quantizer
    rs[s] = inputs_routing(p, s);
  }
  const int64_t Mme = p.tokens[me];
  std::vector<std::vector<float>> acc_rows(static_cast<size_t>(Mme), std::vector<float>(K, 0.0f));
  for (int d = 0; d < W; ++d) {
    Activations b;
    b.format = fp8 ? InputFormat::MXFP8 : InputFormat::BF16;
    b.hidden = K;
    Routing br;
    br.top_k = k;
    std::vector<int64_t> my_row(static_cast<size_t>(Mme), -1);
    for (int s = 0; s < W; ++s) {
      int64_t rows = 0;
      for (int64_t t = 0; t < p.tokens[s]; ++t) {
        bool has = false;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t id = rs[s].ids[t * k + j];
          has |= id >= 0 && id / el == d;
        }
        if (!has) continue;
        if (s == me) my_row[t] = b.tokens;
        if (fp8) {
          b.fp8.insert(b.fp8.end(), xs[s].fp8.begin() + t * K, xs[s].fp8.begin() + (t + 1) * K);
          b.scale.insert(b.scale.end(), xs[s].scale.begin() + t * K / 32, xs[s].scale.begin() + (t + 1) * K / 32);
        } else {
          b.bf16.insert(b.bf16.end(), xs[s].bf16.begin() + t * K, xs[s].bf16.begin() + (t + 1) * K);
        }
        br.ids.insert(br.ids.end(), rs[s].ids.begin() + t * k, rs[s].ids.begin() + (t + 1) * k);
        br.weights.insert(br.weights.end(), rs[s].weights.begin() + t * k, rs[s].weights.begin() + (t + 1) * k);
        ++b.tokens;
        ++rows;
      }
      for (; mode == EpMode::Padded && rows < R; ++rows) {  // padding rows
        if (fp8) {
          b.fp8.insert(b.fp8.end(), K, 0);
          b.scale.insert(b.scale.end(), K / 32, 0);
        } else {
          b.bf16.insert(b.bf16.end(), K, 0);
        }
        br.ids.insert(br.ids.end(), k, -1);
        br.weights.insert(br.weights.end(), k, 0.0f);
        ++b.tokens;
      }
    }
    br.tokens = b.tokens;
    if (b.tokens == 0) continue;
    MoeConfig cd = rank_cfg(p, d);
    cd.output_format = OutputFormat::FP32;
    cd.output_scale = 1.0f;
    const SyntheticLayer w = make_synthetic_layer(cd, p.seed);
    CudaMoeLayer layer(cd, w.weights);
    CudaHostSession session(layer, b.tokens);
    session.set_inputs(b, &br, nullptr);
    const Output y = session.run_eager();
    for (int64_t t = 0; t < Mme; ++t) {
      if (my_row[t] < 0) continue;
      for (int64_t c = 0; c < K; ++c) acc_rows[t][c] = acc_rows[t][c] + y.fp32[my_row[t] * K + c];
    }
  }
  Output o;
  o.format = p.cfg.output_format;
  o.tokens = Mme;
  o.hidden = K;
  for (int64_t t = 0; t < Mme; ++t)
    for (int64_t c = 0; c < K; ++c) {
      const float v = acc_rows[t][c] * p.cfg.output_scale;
      if (o.format == OutputFormat::FP32) o.fp32.push_back(v);
      else o.bf16.push_back(fmt::float_to_bf16(v));
    }
  return o;
}

bool same_bits(const Output& a, const Output& b) {
  if (a.format != b.format || a.tokens != b.tokens || a.hidden != b.hidden) return false;
  if (a.format == OutputFormat::FP32)
    return a.fp32.size() == b.fp32.size() &&
           (a.fp32.empty() || std::memcmp(a.fp32.data(), b.fp32.data(), a.fp32.size() * 4) == 0);
  return a.bf16.size() == b.bf16.size() &&
         (a.bf16.empty() || std::memcmp(a.bf16.data(), b.bf16.data(), a.bf16.size() * 2) == 0);
}

Comparison judge(const Output& a, const Output& ref, IntermediateFormat mid) {
  const std::vector<double> av = output_values(a), rv = output_values(ref);
  double ss = 0;
  for (double v : rv) ss += v * v;
  const double rms = rv.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(rv.size()));
  const Tolerance tol = tolerance_for(mid);
  return compare_outputs(av, rv, a.tokens, a.hidden, tol.atol_rms * rms, tol.rtol);
}

// One rank of one EP problem: every check of the file comment.
void check_rank(const Problem& p, EpMode mode, const EpComm& comm) {
  const int rank = comm.rank();
  const MoeConfig cfg = rank_cfg(p, rank);
  const SyntheticLayer mine = make_synthetic_layer(cfg, p.seed);
  CudaEpLayer layer(cfg, mine.weights, comm, p.max_tokens, mode);
  CudaEpHostSession session(layer);
  const Activations x = inputs_x(p, rank);
  const Routing routing = inputs_routing(p, rank);
  session.set_inputs(x, routing);
  const Output ep = session.run_eager();
  const Output again = session.run_eager();
  EXPECT_TRUE(same_bits(ep, again)) << "rank " << rank << ": two EP runs differ";
  EXPECT_EQ(layer.read_error_flags(nullptr), 0u) << "rank " << rank;
  if (mode == EpMode::Padded) {
    const std::vector<Output> replays = session.run_graph(2);
    ASSERT_EQ(replays.size(), 2u);
    for (const Output& o : replays)
      EXPECT_TRUE(same_bits(o, ep)) << "rank " << rank << ": graph replay differs from eager";
  } else {
    expect_invalid([&] { (void)session.run_graph(1); }, "mode");
  }

  // (a) the same-order emulation, bit for bit
  const Output emu = emulate(p, rank, mode);
  EXPECT_TRUE(same_bits(ep, emu)) << "rank " << rank << " (" << to_string(mode)
                                  << "): EP output differs from the same-order emulation";
  if (p.tokens[rank] == 0) return;

  // all-(-1) tokens: zero rows, exactly
  const int64_t K = p.cfg.hidden;
  for (int64_t t = 1; t < p.tokens[rank]; t += 6)
    for (int64_t c = 0; c < K; ++c) ASSERT_EQ(ep.value(t, c), 0.0f) << "token " << t << " col " << c;

  // (b) SPEC §8 bounds against the float64 reference with every expert, and the
  // single-GPU all-experts layer held to the same bounds
  MoeConfig all = p.cfg;
  all.ep_size = 1;
  all.ep_rank = 0;
  const SyntheticLayer every = make_synthetic_layer(all, p.seed);
  const Activations xin = all.input_format == InputFormat::MXFP8 ? x.to_mxfp8(all.scale_rule) : x;
  Output ref;
  reference_forward(all, every.weights, xin, routing, ref);
  const Tolerance tol = tolerance_for(all.resolved_intermediate());
  const Comparison c_ep = judge(ep, ref, all.resolved_intermediate());
  EXPECT_TRUE(c_ep.pass(tol.max_rel_l2, tol.min_cosine)) << "rank " << rank << " EP vs reference: " << c_ep.summary();
  CudaMoeLayer single(all, every.weights);
  CudaHostSession ss(single, p.tokens[rank]);
  ss.set_inputs(x, &routing, nullptr);
  const Output one = ss.run_eager();
  const Comparison c_one = judge(one, ref, all.resolved_intermediate());
  EXPECT_TRUE(c_one.pass(tol.max_rel_l2, tol.min_cosine)) << "rank " << rank << " single GPU vs reference: " << c_one.summary();
  const Comparison c_pair = judge(ep, one, all.resolved_intermediate());
  EXPECT_TRUE(c_pair.pass(tol.max_rel_l2, tol.min_cosine)) << "rank " << rank << " EP vs single GPU: " << c_pair.summary();
}

Problem two_rank_problem(std::vector<int64_t> tokens) {
  Problem p;
  p.cfg = base_cfg(InputFormat::MXFP8, IntermediateFormat::MXFP8, OutputFormat::BF16, 1.0f);
  p.tokens = std::move(tokens);
  return p;
}

// ------------------------------------------------------------------ tests

TEST(Ep, PaddedMatchesEmulationAndReference) {
  const Problem p = two_rank_problem({37, 23});
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);
    check_rank(p, EpMode::Padded, comm);
  });
}

TEST(Ep, ExactMatchesEmulationAndReference) {
  const Problem p = two_rank_problem({37, 23});
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);
    check_rank(p, EpMode::Exact, comm);
  });
}

TEST(Ep, RankWithNoTokensBothModes) {
  const Problem p = two_rank_problem({29, 0});
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);  // one communicator per process: a unique id is used once
    check_rank(p, EpMode::Padded, comm);
    check_rank(p, EpMode::Exact, comm);
  });
}

// forward is collective: a rank whose arguments are rejected still serves its peers'
// tokens (it takes part with none of its own), so they finish, and both stay in step.
TEST(Ep, RejectedRankStillServesItsPeers) {
  const Problem p = two_rank_problem({13, 0});
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);
    for (EpMode mode : {EpMode::Padded, EpMode::Exact}) {
      const MoeConfig cfg = rank_cfg(p, r);
      const SyntheticLayer mine = make_synthetic_layer(cfg, p.seed);
      CudaEpLayer layer(cfg, mine.weights, comm, p.max_tokens, mode);
      CudaEpHostSession session(layer);
      session.set_inputs(inputs_x(p, r), inputs_routing(p, r));  // rank 1: no tokens
      if (r == 0) {
        const Output first = session.run_eager();   // the peer's forward is rejected
        const Output second = session.run_eager();  // the peer's forward is valid (0 tokens)
        EXPECT_TRUE(same_bits(first, second)) << to_string(mode);
        EXPECT_TRUE(same_bits(first, emulate(p, r, mode))) << to_string(mode);
      } else {
        ForwardArgs bad;
        bad.tokens = p.max_tokens + 1;
        expect_invalid([&] { layer.forward(bad, nullptr); }, "args.tokens");
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // its empty exchange has finished
        (void)session.run_eager();
      }
    }
  });
}

TEST(Ep, Mxfp8InputBf16IntermediateFp32OutputWithScale) {
  Problem p = two_rank_problem({40, 17});
  p.cfg = base_cfg(InputFormat::MXFP8, IntermediateFormat::BF16, OutputFormat::FP32, 2.5f);
  p.x_bf16 = false;  // MXFP8 x given directly: no quantization on the rank
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);  // one communicator per process: a unique id is used once
    check_rank(p, EpMode::Padded, comm);
    check_rank(p, EpMode::Exact, comm);
  });
}

TEST(Ep, Bf16ActivationsTravelAsBf16) {
  Problem p = two_rank_problem({11, 31});
  p.cfg = base_cfg(InputFormat::BF16, IntermediateFormat::BF16, OutputFormat::BF16, 1.0f);
  p.max_tokens = 32;
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);  // one communicator per process: a unique id is used once
    check_rank(p, EpMode::Padded, comm);
    check_rank(p, EpMode::Exact, comm);
  });
}

TEST(Ep, DecodeSizes) {  // one token per rank: the engine's decode path on 2 padded rows
  Problem p = two_rank_problem({1, 1});
  p.max_tokens = 1;
  RUN_RANKS(2, [&](int r, int n, const EpUniqueId& id) {
    EpComm comm(id, n, r, r);  // one communicator per process: a unique id is used once
    check_rank(p, EpMode::Padded, comm);
    check_rank(p, EpMode::Exact, comm);
  });
}

// (d) argument errors: one rank is enough (a world of one talks to itself).
TEST(EpArgs, ConstructorChecksItsArguments) {
  RUN_RANKS(1, [](int, int, const EpUniqueId& id) {
    expect_invalid([&] { EpComm c(id, 0, 0); }, "world_size");
    expect_invalid([&] { EpComm c(id, 1, 1); }, "rank");
    EpComm comm(id, 1, 0, 0);
    MoeConfig cfg = base_cfg(InputFormat::MXFP8, IntermediateFormat::MXFP8, OutputFormat::BF16, 1.0f);
    const SyntheticLayer w = make_synthetic_layer(cfg, 5);
    MoeConfig two = cfg;
    two.ep_size = 2;
    const SyntheticLayer w2 = make_synthetic_layer(two, 5);
    expect_invalid([&] { CudaEpLayer l(two, w2.weights, comm, 8); }, "config.ep_size");
    expect_invalid([&] { CudaEpLayer l(cfg, w.weights, comm, 0); }, "max_tokens_per_rank");
    expect_invalid([&] { CudaEpLayer l(cfg, w.weights, comm, 8, static_cast<EpMode>(7)); }, "mode");
    expect_invalid([&] { CudaEpLayer l(cfg, w2.weights, comm, 8); }, "weights.num_local");
    MoeConfig mapped = cfg;
    mapped.expert_map.assign(16, -1);
    mapped.expert_map[3] = 0;
    EXPECT_THROW({ CudaEpLayer l(mapped, make_synthetic_layer(mapped, 5).weights, comm, 8); },
                 Unsupported);
    CudaEpLayer ok(cfg, w.weights, comm, 8);  // the comm still works after the refusals
    EXPECT_EQ(ok.max_tokens_per_rank(), 8);
  });
}

TEST(EpArgs, ForwardChecksItsArgumentsAndWritesNothing) {
  RUN_RANKS(1, [](int, int, const EpUniqueId& id) {
    EpComm comm(id, 1, 0, 0);
    MoeConfig cfg = base_cfg(InputFormat::MXFP8, IntermediateFormat::MXFP8, OutputFormat::BF16, 1.0f);
    const SyntheticLayer w = make_synthetic_layer(cfg, 6);
    CudaEpLayer padded(cfg, w.weights, comm, 4, EpMode::Padded);
    CudaEpLayer exact(cfg, w.weights, comm, 4, EpMode::Exact);
    char* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
    ASSERT_EQ(cudaMemset(buf, 0, 1 << 20), cudaSuccess);
    char* out = buf + (512 << 10);
    ASSERT_EQ(cudaMemset(out, 0xAB, 4 * 256 * 2), cudaSuccess);
    ForwardArgs a;
    a.tokens = 4;
    a.x = buf;
    a.topk_ids = reinterpret_cast<const int32_t*>(buf + 65536);
    a.topk_weights = reinterpret_cast<const float*>(buf + 131072);
    a.out = out;
    auto with = [&](auto change) {
      ForwardArgs b = a;
      change(b);
      return b;
    };
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.tokens = 5; }), nullptr); }, "args.tokens");
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.tokens = -1; }), nullptr); }, "args.tokens");
    expect_invalid([&] { padded.forward(with([&](ForwardArgs& b) { b.router_logits = a.topk_weights; }), nullptr); },
                   "args.router_logits");
    expect_invalid([&] {
      padded.forward(with([&](ForwardArgs& b) { b.router_logits_bf16 = reinterpret_cast<const uint16_t*>(a.topk_weights); }),
                     nullptr);
    }, "args.router_logits_bf16");
    expect_invalid([&] { padded.forward(with([&](ForwardArgs& b) { b.x = buf + 8; }), nullptr); }, "args.x");
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.x = nullptr; }), nullptr); }, "args.x");
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.x_format = InputFormat::MXFP8; }), nullptr); },
                   "args.x_scale");
    expect_invalid([&] { padded.forward(with([&](ForwardArgs& b) { b.x_scale = reinterpret_cast<uint8_t*>(buf); }), nullptr); },
                   "args.x_scale");
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.topk_ids = nullptr; }), nullptr); }, "args.topk_ids");
    expect_invalid([&] { padded.forward(with([&](ForwardArgs& b) { b.topk_weights = reinterpret_cast<const float*>(buf + 131073); }), nullptr); },
                   "args.topk_weights");
    expect_invalid([&] { padded.forward(with([](ForwardArgs& b) { b.out = nullptr; }), nullptr); }, "args.out");
    std::vector<uint16_t> host_x(4 * 256);
    expect_invalid([&] { padded.forward(with([&](ForwardArgs& b) { b.x = host_x.data(); }), nullptr); }, "args.x");
    void* events[4] = {nullptr, nullptr, nullptr, nullptr};
    expect_invalid([&] { padded.forward(a, nullptr, events); }, "phase_events");
    // Exact mode refuses a capturing stream (it would synchronize inside the capture).
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    expect_invalid([&] { exact.forward(a, st); }, "stream");
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st, &g);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    // Nothing was written.
    std::vector<uint8_t> back(4 * 256 * 2);
    ASSERT_EQ(cudaMemcpy(back.data(), out, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint8_t b : back) ASSERT_EQ(b, 0xAB);
    // A BF16 layer refuses MXFP8 x.
    MoeConfig bf = base_cfg(InputFormat::BF16, IntermediateFormat::BF16, OutputFormat::BF16, 1.0f);
    CudaEpLayer bl(bf, make_synthetic_layer(bf, 7).weights, comm, 4);
    expect_invalid([&] {
      bl.forward(with([&](ForwardArgs& b) {
        b.x_format = InputFormat::MXFP8;
        b.x_scale = reinterpret_cast<uint8_t*>(buf);
      }), nullptr);
    }, "args.x_format");
    cudaFree(buf);
  });
}

// The launcher itself (no GPU needed, but NCCL must be built: rank 0 makes the id).
TEST(EpLaunch, ReportsExitCodesAndKillsHungRanks) {
  if (!ep_built()) GTEST_SKIP() << "this build has no NCCL: EP over NCCL is not built";
  expect_invalid([] { (void)ep_launch(0, [](int, int, const EpUniqueId&) { return 0; }); }, "ranks");
  EXPECT_EQ(ep_launch(3, [](int r, int n, const EpUniqueId&) { return n == 3 && r >= 0 ? 0 : 1; }), 0);
  EXPECT_EQ(ep_launch(3, [](int r, int, const EpUniqueId&) { return r == 1 ? 5 : 0; }), 5);
  // Every rank receives the same id.
  EXPECT_EQ(ep_launch(2, [](int, int, const EpUniqueId& id) {
              bool zero = true;
              for (char c : id) zero = zero && c == 0;
              return zero ? 9 : 0;
            }),
            0);
  EXPECT_EQ(ep_launch(2, [](int r, int, const EpUniqueId&) -> int {
              if (r == 1) throw InvalidArgument("x", "thrown in a rank");
              return 0;
            }),
            1);
  // A rank that never finishes is killed at the timeout.
  EXPECT_EQ(ep_launch(1, [](int, int, const EpUniqueId&) {
              std::this_thread::sleep_for(std::chrono::seconds(30));
              return 0;
            }, 1),
            128 + 9);
}

}  // namespace
