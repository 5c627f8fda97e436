"""Capabilities, weight preparation, checkpoint loading and the Layer (CPU and CUDA)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _C
from ._C import ExpertWeights, InvalidArgument, MoeConfig, RoutingParams, UnsupportedError

ArrayLike = Any  # numpy.ndarray, torch.Tensor, or anything with __dlpack__


# ----------------------------------------------------------------------------- helpers


def _is_torch(a: Any) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "is_cuda")


def _is_cuda_tensor(a: Any) -> bool:
    return _is_torch(a) and bool(a.is_cuda)


def _host(a: ArrayLike, name: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """Any array -> contiguous host NumPy array (copies only when it must)."""
    if a is None:
        raise InvalidArgument(f"{name}: is required")
    if _is_torch(a):
        import torch

        t = a.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()  # NumPy has no bfloat16; biases are widened exactly
        a = t.cpu().contiguous().numpy()
    arr = np.ascontiguousarray(np.asarray(a))
    if dtype is not None and arr.dtype != dtype:
        if np.dtype(dtype) == np.uint8:
            raise InvalidArgument(f"{name}: has dtype {arr.dtype}, expected uint8 (packed MXFP4 / E8M0 bytes)")
        _refuse_non_floating(arr, name, dtype)
        arr = arr.astype(dtype)
    return arr


def _refuse_non_floating(arr: np.ndarray, name: str, dtype) -> None:
    if np.dtype(dtype).kind == "f" and arr.dtype.kind != "f":
        raise InvalidArgument(f"{name}: has dtype {arr.dtype}, expected a floating dtype (read as {np.dtype(dtype)})")


def _float32_array(a: ArrayLike, name: str) -> np.ndarray:
    """A NumPy (or array-like) operand the bindings read as float32: a floating dtype,
    converted; anything else refused. A float32 view is passed as it is (not copied), so
    the bindings refuse a non-contiguous one as they refuse a non-contiguous x."""
    arr = np.asarray(a)
    _refuse_non_floating(arr, name, np.float32)
    return np.asarray(arr, dtype=np.float32)


def _float32_tensor(t, name):
    """A torch operand read as float32 (topk_weights, router_logits): a floating dtype,
    converted on the tensor's device; anything else refused, on the CPU and the GPU path
    alike (integer weights are most often ids passed in the weights' place)."""
    import torch

    if t is None or t.dtype == torch.float32:
        return t
    if not t.dtype.is_floating_point:
        raise InvalidArgument(f"{name}: has dtype {t.dtype}, expected a floating dtype (read as float32)")
    return t.float()


def _torch_x(x, wide):
    """A torch x as the bindings take it: BF16, BF16 bits (int16 / uint16), MXFP8 codes
    (uint8, float8_e4m3fn, int8) and `wide` as they are; another floating dtype converted
    to `wide` (bfloat16 for the GPU, float32 for the CPU, whose C++ side rounds it to BF16);
    anything else refused (cast, codes or bits would be taken as other numbers)."""
    import torch

    as_is = (torch.bfloat16, torch.int16, torch.uint8, torch.int8, torch.float8_e4m3fn, wide)
    if x.dtype in as_is or getattr(torch, "uint16", None) == x.dtype:
        return x
    if not x.dtype.is_floating_point:
        raise InvalidArgument(f"x: has dtype {x.dtype}, expected bfloat16 (or another floating dtype, "
                              "rounded to bfloat16), BF16 bits (int16 / uint16) or MXFP8 codes "
                              "(uint8 / float8_e4m3fn / int8)")
    return x.to(wide)


def _cuda_operands(x, topk_ids, topk_weights, router_logits):
    """The CUDA forward's torch operands in the dtypes its kernels read, converted on the
    device without a host sync (so under CUDA-graph capture too), refusing what a
    conversion would silently change (SPEC §9):
    - x: _torch_x (another floating dtype rounded to BF16, as the CPU path rounds float32).
    - topk_ids: int32 as it is; int64 (torch.topk's) saturated into int32, so that an id
      past int32's range stays out of range (skipped and flagged by the kernels) instead of
      wrapping onto a valid expert; anything else refused.
    - topk_weights, router_logits: a floating dtype, as float32; anything else refused.
      BF16 router logits go as they are: the routing kernel widens them exactly."""
    import torch

    x = _torch_x(x, torch.bfloat16)
    if topk_ids is not None and topk_ids.dtype != torch.int32:
        if topk_ids.dtype != torch.int64:
            raise InvalidArgument(f"topk_ids: has dtype {topk_ids.dtype}, expected int32 or int64")
        topk_ids = topk_ids.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    if router_logits is not None and router_logits.dtype != torch.bfloat16:
        router_logits = _float32_tensor(router_logits, "router_logits")
    return x, topk_ids, _float32_tensor(topk_weights, "topk_weights"), router_logits


def _pair(p: Any, name: str) -> Tuple[Any, Any]:
    if isinstance(p, Mapping):
        try:
            return p["weight_packed"], p["weight_scale"]
        except KeyError:
            return p["packed"], p["scale"]
    if isinstance(p, (tuple, list)) and len(p) == 2 and not isinstance(p[0], (tuple, list)):
        return p[0], p[1]
    raise InvalidArgument(f"{name}: expected a (packed, scale) pair, got {type(p).__name__}")


def _stacked(p: Any, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """A (packed, scale) pair of stacked [E, rows, ...] arrays, or a list of per-expert pairs."""
    if isinstance(p, (list, tuple)) and len(p) > 0 and isinstance(p[0], (list, tuple, Mapping)):
        pairs = [_pair(q, f"{name}[{i}]") for i, q in enumerate(p)]
        packed = np.stack([_host(q[0], f"{name}[{i}].packed", np.uint8) for i, q in enumerate(pairs)])
        scale = np.stack([_host(q[1], f"{name}[{i}].scale", np.uint8) for i, q in enumerate(pairs)])
    else:
        pk, sc = _pair(p, name)
        packed, scale = _host(pk, f"{name}.packed", np.uint8), _host(sc, f"{name}.scale", np.uint8)
    if packed.ndim == 4:
        # GPT-OSS "blocks" [E, rows, cols/32, 16] are the same bytes as [E, rows, cols/2].
        packed = packed.reshape(packed.shape[0], packed.shape[1], -1)
    if packed.ndim != 3 or scale.ndim != 3:
        raise InvalidArgument(
            f"{name}: expected stacked [E, rows, cols/2] packed and [E, rows, cols/32] scale, "
            f"got shapes {list(packed.shape)} and {list(scale.shape)}"
        )
    return packed, scale


# ----------------------------------------------------------------------------- start-up


def capabilities() -> dict:
    """What this build and machine can run: backends, precisions, GPUs (per device:
    supported, activations, input/intermediate/output formats, precisions (exact; fp8 on
    Hopper), paths (decode; prefill on Hopper), note), layouts, routers."""
    return _C.capabilities()


def _as_config(config: Union[MoeConfig, Mapping[str, Any]]) -> MoeConfig:
    if isinstance(config, MoeConfig):
        return config
    c = dict(config)
    return MoeConfig(c.pop("num_experts"), c.pop("top_k"), c.pop("hidden"), c.pop("intermediate"), **c)


# The CPU engine computes the exact MX semantics whatever config.precision says; the FP8
# mode is a Hopper kernel path (docs/FP8_MODE.md). Said at initialisation (SPEC §9), not
# run silently as exact. The reference backend is the oracle for either precision.
_CPU_FP8 = ("'fp8' is the CUDA engine's FP8 mode on Hopper (sm_90); the CPU engine is exact: "
            "use precision 'exact' on the CPU, or device 'cuda' on an H100/H200")


def supports(config: Union[MoeConfig, Mapping[str, Any]], backend: str = "auto", device: Optional[int] = None) -> Tuple[bool, str]:
    """(ok, reason): can `backend` ("auto", "cpu", "reference", "cuda") run `config`?

    `config` is a MoeConfig or a dict of MoeConfig's arguments. Never raises for a bad
    config: the reason names the offending field. With "auto", the reason says which
    backend would run it."""
    try:
        cfg = _as_config(config)
    except (ValueError, KeyError, TypeError) as e:
        return False, f"config: {e}"
    if backend == "cpu" and cfg.precision == "fp8":
        return False, f"precision: {_CPU_FP8}"
    if backend in ("cpu", "reference"):
        return True, f"{backend}: supported ({cfg.describe()})"
    if backend not in ("cuda", "auto"):
        return False, f"backend: unknown backend {backend!r} (expected auto, cpu, reference or cuda)"
    caps = _C.capabilities()

    def on_cpu(why: str) -> Tuple[bool, str]:  # "auto" without a GPU for it: the CPU engine, if it can
        if cfg.precision == "fp8":
            return False, f"precision: {_CPU_FP8} ({why})"
        return True, f"cpu: {why}"

    if not caps["cuda_built"]:
        why = "this build of mxmoe has no CUDA engine (nvcc was absent when it was built); use backend 'cpu'"
        return on_cpu(why) if backend == "auto" else (False, f"cuda: {why}")
    devs = caps["devices"]
    if device is not None:
        devs = [d for d in devs if d["index"] == device]
        if not devs:
            return False, f"device: no CUDA device {device} (have {len(caps['devices'])})"
    lacking = []
    for d in devs:
        if d["supported"]:
            # Each field against what this GPU runs (capabilities(): per-GPU lists).
            miss = [f"{field} {value}" for field, value, have in (
                ("activation", cfg.activation, d["activations"]),
                ("input_format", cfg.input_format, d["input_formats"]),
                ("intermediate_format", cfg.intermediate_format, d["intermediate_formats"]),
                ("output_format", cfg.output_format, d["output_formats"]),
                ("precision", cfg.precision, d["precisions"])) if value not in have]
            if miss:
                lacking.append(f"cuda:{d['index']} {d['name']} (sm{d['sm']}) does not run {', '.join(miss)}")
                continue
            return True, f"cuda:{d['index']} ({d['name']}, sm{d['sm']})"
    notes = "; ".join(lacking + [f"cuda:{d['index']} {d['name']}: {d['note']}" for d in devs if not d["supported"]])
    notes = notes or "no CUDA device visible"
    if backend == "auto":
        return on_cpu(f"no supported GPU ({notes})")
    return False, f"cuda: no supported GPU ({notes}); use backend 'cpu'"


# ----------------------------------------------------------------------------- weights


def prepare_weights(
    format: str = "kimi",
    *,
    w1: Any = None,
    w3: Any = None,
    w2: Any = None,
    w13: Any = None,
    w13_bias: Any = None,
    w2_bias: Any = None,
) -> ExpertWeights:
    """Convert checkpoint tensors into the kernel layout, once at load time (bit-exact).

    Each weight is a ``(packed, scale)`` pair (MXFP4 bytes and E8M0 scales, uint8), stacked
    over experts, or a list of per-expert pairs; tensors may be NumPy or PyTorch (any
    device: they are copied to the host).

    - ``format="kimi"``: ``w1`` gate [E,N,K/2]+[E,N,K/32], ``w3`` up (same), ``w2`` down
      [E,K,N/2]+[E,K,N/32].
    - ``format="gpt-oss"``: ``w13`` = (gate_up_proj_blocks [E,2N,K/32,16] or [E,2N,K/2],
      gate_up_proj_scales [E,2N,K/32]), rows interleaved [g0,u0,g1,u1,...]; ``w2`` =
      (down_proj_blocks, down_proj_scales); optional ``w13_bias`` [E,2N], ``w2_bias`` [E,K].
    - ``format="up_gate"`` (FlashInfer/TensorRT-LLM "w31") or ``"gate_up"``: ``w13`` rows as
      two halves in that order, ``w2`` as above, optional biases in the same row order.
    """
    fmt = format.lower().replace("-", "_")
    if w2 is None:
        raise InvalidArgument("w2: is required (the down projection)")
    p2, s2 = _stacked(w2, "w2")
    if fmt in ("kimi", "kimi_k3"):
        if w1 is None or w3 is None:
            raise InvalidArgument(("w1" if w1 is None else "w3") + ": is required for format 'kimi' (w1 gate, w3 up)")
        if w13 is not None:
            raise InvalidArgument("w13: format 'kimi' takes w1 and w3, not w13")
        p1, s1 = _stacked(w1, "w1")
        p3, s3 = _stacked(w3, "w3")
        if p1.shape != p3.shape or s1.shape != s3.shape:
            raise InvalidArgument(f"w3: shape {list(p3.shape)} differs from w1's {list(p1.shape)}")
        p13, s13, layout = np.concatenate([p1, p3], axis=1), np.concatenate([s1, s3], axis=1), "gate_up"
    else:
        layout = {"gpt_oss": "interleaved", "interleaved": "interleaved", "up_gate": "up_gate", "w31": "up_gate",
                  "gate_up": "gate_up"}.get(fmt)
        if layout is None:
            raise InvalidArgument(f"format: unknown format {format!r} (expected kimi, gpt-oss, up_gate or gate_up)")
        if w13 is None:
            raise InvalidArgument(f"w13: is required for format {format!r}")
        if w1 is not None or w3 is not None:
            raise InvalidArgument(f"w1: format {format!r} takes w13, not w1/w3")
        p13, s13 = _stacked(w13, "w13")
    b13 = None if w13_bias is None else _host(w13_bias, "w13_bias", np.float32)
    b2 = None if w2_bias is None else _host(w2_bias, "w2_bias", np.float32)
    return _C.to_kernel_layout(layout, p13, s13, p2, s2, b13, b2)


@dataclasses.dataclass
class LoadedCheckpoint:
    """This EP rank's routed experts from a checkpoint, ready for Layer."""

    format: str
    num_experts: int
    hidden: int
    intermediate: int
    weights: ExpertWeights
    correction_bias: Optional[np.ndarray]
    metadata: dict
    top_k: Optional[int]  # recorded by synthetic checkpoints; None for real ones

    def config(self, top_k: Optional[int] = None, *, ep_size: int = 1, ep_rank: int = 0, **kwargs: Any) -> MoeConfig:
        """A MoeConfig for this layer (activation defaults by format: kimi -> SiTU,
        gpt-oss -> SwiGLU-OAI with biases)."""
        k = top_k or self.top_k or (16 if self.format == "kimi" else 4)
        if self.format == "gpt-oss":
            kwargs.setdefault("activation", "swiglu")
            kwargs.setdefault("has_bias", self.weights.w13_bias is not None)
        return MoeConfig(self.num_experts, k, self.hidden, self.intermediate, ep_size=ep_size, ep_rank=ep_rank, **kwargs)


def checkpoint_layers(path: str) -> list:
    """Layer indices that hold routed experts under the default prefix
    ("model.layers.<i>.mlp.experts..."), of a safetensors file or of a sharded checkpoint
    (its index ``model.safetensors.index.json`` or the folder holding it)."""
    import re

    names = _C.checkpoint_tensor_names(str(path))  # the loader's own reading of the file or index
    pat = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.")
    return sorted({int(m.group(1)) for n in names if (m := pat.match(n))})


def load_checkpoint(path: str, *, layer: Optional[int] = None, prefix: str = "", ep_size: int = 1,
                    ep_rank: int = 0) -> LoadedCheckpoint:
    """Load this EP rank's routed experts (Kimi-K3 or GPT-OSS MXFP4 safetensors: one file,
    or a sharded checkpoint's index or folder) into the kernel layout. ``layer=None``: the
    checkpoint's only expert layer (an error if several).
    Raises mxmoe.FormatError for a malformed file."""
    if layer is None:
        layers = [] if prefix else checkpoint_layers(path)
        if len(layers) > 1:
            raise InvalidArgument(f"layer: {path} holds experts of layers {layers}; say which")
        layer = layers[0] if layers else 0
    d = _C.load_checkpoint(str(path), layer=layer, prefix=prefix, ep_size=ep_size, ep_rank=ep_rank)
    return LoadedCheckpoint(
        format=d["format"], num_experts=d["num_experts"], hidden=d["hidden"], intermediate=d["intermediate"],
        weights=d["weights"], correction_bias=d["correction_bias"], metadata=dict(d["metadata"]),
        top_k=_C.synthetic_top_k(d["metadata"]),
    )


def route(router_logits: ArrayLike, correction_bias: Optional[ArrayLike] = None, params: Optional[RoutingParams] = None):
    """Top-k routing on the CPU (SPEC §3): (topk_ids int32 [M,k], topk_weights float32 [M,k])."""
    params = params or RoutingParams()
    logits = _host(router_logits, "router_logits", np.float32)
    bias = None if correction_bias is None else _host(correction_bias, "correction_bias", np.float32)
    try:
        return _C.route(logits, bias, params)
    except InvalidArgument as e:
        if getattr(e, "argument", None) != "bias":
            raise
        # The C++ check names its own parameter; name this function's (SPEC §9).
        err = InvalidArgument("correction_bias" + str(e)[len("bias"):])
        err.argument = "correction_bias"
        raise err from None


# ----------------------------------------------------------------------------- workspace


def workspace_size(layer: "Layer", max_tokens: int) -> int:
    """Bytes of device workspace `layer` needs for up to max_tokens tokens (0 on the CPU)."""
    return layer.workspace_size(max_tokens)


def make_workspace(layer: "Layer", max_tokens: int):
    """A torch uint8 CUDA tensor big enough for max_tokens (the largest token count the
    engine will run or capture). Allocate once, before graph capture."""
    import torch

    n = layer.workspace_size(max_tokens)
    return torch.empty(max(n, 1), dtype=torch.uint8, device=layer.device)


# ----------------------------------------------------------------------------- the layer


class Layer:
    """One MoE layer: config + kernel-layout weights, on the CPU or resident on a GPU.

    ``device="cpu"`` runs the library's fp32 CPU backend (``backend="reference"``: the
    float64 oracle). Its inputs are copied into the library's host types, so it is for
    checking and small runs. ``device="cuda"`` / ``"cuda:N"`` / ``N`` uploads the weights
    once; ``forward`` then takes PyTorch CUDA tensors (through DLPack, no copies), runs on
    the caller's current stream, never allocates (when ``out`` is given) and never
    synchronizes, so it can be captured in a CUDA graph.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: ExpertWeights,
        *,
        device: Union[str, int, Any] = "cpu",
        routing: Optional[RoutingParams] = None,
        router_bias: Optional[ArrayLike] = None,
        max_tokens: int = 1024,
        backend: Optional[str] = None,
        threads: int = 0,
    ):
        weights.validate(config)
        self.config = config
        self.weights = weights
        self.routing = routing
        self.router_bias = None if router_bias is None else _host(router_bias, "router_bias", np.float32)
        if self.router_bias is not None and self.router_bias.shape != (config.num_experts,):
            raise InvalidArgument(f"router_bias: has shape {list(self.router_bias.shape)}, expected [{config.num_experts}]")
        self.threads = threads
        self.max_tokens = int(max_tokens)
        if self.max_tokens < 1:
            raise InvalidArgument(f"max_tokens: is {max_tokens}, expected >= 1")
        dev = str(device) if not isinstance(device, int) else f"cuda:{device}"
        if dev.startswith("cuda"):
            index = int(dev.split(":")[1]) if ":" in dev else None
            if index is None:
                import torch

                index = torch.cuda.current_device()
            self.device = f"cuda:{index}"
            self.backend = backend or "cuda"
            if self.backend != "cuda":
                raise InvalidArgument(f"backend: {backend!r} on device {self.device}; a GPU layer runs backend 'cuda'")
            self._cuda = _C.CudaLayer(config, weights, routing=routing, router_bias=self.router_bias, device=index)
            self._workspace = None  # allocated on first use (torch), sized for max_tokens
        elif dev == "cpu":
            self.device = "cpu"
            self.backend = backend or "cpu"
            if self.backend not in ("cpu", "reference"):
                raise InvalidArgument(f"backend: {backend!r} on the CPU (expected cpu or reference)")
            if self.backend == "cpu" and config.precision == "fp8":
                raise UnsupportedError(f"config.precision: {_CPU_FP8}")
            self._cuda = None
        else:
            raise InvalidArgument(f"device: {device!r} (expected 'cpu', 'cuda', 'cuda:N' or an index)")

    # -- sizes

    def workspace_size(self, max_tokens: int) -> int:
        return 0 if self._cuda is None else int(self._cuda.workspace_size(int(max_tokens)))

    @property
    def output_dtype_name(self) -> str:
        return self.config.output_format

    def __repr__(self) -> str:
        return f"mxmoe.Layer({self.config.describe()}, device={self.device}, backend={self.backend})"

    # -- running

    def forward(
        self,
        x: ArrayLike,
        topk_ids: Optional[ArrayLike] = None,
        topk_weights: Optional[ArrayLike] = None,
        *,
        router_logits: Optional[ArrayLike] = None,
        x_scale: Optional[ArrayLike] = None,
        out: Optional[ArrayLike] = None,
        workspace: Optional[ArrayLike] = None,
        stream: Optional[int] = None,
    ):
        """y[M,K] = sum_k w_k * expert_k(x). Either (topk_ids, topk_weights) or router_logits.

        x: bf16 [M,K] (also: another floating dtype, rounded to BF16, or BF16 bits as
        uint16/int16; MXFP8 codes uint8/float8_e4m3fn/int8 with x_scale [M,K/32]).
        topk_ids: int32 or int64 global ids, -1 = none (on the GPU an int64 id past int32's
        range stays out of range: skipped and flagged). topk_weights: floating, as float32.
        Returns: a torch tensor for torch input (bf16 or fp32 by config.output_format), a
        float32 NumPy array for NumPy input (BF16 values, widened exactly), or `out`."""
        if self._cuda is not None:
            return self._forward_cuda(x, topk_ids, topk_weights, router_logits, x_scale, out, workspace, stream)
        return self._forward_cpu(x, topk_ids, topk_weights, router_logits, x_scale, out)

    __call__ = forward

    def _forward_cpu(self, x, topk_ids, topk_weights, router_logits, x_scale, out):
        if _is_cuda_tensor(x):
            raise InvalidArgument(f"x: is on {x.device} but this layer runs on the CPU; build Layer(..., device='cuda')")
        torch_in = _is_torch(x)
        if router_logits is not None:
            if topk_ids is not None or topk_weights is not None:
                raise InvalidArgument("router_logits: given together with topk_ids/topk_weights; pass one or the other")
            if self.routing is None:
                raise InvalidArgument("router_logits: given but the layer has no routing parameters (Layer(..., routing=))")
            topk_ids, topk_weights = route(router_logits, self.router_bias, self.routing)
        if topk_ids is None or topk_weights is None:
            raise InvalidArgument(("topk_ids" if topk_ids is None else "topk_weights") + ": is required (or pass router_logits)")
        xs = x
        if torch_in:
            import torch

            xs = x.detach()
            xs = _torch_x(xs, torch.float32)  # the C++ side rounds float32 to BF16
        ids = topk_ids.detach() if _is_torch(topk_ids) else topk_ids
        wts = (_float32_tensor(topk_weights.detach(), "topk_weights") if _is_torch(topk_weights)
               else _float32_array(topk_weights, "topk_weights"))
        xsc = x_scale.detach() if _is_torch(x_scale) else x_scale
        if out is not None:
            _C.forward_cpu(self.config, self.weights, xs, ids, wts, x_scale=xsc, out=out,
                           backend=self.backend, threads=self.threads)
            return out
        y = _C.forward_cpu(self.config, self.weights, xs, ids, wts, x_scale=xsc, backend=self.backend,
                           threads=self.threads)
        if torch_in:
            import torch

            if y.dtype == np.uint16:
                return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(y)
        return _C.bf16_to_float32(y) if y.dtype == np.uint16 else y

    def reference(self, x: ArrayLike, topk_ids=None, topk_weights=None, *, router_logits=None, x_scale=None,
                  toward=None) -> np.ndarray:
        """The float64 oracle on the same quantized bytes (SPEC §8), unrounded: float64
        NumPy [M,K]. The judge for this layer's outputs, on the CPU whatever the device.
        toward (a backend's output [M,K]): instead, the reference as the C++ suite judges
        it, rounded to the output format with either rounding taken where the intermediate
        or the output rounding is a near-tie (SPEC §7)."""
        if router_logits is not None:
            topk_ids, topk_weights = route(router_logits, self.router_bias, self.routing)
        h = lambda a, dt=None: None if a is None else _host(a, "x", dt)  # noqa: E731
        xs = x
        if _is_torch(x):
            import torch

            xs = x.detach().cpu()
            xs = _torch_x(xs, torch.float32)  # the C++ side rounds float32 to BF16
        xsc = None if x_scale is None else h(x_scale)
        ids = _host(topk_ids, "topk_ids")
        wts = _host(topk_weights, "topk_weights", np.float32)
        if toward is not None:
            t = toward.detach().float().cpu().numpy() if _is_torch(toward) else np.asarray(toward, dtype=np.float64)
            return _C.forward_cpu(self.config, self.weights, xs, ids, wts, x_scale=xsc, backend="reference",
                                  threads=self.threads, toward=t)
        return _C.forward_cpu(self.config, self.weights, xs, ids, wts, x_scale=xsc, backend="reference",
                              threads=self.threads, exact=True)

    def _ensure_workspace(self, tokens: int):
        import torch

        need = self.workspace_size(max(tokens, self.max_tokens))
        if self._workspace is None or self._workspace.numel() < need:
            if torch.cuda.is_current_stream_capturing():
                raise InvalidArgument(
                    f"x: {tokens} tokens exceed max_tokens={self.max_tokens} during CUDA-graph capture; "
                    "build the layer with a larger max_tokens"
                )
            self.max_tokens = max(tokens, self.max_tokens)
            self._workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=self.device)
        return self._workspace

    def _forward_cuda(self, x, topk_ids, topk_weights, router_logits, x_scale, out, workspace, stream):
        import torch

        if not _is_cuda_tensor(x):
            raise InvalidArgument(f"x: expected a CUDA tensor on {self.device}, got {type(x).__name__}"
                                  + (f" on {x.device}" if _is_torch(x) else ""))
        tokens = x.shape[0]
        x, topk_ids, topk_weights, router_logits = _cuda_operands(x, topk_ids, topk_weights, router_logits)
        det = lambda t: None if t is None else t.detach().contiguous()  # noqa: E731
        if out is None:
            dt = torch.bfloat16 if self.config.output_format == "bf16" else torch.float32
            out = torch.empty((tokens, self.config.hidden), dtype=dt, device=x.device)
        if workspace is None:
            workspace = self._ensure_workspace(tokens)
        if stream is None:
            stream = torch.cuda.current_stream(x.device).cuda_stream
        self._cuda.forward(det(x), topk_ids=det(topk_ids), topk_weights=det(topk_weights),
                           router_logits=det(router_logits), out=out, workspace=workspace, stream=int(stream),
                           x_scale=det(x_scale))
        return out
