"""Shared fixtures: small synthetic layers (fresh seeds per test run, printed on failure)."""

import os
import random

import numpy as np
import pytest

import mxmoe

# Fresh random inputs every run (SPEC §8); the seed is in the test report for replay.
SEED = int(os.environ.get("MXMOE_TEST_SEED", random.SystemRandom().randrange(1, 2**31)))


def pytest_report_header(config):
    return f"mxmoe {mxmoe.__version__}, seed {SEED} (MXMOE_TEST_SEED={SEED} reproduces)"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs PyTorch with a CUDA GPU the engine supports")
    config.addinivalue_line("markers", "torch: needs PyTorch")


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


def small_config(**kw):
    args = dict(num_experts=8, top_k=3, hidden=256, intermediate=128)
    args.update(kw)
    return mxmoe.MoeConfig(args.pop("num_experts"), args.pop("top_k"), args.pop("hidden"), args.pop("intermediate"), **args)


def random_routing(rng, tokens, num_experts, top_k, minus_one=0.0):
    ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
    if minus_one:
        ids[rng.random(ids.shape) < minus_one] = -1
    w = rng.random((tokens, top_k)).astype(np.float32) + 0.05
    return ids, w / w.sum(axis=1, keepdims=True)


def random_x(rng, tokens, hidden):
    return rng.standard_normal((tokens, hidden)).astype(np.float32)


def reference(cfg, weights, x, ids, w, actual=None, **kw):
    """The float64 oracle rounded to the output format, as the C++ suite compares (an
    unrounded judge would charge the BF16 output's own rounding, ~1.5e-3, to the kernel).
    With `actual` (the output under test): the suite's judge exactly, i.e. either rounding
    accepted where the intermediate or the output rounding is a near-tie (SPEC §7), so a
    correct backend is not failed for a rounding its fp32 sums may take the other way."""
    layer = mxmoe.Layer(cfg, weights, backend="reference")
    if actual is not None:
        return layer.reference(x, ids, w, toward=actual, **kw)
    return layer.forward(x, ids, w, **kw)


def assert_close(actual, ref, max_rel_l2, min_cos=0.9999):
    c = mxmoe.compare(np.asarray(actual, dtype=np.float64), np.asarray(ref, dtype=np.float64), 1e-2, 2e-2)
    assert c["nonfinite"] == 0, c["summary"]
    assert c["max_row_rel_l2"] <= max_rel_l2 and c["min_cosine"] >= min_cos, c["summary"]
    return c


@pytest.fixture
def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def cuda_or_skip():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    ok, why = mxmoe.supports(small_config(), backend="cuda")
    if not ok:
        pytest.skip(why)
    return torch
