"""KimiK3Experts: the routed experts of one Kimi-K3 MoE layer as a PyTorch module."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from . import _C
from ._layer import Layer, load_checkpoint
from .torch_ops import register_layer, unregister_layer


class KimiK3Experts(nn.Module):
    """Routed experts of a Kimi-format (compressed-tensors MXFP4) checkpoint layer, this
    EP rank's share, with Kimi-K3 routing: sigmoid scores, correction bias for selection
    only, top-k (16 for K3), renormalize, routed scaling factor.

    ``forward(hidden_states, router_logits)`` routes in the library (on the GPU for a CUDA
    module) and runs the fused MoE through ``torch.ops.mxmoe.fused_moe``; engines that
    route themselves call ``forward(hidden_states, topk_ids=..., topk_weights=...)``.
    Under expert parallelism each rank returns its experts' share (a token with no local
    expert gets zeros), so the ranks' outputs are summed (all-reduce / combine).

    The module works with torch.compile and CUDA-graph capture: its workspace is sized
    for ``max_tokens`` at construction. ``precision="fp8"`` opts into the FP8 mode on
    Hopper (docs/FP8_MODE.md; exact by default).
    """

    def __init__(
        self,
        checkpoint: str,
        *,
        layer: Optional[int] = None,
        prefix: str = "",
        ep_size: int = 1,
        ep_rank: int = 0,
        top_k: Optional[int] = None,
        n_group: int = 0,
        topk_group: int = 0,
        renormalize: bool = True,
        routed_scaling_factor: float = 1.0,
        scaling_on_output: bool = False,
        alpha: float = 4.0,
        beta: float = 25.0,
        input_format: str = "mxfp8",
        intermediate_format: Optional[str] = None,
        output_format: str = "bf16",
        device: Union[str, int, torch.device] = "cpu",
        max_tokens: int = 1024,
        backend: Optional[str] = None,
        precision: str = "exact",
    ):
        super().__init__()
        ck = load_checkpoint(checkpoint, layer=layer, prefix=prefix, ep_size=ep_size, ep_rank=ep_rank)
        if ck.format != "kimi":
            raise _C.FormatError(f"{checkpoint}: holds a {ck.format} checkpoint, KimiK3Experts expects kimi")
        k = top_k or ck.top_k or 16
        self.config = _C.MoeConfig(
            ck.num_experts, k, ck.hidden, ck.intermediate, ep_size=ep_size, ep_rank=ep_rank,
            activation="situ", alpha=[alpha], beta=[beta], input_format=input_format,
            intermediate_format=intermediate_format or input_format, output_format=output_format,
            output_scale=routed_scaling_factor if scaling_on_output else 1.0, precision=precision,
        )
        self.routing = _C.RoutingParams(
            "sigmoid", k, renormalize=renormalize, n_group=n_group, topk_group=topk_group,
            routed_scaling_factor=routed_scaling_factor, scaling_in_weights=not scaling_on_output,
        )
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.moe = Layer(self.config, ck.weights, device=str(dev), routing=self.routing,
                         router_bias=ck.correction_bias, max_tokens=max_tokens, backend=backend)
        self.metadata = ck.metadata
        bias = ck.correction_bias
        self.register_buffer(
            "e_score_correction_bias",
            torch.from_numpy(bias.copy()) if bias is not None else torch.zeros(ck.num_experts), persistent=False,
        )
        self.handle = register_layer(self.moe)
        if dev.type == "cuda":
            self.moe._ensure_workspace(max_tokens)  # before any capture

    @property
    def num_experts(self) -> int:
        return self.config.num_experts

    @property
    def hidden_size(self) -> int:
        return self.config.hidden

    def extra_repr(self) -> str:
        return f"{self.config.describe()}, device={self.moe.device}"

    def route(self, router_logits: torch.Tensor):
        """The library's routing on the CPU: (topk_ids int32, topk_weights fp32) tensors."""
        from ._layer import route

        ids, w = route(router_logits, self.e_score_correction_bias.cpu().numpy(), self.routing)
        return torch.from_numpy(ids), torch.from_numpy(w)

    def forward(
        self,
        hidden_states: torch.Tensor,
        router_logits: Optional[torch.Tensor] = None,
        *,
        topk_ids: Optional[torch.Tensor] = None,
        topk_weights: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        if router_logits is not None:
            router_logits = router_logits.reshape(x.shape[0], -1)
        y = torch.ops.mxmoe.fused_moe(x, topk_ids, topk_weights, router_logits, self.handle)
        return y.reshape(*shape[:-1], y.shape[-1])

    def __del__(self):
        try:
            unregister_layer(self.handle)
        except Exception:
            pass
