"""Checkpoints: this EP rank's share of a Kimi-format file, malformed files, the example."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mxmoe
from conftest import SEED, assert_close, random_x

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kimi_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("ck") / "kimi.safetensors"
    mxmoe.write_synthetic_checkpoint(str(p), format="kimi", num_experts=16, hidden=256, intermediate=128, top_k=4, seed=SEED)
    return p


def test_load_checkpoint_reads_shapes_bias_and_top_k(kimi_file):
    ck = mxmoe.load_checkpoint(kimi_file)
    assert (ck.format, ck.num_experts, ck.hidden, ck.intermediate, ck.top_k) == ("kimi", 16, 256, 128, 4)
    assert ck.correction_bias.shape == (16,)
    assert ck.weights.num_local == 16


def test_ep_rank_loads_its_slice(kimi_file):
    full = mxmoe.load_checkpoint(kimi_file)
    part = mxmoe.load_checkpoint(kimi_file, ep_size=4, ep_rank=3)
    assert part.weights.num_local == 4
    np.testing.assert_array_equal(part.weights.w13_packed, full.weights.w13_packed[12:16])


def test_ep_rank_layers_sum_to_the_whole(rng, kimi_file):
    x = random_x(rng, 6, 256)
    logits = rng.standard_normal((6, 16)).astype(np.float32)
    full = mxmoe.load_checkpoint(kimi_file)
    routing = mxmoe.RoutingParams("sigmoid", 4)
    kw = dict(input_format="bf16", intermediate_format="bf16", output_format="fp32")
    whole = mxmoe.Layer(full.config(**kw), full.weights, routing=routing, router_bias=full.correction_bias,
                        backend="reference").forward(x, router_logits=logits)
    total = np.zeros_like(whole)
    for r in range(2):
        ck = mxmoe.load_checkpoint(kimi_file, ep_size=2, ep_rank=r)
        total += mxmoe.Layer(ck.config(ep_size=2, ep_rank=r, **kw), ck.weights, routing=routing,
                             router_bias=ck.correction_bias, backend="reference").forward(x, router_logits=logits)
    np.testing.assert_allclose(total, whole, rtol=1e-5, atol=1e-6)


def _split_into_shards(src: Path, folder: Path, shard_of) -> None:
    """A Hugging Face style sharded copy of a safetensors file: each tensor's bytes in the
    shard shard_of(name) names, and model.safetensors.index.json mapping them."""
    import json
    import struct

    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    shards, weight_map = {}, {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        shard = shard_of(name)
        weight_map[name] = shard
        shards.setdefault(shard, []).append((name, t))
    folder.mkdir()
    for shard, tensors in shards.items():
        h, blob = {"__metadata__": header.get("__metadata__", {})}, b""
        for name, t in tensors:
            b, e = t["data_offsets"]
            h[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [len(blob), len(blob) + e - b]}
            blob += body[b:e]
        hj = json.dumps(h).encode()
        hj += b" " * (-len(hj) % 8)
        (folder / shard).write_bytes(struct.pack("<Q", len(hj)) + hj + blob)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path, kimi_file):
    folder = tmp_path / "sharded"
    _split_into_shards(kimi_file, folder, lambda n: "b.safetensors" if ".experts.1" in n else "a.safetensors")
    one = mxmoe.load_checkpoint(kimi_file)
    for path in (folder, folder / "model.safetensors.index.json"):
        ck = mxmoe.load_checkpoint(path, ep_size=2, ep_rank=1)
        assert (ck.format, ck.num_experts, ck.top_k) == ("kimi", 16, 4)
        np.testing.assert_array_equal(ck.weights.w13_packed, one.weights.w13_packed[8:16])
        np.testing.assert_array_equal(ck.correction_bias, one.correction_bias)
    (folder / "b.safetensors").unlink()
    with pytest.raises(mxmoe.FormatError, match="b.safetensors"):
        mxmoe.load_checkpoint(folder)
    (folder / "model.safetensors.index.json").write_text("{")
    with pytest.raises(mxmoe.FormatError, match="index"):
        mxmoe.load_checkpoint(folder)


def test_malformed_checkpoint_raises_format_error(tmp_path, kimi_file):
    bad = tmp_path / "bad.safetensors"
    data = kimi_file.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(mxmoe.FormatError):
        mxmoe.load_checkpoint(bad)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError):
        mxmoe.load_checkpoint(garbage)
    with pytest.raises(ValueError, match="ep_rank"):
        mxmoe.load_checkpoint(kimi_file, ep_size=2, ep_rank=2)


def test_example_runs_on_cpu():
    pkg = str(Path(mxmoe.__file__).resolve().parents[1])
    env = dict(os.environ, MXMOE_EXAMPLE_DEVICE="cpu", MXMOE_TEST_SEED=str(SEED),
               PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "kimi_k3_layer.py"), "--device", "cpu", "--tokens", "4"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agreement with the reference: PASS" in r.stdout, r.stdout
