// module.cpp — mxmoe._C, the nanobind extension over the C++ API.
//
// Tensors cross through DLPack (nb::ndarray), so NumPy arrays, PyTorch CPU/CUDA tensors,
// CuPy and JAX arrays all arrive without a copy and without the extension depending on
// any of them. The GPU path hands device pointers straight to CudaMoeLayer::forward on
// the caller's stream. The CPU path copies inputs into the library's std::vector-based
// host types (moe.h): the CPU backend is for checking and small runs, not for speed.
// Library errors become Python exceptions: InvalidArgument -> mxmoe.InvalidArgument
// (a ValueError), FormatError -> mxmoe.FormatError (a ValueError), Unsupported ->
// mxmoe.UnsupportedError (a NotImplementedError), CudaError -> mxmoe.CudaError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/formats.h"
#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/reference.h"
#include "mxmoe/routing.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/suite.h"

#ifndef MXMOE_VERSION
#define MXMOE_VERSION "0.0.0"
#endif

namespace nb = nanobind;
using namespace nb::literals;
using namespace mxmoe;
using namespace mxmoe::fmt;
using mxmoe_py::Array;
using mxmoe_py::Dev;

namespace {

// ---------------------------------------------------------------- names <-> enums

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

InputFormat parse_input_format(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "bf16" || l == "bfloat16") return InputFormat::BF16;
  if (l == "mxfp8") return InputFormat::MXFP8;
  throw InvalidArgument(arg, "unknown format '" + s + "' (expected bf16 or mxfp8)");
}
IntermediateFormat parse_intermediate_format(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "bf16" || l == "bfloat16") return IntermediateFormat::BF16;
  if (l == "mxfp8") return IntermediateFormat::MXFP8;
  if (l == "auto") return IntermediateFormat::Auto;
  throw InvalidArgument(arg, "unknown format '" + s + "' (expected auto, bf16 or mxfp8)");
}
OutputFormat parse_output_format(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "bf16" || l == "bfloat16") return OutputFormat::BF16;
  if (l == "fp32" || l == "float32") return OutputFormat::FP32;
  throw InvalidArgument(arg, "unknown format '" + s + "' (expected bf16 or fp32)");
}
ScaleRule parse_scale_rule(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "round_up" || l == "roundup" || l == "round-up") return ScaleRule::RoundUp;
  if (l == "floor") return ScaleRule::Floor;
  throw InvalidArgument(arg, "unknown scale rule '" + s + "' (expected round_up or floor)");
}
const char* scale_rule_name(ScaleRule r) { return r == ScaleRule::Floor ? "floor" : "round_up"; }
W13Layout parse_layout(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "gate_up" || l == "gateup" || l == "kimi") return W13Layout::GateUp;
  if (l == "interleaved" || l == "gpt-oss" || l == "gpt_oss") return W13Layout::Interleaved;
  if (l == "up_gate" || l == "upgate" || l == "w31") return W13Layout::UpGate;
  throw InvalidArgument(arg, "unknown layout '" + s + "' (expected gate_up, interleaved or up_gate)");
}
RouterKind parse_router(const std::string& s, const char* arg) {
  const auto l = lower(s);
  if (l == "sigmoid") return RouterKind::Sigmoid;
  if (l == "softmax") return RouterKind::Softmax;
  throw InvalidArgument(arg, "unknown router '" + s + "' (expected sigmoid or softmax)");
}

// ---------------------------------------------------------------- exceptions

PyObject* g_invalid = nullptr;
PyObject* g_format = nullptr;
PyObject* g_unsupported = nullptr;
PyObject* g_cuda = nullptr;
PyObject* g_error = nullptr;

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    // The argument name travels as an attribute so callers can react to it.
    PyObject* exc = PyObject_CallFunction(g_invalid, "s", e.what());
    if (exc) {
      PyObject* a = PyUnicode_FromString(e.argument().c_str());
      if (a) {
        PyObject_SetAttrString(exc, "argument", a);
        Py_DECREF(a);
      }
      PyErr_SetObject(g_invalid, exc);
      Py_DECREF(exc);
    }
  } catch (const FormatError& e) {
    PyErr_SetString(g_format, e.what());
  } catch (const Unsupported& e) {
    PyErr_SetString(g_unsupported, e.what());
  } catch (const CudaError& e) {
    PyErr_SetString(g_cuda, e.what());
  } catch (const Error& e) {
    PyErr_SetString(g_error, e.what());
  }
}

// ---------------------------------------------------------------- numpy results

template <typename T>
nb::object numpy_from(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner).cast();
}

template <typename T>
nb::object numpy_from(std::vector<T>&& v, const std::vector<size_t>& shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape.size(), shape.data(), owner).cast();
}

// ---------------------------------------------------------------- inputs

MoeConfig make_config(int64_t num_experts, int64_t top_k, int64_t hidden, int64_t intermediate,
                      int64_t ep_size, int64_t ep_rank, std::optional<std::vector<int32_t>> expert_map,
                      const std::string& activation, std::optional<std::vector<float>> alpha,
                      std::optional<std::vector<float>> beta, std::optional<std::vector<float>> limit,
                      const std::string& input_format, const std::string& intermediate_format,
                      const std::string& output_format, bool has_bias, float output_scale,
                      const std::string& scale_rule, const std::string& precision) {
  MoeConfig c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.ep_size = ep_size;
  c.ep_rank = ep_rank;
  if (expert_map) c.expert_map = *expert_map;
  switch (parse_activation(activation, "activation")) {
    case Activation::SiTU: c.activation = ActivationParams::situ(); break;
    case Activation::SwiGLU_OAI: c.activation = ActivationParams::swiglu_oai(); break;
    case Activation::SiLU_Gated: c.activation = ActivationParams::silu_gated(); break;
  }
  const bool silu = c.activation.kind == Activation::SiLU_Gated;
  MXMOE_CHECK_ARG(!(silu && (alpha || beta || limit)), "activation",
                  "silu takes no alpha/beta/limit parameters");
  MXMOE_CHECK_ARG(!(c.activation.kind == Activation::SiTU && limit), "limit",
                  "SiTU takes no limit (its up branch is bounded by beta*tanh(u/beta))");
  if (alpha) c.activation.alpha = *alpha;
  if (beta) c.activation.beta = *beta;
  if (limit) c.activation.limit = *limit;
  c.input_format = parse_input_format(input_format, "input_format");
  c.intermediate_format = parse_intermediate_format(intermediate_format, "intermediate_format");
  c.output_format = parse_output_format(output_format, "output_format");
  c.scale_rule = parse_scale_rule(scale_rule, "scale_rule");
  c.has_bias = has_bias;
  c.output_scale = output_scale;
  c.precision = parse_precision(precision, "precision");
  c.validate();
  return c;
}

// Activations from x: bf16 (or its bits as uint16/int16), float32 (rounded to BF16 here,
// as an engine would cast), or MXFP8 codes + x_scale. Converted to what the config
// consumes (BF16 -> MXFP8 with the config's scale rule, as the GPU quantizes).
Activations host_activations(const MoeConfig& cfg, const Array& x, const std::optional<Array>& x_scale) {
  using namespace mxmoe_py;
  Activations a;
  const bool codes = is_any(x, {kU8, kE4m3, kI8});
  if (codes) {
    check(x, "x", Dev::Cpu, {kU8, kE4m3, kI8}, {-1, cfg.hidden});
    MXMOE_CHECK_ARG(x_scale.has_value(), "x_scale",
                    "is required when x holds MXFP8 codes (dtype ", dtype_name(x), ")");
    const int64_t m = (int64_t)x.shape(0);
    check(*x_scale, "x_scale", Dev::Cpu, {kU8}, {m, cfg.hidden / kMxBlock});
    MXMOE_CHECK_ARG(cfg.input_format == InputFormat::MXFP8, "x",
                    "holds MXFP8 codes but config.input_format is bf16; pass bf16 activations");
    a.format = InputFormat::MXFP8;
    a.tokens = m;
    a.hidden = cfg.hidden;
    a.fp8 = to_vector<uint8_t>(x);
    a.scale = to_vector<uint8_t>(*x_scale);
    return a;
  }
  check(x, "x", Dev::Cpu, {kBf16, kU16, kI16, kF32}, {-1, cfg.hidden});
  MXMOE_CHECK_ARG(!x_scale.has_value(), "x_scale", "given but x is not MXFP8 codes (dtype ",
                  dtype_name(x), ")");
  a.format = InputFormat::BF16;
  a.tokens = (int64_t)x.shape(0);
  a.hidden = cfg.hidden;
  if (is(x, kF32)) {
    const float* p = static_cast<const float*>(ptr(x));
    a.bf16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) a.bf16[i] = float_to_bf16(p[i]);
  } else {
    a.bf16 = to_vector<uint16_t>(x);
  }
  if (cfg.input_format == InputFormat::MXFP8) return a.to_mxfp8(cfg.scale_rule);
  return a;
}

Routing host_routing(const MoeConfig& cfg, int64_t tokens, const Array& ids, const Array& weights) {
  using namespace mxmoe_py;
  check(ids, "topk_ids", Dev::Cpu, {kI32, kI64}, {tokens, cfg.top_k});
  check(weights, "topk_weights", Dev::Cpu, {kF32}, {tokens, cfg.top_k});
  Routing r;
  r.tokens = tokens;
  r.top_k = cfg.top_k;
  if (is(ids, kI32)) {
    r.ids = to_vector<int32_t>(ids);
  } else {
    const int64_t* p = static_cast<const int64_t*>(ptr(ids));
    r.ids.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      MXMOE_CHECK_ARG(p[i] >= -1 && p[i] < cfg.num_experts, "topk_ids", "value ", p[i], " at flat index ",
                      i, " is outside [-1, ", cfg.num_experts, ")");
      r.ids[i] = static_cast<int32_t>(p[i]);
    }
  }
  r.weights = to_vector<float>(weights);
  return r;
}

RoutingParams make_routing_params(const std::string& kind, int64_t top_k, bool renormalize,
                                  int64_t n_group, int64_t topk_group, float routed_scaling_factor,
                                  bool scaling_in_weights) {
  RoutingParams p;
  p.kind = parse_router(kind, "router");
  p.top_k = top_k;
  p.renormalize = renormalize;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.routed_scaling_factor = routed_scaling_factor;
  p.scaling_in_weights = scaling_in_weights;
  return p;
}

// Write a host Output into `out` (validated beforehand) or return a new NumPy array.
void check_out(const MoeConfig& cfg, const Array& out, int64_t tokens, Dev dev, int device) {
  using namespace mxmoe_py;
  if (cfg.output_format == OutputFormat::BF16)
    check(out, "out", dev, {kBf16, kU16, kI16}, {tokens, cfg.hidden}, device);
  else
    check(out, "out", dev, {kF32}, {tokens, cfg.hidden}, device);
}

nb::object deliver(const Output& o, const std::optional<Array>& out) {
  const size_t m = (size_t)o.tokens, k = (size_t)o.hidden;
  if (out) {
    if (m == 0) return nb::none();  // an empty `out` may have a null data pointer
    void* dst = mxmoe_py::mut_ptr(*out);
    if (o.format == OutputFormat::BF16)
      std::memcpy(dst, o.bf16.data(), o.bf16.size() * sizeof(uint16_t));
    else
      std::memcpy(dst, o.fp32.data(), o.fp32.size() * sizeof(float));
    return nb::none();
  }
  if (o.format == OutputFormat::BF16) return numpy_from(std::vector<uint16_t>(o.bf16), {m, k});
  return numpy_from(std::vector<float>(o.fp32), {m, k});
}

// ---------------------------------------------------------------- weights

ExpertWeights weights_from_arrays(const Array& w13_packed, const Array& w13_scale, const Array& w2_packed,
                                  const Array& w2_scale, const std::optional<Array>& w13_bias,
                                  const std::optional<Array>& w2_bias) {
  using namespace mxmoe_py;
  check(w13_packed, "w13_packed", Dev::Cpu, {kU8}, {-1, -1, -1});
  const int64_t e = (int64_t)w13_packed.shape(0), n2 = (int64_t)w13_packed.shape(1),
                k = 2 * (int64_t)w13_packed.shape(2);
  MXMOE_CHECK_ARG(n2 % 2 == 0, "w13_packed", "has ", n2, " rows per expert; expected 2N (even)");
  const int64_t n = n2 / 2;
  MXMOE_CHECK_ARG(k % kMxBlock == 0 && n % kMxBlock == 0, "w13_packed",
                  "implies K=", k, ", N=", n, "; both must be multiples of 32");
  check(w13_scale, "w13_scale", Dev::Cpu, {kU8}, {e, n2, k / kMxBlock});
  check(w2_packed, "w2_packed", Dev::Cpu, {kU8}, {e, k, n / 2});
  check(w2_scale, "w2_scale", Dev::Cpu, {kU8}, {e, k, n / kMxBlock});
  ExpertWeights w;
  w.num_local = e;
  w.hidden = k;
  w.intermediate = n;
  w.w13_packed = to_vector<uint8_t>(w13_packed);
  w.w13_scale = to_vector<uint8_t>(w13_scale);
  w.w2_packed = to_vector<uint8_t>(w2_packed);
  w.w2_scale = to_vector<uint8_t>(w2_scale);
  if (w13_bias) {
    check(*w13_bias, "w13_bias", Dev::Cpu, {kF32}, {e, n2});
    w.w13_bias = to_vector<float>(*w13_bias);
  }
  if (w2_bias) {
    check(*w2_bias, "w2_bias", Dev::Cpu, {kF32}, {e, k});
    w.w2_bias = to_vector<float>(*w2_bias);
  }
  MXMOE_CHECK_ARG(w13_bias.has_value() == w2_bias.has_value(), w13_bias ? "w2_bias" : "w13_bias",
                  "biases come in pairs: give both w13_bias and w2_bias or neither");
  return w;
}

template <typename T>
nb::object view_of(std::vector<T>& v, std::initializer_list<size_t> shape) {
  if (v.empty()) return nb::none();
  return nb::ndarray<nb::numpy, T>(v.data(), shape, nb::handle()).cast(nb::rv_policy::reference_internal);
}

// ---------------------------------------------------------------- the GPU layer

struct CudaLayer {
  std::unique_ptr<CudaMoeLayer> layer;
  MoeConfig cfg;
  int device = 0;
  bool has_router = false;

  CudaLayer(const MoeConfig& c, const ExpertWeights& w, std::optional<RoutingParams> routing,
            std::optional<Array> router_bias, int dev)
      : cfg(c), device(dev) {
    using namespace mxmoe_py;
    MXMOE_CHECK_ARG(dev >= 0, "device", "is ", dev, "; pass the CUDA device index the tensors live on");
    std::vector<float> bias;
    if (router_bias) {
      MXMOE_CHECK_ARG(routing.has_value(), "router_bias", "given without routing parameters");
      check(*router_bias, "router_bias", Dev::Cpu, {kF32}, {c.num_experts});
      bias = to_vector<float>(*router_bias);
    }
    has_router = routing.has_value();
    layer = std::make_unique<CudaMoeLayer>(c, w, routing ? &*routing : nullptr,
                                           router_bias ? &bias : nullptr, dev);
  }

  void forward(const Array& x, std::optional<Array> topk_ids, std::optional<Array> topk_weights,
               std::optional<Array> router_logits, const Array& out, const Array& workspace,
               uintptr_t stream, std::optional<Array> x_scale) const {
    using namespace mxmoe_py;
    ForwardArgs a;
    const bool codes = is_any(x, {kU8, kE4m3, kI8});
    if (codes) {
      check(x, "x", Dev::Cuda, {kU8, kE4m3, kI8}, {-1, cfg.hidden}, device);
      MXMOE_CHECK_ARG(x_scale.has_value(), "x_scale", "is required when x holds MXFP8 codes");
    } else {
      check(x, "x", Dev::Cuda, {kBf16, kU16, kI16}, {-1, cfg.hidden}, device);
      MXMOE_CHECK_ARG(!x_scale.has_value(), "x_scale", "given but x is not MXFP8 codes");
    }
    a.tokens = (int64_t)x.shape(0);
    a.x_format = codes ? InputFormat::MXFP8 : InputFormat::BF16;
    a.x = ptr(x);
    if (x_scale) {
      check(*x_scale, "x_scale", Dev::Cuda, {kU8}, {a.tokens, cfg.hidden / kMxBlock}, device);
      a.x_scale = static_cast<const uint8_t*>(ptr(*x_scale));
    }
    if (router_logits) {
      MXMOE_CHECK_ARG(!topk_ids && !topk_weights, "router_logits",
                      "given together with topk_ids/topk_weights; pass one or the other");
      MXMOE_CHECK_ARG(has_router, "router_logits",
                      "given but the layer was built without routing parameters");
      // fp32, or BF16 as a model's router often gives them (the kernel widens them exactly).
      check(*router_logits, "router_logits", Dev::Cuda, {kF32, kBf16}, {a.tokens, cfg.num_experts}, device);
      if (is_any(*router_logits, {kBf16}))
        a.router_logits_bf16 = static_cast<const uint16_t*>(ptr(*router_logits));
      else
        a.router_logits = static_cast<const float*>(ptr(*router_logits));
    } else {
      MXMOE_CHECK_ARG(topk_ids.has_value(), "topk_ids", "is required (or pass router_logits)");
      MXMOE_CHECK_ARG(topk_weights.has_value(), "topk_weights", "is required with topk_ids");
      check(*topk_ids, "topk_ids", Dev::Cuda, {kI32}, {a.tokens, cfg.top_k}, device);
      check(*topk_weights, "topk_weights", Dev::Cuda, {kF32}, {a.tokens, cfg.top_k}, device);
      a.topk_ids = static_cast<const int32_t*>(ptr(*topk_ids));
      a.topk_weights = static_cast<const float*>(ptr(*topk_weights));
    }
    check_out(cfg, out, a.tokens, Dev::Cuda, device);
    a.out = mut_ptr(out);
    check(workspace, "workspace", Dev::Cuda, {kU8, kI8}, {-1}, device);
    // No tokens needs what one does (workspace_size takes max_tokens >= 1; forward the same).
    const size_t need = layer->workspace_size(std::max<int64_t>(a.tokens, 1));
    MXMOE_CHECK_ARG(workspace.size() >= need, "workspace", "has ", workspace.size(), " bytes, ", a.tokens,
                    " tokens need ", need, " (size it with workspace_size(max_tokens))");
    nb::gil_scoped_release unlock;
    layer->forward(a, mut_ptr(workspace), workspace.size(), reinterpret_cast<void*>(stream));
  }
};

// ---------------------------------------------------------------- capabilities

nb::dict capabilities() {
  nb::dict d;
  d["version"] = MXMOE_VERSION;
  d["cuda_built"] = cuda_built();
  const LibraryCapabilities& all = library_capabilities();
  nb::list devs, backends;
  backends.append("cpu");
  backends.append("reference");
  bool any_fp8 = false;
  const std::vector<GpuInfo> gpus = cuda_devices();
  for (const auto& g : gpus) {
    nb::dict gd;
    gd["index"] = g.index;
    gd["name"] = g.name;
    gd["sm"] = std::to_string(g.sm_major) + std::to_string(g.sm_minor);
    gd["sm_count"] = g.sm_count;
    gd["memory_bytes"] = g.memory_bytes;
    gd["supported"] = g.supported;
    gd["note"] = g.note;
    // What this GPU runs (GpuCapabilities, gpu_capabilities: empty lists when unsupported).
    const GpuCapabilities& c = g.capabilities;
    gd["activations"] = c.activations;
    gd["input_formats"] = c.input_formats;
    gd["intermediate_formats"] = c.intermediate_formats;
    gd["output_formats"] = c.output_formats;
    gd["precisions"] = c.precisions;
    gd["paths"] = c.paths;
    devs.append(gd);
    for (const std::string& pr : c.precisions) any_fp8 |= pr == "fp8";
  }
  if (default_backend(gpus) == Backend::Cuda) backends.append("cuda");  // the CLI's rule too
  d["backends"] = backends;
  d["devices"] = devs;
  d["activations"] = all.activations;
  d["input_formats"] = all.input_formats;
  d["intermediate_formats"] = all.intermediate_formats;
  d["output_formats"] = all.output_formats;
  nb::list precisions;  // exact everywhere; fp8 where some GPU here runs the FP8 mode
  precisions.append("exact");
  if (any_fp8) precisions.append("fp8");
  d["precisions"] = precisions;
  d["weight_formats"] = all.weight_formats;
  d["w13_layouts"] = all.w13_layouts;
  d["routers"] = all.routers;
  d["checkpoint_formats"] = all.checkpoint_formats;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "mxmoe C++ extension (nanobind). Use the `mxmoe` package, not this module.";
  m.attr("__version__") = MXMOE_VERSION;

  g_error = PyErr_NewException("mxmoe.Error", PyExc_RuntimeError, nullptr);
  g_invalid = PyErr_NewException("mxmoe.InvalidArgument", PyExc_ValueError, nullptr);
  g_format = PyErr_NewException("mxmoe.FormatError", PyExc_ValueError, nullptr);
  g_unsupported = PyErr_NewException("mxmoe.UnsupportedError", PyExc_NotImplementedError, nullptr);
  g_cuda = PyErr_NewException("mxmoe.CudaError", g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("InvalidArgument") = nb::handle(g_invalid);
  m.attr("FormatError") = nb::handle(g_format);
  m.attr("UnsupportedError") = nb::handle(g_unsupported);
  m.attr("CudaError") = nb::handle(g_cuda);
  nb::register_exception_translator(translate);

  // ------------------------------------------------------------ config
  nb::class_<MoeConfig>(m, "MoeConfig", "One MoE layer (routed experts of one EP rank).")
      .def(nb::new_([](int64_t num_experts, int64_t top_k, int64_t hidden, int64_t intermediate,
                       int64_t ep_size, int64_t ep_rank, std::optional<std::vector<int32_t>> expert_map,
                       const std::string& activation, std::optional<std::vector<float>> alpha,
                       std::optional<std::vector<float>> beta, std::optional<std::vector<float>> limit,
                       const std::string& input_format, const std::string& intermediate_format,
                       const std::string& output_format, bool has_bias, float output_scale,
                       const std::string& scale_rule, const std::string& precision) {
             return make_config(num_experts, top_k, hidden, intermediate, ep_size, ep_rank, expert_map,
                                activation, alpha, beta, limit, input_format, intermediate_format,
                                output_format, has_bias, output_scale, scale_rule, precision);
           }),
           "num_experts"_a, "top_k"_a, "hidden"_a, "intermediate"_a, nb::kw_only(), "ep_size"_a = 1,
           "ep_rank"_a = 0, "expert_map"_a = nb::none(), "activation"_a = "situ", "alpha"_a = nb::none(),
           "beta"_a = nb::none(), "limit"_a = nb::none(), "input_format"_a = "mxfp8",
           "intermediate_format"_a = "auto", "output_format"_a = "bf16", "has_bias"_a = false,
           "output_scale"_a = 1.0f, "scale_rule"_a = "round_up", "precision"_a = "exact",
           "Build and validate a config. Raises mxmoe.InvalidArgument (ValueError) naming the field.")
      .def_ro("num_experts", &MoeConfig::num_experts)
      .def_ro("top_k", &MoeConfig::top_k)
      .def_ro("hidden", &MoeConfig::hidden)
      .def_ro("intermediate", &MoeConfig::intermediate)
      .def_ro("ep_size", &MoeConfig::ep_size)
      .def_ro("ep_rank", &MoeConfig::ep_rank)
      .def_ro("expert_map", &MoeConfig::expert_map)
      .def_ro("has_bias", &MoeConfig::has_bias)
      .def_ro("output_scale", &MoeConfig::output_scale)
      .def_prop_ro("precision", [](const MoeConfig& c) { return std::string(to_string(c.precision)); })
      .def_prop_ro("local_experts", &MoeConfig::local_experts)
      .def_prop_ro("activation", [](const MoeConfig& c) { return std::string(to_string(c.activation.kind)); })
      .def_prop_ro("alpha", [](const MoeConfig& c) { return c.activation.alpha; })
      .def_prop_ro("beta", [](const MoeConfig& c) { return c.activation.beta; })
      .def_prop_ro("limit", [](const MoeConfig& c) { return c.activation.limit; })
      .def_prop_ro("input_format", [](const MoeConfig& c) { return std::string(to_string(c.input_format)); })
      .def_prop_ro("intermediate_format",
                   [](const MoeConfig& c) { return std::string(to_string(c.resolved_intermediate())); })
      .def_prop_ro("output_format", [](const MoeConfig& c) { return std::string(to_string(c.output_format)); })
      .def_prop_ro("scale_rule", [](const MoeConfig& c) { return std::string(scale_rule_name(c.scale_rule)); })
      .def("local_of", &MoeConfig::local_of, "global_id"_a,
           "Local index of a global expert id, or -1 when another rank owns it.")
      .def("validate", &MoeConfig::validate)
      .def("describe", &MoeConfig::describe)
      .def("__repr__", [](const MoeConfig& c) { return "mxmoe.MoeConfig(" + c.describe() + ")"; });

  nb::class_<RoutingParams>(m, "RoutingParams", "Top-k routing (SPEC §3).")
      .def(nb::new_(&make_routing_params), "kind"_a = "sigmoid", "top_k"_a = 16, nb::kw_only(),
           "renormalize"_a = true, "n_group"_a = 0, "topk_group"_a = 0, "routed_scaling_factor"_a = 1.0f,
           "scaling_in_weights"_a = true)
      .def_prop_ro("kind", [](const RoutingParams& p) {
        return std::string(p.kind == RouterKind::Sigmoid ? "sigmoid" : "softmax");
      })
      .def_ro("top_k", &RoutingParams::top_k)
      .def_ro("renormalize", &RoutingParams::renormalize)
      .def_ro("n_group", &RoutingParams::n_group)
      .def_ro("topk_group", &RoutingParams::topk_group)
      .def_ro("routed_scaling_factor", &RoutingParams::routed_scaling_factor)
      .def_ro("scaling_in_weights", &RoutingParams::scaling_in_weights);

  // ------------------------------------------------------------ weights
  nb::class_<ExpertWeights>(m, "ExpertWeights",
                            "Local experts in the kernel layout (host memory, owned by this object).")
      .def_static("from_arrays", &weights_from_arrays, "w13_packed"_a, "w13_scale"_a, "w2_packed"_a,
                  "w2_scale"_a, "w13_bias"_a = nb::none(), "w2_bias"_a = nb::none(),
                  "Copy kernel-layout arrays ([E,2N,K/2], [E,2N,K/32], [E,K,N/2], [E,K,N/32]).")
      .def_ro("num_local", &ExpertWeights::num_local)
      .def_ro("hidden", &ExpertWeights::hidden)
      .def_ro("intermediate", &ExpertWeights::intermediate)
      .def_prop_ro("w13_packed", [](ExpertWeights& w) {
        return view_of(w.w13_packed, {(size_t)w.num_local, (size_t)(2 * w.intermediate), (size_t)(w.hidden / 2)});
      })
      .def_prop_ro("w13_scale", [](ExpertWeights& w) {
        return view_of(w.w13_scale, {(size_t)w.num_local, (size_t)(2 * w.intermediate), (size_t)(w.hidden / 32)});
      })
      .def_prop_ro("w2_packed", [](ExpertWeights& w) {
        return view_of(w.w2_packed, {(size_t)w.num_local, (size_t)w.hidden, (size_t)(w.intermediate / 2)});
      })
      .def_prop_ro("w2_scale", [](ExpertWeights& w) {
        return view_of(w.w2_scale, {(size_t)w.num_local, (size_t)w.hidden, (size_t)(w.intermediate / 32)});
      })
      .def_prop_ro("w13_bias", [](ExpertWeights& w) {
        return view_of(w.w13_bias, {(size_t)w.num_local, (size_t)(2 * w.intermediate)});
      })
      .def_prop_ro("w2_bias", [](ExpertWeights& w) {
        return view_of(w.w2_bias, {(size_t)w.num_local, (size_t)w.hidden});
      })
      .def_prop_ro("nbytes", [](const ExpertWeights& w) {
        return w.w13_packed.size() + w.w13_scale.size() + w.w2_packed.size() + w.w2_scale.size() +
               4 * (w.w13_bias.size() + w.w2_bias.size());
      })
      .def("validate", &ExpertWeights::validate, "config"_a)
      .def("__repr__", [](const ExpertWeights& w) {
        return detail::cat("mxmoe.ExpertWeights(num_local=", w.num_local, ", hidden=", w.hidden,
                           ", intermediate=", w.intermediate, ", bias=", !w.w13_bias.empty(), ")");
      });

  m.def(
      "to_kernel_layout",
      [](const std::string& layout, const Array& w13_packed, const Array& w13_scale, const Array& w2_packed,
         const Array& w2_scale, std::optional<Array> w13_bias, std::optional<Array> w2_bias) {
        // Same array checks as kernel-layout arrays (the shapes agree), then a per-expert split.
        const W13Layout l = parse_layout(layout, "layout");
        ExpertWeights flat = weights_from_arrays(w13_packed, w13_scale, w2_packed, w2_scale, w13_bias, w2_bias);
        const int64_t e = flat.num_local, k = flat.hidden, n = flat.intermediate;
        std::vector<SourceExpert> src((size_t)e);
        auto slice = [](const std::vector<uint8_t>& v, int64_t i, int64_t per) {
          return std::vector<uint8_t>(v.begin() + i * per, v.begin() + (i + 1) * per);
        };
        auto slicef = [](const std::vector<float>& v, int64_t i, int64_t per) {
          return std::vector<float>(v.begin() + i * per, v.begin() + (i + 1) * per);
        };
        for (int64_t i = 0; i < e; ++i) {
          auto& s = src[(size_t)i];
          s.w13 = MxMatrix{2 * n, k, slice(flat.w13_packed, i, 2 * n * k / 2), slice(flat.w13_scale, i, 2 * n * k / 32)};
          s.w2 = MxMatrix{k, n, slice(flat.w2_packed, i, k * n / 2), slice(flat.w2_scale, i, k * n / 32)};
          if (!flat.w13_bias.empty()) {
            s.w13_bias = slicef(flat.w13_bias, i, 2 * n);
            s.w2_bias = slicef(flat.w2_bias, i, k);
          }
        }
        nb::gil_scoped_release unlock;
        return to_kernel_layout(src, l);
      },
      "layout"_a, "w13_packed"_a, "w13_scale"_a, "w2_packed"_a, "w2_scale"_a, "w13_bias"_a = nb::none(),
      "w2_bias"_a = nb::none(),
      "Convert stacked checkpoint-layout experts (W13 rows in `layout` order) into the kernel layout.");

  m.def(
      "from_kernel_layout",
      [](const ExpertWeights& w, const std::string& layout) {
        const W13Layout l = parse_layout(layout, "layout");
        std::vector<SourceExpert> src = from_kernel_layout(w, l);
        std::vector<uint8_t> p13, s13, p2, s2;
        std::vector<float> b13, b2;
        for (auto& s : src) {
          p13.insert(p13.end(), s.w13.packed.begin(), s.w13.packed.end());
          s13.insert(s13.end(), s.w13.scale.begin(), s.w13.scale.end());
          p2.insert(p2.end(), s.w2.packed.begin(), s.w2.packed.end());
          s2.insert(s2.end(), s.w2.scale.begin(), s.w2.scale.end());
          b13.insert(b13.end(), s.w13_bias.begin(), s.w13_bias.end());
          b2.insert(b2.end(), s.w2_bias.begin(), s.w2_bias.end());
        }
        const size_t e = (size_t)w.num_local, k = (size_t)w.hidden, n = (size_t)w.intermediate;
        nb::dict d;
        d["w13_packed"] = numpy_from(std::move(p13), {e, 2 * n, k / 2});
        d["w13_scale"] = numpy_from(std::move(s13), {e, 2 * n, k / 32});
        d["w2_packed"] = numpy_from(std::move(p2), {e, k, n / 2});
        d["w2_scale"] = numpy_from(std::move(s2), {e, k, n / 32});
        d["w13_bias"] = b13.empty() ? nb::none() : numpy_from(std::move(b13), {e, 2 * n});
        d["w2_bias"] = b2.empty() ? nb::none() : numpy_from(std::move(b2), {e, k});
        return d;
      },
      "weights"_a, "layout"_a, "Kernel layout back into a checkpoint layout (stacked NumPy arrays).");

  // ------------------------------------------------------------ checkpoints and synthetic data
  m.def(
      "load_checkpoint",
      [](const std::string& path, int64_t layer, const std::string& prefix, int64_t ep_size, int64_t ep_rank) {
        LoadOptions o;
        o.layer = layer;
        o.prefix = prefix;
        o.ep_size = ep_size;
        o.ep_rank = ep_rank;
        LoadedLayer L;
        {
          nb::gil_scoped_release unlock;
          L = load_checkpoint(path, o);
        }
        nb::dict d;
        d["format"] = std::string(to_string(L.format));
        d["num_experts"] = L.num_experts;
        d["hidden"] = L.hidden;
        d["intermediate"] = L.intermediate;
        d["correction_bias"] = L.correction_bias.empty()
                                   ? nb::none()
                                   : numpy_from(std::vector<float>(L.correction_bias), {L.correction_bias.size()});
        d["metadata"] = L.metadata;
        d["weights"] = nb::cast(std::move(L.weights));
        return d;
      },
      "path"_a, nb::kw_only(), "layer"_a = 0, "prefix"_a = "", "ep_size"_a = 1, "ep_rank"_a = 0,
      "Load this EP rank's routed experts (kernel layout) from a Kimi-K3 or GPT-OSS safetensors file, "
      "or from a sharded checkpoint's index (model.safetensors.index.json) or its folder.");

  m.def("checkpoint_tensor_names", &checkpoint_tensor_names, "path"_a,
        "Tensor names of a checkpoint (a safetensors file, or a sharded checkpoint's index or folder).");

  m.def(
      "safetensors_tensors",
      [](const std::string& path) {
        SafetensorsFile f = SafetensorsFile::open(path);
        nb::list names;
        for (const auto& t : f.tensors()) names.append(nb::make_tuple(t.name, std::string(to_string(t.dtype)), t.shape));
        return nb::make_tuple(names, f.metadata());
      },
      "path"_a, "([(name, dtype, shape)], metadata) of a safetensors file (bounds-checked reader).");

  m.def(
      "write_synthetic_checkpoint",
      [](const std::string& path, const std::string& format, int64_t num_experts, int64_t hidden,
         int64_t intermediate, int64_t top_k, int64_t layer, uint64_t seed, bool with_bias) {
        SyntheticSpec s;
        s.format = parse_checkpoint_format(format);
        s.num_experts = num_experts;
        s.hidden = hidden;
        s.intermediate = intermediate;
        s.top_k = top_k;
        s.layer = layer;
        s.seed = seed;
        s.with_bias = with_bias;
        nb::gil_scoped_release unlock;
        write_synthetic_checkpoint(path, s);
      },
      "path"_a, nb::kw_only(), "format"_a = "kimi", "num_experts"_a = 32, "hidden"_a = 256,
      "intermediate"_a = 192, "top_k"_a = 8, "layer"_a = 0, "seed"_a = 1, "with_bias"_a = false);

  m.def(
      "synthetic_top_k",
      [](const std::map<std::string, std::string>& md) -> std::optional<int64_t> {
        SyntheticSpec s;
        if (!synthetic_spec_from_metadata(md, s)) return std::nullopt;
        return s.top_k;
      },
      "metadata"_a, "top_k recorded in a synthetic checkpoint's metadata, or None.");

  m.def(
      "make_synthetic_weights",
      [](const MoeConfig& cfg, uint64_t seed) {
        nb::gil_scoped_release unlock;
        return make_synthetic_layer(cfg, seed).weights;
      },
      "config"_a, "seed"_a, "Deterministic Gaussian weights quantized to MXFP4 (kernel layout).");

  m.def(
      "make_activations",
      [](int64_t tokens, int64_t hidden, uint64_t seed) {
        Activations a = make_activations(tokens, hidden, seed);
        return numpy_from(std::move(a.bf16), {(size_t)tokens, (size_t)hidden});
      },
      "tokens"_a, "hidden"_a, "seed"_a, "Deterministic Gaussian activations as BF16 bits (uint16 [M, K]).");

  // ------------------------------------------------------------ numerics helpers
  m.def(
      "bf16_to_float32",
      [](const Array& a) {
        using namespace mxmoe_py;
        MXMOE_CHECK_ARG(a.device_type() == nb::device::cpu::value, "a", "is on ", device_name(a),
                        ", expected a CPU array");
        MXMOE_CHECK_ARG(is_any(a, {kBf16, kU16, kI16}), "a", "has dtype ", dtype_name(a),
                        ", expected bfloat16 or its bits (uint16)");
        std::vector<size_t> shape(a.ndim());
        std::vector<uint16_t> bits(a.size());
        for (size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
        // Strided gather, so any view works.
        const uint8_t* base = static_cast<const uint8_t*>(ptr(a));
        std::vector<size_t> idx(a.ndim(), 0);
        for (size_t flat = 0; flat < a.size(); ++flat) {
          int64_t off = 0;
          for (size_t d = 0; d < a.ndim(); ++d) off += (int64_t)idx[d] * a.stride(d);
          std::memcpy(&bits[flat], base + off * 2, 2);
          for (size_t d = a.ndim(); d-- > 0;) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
          }
        }
        std::vector<float> f(bits.size());
        for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_float(bits[i]);
        return numpy_from(std::move(f), shape);
      },
      "a"_a, "BF16 bits (uint16) -> float32, exactly.");
  m.def(
      "float32_to_bf16",
      [](const Array& a) {
        using namespace mxmoe_py;
        MXMOE_CHECK_ARG(a.device_type() == nb::device::cpu::value && is(a, kF32), "a", "has dtype ",
                        dtype_name(a), " on ", device_name(a), ", expected a float32 CPU array");
        std::vector<size_t> shape(a.ndim());
        for (size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
        check_c_contiguous(a, "a");
        const float* p = static_cast<const float*>(ptr(a));
        std::vector<uint16_t> b(a.size());
        for (size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16(p[i]);
        return numpy_from(std::move(b), shape);
      },
      "a"_a, "float32 -> BF16 bits (uint16), round to nearest even (NaN stays NaN).");
  m.def(
      "quantize_mxfp4",
      [](const Array& a, const std::string& scale_rule) {
        using namespace mxmoe_py;
        check(a, "a", Dev::Cpu, {kF32}, {-1, -1});
        const size_t rows = a.shape(0), cols = a.shape(1);
        MXMOE_CHECK_ARG(cols % kMxBlock == 0, "a", "has ", cols, " columns, expected a multiple of 32");
        const ScaleRule rule = parse_scale_rule(scale_rule, "scale_rule");
        const float* p = static_cast<const float*>(ptr(a));
        std::vector<uint8_t> packed(rows * cols / 2), scale(rows * cols / kMxBlock);
        for (size_t b = 0; b < rows * cols / kMxBlock; ++b)
          quantize_block_e2m1(p + b * kMxBlock, packed.data() + b * 16, scale.data() + b, rule);
        return nb::make_tuple(numpy_from(std::move(packed), {rows, cols / 2}),
                              numpy_from(std::move(scale), {rows, cols / kMxBlock}));
      },
      "a"_a, "scale_rule"_a = "round_up", "float32 [rows, cols] -> MXFP4 (packed [rows, cols/2], scale [rows, cols/32]).");
  m.def(
      "quantize_mxfp8",
      [](const Array& a, const std::string& scale_rule) {
        using namespace mxmoe_py;
        check(a, "a", Dev::Cpu, {kF32}, {-1, -1});
        const size_t rows = a.shape(0), cols = a.shape(1);
        MXMOE_CHECK_ARG(cols % kMxBlock == 0, "a", "has ", cols, " columns, expected a multiple of 32");
        const ScaleRule rule = parse_scale_rule(scale_rule, "scale_rule");
        const float* p = static_cast<const float*>(ptr(a));
        std::vector<uint8_t> codes(rows * cols), scale(rows * cols / kMxBlock);
        for (size_t b = 0; b < rows * cols / kMxBlock; ++b)
          quantize_block_e4m3(p + b * kMxBlock, codes.data() + b * kMxBlock, scale.data() + b, rule);
        return nb::make_tuple(numpy_from(std::move(codes), {rows, cols}),
                              numpy_from(std::move(scale), {rows, cols / kMxBlock}));
      },
      "a"_a, "scale_rule"_a = "round_up", "float32 [rows, cols] -> MXFP8 (E4M3 codes [rows, cols], scale [rows, cols/32]).");

  // ------------------------------------------------------------ routing (CPU)
  m.def(
      "route",
      [](const Array& logits, std::optional<Array> bias, const RoutingParams& params) {
        using namespace mxmoe_py;
        check(logits, "router_logits", Dev::Cpu, {kF32}, {-1, -1});
        const int64_t m = (int64_t)logits.shape(0), e = (int64_t)logits.shape(1);
        std::vector<float> b;
        if (bias) {
          check(*bias, "correction_bias", Dev::Cpu, {kF32}, {e});
          b = to_vector<float>(*bias);
        }
        const float* lp = static_cast<const float*>(ptr(logits));
        Routing r;
        {
          nb::gil_scoped_release unlock;
          r = route_cpu(lp, m, e, bias ? b.data() : nullptr, params);
        }
        const size_t k = (size_t)r.top_k;
        return nb::make_tuple(numpy_from(std::move(r.ids), {(size_t)m, k}),
                              numpy_from(std::move(r.weights), {(size_t)m, k}));
      },
      "router_logits"_a, "correction_bias"_a = nb::none(), "params"_a,
      "Top-k routing on the CPU: (topk_ids int32 [M,k], topk_weights float32 [M,k]).");

  // ------------------------------------------------------------ forward (CPU)
  m.def(
      "forward_cpu",
      [](const MoeConfig& cfg, const ExpertWeights& w, const Array& x, const Array& topk_ids,
         const Array& topk_weights, std::optional<Array> x_scale, std::optional<Array> out,
         const std::string& backend, int threads, bool exact, std::optional<Array> toward) {
        const auto be = lower(backend);
        MXMOE_CHECK_ARG(!exact || (be == "reference" && !out), "exact",
                        "needs backend 'reference' and no out (it returns the unrounded float64 result)");
        MXMOE_CHECK_ARG(!toward || (be == "reference" && !out && !exact), "toward",
                        "needs backend 'reference', no out and exact=False (it returns the judged float64 reference)");
        MXMOE_CHECK_ARG(be == "cpu" || be == "reference", "backend", "is '", backend,
                        "'; forward_cpu runs 'cpu' (fp32 engine) or 'reference' (float64 oracle)");
        Activations a = host_activations(cfg, x, x_scale);
        Routing r = host_routing(cfg, a.tokens, topk_ids, topk_weights);
        if (out) check_out(cfg, *out, a.tokens, Dev::Cpu, -1);
        std::vector<double> ta;  // `toward` as doubles
        if (toward) {
          using namespace mxmoe_py;
          check(*toward, "toward", Dev::Cpu, {kF32, kF64}, {a.tokens, cfg.hidden});
          ta = to_doubles(*toward);
        }
        Output o;
        std::vector<double> o64;
        {
          nb::gil_scoped_release unlock;
          validate_forward_inputs(cfg, w, a, r);
          if (be == "cpu")
            cpu_forward(cfg, w, a, r, o, threads);
          else if (toward)
            o64 = reference_toward(cfg, w, a, r, ta, nullptr, threads);
          else
            reference_forward(cfg, w, a, r, o, exact ? &o64 : nullptr, threads);
        }
        if (exact || toward) return numpy_from(std::move(o64), {(size_t)a.tokens, (size_t)cfg.hidden});
        return deliver(o, out);
      },
      "config"_a, "weights"_a, "x"_a, "topk_ids"_a, "topk_weights"_a, nb::kw_only(), "x_scale"_a = nb::none(),
      "out"_a = nb::none(), "backend"_a = "cpu", "threads"_a = 0, "exact"_a = false, "toward"_a = nb::none(),
      "Run the layer on the CPU. x: bf16 (or uint16 bits) / float32 [M,K], or MXFP8 codes with x_scale. "
      "Returns the output (uint16 BF16 bits or float32 [M,K]) or writes it into `out` and returns None; "
      "exact=True (reference only): the unrounded float64 result; toward=a backend's output (reference "
      "only): the judge's float64 reference for it, near-ties taken toward it (reference_toward).");

  m.def(
      "compare",
      [](const Array& actual, const Array& ref, double atol, double rtol) {
        using namespace mxmoe_py;
        check(actual, "actual", Dev::Cpu, {kF32, kF64}, {-1, -1});
        check(ref, "ref", Dev::Cpu, {kF32, kF64}, {(int64_t)actual.shape(0), (int64_t)actual.shape(1)});
        std::vector<double> va = to_doubles(actual), vr = to_doubles(ref);
        Comparison c = compare_outputs(va, vr, (int64_t)actual.shape(0), (int64_t)actual.shape(1), atol, rtol);
        nb::dict d;
        d["max_row_rel_l2"] = c.max_row_rel_l2;
        d["min_cosine"] = c.min_cosine;
        d["max_abs_err"] = c.max_abs_err;
        d["bound_violations"] = c.bound_violations;
        d["nonfinite"] = c.nonfinite;
        d["first_bad_row"] = c.first_bad_row;
        d["first_bad_col"] = c.first_bad_col;
        d["summary"] = c.summary();
        return d;
      },
      "actual"_a, "ref"_a, "atol"_a, "rtol"_a, "Kernel-vs-reference metrics (SPEC §8) over float32/float64 [M,K].");

  // ------------------------------------------------------------ GPU
  m.def("cuda_built", &cuda_built);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("capabilities", &capabilities);

  nb::class_<CudaLayer>(m, "CudaLayer", "One MoE layer resident on a GPU (weights uploaded once).")
      .def(nb::init<const MoeConfig&, const ExpertWeights&, std::optional<RoutingParams>, std::optional<Array>,
                    int>(),
           "config"_a, "weights"_a, nb::kw_only(), "routing"_a = nb::none(), "router_bias"_a = nb::none(),
           "device"_a)
      .def_prop_ro("device", [](const CudaLayer& l) { return l.device; })
      .def_prop_ro("config", [](const CudaLayer& l) { return l.cfg; })
      .def_prop_ro("has_router", [](const CudaLayer& l) { return l.has_router; })
      .def("workspace_size", [](const CudaLayer& l, int64_t max_tokens) { return l.layer->workspace_size(max_tokens); },
           "max_tokens"_a)
      .def("forward", &CudaLayer::forward, "x"_a, nb::kw_only(), "topk_ids"_a = nb::none(),
           "topk_weights"_a = nb::none(), "router_logits"_a = nb::none(), "out"_a, "workspace"_a, "stream"_a,
           "x_scale"_a = nb::none(),
           "Enqueue the MoE on `stream` (a cudaStream_t as int). Never allocates or synchronizes; "
           "CUDA-graph capturable. Every argument is validated first (ValueError naming it).");
}
