"""PyTorch: the custom op (CPU tensors, fake tensors, torch.compile) and, on a GPU, CUDA
tensors through DLPack, CUDA-graph capture and replay, torch.compile of KimiK3Experts,
and agreement with the float64 reference. Skipped with the reason where torch/CUDA are absent."""

import numpy as np
import pytest

import mxmoe
from conftest import SEED, assert_close, cuda_or_skip, random_routing, random_x, reference, small_config

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
from mxmoe import _layer  # noqa: E402
from mxmoe.torch_ops import register_layer  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def kimi_file(tmp_path):
    p = tmp_path / "kimi.safetensors"
    mxmoe.write_synthetic_checkpoint(str(p), format="kimi", num_experts=16, hidden=256, intermediate=128, top_k=4, seed=SEED)
    return p


def _inputs(rng, cfg, tokens, minus_one=0.0):
    x = random_x(rng, tokens, cfg.hidden)
    ids, wt = random_routing(rng, tokens, cfg.num_experts, cfg.top_k, minus_one)
    return x, ids, wt


# ------------------------------------------------------------------ CUDA operand conversions
# mxmoe._layer._cuda_operands, on CPU tensors (device-agnostic torch ops, so checked
# without a GPU). What they must not do is change an input silently (SPEC §9): an int64
# expert id wrapped into int32 could land on a valid expert, and MXFP8 codes or BF16 bits
# cast as values would be other numbers.

def test_int64_ids_saturate_into_int32_instead_of_wrapping():
    ids = torch.tensor([[2**32 + 3, -(2**33) + 5, 5, -1, 2**31 - 1]], dtype=torch.int64)
    _, out, _, _ = _layer._cuda_operands(torch.zeros(1, 8, dtype=torch.bfloat16), ids, torch.ones(1, 5), None)
    assert out.dtype == torch.int32
    # 2^32 + 3 wrapped would be 3, a valid expert; saturated it stays out of range.
    assert out.tolist() == [[2**31 - 1, -(2**31), 5, -1, 2**31 - 1]]


def test_int32_ids_and_float32_weights_pass_through_unchanged():
    ids = torch.tensor([[0, 7]], dtype=torch.int32)
    w = torch.tensor([[0.25, 0.75]], dtype=torch.float32)
    x = torch.ones(1, 8, dtype=torch.bfloat16)
    x2, ids2, w2, _ = _layer._cuda_operands(x, ids, w, None)
    assert x2 is x and ids2 is ids and w2 is w


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8, torch.bool])
def test_ids_of_another_dtype_are_refused(dtype):
    x = torch.zeros(1, 8, dtype=torch.bfloat16)
    ids = torch.zeros(1, 2).to(dtype)
    with pytest.raises(mxmoe.InvalidArgument, match="topk_ids: has dtype"):
        _layer._cuda_operands(x, ids, torch.ones(1, 2), None)


def test_codes_and_bf16_bits_are_not_cast_as_values():
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.float8_e4m3fn):
        x = torch.zeros(2, 8, dtype=dtype)
        assert _layer._cuda_operands(x, None, None, None)[0] is x


def test_other_floating_x_rounds_to_bf16_and_integers_are_refused():
    x = torch.tensor([[1.0 + 2**-10, 3.0]], dtype=torch.float32)
    out = _layer._cuda_operands(x, None, None, None)[0]
    assert out.dtype == torch.bfloat16 and out.float().tolist() == [[1.0, 3.0]]
    with pytest.raises(mxmoe.InvalidArgument, match="x: has dtype"):
        _layer._cuda_operands(torch.zeros(1, 8, dtype=torch.int32), None, None, None)


def test_weights_and_logits_must_be_floating():
    x = torch.zeros(1, 8, dtype=torch.bfloat16)
    ids = torch.zeros(1, 2, dtype=torch.int32)
    _, _, w, _ = _layer._cuda_operands(x, ids, torch.ones(1, 2, dtype=torch.float64), None)
    assert w.dtype == torch.float32
    _, _, _, logits = _layer._cuda_operands(x, None, None, torch.ones(1, 4, dtype=torch.float16))
    assert logits.dtype == torch.float32
    bf16 = torch.ones(1, 4, dtype=torch.bfloat16)  # the routing kernel reads BF16 logits itself
    assert _layer._cuda_operands(x, None, None, bf16)[3] is bf16
    with pytest.raises(mxmoe.InvalidArgument, match="topk_weights: has dtype"):
        _layer._cuda_operands(x, ids, torch.ones(1, 2, dtype=torch.int32), None)
    with pytest.raises(mxmoe.InvalidArgument, match="router_logits: has dtype"):
        _layer._cuda_operands(x, None, None, torch.ones(1, 4, dtype=torch.int64))


# ------------------------------------------------------------------ CPU tensors


def test_op_on_cpu_tensors_matches_numpy_path(rng):
    cfg = small_config()
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    L = mxmoe.Layer(cfg, w)
    x, ids, wt = _inputs(rng, cfg, 5)
    h = register_layer(L)
    xt = torch.from_numpy(x).to(torch.bfloat16)
    y = torch.ops.mxmoe.fused_moe(xt, torch.from_numpy(ids).long(), torch.from_numpy(wt), None, h)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, cfg.hidden)
    np.testing.assert_array_equal(y.float().numpy(), L.forward(xt.float().numpy(), ids, wt))


def test_cpu_layer_takes_bf16_bits_as_bits_and_refuses_integer_values(rng):
    # int16 holds BF16 bits for the bindings; cast as values it would be other numbers.
    cfg = small_config()
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED))
    x, ids, wt = _inputs(rng, cfg, 3)
    xb = torch.from_numpy(x).to(torch.bfloat16)
    y = L.forward(xb, torch.from_numpy(ids), torch.from_numpy(wt))
    assert torch.equal(L.forward(xb.view(torch.int16), torch.from_numpy(ids), torch.from_numpy(wt)), y)
    with pytest.raises(mxmoe.InvalidArgument, match="x: has dtype"):
        L.forward(torch.zeros(3, cfg.hidden, dtype=torch.int32), torch.from_numpy(ids), torch.from_numpy(wt))


def test_cpu_layer_refuses_integer_weights_as_the_gpu_path_does(rng):
    cfg = small_config()
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED))
    x, ids, wt = _inputs(rng, cfg, 3)
    xb, idt = torch.from_numpy(x).to(torch.bfloat16), torch.from_numpy(ids)
    with pytest.raises(mxmoe.InvalidArgument, match="topk_weights: has dtype torch.int32"):
        L.forward(xb, idt, idt)
    y = L.forward(xb, idt, torch.from_numpy(wt).double())
    assert torch.equal(y, L.forward(xb, idt, torch.from_numpy(wt)))


def test_cpu_layer_takes_an_empty_batch():
    cfg = small_config()
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED))
    x = torch.zeros(0, cfg.hidden, dtype=torch.bfloat16)
    ids, wt = torch.zeros(0, cfg.top_k, dtype=torch.int64), torch.zeros(0, cfg.top_k)
    assert tuple(L.forward(x, ids, wt).shape) == (0, cfg.hidden)
    assert L.reference(x, ids, wt).shape == (0, cfg.hidden)
    out = torch.empty(0, cfg.hidden, dtype=torch.bfloat16)  # data_ptr 0: nothing is copied into it
    assert L.forward(x, ids, wt, out=out) is out


def test_fake_impl_gives_shape_and_dtype_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = small_config(output_format="fp32")
    h = register_layer(mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED)))
    with FakeTensorMode():
        x = torch.empty(7, cfg.hidden, dtype=torch.bfloat16)
        y = torch.ops.mxmoe.fused_moe(x, torch.empty(7, 3, dtype=torch.int32), torch.empty(7, 3), None, h)
    assert tuple(y.shape) == (7, cfg.hidden) and y.dtype == torch.float32


def test_opcheck_passes():
    cfg = small_config()
    h = register_layer(mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED)))
    rng = np.random.default_rng(SEED)
    x, ids, wt = _inputs(rng, cfg, 4)
    torch.library.opcheck(torch.ops.mxmoe.fused_moe.default,
                          (torch.from_numpy(x).bfloat16(), torch.from_numpy(ids), torch.from_numpy(wt), None, h),
                          test_utils=("test_schema", "test_faketensor"))


def test_kimi_module_compiles_without_graph_breaks_on_cpu(rng, kimi_file):
    m = mxmoe.KimiK3Experts(str(kimi_file), device="cpu")
    x = torch.from_numpy(random_x(rng, 6, m.hidden_size)).bfloat16()
    logits = torch.from_numpy(rng.standard_normal((6, m.num_experts)).astype(np.float32))
    eager = m(x, logits)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")(x, logits)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    ids, wt = m.route(logits)
    ref = reference(m.config, m.moe.weights, x.float().numpy(), ids.numpy(), wt.numpy(), actual=eager.float().numpy())
    assert_close(eager.float().numpy(), ref, 5e-3)


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["situ", "swiglu", "silu"])
@pytest.mark.parametrize("tokens", [1, 2, 8, 32, 128])
def test_gpu_layer_matches_reference(rng, activation, tokens):
    cuda_or_skip()
    cfg = small_config(activation=activation)
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    L = mxmoe.Layer(cfg, w, device="cuda", max_tokens=128)
    x, ids, wt = _inputs(rng, cfg, tokens, minus_one=0.1)
    xt = torch.from_numpy(x).to("cuda", torch.bfloat16)
    y = L.forward(xt, torch.from_numpy(ids).cuda(), torch.from_numpy(wt).cuda())
    assert y.is_cuda and y.dtype == torch.bfloat16
    got = y.float().cpu().numpy()
    assert_close(got, reference(cfg, w, xt.float().cpu().numpy(), ids, wt, actual=got), 5e-3)


@pytest.mark.gpu
def test_gpu_out_and_workspace_are_used_in_place(rng):
    cuda_or_skip()
    cfg = small_config(output_format="fp32")
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    L = mxmoe.Layer(cfg, w, device="cuda", max_tokens=16)
    ws = mxmoe.make_workspace(L, 16)
    x, ids, wt = _inputs(rng, cfg, 16)
    out = torch.full((16, cfg.hidden), float("nan"), device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ret = L.forward(torch.from_numpy(x).cuda().bfloat16(), torch.from_numpy(ids).cuda(), torch.from_numpy(wt).cuda(),
                        out=out, workspace=ws)
    s.synchronize()
    assert ret is out and torch.isfinite(out).all()


@pytest.mark.gpu
def test_gpu_layer_takes_an_empty_batch():
    cuda_or_skip()
    cfg = small_config()
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED), device="cuda", max_tokens=8)
    x = torch.zeros(0, cfg.hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.zeros(0, cfg.top_k, device="cuda", dtype=torch.int64)
    y = L.forward(x, ids, torch.zeros(0, cfg.top_k, device="cuda"))
    torch.cuda.synchronize()
    assert y.is_cuda and tuple(y.shape) == (0, cfg.hidden)


@pytest.mark.gpu
def test_gpu_bf16_router_logits_route_as_their_float32_widening(rng):
    cuda_or_skip()
    cfg = small_config()
    params = mxmoe.RoutingParams("sigmoid", cfg.top_k)
    bias = (0.1 * rng.standard_normal(cfg.num_experts)).astype(np.float32)
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED), device="cuda", max_tokens=16,
                    routing=params, router_bias=bias)
    x = torch.from_numpy(random_x(rng, 9, cfg.hidden)).cuda().bfloat16()
    logits = torch.from_numpy(rng.standard_normal((9, cfg.num_experts)).astype(np.float32)).cuda().bfloat16()
    y16 = L.forward(x, router_logits=logits)
    y32 = L.forward(x, router_logits=logits.float())
    torch.cuda.synchronize()
    assert torch.equal(y16, y32)
    ids, wt = mxmoe.route(logits.float().cpu().numpy(), bias, params)
    got = y16.float().cpu().numpy()
    assert_close(got, reference(cfg, L.weights, x.float().cpu().numpy(), ids, wt, actual=got), 5e-3)


@pytest.mark.gpu
def test_gpu_bad_input_names_argument_and_writes_nothing(rng):
    cuda_or_skip()
    cfg = small_config()
    L = mxmoe.Layer(cfg, mxmoe.make_synthetic_weights(cfg, SEED), device="cuda", max_tokens=8)
    x, ids, wt = _inputs(rng, cfg, 4)
    xt = torch.from_numpy(x).cuda().bfloat16()
    idt, wtt = torch.from_numpy(ids).cuda(), torch.from_numpy(wt).cuda()
    out = torch.full((4, cfg.hidden), 3.0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x: "):
        L.forward(xt[:, :128].contiguous(), idt, wtt, out=out)
    with pytest.raises(ValueError, match="^out: "):
        L.forward(xt, idt, wtt, out=out[:2])
    with pytest.raises(ValueError, match="^workspace: "):
        L.forward(xt, idt, wtt, out=out, workspace=torch.empty(1, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="^x: "):
        L.forward(xt.cpu(), idt, wtt)
    torch.cuda.synchronize()
    assert (out == 3.0).all()
    # Ids in device memory cannot be checked on the host without a synchronization
    # (SPEC §10): out-of-range ids are skipped, never dereferenced, and flagged in the
    # device error word (CudaMoeLayer::read_error_flags); their slots contribute nothing.
    bad = torch.full((4, cfg.hidden), 3.0, device="cuda", dtype=torch.bfloat16)
    L.forward(xt, torch.full_like(idt, cfg.num_experts), wtt, out=bad)
    torch.cuda.synchronize()
    assert (bad == 0).all()


@pytest.mark.gpu
def test_gpu_graph_capture_and_two_replays_equal_eager(rng, kimi_file):
    cuda_or_skip()
    m = mxmoe.KimiK3Experts(str(kimi_file), device="cuda", max_tokens=32)
    x = torch.from_numpy(random_x(rng, 32, m.hidden_size)).cuda().bfloat16()
    logits = torch.from_numpy(rng.standard_normal((32, m.num_experts)).astype(np.float32)).cuda()
    eager = m(x, logits).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(x, logits)  # warm-up off the default stream, as torch recommends before capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(x, logits)
    for _ in range(2):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, eager)
    ids, wt = m.route(logits.cpu())
    got = eager.float().cpu().numpy()
    ref = reference(m.config, m.moe.weights, x.float().cpu().numpy(), ids.numpy(), wt.numpy(), actual=got)
    assert_close(got, ref, 5e-3)


@pytest.mark.gpu
def test_gpu_torch_compile_of_kimi_module(rng, kimi_file):
    cuda_or_skip()
    m = mxmoe.KimiK3Experts(str(kimi_file), device="cuda", max_tokens=64)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = m

        def forward(self, x, logits):
            return self.experts(x * 1.0, logits) + 0.0

    x = torch.from_numpy(random_x(rng, 64, m.hidden_size)).cuda().bfloat16()
    logits = torch.from_numpy(rng.standard_normal((64, m.num_experts)).astype(np.float32)).cuda()
    eager = Block()(x, logits)
    compiled = torch.compile(Block(), fullgraph=True)
    torch.testing.assert_close(compiled(x, logits), eager, rtol=0, atol=0)
    cg = torch.compile(Block(), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        got = cg(x, logits)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_adapter_runs_on_cuda_tensors(rng):
    cuda_or_skip()
    from mxmoe.sglang import MxMoeRunner, runner_config_to_moe_config

    rc = dict(num_experts=8, hidden_size=256, intermediate_size_per_partition=128, top_k=3, activation="situ",
              gemm1_alpha=4.0, gemm1_clamp_limit=25.0)
    cfg = runner_config_to_moe_config(rc)
    w = mxmoe.make_synthetic_weights(cfg, SEED)
    r = MxMoeRunner(rc, w, device="cuda", max_tokens=8)
    x, ids, wt = _inputs(rng, cfg, 8, minus_one=0.2)
    xt = torch.from_numpy(x).cuda().bfloat16()
    y = r(xt, (torch.from_numpy(wt).cuda(), torch.from_numpy(ids).cuda()))
    got = y.float().cpu().numpy()
    assert_close(got, reference(cfg, w, xt.float().cpu().numpy(), ids, wt, actual=got), 5e-3)
