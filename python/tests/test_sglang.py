"""The SGLang-style adapter: runner config -> library config, and runs against the reference."""

import numpy as np
import pytest

import mxmoe
from mxmoe.sglang import MxMoeRunner, RunnerConfig, runner_config_to_moe_config
from conftest import SEED, assert_close, random_routing, random_x, reference, small_config

BASE = dict(num_experts=8, hidden_size=256, intermediate_size_per_partition=128, top_k=3)


def test_situ_takes_alpha_and_clamp_limit_as_its_two_constants():
    cfg = runner_config_to_moe_config(RunnerConfig(**BASE, activation="situ", gemm1_alpha=4.0, gemm1_clamp_limit=25.0))
    assert (cfg.activation, cfg.alpha, cfg.beta) == ("situ", [4.0], [25.0])
    cfg = runner_config_to_moe_config(RunnerConfig(**BASE, activation="situ", gemm1_alpha=3.0, gemm1_clamp_limit=10.0))
    assert (cfg.alpha, cfg.beta) == ([3.0], [10.0])


def test_silu_with_alpha_and_limit_is_swiglu_oai_and_without_is_silu_gated():
    cfg = runner_config_to_moe_config(dict(BASE, activation="silu", gemm1_alpha=1.702, gemm1_clamp_limit=7.0))
    assert cfg.activation == "swiglu"
    assert cfg.alpha == pytest.approx([1.702]) and cfg.limit == [7.0] and cfg.beta == [1.0]
    assert runner_config_to_moe_config(dict(BASE, activation="silu")).activation == "silu"
    with pytest.raises(ValueError, match="gemm1_alpha"):
        runner_config_to_moe_config(dict(BASE, activation="silu", gemm1_clamp_limit=7.0))


def test_unsupported_runner_features_say_so():
    with pytest.raises(mxmoe.UnsupportedError, match="gelu"):
        runner_config_to_moe_config(dict(BASE, activation="gelu"))
    with pytest.raises(mxmoe.UnsupportedError, match="apply_router_weight_on_input"):
        runner_config_to_moe_config(dict(BASE, apply_router_weight_on_input=True))


def test_ep_fields_and_local_ids():
    cfg = runner_config_to_moe_config(dict(BASE, moe_ep_size=2, moe_ep_rank=1, num_local_experts=4))
    assert (cfg.ep_size, cfg.ep_rank, cfg.local_experts) == (2, 1, 4)
    local = runner_config_to_moe_config(dict(BASE, ep_size=2, ep_rank=1, topk_ids_are_local=True))
    assert (local.num_experts, local.ep_size) == (4, 1)
    with pytest.raises(ValueError, match="num_local_experts"):
        runner_config_to_moe_config(dict(BASE, ep_size=2, num_local_experts=3))


def test_runner_situ_matches_reference_with_minus_one_ids(rng):
    rc = RunnerConfig(**BASE, activation="situ", gemm1_alpha=4.0, gemm1_clamp_limit=25.0)
    cfg = runner_config_to_moe_config(rc)
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    d = mxmoe._C.from_kernel_layout(w, "gate_up")  # SGLang's w13 order: [gate; up]
    runner = MxMoeRunner(rc, w13_weight=d["w13_packed"], w13_weight_scale=d["w13_scale"], w2_weight=d["w2_packed"],
                         w2_weight_scale=d["w2_scale"])
    x = random_x(rng, 8, cfg.hidden)
    ids, wt = random_routing(rng, 8, cfg.num_experts, cfg.top_k, minus_one=0.2)
    out = runner(x, (wt, ids))
    assert_close(out, reference(cfg, w, x, ids, wt, actual=out), 5e-3)


def test_routed_scaling_on_output_equals_scaled_weights(rng):
    common = dict(BASE, activation="silu", routed_scaling_factor=2.5, input_format="bf16", intermediate_format="bf16",
                  output_format="fp32")
    on_out = runner_config_to_moe_config(dict(common, routed_scaling_on_output=True))
    in_w = runner_config_to_moe_config(dict(common, routed_scaling_on_output=False))
    assert on_out.output_scale == 2.5 and in_w.output_scale == 1.0
    w = mxmoe.make_synthetic_weights(on_out, SEED)
    x = random_x(rng, 5, on_out.hidden)
    ids, wt = random_routing(rng, 5, on_out.num_experts, on_out.top_k)
    a = MxMoeRunner(common | dict(routed_scaling_on_output=True), w)(x, (wt, ids))
    b = MxMoeRunner(common | dict(routed_scaling_on_output=False), w)(x, (wt * np.float32(2.5), ids))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert np.abs(a).max() > 0


def test_local_ids_give_the_same_rank_output_as_global_ids(rng):
    common = dict(BASE, activation="situ", gemm1_alpha=4.0, gemm1_clamp_limit=25.0, ep_size=2, ep_rank=1)
    glob = runner_config_to_moe_config(common)
    w = mxmoe.make_synthetic_weights(glob, SEED)
    x = random_x(rng, 6, glob.hidden)
    ids, wt = random_routing(rng, 6, 8, 3)
    local_ids = np.where(ids >= 4, ids - 4, -1).astype(np.int32)
    a = MxMoeRunner(common, w)(x, (wt, ids))
    b = MxMoeRunner(dict(common, topk_ids_are_local=True), w)(x, (wt, local_ids))
    np.testing.assert_array_equal(a, b)


class _TopK:  # SGLang's StandardTopKOutput shape
    def __init__(self, w, i):
        self.topk_weights, self.topk_ids, self.router_logits = w, i, None


def test_runner_accepts_topk_output_objects(rng):
    rc = dict(BASE, activation="situ")
    cfg = runner_config_to_moe_config(rc)
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = random_x(rng, 3, cfg.hidden)
    ids, wt = random_routing(rng, 3, 8, 3)
    r = MxMoeRunner(rc, w)
    np.testing.assert_array_equal(r(x, _TopK(wt, ids)), r(x, (wt, ids)))


def test_precision_passes_through_and_defaults_to_exact():
    assert runner_config_to_moe_config(dict(BASE, activation="silu")).precision == "exact"
    assert runner_config_to_moe_config(dict(BASE, activation="silu", precision="fp8")).precision == "fp8"
