"""mxmoe: fused Mixture-of-Experts for MXFP4 routed experts (Kimi-K3 SiTU, GPT-OSS SwiGLU).

Start-up (decide once, before loading weights)::

    import mxmoe
    caps = mxmoe.capabilities()            # backends, GPUs, activations, formats
    ok, why = mxmoe.supports(cfg, backend="cuda")

Weights: ``mxmoe.prepare_weights(...)`` (Kimi w1/w3/w2, GPT-OSS interleaved, or
``[up; gate]``) or ``mxmoe.load_checkpoint(path, ep_size=, ep_rank=)``. Running:
``mxmoe.Layer(cfg, weights, device="cuda:0").forward(x, topk_ids, topk_weights)``, the
PyTorch op ``torch.ops.mxmoe.fused_moe`` (``mxmoe.torch_ops``), the module
``mxmoe.KimiK3Experts`` and the SGLang-style adapter ``mxmoe.sglang``.

PyTorch is optional: NumPy arrays run on the CPU backend without it. Torch-dependent
names (``KimiK3Experts``, ``torch_ops``) are imported on first use.
"""

from __future__ import annotations

from . import _C
from ._C import (
    CudaError,
    Error,
    ExpertWeights,
    FormatError,
    InvalidArgument,
    MoeConfig,
    RoutingParams,
    UnsupportedError,
    bf16_to_float32,
    compare,
    float32_to_bf16,
    make_activations,
    make_synthetic_weights,
    quantize_mxfp4,
    quantize_mxfp8,
    write_synthetic_checkpoint,
)
from ._layer import (
    Layer,
    LoadedCheckpoint,
    capabilities,
    load_checkpoint,
    make_workspace,
    prepare_weights,
    route,
    supports,
    workspace_size,
)

__version__ = _C.__version__

__all__ = [
    "CudaError",
    "Error",
    "ExpertWeights",
    "FormatError",
    "InvalidArgument",
    "KimiK3Experts",
    "Layer",
    "LoadedCheckpoint",
    "MoeConfig",
    "RoutingParams",
    "UnsupportedError",
    "bf16_to_float32",
    "capabilities",
    "compare",
    "float32_to_bf16",
    "load_checkpoint",
    "make_activations",
    "make_synthetic_weights",
    "make_workspace",
    "prepare_weights",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "route",
    "supports",
    "workspace_size",
    "write_synthetic_checkpoint",
]


def __getattr__(name: str):
    # Torch is imported only when a torch-facing name is asked for.
    if name == "KimiK3Experts":
        from .kimi import KimiK3Experts

        return KimiK3Experts
    if name in ("torch_ops", "sglang", "kimi"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mxmoe' has no attribute {name!r}")
