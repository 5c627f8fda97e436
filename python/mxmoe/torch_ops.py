"""``torch.ops.mxmoe.fused_moe``: the fused MoE as a PyTorch custom op.

Registered in pure Python with ``torch.library.custom_op`` and a fake (meta)
implementation, so ``torch.compile`` traces through it without graph breaks and a CUDA
graph can capture a module that calls it. Layers are referred to by an integer handle
(``register_layer``), because an op's schema can carry only tensors and scalars: the
handle is a compile-time constant, the layer's weights stay resident on the GPU.

The op's scratch workspace belongs to the layer (allocated once for ``max_tokens``),
so the op is functional (it mutates none of its arguments); one layer must therefore
not run on two streams at once.
"""

from __future__ import annotations

import itertools
import threading
from typing import Dict, Optional

import torch

from ._layer import Layer

_LAYERS: Dict[int, Layer] = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()


def register_layer(layer: Layer) -> int:
    """Make `layer` callable from the op; returns its handle."""
    with _LOCK:
        h = next(_NEXT)
        _LAYERS[h] = layer
    return h


def unregister_layer(handle: int) -> None:
    with _LOCK:
        _LAYERS.pop(handle, None)


def get_layer(handle: int) -> Layer:
    try:
        return _LAYERS[handle]
    except KeyError:
        raise ValueError(f"layer: no mxmoe layer registered under handle {handle}") from None


def _out_dtype(layer: Layer) -> torch.dtype:
    return torch.bfloat16 if layer.config.output_format == "bf16" else torch.float32


@torch.library.custom_op("mxmoe::fused_moe", mutates_args=(), device_types=("cpu", "cuda"))
def fused_moe(
    x: torch.Tensor,
    topk_ids: Optional[torch.Tensor],
    topk_weights: Optional[torch.Tensor],
    router_logits: Optional[torch.Tensor],
    layer: int,
) -> torch.Tensor:
    """Fused MoE of registered layer `layer`: route (when router_logits is given) ->
    GEMM1 + gated activation -> GEMM2 -> weighted sum over top-k. x [M,K] bf16;
    topk_ids [M,k] int32/int64 (global ids, -1 = none); topk_weights [M,k] fp32.
    Returns [M,K] in the layer's output format (bf16 by default)."""
    L = get_layer(layer)
    return L.forward(x, topk_ids, topk_weights, router_logits=router_logits)


@fused_moe.register_fake
def _fused_moe_fake(x, topk_ids, topk_weights, router_logits, layer):
    L = get_layer(layer)
    torch._check(x.dim() == 2, lambda: f"x: expected [M, K], got {x.dim()} dims")
    return x.new_empty((x.shape[0], L.config.hidden), dtype=_out_dtype(L))
