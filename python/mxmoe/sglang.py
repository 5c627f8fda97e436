"""An adapter for SGLang-style MoE runners.

SGLang describes a MoE layer to its runner backends with a ``MoeRunnerConfig`` and hands
each call a ``StandardTopKOutput`` (topk_weights, topk_ids, router_logits). This module maps
such a config onto the library (``runner_config_to_moe_config``) and runs it
(``MxMoeRunner``). No SGLang import is needed: any object with the attributes below (or
a dict) works, so the adapter is testable on its own.

Mapping (attribute -> library):
- ``activation="situ"`` (Kimi-K3): SiTU with alpha = ``gemm1_alpha`` (4.0) and beta =
  ``gemm1_clamp_limit`` (25.0). SGLang carries SiTU's two constants in those two fields.
- ``activation="silu"`` with ``gemm1_alpha``/``gemm1_clamp_limit`` set (GPT-OSS):
  SwiGLU-OAI(alpha=gemm1_alpha, beta=1.0, limit=gemm1_clamp_limit); without them:
  plain SiLU-gated (silu(g)*u). ``"swiglu"`` is accepted as SwiGLU-OAI.
- ``num_experts`` (global), ``ep_size``/``ep_rank`` (or ``moe_ep_size``/``moe_ep_rank``):
  this rank owns a contiguous slice. ``topk_ids_are_local=True`` says the ids the runner
  gets were already mapped to local indices with ``-1`` for other ranks' experts.
- ``-1`` in topk_ids: "no expert", passed through (contributes nothing).
- ``routed_scaling_factor`` with ``routed_scaling_on_output``: True -> the library scales
  the output (the weights do not carry it); False (default) -> the weights already do.
- ``precision`` (not an SGLang field; default ``"exact"``): ``"fp8"`` opts into the FP8
  mode on Hopper (docs/FP8_MODE.md).
- ``apply_router_weight_on_input=True`` and other activations (gelu) are refused with
  mxmoe.UnsupportedError naming the alternative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from . import _C
from ._layer import Layer, prepare_weights


@dataclass
class RunnerConfig:
    """The fields of SGLang's MoeRunnerConfig (plus EP) that the library needs."""

    num_experts: int
    hidden_size: int
    intermediate_size_per_partition: int
    top_k: int
    activation: str = "silu"
    gemm1_alpha: Optional[float] = None
    gemm1_clamp_limit: Optional[float] = None
    routed_scaling_factor: Optional[float] = None
    routed_scaling_on_output: bool = False
    ep_size: int = 1
    ep_rank: int = 0
    topk_ids_are_local: bool = False
    num_local_experts: Optional[int] = None
    apply_router_weight_on_input: bool = False
    has_bias: bool = False
    input_format: str = "mxfp8"
    intermediate_format: Optional[str] = None
    output_format: str = "bf16"


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        if isinstance(cfg, Mapping):
            if n in cfg and cfg[n] is not None:
                return cfg[n]
        elif getattr(cfg, n, None) is not None:
            return getattr(cfg, n)
    return default


def activation_of(cfg: Any) -> Tuple[str, dict]:
    """(library activation, its parameters) for a runner config."""
    act = str(_get(cfg, "activation", default="silu")).lower()
    alpha = _get(cfg, "gemm1_alpha")
    limit = _get(cfg, "gemm1_clamp_limit")
    if act == "situ":
        return "situ", {"alpha": [float(4.0 if alpha is None else alpha)], "beta": [float(25.0 if limit is None else limit)]}
    if act in ("swiglu", "swiglu_oai", "swigluoai") or (act == "silu" and (alpha is not None or limit is not None)):
        if alpha is None or limit is None:
            if act == "silu":
                raise _C.InvalidArgument(
                    "gemm1_alpha: SwiGLU-OAI needs both gemm1_alpha and gemm1_clamp_limit "
                    f"(got {alpha} and {limit})")
        return "swiglu", {"alpha": [float(1.702 if alpha is None else alpha)], "beta": [1.0],
                          "limit": [float(7.0 if limit is None else limit)]}
    if act == "silu":
        return "silu", {}
    raise _C.UnsupportedError(
        f"activation: {act!r} is not supported by mxmoe (supported: situ, silu (SiLU-gated or "
        "SwiGLU-OAI with gemm1_alpha/gemm1_clamp_limit)); use SGLang's triton runner for it")


def runner_config_to_moe_config(cfg: Any) -> _C.MoeConfig:
    """Map an SGLang-style runner config (object or dict) onto a MoeConfig."""
    if _get(cfg, "apply_router_weight_on_input", default=False):
        raise _C.UnsupportedError(
            "apply_router_weight_on_input: mxmoe applies router weights in its finalize (on the "
            "output); run with apply_router_weight_on_input=False")
    if not _get(cfg, "is_gated", default=True):
        raise _C.UnsupportedError("is_gated: mxmoe runs gated experts (gate and up) only")
    num_experts = int(_get(cfg, "num_experts"))
    ep_size = int(_get(cfg, "ep_size", "moe_ep_size", default=1))
    ep_rank = int(_get(cfg, "ep_rank", "moe_ep_rank", default=0))
    n_local = _get(cfg, "num_local_experts")
    if n_local is not None and ep_size > 0 and int(n_local) * ep_size != num_experts:
        raise _C.InvalidArgument(
            f"num_local_experts: {n_local} x ep_size {ep_size} != num_experts {num_experts}")
    if _get(cfg, "topk_ids_are_local", default=False):
        # The runner already turned ids into local indices (-1 elsewhere): a one-rank view.
        num_experts = num_experts // max(ep_size, 1)
        ep_size, ep_rank = 1, 0
    act, params = activation_of(cfg)
    scale = _get(cfg, "routed_scaling_factor")
    on_output = bool(_get(cfg, "routed_scaling_on_output", default=False))
    input_format = str(_get(cfg, "input_format", default="mxfp8"))
    return _C.MoeConfig(
        num_experts, int(_get(cfg, "top_k")), int(_get(cfg, "hidden_size")),
        int(_get(cfg, "intermediate_size_per_partition", "intermediate_size")),
        ep_size=ep_size, ep_rank=ep_rank, activation=act, input_format=input_format,
        intermediate_format=str(_get(cfg, "intermediate_format", default=input_format)),
        output_format=str(_get(cfg, "output_format", default="bf16")),
        has_bias=bool(_get(cfg, "has_bias", default=False)),
        output_scale=float(scale) if (on_output and scale is not None) else 1.0,
        precision=str(_get(cfg, "precision", default="exact")), **params)


class MxMoeRunner:
    """Runs an SGLang-style MoE call on mxmoe: ``runner(hidden_states, topk_output)``.

    Weights: ``ExpertWeights`` (already in the kernel layout), or SGLang's parameter
    tensors ``w13_weight``/``w13_weight_scale`` (rows [gate; up], SGLang's order) and
    ``w2_weight``/``w2_weight_scale``, converted once here (``w13_layout`` says otherwise,
    e.g. "up_gate" for FlashInfer-ordered or "interleaved" for GPT-OSS weights)."""

    def __init__(self, runner_config: Any, weights: Any = None, *, w13_weight=None, w13_weight_scale=None,
                 w2_weight=None, w2_weight_scale=None, w13_bias=None, w2_bias=None, w13_layout: str = "gate_up",
                 device: Any = "cpu", max_tokens: int = 1024):
        self.moe_config = runner_config_to_moe_config(runner_config)
        if weights is None:
            weights = prepare_weights(w13_layout, w13=(w13_weight, w13_weight_scale), w2=(w2_weight, w2_weight_scale),
                                      w13_bias=w13_bias, w2_bias=w2_bias)
        self.layer = Layer(self.moe_config, weights, device=device, max_tokens=max_tokens)

    @staticmethod
    def _topk(topk_output: Any):
        if isinstance(topk_output, (tuple, list)):
            return topk_output[0], topk_output[1]  # SGLang's StandardTopKOutput order
        return topk_output.topk_weights, topk_output.topk_ids

    def __call__(self, hidden_states: Any, topk_output: Any, *, out: Any = None):
        topk_weights, topk_ids = self._topk(topk_output)
        return self.layer.forward(hidden_states, topk_ids, topk_weights, out=out)

    run = __call__
