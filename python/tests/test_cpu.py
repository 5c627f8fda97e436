"""CPU backend through the Python API: NumPy via DLPack, agreement with the float64
reference (SPEC §8 bounds), capability queries and bad input (SPEC §9)."""

import numpy as np
import pytest

import mxmoe
from conftest import SEED, assert_close, random_routing, random_x, reference, small_config


def test_capabilities_lists_cpu_backend_and_all_activations():
    caps = mxmoe.capabilities()
    assert "cpu" in caps["backends"] and "reference" in caps["backends"]
    assert set(caps["activations"]) == {"situ", "swiglu", "silu"}
    assert set(caps["input_formats"]) == {"bf16", "mxfp8"}
    assert caps["version"] == mxmoe.__version__
    assert ("cuda" in caps["backends"]) == any(d["supported"] for d in caps["devices"])


def test_capabilities_names_are_the_ones_the_api_takes(tmp_path):
    caps = mxmoe.capabilities()
    for a in caps["activations"]:
        assert small_config(activation=a).activation == a
    for key in ("input_format", "intermediate_format", "output_format"):
        for f in caps[key + "s"]:
            small_config(**{key: f})
    for r in caps["routers"]:
        mxmoe.RoutingParams(r, 2)
    for c in caps["checkpoint_formats"]:
        mxmoe.write_synthetic_checkpoint(str(tmp_path / f"{c}.safetensors"), format=c, num_experts=4, hidden=64,
                                         intermediate=64, top_k=2, seed=SEED)
    for layout in caps["w13_layouts"]:  # a known layout gets as far as asking for its tensors
        with pytest.raises(ValueError, match=r"^w13: is required"):
            mxmoe.prepare_weights(layout, w2=(np.zeros((1, 64, 32), np.uint8), np.zeros((1, 64, 2), np.uint8)))
    assert caps["weight_formats"] == ["mxfp4"]


def test_supports_reports_bad_config_field_without_raising():
    ok, why = mxmoe.supports(dict(num_experts=8, top_k=9, hidden=64, intermediate=64))
    assert not ok and "top_k" in why
    ok, why = mxmoe.supports(dict(num_experts=8, top_k=2, hidden=64, intermediate=64), backend="cpu")
    assert ok, why
    ok, why = mxmoe.supports(small_config(), backend="tpu")
    assert not ok and "backend" in why


def test_supports_cuda_checks_each_field_against_the_gpus_capabilities(monkeypatch):
    # supports() reads mxmoe.capabilities()' per-GPU lists: a GPU without the FP8 mode (an
    # sm_80 here) is named with what it lacks; a Hopper with it runs the config.
    def device(index, sm, precisions):
        return dict(index=index, name=f"GPU{index}", sm=sm, supported=True, note="", activations=["situ", "swiglu", "silu"],
                    input_formats=["bf16", "mxfp8"], intermediate_formats=["bf16", "mxfp8"],
                    output_formats=["bf16", "fp32"], precisions=precisions, paths=["decode"])

    real = mxmoe._layer._C.capabilities()
    fake = dict(real, cuda_built=True, devices=[device(0, "80", ["exact"])])
    monkeypatch.setattr(mxmoe._layer._C, "capabilities", lambda: fake)
    ok, why = mxmoe.supports(small_config(precision="fp8"), backend="cuda")
    assert not ok and "precision fp8" in why and "cuda:0" in why
    assert mxmoe.supports(small_config(), backend="cuda")[0]
    ok, why = mxmoe.supports(small_config(precision="fp8"), backend="auto")
    assert not ok and "precision" in why  # nor on the CPU engine
    fake["devices"].append(device(1, "90", ["exact", "fp8"]))
    ok, why = mxmoe.supports(small_config(precision="fp8"), backend="cuda")
    assert ok and why.startswith("cuda:1")


def test_capabilities_list_precisions():
    caps = mxmoe.capabilities()
    assert caps["precisions"][0] == "exact"
    for d in caps["devices"]:
        assert set(d["precisions"]) <= {"exact", "fp8"} and set(d["paths"]) <= {"decode", "prefill"}


def test_supports_cuda_names_alternative_when_unavailable():
    ok, why = mxmoe.supports(small_config(), backend="cuda")
    if not mxmoe.capabilities()["cuda_built"]:
        assert not ok and "cpu" in why


@pytest.mark.parametrize("activation", ["situ", "swiglu", "silu"])
# SPEC §8 bounds are 5e-3 (MXFP8 intermediate) and 1e-3 (BF16) at the C++ suite's shapes.
# At these small test shapes (N=128: four 32-blocks per row) one E4M3 rounding flip of the
# intermediate, where fp32 and float64 sums straddle a boundary, moves a row by up to ~0.8%;
# the element-wise bound in assert_close still holds, and a layout error gives ~100%.
@pytest.mark.parametrize("fmt,bound", [("mxfp8", 1e-2), ("bf16", 1e-3)])
@pytest.mark.parametrize("tokens", [1, 2, 8, 32])
def test_cpu_backend_matches_reference(rng, activation, fmt, bound, tokens):
    cfg = small_config(activation=activation, input_format=fmt, intermediate_format=fmt)
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = random_x(rng, tokens, cfg.hidden)
    ids, wt = random_routing(rng, tokens, cfg.num_experts, cfg.top_k)
    out = mxmoe.Layer(cfg, w).forward(x, ids, wt)
    ref = reference(cfg, w, x, ids, wt, actual=out)
    assert out.shape == (tokens, cfg.hidden) and out.dtype == np.float32
    assert np.abs(ref).max() > 0
    assert_close(out, ref, bound)


def test_an_empty_batch_is_a_valid_forward():
    # A serving engine calls the layer with no tokens (an idle data-parallel rank, an
    # empty microbatch). NumPy and DLPack export empty arrays with zero or arbitrary
    # strides; they used to be refused as "not C-contiguous".
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    routing = mxmoe.RoutingParams("softmax", cfg.top_k)
    x = np.zeros((0, cfg.hidden), np.float32)
    ids, wt = np.zeros((0, cfg.top_k), np.int32), np.zeros((0, cfg.top_k), np.float32)
    logits = np.zeros((0, cfg.num_experts), np.float32)
    assert [a.shape for a in mxmoe.route(logits, None, routing)] == [(0, cfg.top_k)] * 2
    x8, s8 = mxmoe.quantize_mxfp8(x)
    assert x8.shape == (0, cfg.hidden) and s8.shape == (0, cfg.hidden // 32)
    assert mxmoe.float32_to_bf16(x).shape == (0, cfg.hidden)
    assert mxmoe.bf16_to_float32(np.zeros((0, 4), np.uint16)).shape == (0, 4)
    out = np.zeros((0, cfg.hidden), np.uint16)
    assert mxmoe.Layer(cfg, w).forward(x, ids, wt, out=out) is out
    for backend in ("cpu", "reference"):
        layer = mxmoe.Layer(cfg, w, backend=backend, routing=routing)
        for y in (layer.forward(x, ids, wt), layer.forward(x8, ids, wt, x_scale=s8),
                  layer.forward(x, router_logits=logits), layer.reference(x, ids, wt)):
            assert y.shape == (0, cfg.hidden)


def test_minus_one_slots_contribute_nothing(rng):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = random_x(rng, 6, cfg.hidden)
    ids, wt = random_routing(rng, 6, cfg.num_experts, cfg.top_k)
    ids[:, 2] = -1
    wt_huge = wt.copy()
    wt_huge[:, 2] = 1e6  # a -1 slot's weight must not matter
    a = mxmoe.Layer(cfg, w).forward(x, ids, wt)
    b = mxmoe.Layer(cfg, w).forward(x, ids, wt_huge)
    np.testing.assert_array_equal(a, b)
    ids[3, :] = -1
    assert not mxmoe.Layer(cfg, w).forward(x, ids, wt)[3].any()


def test_ep_ranks_sum_to_the_single_rank_output(rng):
    full = small_config(input_format="bf16", intermediate_format="bf16", output_format="fp32")
    w = mxmoe.make_synthetic_weights(full, SEED)
    x = random_x(rng, 5, full.hidden)
    ids, wt = random_routing(rng, 5, full.num_experts, full.top_k)
    whole = mxmoe.Layer(full, w, backend="reference").forward(x, ids, wt)
    d = mxmoe._C.from_kernel_layout(w, "gate_up")
    parts = []
    for rank in range(2):
        cfg = small_config(input_format="bf16", intermediate_format="bf16", output_format="fp32", ep_size=2, ep_rank=rank)
        sl = slice(rank * 4, rank * 4 + 4)
        wr = mxmoe.prepare_weights("gate_up", w13=(d["w13_packed"][sl], d["w13_scale"][sl]), w2=(d["w2_packed"][sl], d["w2_scale"][sl]))
        parts.append(mxmoe.Layer(cfg, wr, backend="reference").forward(x, ids, wt))
    np.testing.assert_allclose(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-6)


def test_out_array_is_written_in_place_through_dlpack(rng):
    cfg = small_config(output_format="fp32")
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = random_x(rng, 4, cfg.hidden)
    ids, wt = random_routing(rng, 4, cfg.num_experts, cfg.top_k)
    out = np.full((4, cfg.hidden), np.nan, dtype=np.float32)
    ret = mxmoe.Layer(cfg, w).forward(x, ids, wt, out=out)
    assert ret is out and np.isfinite(out).all()
    np.testing.assert_array_equal(out, mxmoe.Layer(cfg, w).forward(x, ids, wt))


def test_bf16_bits_and_float32_inputs_agree(rng):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = random_x(rng, 3, cfg.hidden)
    ids, wt = random_routing(rng, 3, cfg.num_experts, cfg.top_k)
    bits = mxmoe.float32_to_bf16(x)
    assert bits.dtype == np.uint16
    L = mxmoe.Layer(cfg, w)
    np.testing.assert_array_equal(L.forward(x, ids, wt), L.forward(bits, ids, wt))
    np.testing.assert_array_equal(L.forward(x, ids, wt), L.forward(x, ids.astype(np.int64), wt))


def test_mxfp8_codes_input_matches_quantizing_inside(rng):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    x = mxmoe.bf16_to_float32(mxmoe.float32_to_bf16(random_x(rng, 3, cfg.hidden)))
    ids, wt = random_routing(rng, 3, cfg.num_experts, cfg.top_k)
    codes, scale = mxmoe.quantize_mxfp8(x)
    L = mxmoe.Layer(cfg, w)
    np.testing.assert_array_equal(L.forward(codes, ids, wt, x_scale=scale), L.forward(x, ids, wt))


def test_router_logits_route_with_sigmoid_and_bias(rng):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    logits = rng.standard_normal((7, cfg.num_experts)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cfg.num_experts)).astype(np.float32)
    params = mxmoe.RoutingParams("sigmoid", cfg.top_k)
    ids, wt = mxmoe.route(logits, bias, params)
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    expect = np.argsort(-(s + bias), axis=1, kind="stable")[:, : cfg.top_k]
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.sort(expect, axis=1))
    np.testing.assert_allclose(wt.sum(axis=1), 1.0, rtol=1e-5)
    x = random_x(rng, 7, cfg.hidden)
    L = mxmoe.Layer(cfg, w, routing=params, router_bias=bias)
    np.testing.assert_array_equal(L.forward(x, router_logits=logits), L.forward(x, ids, wt))


# ------------------------------------------------------------------ bad input (SPEC §9)


def _layer_and_inputs(rng, tokens=4):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    ids, wt = random_routing(rng, tokens, cfg.num_experts, cfg.top_k)
    return cfg, mxmoe.Layer(cfg, w), random_x(rng, tokens, cfg.hidden), ids, wt


def test_wrong_hidden_size_names_x(rng):
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    with pytest.raises(ValueError, match=r"^x: .*expected 256") as e:
        L.forward(x[:, :32].copy(), ids, wt)
    assert e.value.argument == "x"


def test_non_contiguous_x_is_refused(rng):
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    wide = np.repeat(x, 2, axis=1)[:, ::2]
    with pytest.raises(ValueError, match=r"^x: is not C-contiguous"):
        L.forward(wide, ids, wt)
    with pytest.raises(ValueError, match=r"^topk_weights: is not C-contiguous"):
        L.forward(x, ids, np.repeat(wt, 2, axis=1)[:, ::2])


def test_integer_weights_and_logits_are_refused_not_converted(rng):
    # Integer weights are most often the ids passed in the weights' place; the GPU path
    # refuses them, and so does the CPU path (one rule, SPEC §9).
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    for call in (lambda: L.forward(x, ids, ids), lambda: L.reference(x, ids, ids)):
        with pytest.raises(ValueError, match=r"^topk_weights: has dtype int32, expected a floating dtype"):
            call()
    with pytest.raises(ValueError, match=r"^router_logits: has dtype int64"):
        mxmoe.route(np.zeros((2, cfg.num_experts), np.int64), None, mxmoe.RoutingParams("softmax", cfg.top_k))
    with pytest.raises(ValueError, match=r"^router_bias: has dtype int32"):
        mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED), router_bias=np.zeros(cfg.num_experts, np.int32))
    np.testing.assert_array_equal(L.forward(x, ids, wt.astype(np.float64)), L.forward(x, ids, wt))


def test_out_of_range_expert_id_names_topk_ids(rng):
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    ids[1, 0] = cfg.num_experts
    with pytest.raises(ValueError, match=r"topk_ids") as e:
        L.forward(x, ids, wt)
    assert e.value.argument == "topk_ids"
    ids[1, 0] = -2
    with pytest.raises(ValueError, match=r"topk_ids"):
        L.forward(x, ids.astype(np.int64), wt)


def test_wrong_dtypes_name_the_argument(rng):
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    with pytest.raises(ValueError, match=r"^topk_ids: has dtype float32"):
        L.forward(x, ids.astype(np.float32), wt)
    with pytest.raises(ValueError, match=r"^topk_weights: has shape"):
        L.forward(x, ids, wt[:2])
    with pytest.raises(ValueError, match=r"^x: has dtype float64"):
        L.forward(x.astype(np.float64), ids, wt)
    with pytest.raises(ValueError, match=r"^x_scale: is required"):
        L.forward(np.zeros((4, cfg.hidden), np.uint8), ids, wt)


def test_out_with_wrong_shape_is_not_written(rng):
    cfg, L, x, ids, wt = _layer_and_inputs(rng)
    out = np.full((3, cfg.hidden), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"^out: "):
        L.forward(x, ids, wt, out=out)
    assert (out == 7.0).all()


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(top_k=0), "top_k"),
        (dict(hidden=48), "hidden"),
        (dict(ep_size=3), "ep_size"),
        (dict(activation="gelu"), "activation"),
        (dict(input_format="fp4"), "input_format"),
        (dict(activation="situ", limit=[7.0]), "limit"),
        (dict(precision="fp4"), "precision"),
        (dict(precision="fp8", input_format="bf16"), "config.precision"),
    ],
)
def test_bad_config_raises_value_error_naming_field(kw, field):
    with pytest.raises(ValueError, match=field):
        small_config(**kw)


@pytest.mark.parametrize("bad", [10**9, 2**31 - 1, -2])
def test_local_of_refuses_ids_outside_the_config(bad):
    cfg = small_config()
    assert cfg.local_of(-1) == -1
    with pytest.raises(ValueError, match="global_id") as e:
        cfg.local_of(bad)
    assert e.value.argument == "global_id"


def test_intermediate_format_follows_the_input_unless_given():
    # SPEC §7: MXFP8 by default for MXFP8 activations, BF16 by default for BF16 ones.
    assert small_config().intermediate_format == "mxfp8"
    assert small_config(input_format="bf16").intermediate_format == "bf16"
    assert small_config(input_format="bf16", intermediate_format="mxfp8").intermediate_format == "mxfp8"
    assert small_config(intermediate_format="auto").intermediate_format == "mxfp8"
    assert "mid=bf16" in small_config(input_format="bf16").describe()
    with pytest.raises(ValueError, match="intermediate_format"):
        small_config(intermediate_format="fp4")


def test_route_names_correction_bias_when_it_is_wrong():
    logits = np.zeros((2, 8), np.float32)
    for bias, params, why in ((np.full(8, np.nan, np.float32), mxmoe.RoutingParams("sigmoid", 2), "not finite"),
                              (np.zeros(8, np.float32), mxmoe.RoutingParams("softmax", 2), "sigmoid router only")):
        with pytest.raises(ValueError, match=f"^correction_bias: .*{why}") as e:
            mxmoe.route(logits, bias, params)
        assert e.value.argument == "correction_bias"


def test_precision_defaults_to_exact_and_fp8_is_opt_in():
    assert small_config().precision == "exact"
    assert small_config(precision="fp8").precision == "fp8"


def test_fp8_precision_on_the_cpu_engine_is_refused_naming_the_alternative():
    cfg = small_config(precision="fp8")
    w = mxmoe.make_synthetic_weights(cfg, 1)
    with pytest.raises(mxmoe.UnsupportedError, match="precision.*exact") as e:
        mxmoe.Layer(cfg, w, device="cpu")
    assert "cuda" in str(e.value)
    ok, why = mxmoe.supports(cfg, backend="cpu")
    assert not ok and why.startswith("precision:")
    if not any("fp8" in d["precisions"] for d in mxmoe.capabilities()["devices"]):
        ok, why = mxmoe.supports(cfg, backend="auto")  # no GPU here runs it, and the CPU does not
        assert not ok and why.startswith("precision:"), why
    # The reference is the oracle for either precision; the exact CPU engine still runs.
    mxmoe.Layer(cfg, w, device="cpu", backend="reference")
    assert mxmoe.supports(small_config(), backend="cpu")[0]


def test_reference_backend_on_gpu_device_string_is_refused():
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, 1)
    with pytest.raises(ValueError, match="backend"):
        mxmoe.Layer(cfg, w, backend="cuda")
    with pytest.raises(ValueError, match="device"):
        mxmoe.Layer(cfg, w, device="tpu")
