"""prepare_weights: every checkpoint layout converts bit-exactly into the kernel layout,
and a wrong layout shows up as a large error (SPEC §5)."""

import numpy as np
import pytest

import mxmoe
from conftest import SEED, random_routing, random_x, small_config

NAMES = ["w13_packed", "w13_scale", "w2_packed", "w2_scale"]


def _same(a, b):
    for n in NAMES:
        np.testing.assert_array_equal(getattr(a, n), getattr(b, n), err_msg=n)


@pytest.fixture
def layer():
    cfg = small_config()
    return cfg, mxmoe.make_synthetic_weights(cfg, SEED)


def test_kimi_w1_w3_w2_round_trip(layer):
    cfg, w = layer
    d = mxmoe._C.from_kernel_layout(w, "gate_up")
    n = cfg.intermediate
    got = mxmoe.prepare_weights(
        "kimi",
        w1=(d["w13_packed"][:, :n], d["w13_scale"][:, :n]),
        w3=(d["w13_packed"][:, n:], d["w13_scale"][:, n:]),
        w2=(d["w2_packed"], d["w2_scale"]),
    )
    _same(got, w)


def test_kimi_per_expert_lists_and_dicts(layer):
    cfg, w = layer
    d = mxmoe._C.from_kernel_layout(w, "gate_up")
    n = cfg.intermediate
    w1 = [{"weight_packed": d["w13_packed"][e, :n], "weight_scale": d["w13_scale"][e, :n]} for e in range(cfg.num_experts)]
    w3 = [(d["w13_packed"][e, n:], d["w13_scale"][e, n:]) for e in range(cfg.num_experts)]
    w2 = [(d["w2_packed"][e], d["w2_scale"][e]) for e in range(cfg.num_experts)]
    _same(mxmoe.prepare_weights("kimi", w1=w1, w3=w3, w2=w2), w)


@pytest.mark.parametrize("fmt,layout", [("gpt-oss", "interleaved"), ("up_gate", "up_gate"), ("w31", "up_gate"), ("gate_up", "gate_up")])
def test_w13_layouts_round_trip(layer, fmt, layout):
    cfg, w = layer
    d = mxmoe._C.from_kernel_layout(w, layout)
    _same(mxmoe.prepare_weights(fmt, w13=(d["w13_packed"], d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"])), w)


def test_gpt_oss_blocks_and_biases(rng):
    cfg = small_config(activation="swiglu", has_bias=True)
    w = mxmoe.make_synthetic_weights(small_config(), SEED)
    d = mxmoe._C.from_kernel_layout(w, "interleaved")
    e, n2, k = cfg.num_experts, 2 * cfg.intermediate, cfg.hidden
    blocks = d["w13_packed"].reshape(e, n2, k // 32, 16)
    b13 = rng.standard_normal((e, n2)).astype(np.float32)
    b2 = rng.standard_normal((e, k)).astype(np.float32)
    got = mxmoe.prepare_weights("gpt-oss", w13=(blocks, d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"]), w13_bias=b13, w2_bias=b2)
    _same(got, w)
    got.validate(cfg)
    back = mxmoe._C.from_kernel_layout(got, "interleaved")
    np.testing.assert_array_equal(back["w13_bias"], b13)
    np.testing.assert_array_equal(back["w2_bias"], b2)


def test_swapped_gate_and_up_gives_a_large_error(rng, layer):
    cfg, w = layer
    d = mxmoe._C.from_kernel_layout(w, "gate_up")
    wrong = mxmoe.prepare_weights("up_gate", w13=(d["w13_packed"], d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"]))
    x = random_x(rng, 8, cfg.hidden)
    ids, wt = random_routing(rng, 8, cfg.num_experts, cfg.top_k)
    good = mxmoe.Layer(cfg, w).forward(x, ids, wt)
    bad = mxmoe.Layer(cfg, wrong).forward(x, ids, wt)
    assert mxmoe.compare(bad, good, 1e-2, 2e-2)["max_row_rel_l2"] > 0.3


def test_mxfp4_quantizer_feeds_prepare_weights(rng):
    cfg = small_config(num_experts=2, top_k=1)
    k, n = cfg.hidden, cfg.intermediate
    w13 = [mxmoe.quantize_mxfp4(rng.standard_normal((2 * n, k)).astype(np.float32)) for _ in range(2)]
    w2 = [mxmoe.quantize_mxfp4(rng.standard_normal((k, n)).astype(np.float32)) for _ in range(2)]
    got = mxmoe.prepare_weights("gate_up", w13=w13, w2=w2)
    got.validate(cfg)
    back = mxmoe._C.from_kernel_layout(got, "gate_up")
    np.testing.assert_array_equal(back["w13_packed"][1], w13[1][0])


def test_prepare_weights_bad_input_names_argument(layer):
    cfg, w = layer
    d = mxmoe._C.from_kernel_layout(w, "gate_up")
    with pytest.raises(ValueError, match="w3"):
        mxmoe.prepare_weights("kimi", w1=(d["w13_packed"], d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"]))
    with pytest.raises(ValueError, match="w2_scale"):
        mxmoe.prepare_weights("gate_up", w13=(d["w13_packed"], d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"][:, :, :1].copy()))
    with pytest.raises(ValueError, match="format"):
        mxmoe.prepare_weights("mixtral", w13=(d["w13_packed"], d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"]))
    with pytest.raises(ValueError, match="uint8"):
        mxmoe.prepare_weights("gate_up", w13=(d["w13_packed"].astype(np.float32), d["w13_scale"]), w2=(d["w2_packed"], d["w2_scale"]))
